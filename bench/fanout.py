"""Verdict fan-out: what each gateway reads for its own verdicts, v1 versus reply routing.

    python bench/fanout.py [--broker kafka|embedded|HOST:PORT] [--gateways 50] \
        [--sessions 2] [--calls 20] [--reply-partitions 64]

One worker, then N gateways (``GatewayClient``s in this process) each making
``sessions`` x ``calls`` tool calls side by side, twice: first every gateway reads the
whole verdicts topic (v1, ``Topics(replies=None)``), then each reads its reply
partition (the incarnation's hash modulo ``--reply-partitions``). Per mode: records
read per gateway per own verdict (median and max over gateways), bytes the brokers
served all gateways (keys + values of the records read), the share of the records
read that were other gateways' skipped by key (never parsed), and verdict latency
p50 / p99 (publish to verdict, the gateway's own clock). docs/benchmarks.md quotes it.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from loopfuse.streams.gateway.client import GatewayClient, Topics  # noqa: E402
from loopfuse.streams.local.worker_process import WorkerProcess  # noqa: E402
from tests.support.brokers import run_on  # noqa: E402
from tests.support.harness import new_topics, worker_settings  # noqa: E402


@dataclasses.dataclass
class Figures:
    mode: str
    gateways: int
    verdicts: int
    read_per_own_median: float
    read_per_own_max: float
    foreign_share: float
    bytes_served: int
    p50_ms: float
    p99_ms: float
    timeouts: int

    def line(self) -> str:
        return (
            f"{self.mode:>6}: gateways={self.gateways} verdicts={self.verdicts} "
            f"read/own median={self.read_per_own_median:.2f} max={self.read_per_own_max:.2f} "
            f"foreign-skipped={self.foreign_share:.1%} bytes-served={self.bytes_served:,} "
            f"latency p50={self.p50_ms:.2f} ms p99={self.p99_ms:.2f} ms timeouts={self.timeouts}"
        )


async def _gateway_calls(
    client: GatewayClient, prefix: str, sessions: int, calls: int, latencies: list[float]
) -> None:
    async def one(index: int) -> None:
        session = client.session(f"{prefix}-{index}", run_id="run-1")
        for n in range(calls):
            started = time.perf_counter()
            await session.check("read", {"path": f"/f/{n}"})
            latencies.append((time.perf_counter() - started) * 1000)

    await asyncio.gather(*(one(i) for i in range(sessions)))


async def measure(
    bootstrap: str,
    topics: Topics,
    mode: str,
    gateways: int,
    sessions: int,
    calls: int,
    fetch_wait_ms: int,
) -> Figures:
    clients = [
        GatewayClient(
            bootstrap,
            topics=topics,
            timeout=60,
            verdict_fetch_wait_ms=fetch_wait_ms,
            idempotent=fetch_wait_ms != 5,
        )  # 5 ms: the embedded broker, no idempotence
        for _ in range(gateways)
    ]
    for client in clients:
        await client.start()
    latencies: list[float] = []
    try:
        await asyncio.gather(
            *(
                _gateway_calls(c, f"{mode}-{i}-{uuid.uuid4().hex[:6]}", sessions, calls, latencies)
                for i, c in enumerate(clients)
            )
        )
        await asyncio.sleep(2.0)  # the readers catch up with what the others' calls caused
    finally:
        for client in clients:
            await client.stop()
    own = [max(c.stats.verdicts, 1) for c in clients]
    per_own = [c.stats.records_read / n for c, n in zip(clients, own, strict=True)]
    read = sum(c.stats.records_read for c in clients)
    latencies.sort()
    return Figures(
        mode,
        gateways,
        sum(c.stats.verdicts for c in clients),
        statistics.median(per_own),
        max(per_own),
        sum(c.stats.foreign_records for c in clients) / max(read, 1),
        sum(c.stats.bytes_read for c in clients),
        statistics.median(latencies),
        latencies[int(len(latencies) * 0.99) - 1],
        sum(c.stats.timeouts for c in clients),
    )


async def run(args: argparse.Namespace, bootstrap: str, embedded: bool) -> str:
    roles = new_topics()
    replies = f"bench-replies-{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory(prefix="loopfuse-fanout-") as tmp:
        settings = worker_settings(
            bootstrap,
            "tansu" if embedded else "kafka",
            roles,
            f"fanout-{uuid.uuid4().hex[:8]}",
            Path(tmp) / "data",
            reply_topics=replies,
            reply_partitions=args.reply_partitions,
            partitions=4,
        )
        worker = WorkerProcess(settings, log_path=Path(tmp) / "worker.log").start()
        try:
            await asyncio.to_thread(worker.wait_ready, 120)
            routed = Topics(
                roles["tool_calls"],
                roles["tool_results"],
                roles["compactions"],
                roles["verdicts"],
                replies,
            )
            v1 = dataclasses.replace(routed, replies=None)
            wait = 5 if embedded else 500
            # warm-up: the worker's first batches, the clients' first metadata
            await measure(bootstrap, routed, "warmup", 2, 1, 5, wait)
            lines = []
            for mode, topics in (("v1", v1), ("routed", routed)):
                figures = await measure(
                    bootstrap, topics, mode, args.gateways, args.sessions, args.calls, wait
                )
                lines.append(figures.line())
                print(lines[-1], flush=True)
        finally:
            worker.stop()
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--broker", default=None, metavar="kafka|embedded|HOST:PORT")
    parser.add_argument("--gateways", type=int, default=50)
    parser.add_argument("--sessions", type=int, default=2, help="sessions per gateway")
    parser.add_argument("--calls", type=int, default=20, help="calls per session")
    parser.add_argument("--reply-partitions", type=int, default=64)
    args = parser.parse_args()
    run_on(args.broker, lambda b, e: run(args, b, e))
    return 0


if __name__ == "__main__":
    sys.exit(main())
