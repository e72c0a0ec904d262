"""Stream worker benchmark: throughput and verdict latency, each beside raw aiokafka.

    python bench/stream.py [--broker kafka|embedded|HOST:PORT] [--events 20000] [--rate 1000]

Starts the broker ``--broker`` names (Apache Kafka, one local KRaft node, by default;
``embedded``: the embedded Tansu; ``HOST:PORT``: a running one), and one worker
subprocess (``python -m loopfuse.streams.worker.run``). Measures:

(a) throughput: N pre-produced events (tool_call/tool_result pairs over ~200
    sessions, a few of them looping) through the worker until every verdict is
    consumed; beside it a raw aiokafka consume->produce pipe over the same input.
(b) latency: tool_calls sent at a fixed rate, send -> verdict received (p50/p99),
    at ``--rate`` (1k calls/s) and at 80% of the throughput measured in (a);
    beside each the same measurement through a trivial in-process echo
    (consumer -> producer) over the same broker.
(b') the latency-throughput curve (``--no-curve`` skips it): verdict p99 beside the raw
    echo's p99 at paced rates from 250/s, doubling, up to the backlog maximum of (a);
    the highest rate whose verdict p99 is within 3x the echo's.
(c) scale-out: one worker, then two workers in one group, on the same number of
    partitions, both started and assigned before the events are produced.

The last line printed is machine-readable:
worker_events_per_s=... raw_pipe_events_per_s=... ratio=... verdict_p99_ms=... raw_rtt_p99_ms=...
verdict_p50_ms=... raw_rtt_p50_ms=... verdict_p99_at_80pct_ms=... raw_rtt_p99_at_80pct_ms=...
one_worker_events_per_s=... two_workers_events_per_s=... two_worker_speedup=...
max_rate_p99_within_3x_echo=...
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from loopfuse.streams.local.worker_process import (  # noqa: E402
    WorkerProcess,
    input_topic_for,
    topic_settings,
    unique_topics,
)
from tests.support.brokers import run_on  # noqa: E402
from tests.support.harness import create_topics, worker_committed  # noqa: E402

# The benchmark's own consumers' fetch wait, set by run() to what the worker uses by
# default on that broker (loopfuse.streams.settings.Settings.fetch_wait_ms): the embedded broker
# holds a fetch for the whole max wait when there is nothing new, so there every consumer
# polls with a short wait; Apache Kafka answers at the first record.
CLIENT_FETCH_WAIT_MS = 500


# -- workload -------------------------------------------------------------------------


def workload(n_events: int, n_sessions: int, seed: int = 7) -> list[dict[str, Any]]:
    """tool_call/tool_result pairs, round-robin over sessions; 1 in 10 sessions loops."""
    rng = random.Random(seed)
    per_session = max(2, n_events // n_sessions // 2 * 2)
    sessions = [f"bench:{i}" for i in range(n_sessions)]
    streams: list[list[dict[str, Any]]] = []
    for s, key in enumerate(sessions):
        looping = s % 10 == 0
        events = []
        for i in range(per_session // 2):
            if looping:
                tool, args, result = "process", {"action": "poll", "sessionId": "b"}, "running"
            else:
                tool = rng.choice(["read", "exec", "web_search", "write"])
                args = {"path": f"/src/{rng.randrange(10_000)}.py", "n": i}
                result = f"content {rng.random()}"
            common = {
                "session_key": key,
                "run_id": "run-1",
                "agent_id": "bench",
                "call_id": f"{key}-c{i}",
                "tool_name": tool,
                "args": args,
                "ts": 1_780_000_000_000 + i,
            }
            events.append(
                {**common, "type": "tool_call", "event_id": f"{key}-{2 * i}", "seq": 2 * i}
            )
            events.append(
                {
                    **common,
                    "type": "tool_result",
                    "event_id": f"{key}-{2 * i + 1}",
                    "seq": 2 * i + 1,
                    "result": {"content": result},
                }
            )
        streams.append(events)
    out = [e for group in zip(*streams, strict=True) for e in group]
    return out[:n_events]


# -- broker helpers -------------------------------------------------------------------


def producer(bootstrap: str) -> AIOKafkaProducer:
    return AIOKafkaProducer(
        bootstrap_servers=bootstrap, linger_ms=1, max_batch_size=262_144, acks=1
    )


def consumer(bootstrap: str, *topics: str, group: str | None = None) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(
        *topics,
        bootstrap_servers=bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=CLIENT_FETCH_WAIT_MS,
        max_poll_records=2_000,
        session_timeout_ms=6_000,
        heartbeat_interval_ms=1_000,
    )


async def wait_assigned(cons: AIOKafkaConsumer, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cons.assignment():
        if time.monotonic() > deadline:
            raise RuntimeError("consumer got no partitions")
        await asyncio.sleep(0.05)


async def produce_all(bootstrap: str, messages: list[tuple[str, bytes, bytes]]) -> None:
    prod = producer(bootstrap)
    await prod.start()
    try:
        for topic, key, value in messages:
            await prod.send(topic, value, key=key)
        await prod.flush()
    finally:
        await prod.stop()


# -- the worker -----------------------------------------------------------------------


class BenchWorker(WorkerProcess):
    """The worker under test, on topics of its own."""

    def __init__(
        self,
        bootstrap: str,
        embedded: bool,
        partitions: int,
        tmp: Path,
        extra_env: dict[str, str],
        profile: str | None = None,
    ) -> None:
        self.topics = unique_topics("bench")
        self.partitions = partitions
        super().__init__(
            {
                "bootstrap_servers": bootstrap,
                "embedded_broker": str(embedded).lower(),
                "app_id": f"bench-{uuid.uuid4().hex[:8]}",
                "partitions": str(partitions),
                "data_dir": str(tmp / "data"),
                "broker_session_timeout": "6",
                "broker_heartbeat_interval": "1",
                **topic_settings(self.topics),
                **{k.removeprefix("LOOPFUSE_").lower(): v for k, v in extra_env.items()},
            },
            log_path=tmp / "worker.log",
            python_options=["-m", "cProfile", "-o", profile] if profile else (),
        )

    async def ready(self, timeout: float = 90.0) -> None:
        await asyncio.to_thread(self.wait_ready, timeout)

    def twin(self) -> WorkerProcess:
        """Another worker of the same group on the same topics (its own web port)."""
        settings = {
            key.removeprefix("LOOPFUSE_").lower(): value
            for key, value in self.env.items()
            if key.startswith("LOOPFUSE_") and key != "LOOPFUSE_WEB_PORT"
        }
        assert self.log_path is not None
        return WorkerProcess(settings, log_path=self.log_path.with_name("twin.log"))

    def topic_for(self, event: dict[str, Any]) -> str:
        return input_topic_for(self.topics, event)


# -- (a) throughput -------------------------------------------------------------------


async def worker_throughput(
    bootstrap: str, worker: BenchWorker, events: list[dict[str, Any]], spy: str | None = None
) -> float:
    messages = [(worker.topic_for(e), e["session_key"].encode(), orjson.dumps(e)) for e in events]
    expected = sum(1 for e in events if e["type"] == "tool_call")
    # The backlog waits on topics the worker will find (Apache Kafka creates none on demand).
    await create_topics(bootstrap, list(worker.topics.values()), worker.partitions)
    await produce_all(bootstrap, messages)
    cons = consumer(bootstrap, worker.topics["verdicts"])
    await cons.start()
    sampler: subprocess.Popen[bytes] | None = None
    try:
        worker.start()
        if spy is not None:
            sampler = start_sampling(worker, spy)
        # Time between the first and the last decision: excludes start-up, the group
        # join and changelog recovery, which the raw pipe does not have either.
        elapsed = await decision_span(cons, expected, f"see {worker.log_path}")
    finally:
        await cons.stop()
        if sampler is not None:
            sampler.send_signal(signal.SIGINT)  # py-spy writes its file and exits
            sampler.wait(timeout=60)
    if spy is not None:
        print_profile(spy)
    return len(events) / elapsed


def start_sampling(worker: BenchWorker, path: str) -> subprocess.Popen[bytes]:
    """py-spy (not a dependency: pip install py-spy) sampling the worker's threads."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).exists():
        raise SystemExit("--spy needs py-spy (pip install py-spy)")
    return subprocess.Popen(
        [
            spy,
            "record",
            "--pid",
            str(worker.pid),
            "--rate",
            "200",
            "--threads",
            "--format",
            "raw",
            "--output",
            path,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def print_profile(path: str, top: int = 25) -> None:
    """The sampled frames with the most time under them (inclusive), per thread."""
    totals: dict[str, int] = {}
    under: dict[tuple[str, str], int] = {}
    for line in Path(path).read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        thread, samples = frames[0], int(count)
        totals[thread] = totals.get(thread, 0) + samples
        for frame in set(frames[1:]):
            name = frame.split(" (")[0] + " " + frame.rsplit("/", 1)[-1].split(":")[0]
            under[(thread, name)] = under.get((thread, name), 0) + samples
    for thread, total in sorted(totals.items(), key=lambda item: -item[1]):
        print(f"profile of {thread} ({total} samples):")
        ranked = sorted(
            ((n, c) for (t, n), c in under.items() if t == thread), key=lambda item: -item[1]
        )
        for name, samples in ranked[:top]:
            print(f"  {100 * samples / total:5.1f}%  {name}")


async def decision_span(cons: AIOKafkaConsumer, expected: int, hint: str) -> float:
    """Seconds from the first to the last of ``expected`` verdicts' decisions."""
    seen = first = last = 0
    deadline = time.monotonic() + 300
    while seen < expected:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {seen}/{expected} verdicts; {hint}")
        for records in (await cons.getmany(timeout_ms=200, max_records=5_000)).values():
            for r in records:
                decided = orjson.loads(r.value)["decided_ts"]
                first = decided if not first else min(first, decided)
                last = max(last, decided)
                seen += 1
    return max((last - first) / 1000.0, 1e-3)


async def raw_pipe_throughput(
    bootstrap: str, events: list[dict[str, Any]], partitions: int
) -> float:
    """aiokafka consume -> produce (one message out per message in), same input shape."""
    suffix = uuid.uuid4().hex[:8]
    source, sink = f"raw-in-{suffix}", f"raw-out-{suffix}"
    await create_topics(bootstrap, [source, sink], partitions)
    await produce_all(
        bootstrap, [(source, e["session_key"].encode(), orjson.dumps(e)) for e in events]
    )
    cons = consumer(bootstrap, source, group=f"raw-{suffix}")
    prod = producer(bootstrap)
    await cons.start()
    await prod.start()
    try:
        seen, started = 0, 0.0
        while seen < len(events):
            batches = await cons.getmany(timeout_ms=200, max_records=5_000)
            for records in batches.values():
                if not started and records:
                    started = time.perf_counter()
                for r in records:
                    await prod.send(sink, r.value, key=r.key)
                    seen += 1
            if batches:
                await prod.flush()
                await cons.commit()
        elapsed = time.perf_counter() - started
    finally:
        await prod.stop()
        await cons.stop()
    return len(events) / elapsed


# -- (b) latency ----------------------------------------------------------------------


async def paced_round_trips(
    bootstrap: str,
    send_topic: str,
    reply_topic: str,
    rate: float,
    seconds: float,
    make: Any,
    reply_id: Any,
) -> list[float]:
    """Send at ``rate``/s for ``seconds``; return send -> reply latencies in ms."""
    sent: dict[str, float] = {}
    latencies: list[float] = []
    cons = consumer(bootstrap, reply_topic)
    prod = producer(bootstrap)
    await cons.start()
    await prod.start()
    # Start reading at the end of the reply topic.
    await cons.seek_to_end()
    total = int(rate * seconds)

    async def receive() -> None:
        while len(latencies) < total:
            batches = await cons.getmany(timeout_ms=100)
            now = time.perf_counter()
            for records in batches.values():
                for r in records:
                    t0 = sent.pop(reply_id(r.value), None)
                    if t0 is not None:
                        latencies.append((now - t0) * 1000.0)

    receiver = asyncio.create_task(receive())
    try:
        start = time.perf_counter()
        for i in range(total):
            due = start + i / rate
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            key, value, ident = make(i)
            sent[ident] = time.perf_counter()
            await prod.send(send_topic, value, key=key)
        await asyncio.wait_for(receiver, timeout=60)
    finally:
        receiver.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await receiver
        await prod.stop()
        await cons.stop()
    return latencies


def tool_call_maker(prefix: str, sessions: int) -> Any:
    def make(i: int) -> tuple[bytes, bytes, str]:
        key = f"{prefix}:{i % sessions}"
        call_id = f"{prefix}-{i}"
        event = {
            "type": "tool_call",
            "event_id": call_id,
            "session_key": key,
            "run_id": "r",
            "call_id": call_id,
            "tool_name": "read",
            "args": {"path": f"/f{i}"},
            "ts": 1_780_000_000_000 + i,
        }
        return key.encode(), orjson.dumps(event), call_id

    return make


async def worker_latency(
    bootstrap: str, worker: BenchWorker, rate: float, seconds: float
) -> list[float]:
    prefix = f"lat-{uuid.uuid4().hex[:6]}"
    return await paced_round_trips(
        bootstrap,
        worker.topics["tool_calls"],
        worker.topics["verdicts"],
        rate,
        seconds,
        tool_call_maker(prefix, 200),
        lambda value: orjson.loads(value)["call_id"],
    )


async def raw_latency(bootstrap: str, rate: float, seconds: float, partitions: int) -> list[float]:
    """The same paced client through a trivial in-process echo (consume -> produce)."""
    suffix = uuid.uuid4().hex[:8]
    source, sink = f"rtt-in-{suffix}", f"rtt-out-{suffix}"
    await create_topics(bootstrap, [source, sink], partitions)
    echo_cons = consumer(bootstrap, source, group=f"echo-{suffix}")
    echo_prod = producer(bootstrap)
    await echo_cons.start()
    await echo_prod.start()
    await wait_assigned(echo_cons)

    async def echo() -> None:
        while True:
            batches = await echo_cons.getmany(timeout_ms=100)
            for records in batches.values():
                for r in records:
                    await echo_prod.send(sink, r.value, key=r.key)

    echo_task = asyncio.create_task(echo())
    try:
        return await paced_round_trips(
            bootstrap,
            source,
            sink,
            rate,
            seconds,
            tool_call_maker("rtt", 200),
            lambda value: orjson.loads(value)["call_id"],
        )
    finally:
        echo_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await echo_task
        await echo_prod.stop()
        await echo_cons.stop()


async def group_throughput(
    bootstrap: str,
    workers: list[WorkerProcess],
    topics: dict[str, str],
    events: list[dict[str, Any]],
) -> float:
    """Events/s through ``workers`` (one group), all started and assigned beforehand."""
    for worker in workers:
        worker.start()
    for worker in workers:
        await asyncio.to_thread(worker.wait_ready, 120)
    await asyncio.sleep(8)  # let the group settle (a later join would rebalance mid-run)
    for worker in workers:
        await asyncio.to_thread(worker.wait_ready, 120)
    messages = [
        (input_topic_for(topics, e), e["session_key"].encode(), orjson.dumps(e)) for e in events
    ]
    expected = sum(1 for e in events if e["type"] == "tool_call")
    cons = consumer(bootstrap, topics["verdicts"])
    await cons.start()
    try:
        await cons.seek_to_end()
        await produce_all(bootstrap, messages)
        elapsed = await decision_span(cons, expected, f"{len(workers)} worker(s)")
    finally:
        await cons.stop()
    return len(events) / elapsed


async def scale_out(
    bootstrap: str,
    embedded: bool,
    partitions: int,
    tmp: Path,
    extra: dict[str, str],
    events: list[dict[str, Any]],
) -> tuple[float, float]:
    rates = []
    for count in (1, 2):
        (tmp / f"group{count}").mkdir()
        first = BenchWorker(bootstrap, embedded, partitions, tmp / f"group{count}", extra)
        workers: list[WorkerProcess] = [first] + [first.twin() for _ in range(count - 1)]
        try:
            rates.append(await group_throughput(bootstrap, workers, first.topics, events))
        finally:
            for worker in workers:
                worker.stop()
        print(
            f"{count} worker(s) on {partitions} partitions: {rates[-1]:,.0f} events/s", flush=True
        )
    return rates[0], rates[1]


async def latency_curve(
    bootstrap: str, worker: BenchWorker, top: float, seconds: float, partitions: int
) -> tuple[float, list[str]]:
    """Verdict p99 beside the raw echo's p99 at paced rates from 250/s, doubling, up to
    ``top`` (the backlog maximum); the highest rate at which the verdict's p99 stays
    within 3x the echo's (0 when none does), and a line per rate."""
    rates, rate = [], 250.0
    while rate < top:
        rates.append(rate)
        rate *= 2
    rates.append(top)
    best, lines = 0.0, []
    settings = {
        key.removeprefix("LOOPFUSE_").lower(): value
        for key, value in worker.env.items()
        if key.startswith("LOOPFUSE_")
    }
    for rate in rates:
        # Each rate from a caught-up worker: what the last one left unjudged is not
        # this one's latency.
        await worker_committed(bootstrap, settings, timeout=300)
        verdict = percentile(await worker_latency(bootstrap, worker, rate, seconds), 99)
        echo = percentile(await raw_latency(bootstrap, rate, seconds, partitions), 99)
        within = verdict <= 3 * echo
        if within:
            best = max(best, rate)
        lines.append(
            f"curve: {rate:,.0f}/s verdict p99={verdict:.1f} ms echo p99={echo:.1f} ms "
            f"ratio={verdict / echo:.1f}{'' if within else ' (over 3x)'}"
        )
        print(lines[-1], flush=True)
    return best, lines


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100.0 * (len(ordered) - 1)))]


