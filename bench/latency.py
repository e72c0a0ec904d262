"""The verdict's latency budget: one paced call followed through its stages.

    python bench/latency.py [--broker kafka|embedded|HOST:PORT] [--rates 250,1000,4000]

Starts the broker ``--broker`` names (Apache Kafka, one local KRaft node, by default)
and one worker subprocess, on topics whose records carry the broker's append time
(``message.timestamp.type=LogAppendTime``): the input topics and the verdicts topic.
A paced client sends tool calls at each rate and reads their verdicts; each call then
has five clocks, all wall time on this one machine:

- ``sent``: the client hands the call to its producer;
- ``acked``: the client's producer has the broker's ack (the input's append time is
  in that ack);
- ``appended``: the broker appended the input (its log append time);
- ``decided``: the worker judged it (the verdict's ``decided_ts``: the time its batch
  was taken);
- ``answered``: the broker appended the verdict (its log append time);
- ``received``: the client read the verdict and matched it to its call.

The stages between them (``sent -> appended``: the gateway's produce and the broker's
append; ``appended -> decided``: the worker's fetch and its queue to the fold;
``decided -> answered``: the judgement and the verdict's produce with its ack;
``answered -> received``: the gateway's fetch and match) are printed as medians,
means and p99 per rate, beside the same client through a trivial echo (consume ->
produce) on the same broker. Broker times are whole milliseconds: a stage's median
is that coarse, its mean is not.

The last line printed is machine-readable.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.stream import BenchWorker, percentile  # noqa: E402
from tests.support.brokers import run_on  # noqa: E402
from tests.support.harness import create_topics  # noqa: E402

APPEND_TIME = {"message.timestamp.type": "LogAppendTime"}
STAGES = ("sent>appended", "appended>decided", "decided>answered", "answered>received")


@dataclass
class Call:
    sent: float  # wall time, s
    acked: float | None = None
    appended: int | None = None  # broker ms
    decided: int | None = None  # worker ms
    answered: int | None = None  # broker ms
    received: float | None = None


@dataclass
class Budget:
    rate: float
    calls: dict[str, Call] = field(default_factory=dict)

    def stages(self) -> dict[str, list[float]]:
        out: dict[str, list[float]] = {name: [] for name in (*STAGES, "total", "sent>acked")}
        for call in self.calls.values():
            if call.received is None or call.appended is None:
                continue
            sent_ms, received_ms = call.sent * 1000, call.received * 1000
            out["total"].append(received_ms - sent_ms)
            if call.acked is not None:
                out["sent>acked"].append(call.acked * 1000 - sent_ms)
            out["sent>appended"].append(call.appended - sent_ms)
            if call.decided is not None and call.answered is not None:
                out["appended>decided"].append(call.decided - call.appended)
                out["decided>answered"].append(call.answered - call.decided)
            if call.answered is not None:
                out["answered>received"].append(received_ms - call.answered)
        return out


def producer(bootstrap: str) -> AIOKafkaProducer:
    # a gateway's producer: acks=all and idempotent, as the Python client's
    return AIOKafkaProducer(
        bootstrap_servers=bootstrap, linger_ms=0, acks="all", enable_idempotence=True
    )


async def paced(
    bootstrap: str,
    send_topic: str,
    reply_topic: str,
    rate: float,
    seconds: float,
    decided_of: Any,
) -> Budget:
    """Calls at ``rate``/s for ``seconds``, each followed to its reply."""
    budget = Budget(rate)
    total = int(rate * seconds)
    cons = AIOKafkaConsumer(
        reply_topic, bootstrap_servers=bootstrap, fetch_max_wait_ms=500, max_poll_records=2_000
    )
    prod = producer(bootstrap)
    await cons.start()
    await prod.start()
    await cons.seek_to_end()
    received = 0

    async def receive() -> None:
        nonlocal received
        while received < total:
            batches = await cons.getmany(timeout_ms=100)
            now = time.time()
            for records in batches.values():
                for record in records:
                    data = orjson.loads(record.value)
                    call = budget.calls.get(data.get("call_id", ""))
                    if call is not None and call.received is None:
                        call.received = now
                        call.answered = record.timestamp
                        call.decided = decided_of(data)
                        received += 1

    def acked(call: Call, future: asyncio.Future[Any]) -> None:
        if not future.cancelled() and future.exception() is None:
            call.acked = time.time()
            call.appended = future.result().timestamp

    receiver = asyncio.create_task(receive())
    try:
        prefix = uuid.uuid4().hex[:6]
        start = time.perf_counter()
        for i in range(total):
            delay = start + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            call_id = f"{prefix}-{i}"
            session = f"lat:{prefix}:{i % 200}"
            event = {
                "type": "tool_call",
                "event_id": call_id,
                "session_key": session,
                "run_id": "r",
                "call_id": call_id,
                "tool_name": "read",
                "args": {"path": f"/f{i}"},
                "ts": int(time.time() * 1000),
            }
            call = budget.calls[call_id] = Call(time.time())
            future = await prod.send(send_topic, orjson.dumps(event), key=session.encode())
            future.add_done_callback(lambda f, c=call: acked(c, f))
        await asyncio.wait_for(receiver, timeout=60)
    finally:
        receiver.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await receiver
        await prod.stop()
        await cons.stop()
    return budget


async def echo_budget(bootstrap: str, rate: float, seconds: float, partitions: int) -> Budget:
    """The same client through an echo: consume, stamp ``decided``, produce (acks=all)."""
    suffix = uuid.uuid4().hex[:8]
    source, sink = f"lat-in-{suffix}", f"lat-out-{suffix}"
    await create_topics(bootstrap, [source, sink], partitions, APPEND_TIME)
    cons = AIOKafkaConsumer(
        source,
        bootstrap_servers=bootstrap,
        group_id=f"echo-{suffix}",
        auto_offset_reset="earliest",
        fetch_max_wait_ms=500,
    )
    prod = producer(bootstrap)
    await cons.start()
    await prod.start()
    while not cons.assignment():
        await asyncio.sleep(0.05)

    async def echo() -> None:
        while True:
            batches = await cons.getmany(timeout_ms=100)
            for records in batches.values():
                for record in records:
                    data = orjson.loads(record.value)
                    data["decided_ts"] = int(time.time() * 1000)
                    await prod.send(sink, orjson.dumps(data), key=record.key)

    task = asyncio.create_task(echo())
    try:
        return await paced(bootstrap, source, sink, rate, seconds, lambda d: d["decided_ts"])
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await prod.stop()
        await cons.stop()


def table(name: str, budget: Budget) -> list[str]:
    stages = budget.stages()
    lines = [f"{name} at {budget.rate:g}/s (n={len(stages['total'])}):"]
    for stage, values in stages.items():
        if values:
            lines.append(
                f"  {stage:<18} p50 {percentile(values, 50):7.2f}  mean "
                f"{statistics.fmean(values):7.2f}  p99 {percentile(values, 99):8.2f} ms"
            )
    return lines


async def run(args: argparse.Namespace, bootstrap: str, embedded: bool) -> str:
    rates = [float(r) for r in args.rates.split(",")]
    summary: list[str] = []
    with tempfile.TemporaryDirectory(prefix="loopfuse-latency-") as tmp:
        extra = dict(kv.split("=", 1) for kv in args.worker_env)
        worker = BenchWorker(bootstrap, embedded, args.partitions, Path(tmp), extra)
        stamped = [worker.topics[r] for r in ("tool_calls", "tool_results", "verdicts")]
        await create_topics(bootstrap, stamped, args.partitions, APPEND_TIME)
        worker.start()
        try:
            await worker.ready()
            # a warm-up: the first verdicts pay for connections and metadata
            await paced(bootstrap, stamped[0], stamped[2], 200, 1.0, lambda d: d["decided_ts"])
            for rate in rates:
                ours = await paced(
                    bootstrap, stamped[0], stamped[2], rate, args.seconds, lambda d: d["decided_ts"]
                )
                theirs = await echo_budget(bootstrap, rate, args.seconds, args.partitions)
                print("\n".join(table("verdict", ours) + table("echo", theirs)), flush=True)
                v = ours.stages()["total"]
                e = theirs.stages()["total"]
                summary.append(
                    f"rate_{rate:g}_verdict_p50_ms={percentile(v, 50):.2f} "
                    f"rate_{rate:g}_verdict_p99_ms={percentile(v, 99):.2f} "
                    f"rate_{rate:g}_echo_p50_ms={percentile(e, 50):.2f} "
                    f"rate_{rate:g}_echo_p99_ms={percentile(e, 99):.2f}"
                )
        except BaseException:
            print(worker.tail(3000), file=sys.stderr)
            raise
        finally:
            worker.stop()
    return " ".join(summary)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--broker", default=None, metavar="kafka|embedded|HOST:PORT")
    parser.add_argument("--rates", default="250,1000,4000", help="paced calls/s, comma-separated")
    parser.add_argument("--seconds", type=float, default=5.0, help="each rate's duration")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument(
        "--worker-env",
        action="append",
        default=[],
        metavar="LOOPFUSE_X=V",
        help="extra worker setting (repeatable), e.g. LOOPFUSE_PRODUCER_LINGER_MS=0",
    )
    args = parser.parse_args()
    print(run_on(args.broker, lambda b, e: run(args, b, embedded=e)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
