"""Recovery benchmark: a worker restarting onto a changelog of many sessions.

    python bench/recovery.py [--broker kafka|embedded|HOST:PORT] [--sessions 100000] [--partitions 4]

Starts the broker ``--broker`` names (Apache Kafka, one local KRaft node, by default;
``embedded``; ``HOST:PORT``). Then, on topics and a consumer group of its own:

1. starts a worker on an empty changelog and times start -> ``/ready`` (the empty
   start-up: process start, group join, assignment), and stops it;
2. writes ``--sessions`` session states straight into the table's changelog topic
   (real state bytes, ~240 bytes each, keyed like the table's writes);
3. reads that changelog to its end with a plain aiokafka consumer (the floor);
4. starts a fresh worker (``--store``, memory by default; either way an empty one:
   everything comes from the changelog) and
   times start -> ``/ready`` again; ``/ready`` needs table recovery complete.

The goal (issue 11) is ready <= 10 s beyond the empty start-up for 100k sessions.
The last line printed is machine-readable:
ready_empty_s=... ready_recovered_s=... beyond_empty_s=... raw_changelog_read_s=...
sessions=... changelog_bytes=...
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from pathlib import Path

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from loopfuse.schemas.decode import decode_event  # noqa: E402
from loopfuse.streams.engine import Engine, state_codec  # noqa: E402
from loopfuse.streams.local.worker_process import WorkerProcess, topic_settings, unique_topics  # noqa: E402
from tests.support.brokers import run_on  # noqa: E402

CLIENT_FETCH_WAIT_MS = 2  # the raw read's: a changelog read to its end always has data


def state_values(count: int = 64) -> list[bytes]:
    """Real session states: a few calls and results each, some of them looping."""
    engine = Engine()
    values = []
    for n in range(count):
        state = None
        for i in range(2 + n % 12):
            looping = n % 4 == 0
            common = {
                "session_key": "template",
                "run_id": "run-1",
                "agent_id": "bench",
                "call_id": f"c{i}",
                "tool_name": "process" if looping else "read",
                "args": {"action": "poll"} if looping else {"path": f"/src/{n}-{i}.py"},
                "ts": 1_780_000_000_000 + i,
            }
            for event in (
                {**common, "type": "tool_call", "seq": 2 * i, "event_id": f"e{2 * i}"},
                {
                    **common,
                    "type": "tool_result",
                    "seq": 2 * i + 1,
                    "event_id": f"e{2 * i + 1}",
                    "result": "running" if looping else f"content {n} {i}",
                },
            ):
                state, _ = engine.step(state, decode_event(orjson.dumps(event)), 0)
        assert state is not None
        values.append(state_codec.encode(state))
    return values


async def write_changelog(bootstrap: str, topic: str, sessions: int) -> int:
    """``sessions`` states under distinct keys; the producer's default partitioner
    places them where Faust's table writes would go."""
    values = state_values()
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, linger_ms=5, max_batch_size=1_048_576, acks=1
    )
    await producer.start()
    written = 0
    try:
        for n in range(sessions):
            value = values[n % len(values)]
            await producer.send(topic, value, key=f"bench:{n}".encode())
            written += len(value)
        await producer.flush()
    finally:
        await producer.stop()
    return written


async def raw_read(bootstrap: str, topic: str, partitions: int) -> tuple[float, int]:
    """Seconds for a plain consumer to read ``topic`` from the start to its end."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        fetch_max_wait_ms=CLIENT_FETCH_WAIT_MS,
        max_poll_records=10_000,
    )
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        t0 = time.monotonic()
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        remaining = {tp for tp in tps if ends[tp] > 0}
        records = 0
        while remaining:
            batches = await consumer.getmany(*remaining, timeout_ms=1_000)
            for tp, batch in batches.items():
                records += len(batch)
                if batch and batch[-1].offset + 1 >= ends[tp]:
                    remaining.discard(tp)
        return time.monotonic() - t0, records
    finally:
        await consumer.stop()


def timed_ready(
    settings: dict[str, str], log: Path, timeout: float = 300.0, profile: str | None = None
) -> float:
    worker = WorkerProcess(
        settings, log_path=log, python_options=["-m", "cProfile", "-o", profile] if profile else ()
    )
    t0 = time.monotonic()
    worker.start()
    try:
        worker.wait_ready(timeout)
        return time.monotonic() - t0
    finally:
        worker.stop()


async def run(args: argparse.Namespace, bootstrap: str, embedded: bool) -> str:
    topics = unique_topics("recovery")
    app_id = f"bench-recovery-{uuid.uuid4().hex[:8]}"
    changelog = f"{app_id}-sessions-changelog"
    with tempfile.TemporaryDirectory(prefix="loopfuse-bench-") as scratch:
        tmp = args.workdir or scratch
        settings = {
            "bootstrap_servers": bootstrap,
            "embedded_broker": str(embedded).lower(),
            "app_id": app_id,
            "partitions": str(args.partitions),
            "store": args.store,
            "broker_session_timeout": "6",
            "broker_heartbeat_interval": "1",
            **topic_settings(topics),
        }
        logs = Path(tmp)
        logs.mkdir(parents=True, exist_ok=True)
        empty = timed_ready({**settings, "data_dir": str(logs / "a")}, logs / "empty.log")
        print(f"empty start-up: ready after {empty:.1f} s", flush=True)
        t0 = time.monotonic()
        size = await write_changelog(bootstrap, changelog, args.sessions)
        print(
            f"wrote {args.sessions:,} states ({size / 1e6:.1f} MB) into {changelog} in "
            f"{time.monotonic() - t0:.1f} s",
            flush=True,
        )
        raw_s, raw_records = await raw_read(bootstrap, changelog, args.partitions)
        print(
            f"raw aiokafka read of the changelog: {raw_records:,} records in {raw_s:.2f} s "
            f"({raw_records / raw_s:,.0f}/s)",
            flush=True,
        )
        try:
            full = timed_ready(
                {**settings, "data_dir": str(logs / "b")}, logs / "full.log", profile=args.profile
            )
        except BaseException:
            print((logs / "full.log").read_text(errors="replace")[-3000:], file=sys.stderr)
            raise
    print(
        f"restart onto {args.sessions:,} sessions: ready after {full:.1f} s, "
        f"{full - empty:.1f} s beyond the empty start-up (goal <= 10 s)",
        flush=True,
    )
    return (
        f"ready_empty_s={empty:.2f} ready_recovered_s={full:.2f} "
        f"beyond_empty_s={full - empty:.2f} raw_changelog_read_s={raw_s:.2f} "
        f"sessions={args.sessions} changelog_bytes={size} store={args.store}"
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
    parser.add_argument("--sessions", type=int, default=100_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument(
        "--store",
        default="memory://",
        choices=["memory://", "rocksdb://"],
        help="the workers' table store; with rocksdb:// the restarted worker "
        "has an empty data folder, so it restores every session into "
        "RocksDB from the changelog (a new node)",
    )
    parser.add_argument("--profile", metavar="PATH", help="cProfile the recovering worker")
    parser.add_argument("--workdir", type=Path, help="keep the workers' logs here")
    args = parser.parse_args()
    line = run_on(args.broker, lambda b, e: run(args, b, embedded=e))
    print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