# -- main -----------------------------------------------------------------------------


async def run(args: argparse.Namespace, bootstrap: str, embedded: bool) -> str:
    global CLIENT_FETCH_WAIT_MS
    CLIENT_FETCH_WAIT_MS = 5 if embedded else 500
    events = workload(args.events, args.sessions)
    with tempfile.TemporaryDirectory(prefix="loopfuse-bench-") as tmp:
        extra = dict(kv.split("=", 1) for kv in args.worker_env)
        worker = BenchWorker(bootstrap, embedded, args.partitions, Path(tmp), extra, args.profile)
        try:
            worker_rate = await worker_throughput(bootstrap, worker, events, args.spy)
            print(
                f"worker throughput: {worker_rate:,.0f} events/s ({len(events)} events)", flush=True
            )
            await worker.ready()
            verdict_ms = await worker_latency(bootstrap, worker, args.rate, args.seconds)
            best_rate = float("nan")
            if args.curve:
                best_rate, _ = await latency_curve(
                    bootstrap, worker, worker_rate, args.seconds, args.partitions
                )
            rate80 = 0.8 * worker_rate
            await worker_committed(
                bootstrap,
                {
                    key.removeprefix("LOOPFUSE_").lower(): value
                    for key, value in worker.env.items()
                    if key.startswith("LOOPFUSE_")
                },
                timeout=300,
            )
            verdict80_ms = await worker_latency(bootstrap, worker, rate80, args.seconds)
        except BaseException:
            print(worker.tail(3000), file=sys.stderr)
            raise
        finally:
            worker.stop()
        one, two = (
            await scale_out(bootstrap, embedded, args.partitions, Path(tmp), extra, events)
            if args.scale_out
            else (float("nan"),) * 2
        )
    raw_rate = await raw_pipe_throughput(bootstrap, events, args.partitions)
    print(f"raw aiokafka pipe:  {raw_rate:,.0f} events/s", flush=True)
    rtt_ms = await raw_latency(bootstrap, args.rate, args.seconds, args.partitions)
    rtt80_ms = await raw_latency(bootstrap, rate80, args.seconds, args.partitions)
    v50, v99 = percentile(verdict_ms, 50), percentile(verdict_ms, 99)
    r50, r99 = percentile(rtt_ms, 50), percentile(rtt_ms, 99)
    v80, r80 = percentile(verdict80_ms, 99), percentile(rtt80_ms, 99)
    print(
        f"verdict latency at {args.rate:g}/s: p50={v50:.2f} ms p99={v99:.2f} ms "
        f"(n={len(verdict_ms)}, mean={statistics.fmean(verdict_ms):.2f})"
    )
    print(f"raw echo round trip:      p50={r50:.2f} ms p99={r99:.2f} ms (n={len(rtt_ms)})")
    print(
        f"at 80% of the worker's max ({rate80:,.0f}/s): verdict p50="
        f"{percentile(verdict80_ms, 50):.2f} ms p99={v80:.2f} ms; raw echo p50="
        f"{percentile(rtt80_ms, 50):.2f} ms p99={r80:.2f} ms"
    )
    print(
        f"ratio={worker_rate / raw_rate:.3f} (target >= 0.25); "
        f"verdict p50 / raw p50 = {v50 / r50:.1f} (target <= 3); "
        f"verdict p99 / raw p99 = {v99 / r99:.1f} (target <= 10); "
        f"two workers / one = {two / one:.2f} (target >= 1.6 where the cores allow)"
    )
    return (
        f"worker_events_per_s={worker_rate:.1f} raw_pipe_events_per_s={raw_rate:.1f} "
        f"ratio={worker_rate / raw_rate:.4f} verdict_p99_ms={v99:.3f} raw_rtt_p99_ms={r99:.3f}"
        f" verdict_p50_ms={v50:.3f} raw_rtt_p50_ms={r50:.3f}"
        f" verdict_p99_at_80pct_ms={v80:.3f} raw_rtt_p99_at_80pct_ms={r80:.3f}"
        f" one_worker_events_per_s={one:.1f} two_workers_events_per_s={two:.1f}"
        f" two_worker_speedup={two / one:.3f}"
        f" max_rate_p99_within_3x_echo={best_rate:.0f}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--broker",
        default=None,
        metavar="kafka|embedded|HOST:PORT",
        help="Apache Kafka, one local KRaft node (default); the embedded Tansu; or a "
        "running broker (LOOPFUSE_TEST_BROKER_KIND=tansu if it is the embedded one)",
    )
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--rate", type=float, default=1_000.0, help="latency phase, events/s")
    parser.add_argument("--seconds", type=float, default=3.0, help="latency phase duration")
    parser.add_argument(
        "--worker-env",
        action="append",
        default=[],
        metavar="LOOPFUSE_X=V",
        help="extra worker setting (repeatable), e.g. LOOPFUSE_BATCH_MAX=1000",
    )
    parser.add_argument("--profile", metavar="PATH", help="cProfile the worker into PATH")
    parser.add_argument(
        "--spy",
        metavar="PATH",
        help="sample the worker with py-spy during (a) into PATH (raw "
        "stacks) and print where its threads spend their time",
    )
    parser.add_argument(
        "--curve",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also the latency-throughput curve: verdict p99 beside the raw "
        "echo's at paced rates from 250/s doubling to the backlog max",
    )
    parser.add_argument(
        "--scale-out",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also measure one vs two workers (c)",
    )
    args = parser.parse_args()
    line = run_on(args.broker, lambda b, e: run(args, b, embedded=e))
    print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
