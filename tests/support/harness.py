"""Shared helpers of the integration and reliability suites: topics, worker settings,
event generation, producing, collecting outputs, and comparing verdicts with the offline engine.

Expected verdicts always come from ``Engine(config).replay(events)`` with the same
config file the worker reads: verdicts are a deterministic function of each
session's events in ``seq`` order, whatever happens to the worker.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from loopfuse.schemas import load_config, validate_event
from loopfuse.streams.engine import Engine, Verdict
from tests.support.brokers import embedded_in_use

ROOT = Path(__file__).resolve().parents[2]
# warningThreshold 3, criticalThreshold 5, no opt-in rules: the native fold where built
CONFIG = ROOT / "tests" / "fixtures" / "worker.json5"
#: The same with an agent whose runs end by rule ("run-ender"): the Python fold.
RULES_CONFIG = ROOT / "tests" / "fixtures" / "small.json5"
LONG = os.environ.get("LOOPFUSE_LONG", "") not in ("", "0", "false", "no")

#: ts of the first generated event (epoch ms); events are 10 ms apart.
BASE_TS = 1_780_000_000_000

Message = tuple[str, bytes | None, bytes | None]


# -- topics and worker settings ---------------------------------------------------------


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def new_topics(suffix: str | None = None) -> dict[str, str]:
    suffix = suffix or uuid.uuid4().hex[:8]
    return {
        "tool_calls": f"rel-calls-{suffix}",
        "tool_results": f"rel-results-{suffix}",
        "compactions": f"rel-compactions-{suffix}",
        "verdicts": f"rel-verdicts-{suffix}",
        "loop_events": f"rel-loops-{suffix}",
        "dead_letters": f"rel-dead-{suffix}",
    }


async def create_topics(
    bootstrap: str, names: Iterable[str], partitions: int, config: dict[str, str] | None = None
) -> None:
    """Create topics before a worker does (it leaves ones of the right size alone): a
    consumer must not subscribe to a topic that does not exist yet on Apache Kafka,
    which creates none on demand (infra/kafka/broker.properties), where the embedded
    broker created them."""
    from aiokafka.admin import NewTopic

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics(
            [NewTopic(name, partitions, 1, topic_configs=config or {}) for name in names]
        )
    finally:
        await admin.close()


def worker_settings(
    bootstrap: str,
    kind: str,
    topics: dict[str, str],
    app_id: str,
    data_dir: Path,
    **overrides: Any,
) -> dict[str, str]:
    """Settings for :class:`loopfuse.streams.local.worker_process.WorkerProcess` (LOOPFUSE_* sans prefix)."""
    settings = {
        "bootstrap_servers": bootstrap,
        "embedded_broker": str(kind == "tansu").lower(),
        "app_id": app_id,
        "store": "memory://",
        "data_dir": str(data_dir),
        "config_file": str(CONFIG),
        "broker_session_timeout": "6",
        "broker_heartbeat_interval": "1",
        "commit_interval": "0.5",
        **{f"topic_{name}": topic for name, topic in topics.items()},
    }
    settings.update({key: str(value) for key, value in overrides.items()})
    return settings


def topic_of(topics: dict[str, str], event: dict[str, Any]) -> str:
    kind = event.get("type")
    if kind == "tool_call":
        return topics["tool_calls"]
    if kind == "tool_result":
        return topics["tool_results"]
    return topics["compactions"]  # compaction and run_ended


def encode(topics: dict[str, str], events: Iterable[dict[str, Any]]) -> list[Message]:
    return [(topic_of(topics, e), e["session_key"].encode(), orjson.dumps(e)) for e in events]


def http_get(port: int, path: str, timeout: float = 3.0) -> tuple[int, str]:
    """(status, body) of a worker web page; (0, error) when nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as resp:
            return resp.status, resp.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")
    except OSError as exc:
        return 0, repr(exc)


def rss_kb(pid: int) -> int:
    """VmRSS of a process in kB (0 when it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def tree_rss_kb(pid: int) -> int:
    """RSS of a process plus its direct children (the worker has none today)."""
    total = rss_kb(pid)
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        children = []
    return total + sum(rss_kb(int(c)) for c in children)


# -- event generation -------------------------------------------------------------------

KINDS = ("healthy", "generic_repeat", "polling", "ping_pong", "unknown_tool", "compaction_loop")


def _session_events(
    rng: random.Random, key: str, kind: str, budget: int, agent: str | None
) -> list[dict[str, Any]]:
    """``budget`` events of one session (seq 0..budget-1), in a few runs."""
    events: list[dict[str, Any]] = []
    run_no = 0
    step = 0
    run_left = rng.randint(15, 60)

    def add(event: dict[str, Any]) -> None:
        seq = len(events)
        event.update(
            session_key=key,
            run_id=f"run-{run_no}",
            seq=seq,
            event_id=f"{key}#{seq}",
        )
        if agent is not None:
            event["agent_id"] = agent
        events.append(event)

    while len(events) < budget:
        if run_left <= 0 and budget - len(events) > 4:
            add({"type": "run_ended"})
            run_no += 1
            run_left = rng.randint(15, 60)
            continue
        tool, args, outcome = _step(rng, kind, step)
        if (kind == "compaction_loop" and step % 7 == 0) or rng.random() < 0.02:
            add({"type": "compaction", "reason": rng.choice(["context_overflow", "timeout"])})
            if len(events) >= budget:
                break
        call_id = f"c{step}"
        add({"type": "tool_call", "call_id": call_id, "tool_name": tool, "args": args})
        if len(events) < budget:
            add(
                {"type": "tool_result", "call_id": call_id, "tool_name": tool, "args": args}
                | outcome
            )
        step += 1
        run_left -= 2
    return events[:budget]


def _step(rng: random.Random, kind: str, step: int) -> tuple[str, Any, dict[str, Any]]:
    healthy = rng.random() < 0.15  # loopers do something else now and then
    if kind == "healthy" or healthy:
        n = rng.randrange(10**6)
        return "read", {"path": f"/src/f{n}.py"}, {"result": {"content": f"line {n}"}}
    if kind == "generic_repeat":
        return "exec", {"command": "npm test"}, {"result": {"content": "1 failing"}}
    if kind == "polling":
        return (
            "process",
            {"action": "poll", "sessionId": "build-7"},
            {"result": {"content": "still running", "details": {"status": "running"}}},
        )
    if kind == "ping_pong":
        if step % 2:
            return "read", {"path": "/a.txt"}, {"result": {"content": "A"}}
        return "read", {"path": "/b.txt"}, {"result": {"content": "B"}}
    if kind == "unknown_tool":
        return (
            "browserz",
            {"url": "https://example.com"},
            {"error": "Tool browserz not found", "unknown_tool": "browserz"},
        )
    # compaction_loop: the same failing command around compactions
    return "exec", {"command": "make"}, {"result": {"content": "error: 1"}}


def generate(
    n_events: int, n_sessions: int, seed: int = 1, prefix: str = "s"
) -> list[dict[str, Any]]:
    """``n_events`` events over ``n_sessions`` sessions of mixed kinds, randomly
    interleaved (each session's events stay in seq order), ts 10 ms apart."""
    rng = random.Random(seed)
    base, extra = divmod(n_events, n_sessions)
    sessions: list[list[dict[str, Any]]] = []
    for i in range(n_sessions):
        budget = base + (1 if i < extra else 0)
        kind = KINDS[i % len(KINDS)]
        agent = rng.choice([None, "main", "safe-runner"])
        sessions.append(_session_events(rng, f"{prefix}{i}-{kind}", kind, budget, agent))
    order = [i for i, s in enumerate(sessions) for _ in s]
    rng.shuffle(order)
    cursors = [0] * n_sessions
    out: list[dict[str, Any]] = []
    for i in order:
        event = sessions[i][cursors[i]]
        cursors[i] += 1
        event["ts"] = BASE_TS + 10 * len(out)
        out.append(event)
    return out


# -- expected outputs -------------------------------------------------------------------


def without_clock(verdict: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in verdict.items() if k != "decided_ts"}


def expected_verdicts(
    events: Sequence[dict[str, Any]], config: Path = CONFIG
) -> list[dict[str, Any]]:
    parsed = [validate_event(e) for e in events]
    outputs = Engine(load_config(config)).replay(parsed)
    return [without_clock(orjson.loads(o.to_json())) for o in outputs if isinstance(o, Verdict)]


def verdict_key(verdict: dict[str, Any]) -> tuple[str, int | None, str | None, str, bool]:
    """One verdict per tool_call (its seq) plus aborts: the post-compaction guard's (the
    result's seq), or a run ended by rule (the call's seq, beside the call's block)."""
    return (
        verdict["session_key"],
        verdict["seq"],
        verdict["call_id"],
        verdict["type"],
        verdict["action"] == "abort",
    )


@dataclass
class Comparison:
    expected: int
    delivered: int
    missing: int
    wrong: int
    duplicates: int
    examples: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.missing == 0 and self.wrong == 0

    def line(self, name: str) -> str:
        return (
            f"{name}: expected={self.expected} delivered={self.delivered} "
            f"missing={self.missing} wrong={self.wrong} duplicates={self.duplicates}"
        )


def compare(expected: Sequence[dict[str, Any]], delivered: Sequence[dict[str, Any]]) -> Comparison:
    """Each expected verdict delivered, equal to the engine's (all fields but decided_ts:
    action, level, detector, count, message, args_hash, verdict_id, ...). A duplicate
    is fine only with the same verdict_id and identical content; anything else that
    is not expected (or differs) is wrong."""
    want = {verdict_key(v): v for v in expected}
    assert len(want) == len(expected), "verdict keys are not unique"
    seen: dict[tuple[Any, ...], dict[str, Any]] = {}
    wrong = duplicates = 0
    examples: list[str] = []
    for raw in delivered:
        got = without_clock(raw)
        key = verdict_key(got)
        if key in seen:
            duplicates += 1
            if seen[key] != got:
                wrong += 1
                examples.append(f"duplicate differs: {seen[key]} vs {got}")
            continue
        seen[key] = got
        if want.get(key) != got:
            wrong += 1
            diff = {
                k: (want.get(key, {}).get(k), got.get(k))
                for k in set(got) | set(want.get(key, {}))
                if want.get(key, {}).get(k) != got.get(k)
            }
            examples.append(f"{key}: (expected, got) {diff}")
    missing = sum(1 for key in want if key not in seen)
    missing_keys = [key for key in want if key not in seen][:5]
    if missing_keys:
        examples.append(f"missing e.g. {missing_keys}")
    return Comparison(len(expected), len(delivered), missing, wrong, duplicates, examples[:10])


# -- Kafka clients ----------------------------------------------------------------------


async def produce(
    bootstrap: str, messages: Iterable[Message], *, max_request_size: int = 1_048_576
) -> None:
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, linger_ms=5, max_request_size=max_request_size
    )
    await producer.start()
    try:
        futures = [await producer.send(topic, value, key=key) for topic, key, value in messages]
        await producer.flush()
        for future in futures:
            await future  # raises if the broker did not take it
    finally:
        await producer.stop()


async def produce_paced(
    bootstrap: str,
    messages: Sequence[Message],
    rate: float,
    *,
    progress: Callable[[int], None] | None = None,
    acks_all: bool = False,
) -> None:
    """Produce at a steady ``rate`` messages/s (ticks of 50 ms), flushing each tick.

    ``acks_all``: as loopfuse's gateway client produces on Kafka (``acks=all``,
    idempotent), so that a partition leader's crash loses or doubles no input: on a
    cluster, what is lost must be the worker's doing, not the producer's."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        linger_ms=2,
        **({"acks": "all", "enable_idempotence": True} if acks_all else {}),
    )
    await producer.start()
    try:
        start = time.monotonic()
        sent = 0
        while sent < len(messages):
            due = min(len(messages), int((time.monotonic() - start) * rate) + 1)
            futures = [
                await producer.send(topic, value, key=key)
                for topic, key, value in messages[sent:due]
            ]
            sent = max(sent, due)
            await producer.flush()
            for future in futures:
                await future  # raises if the broker did not take it
            if progress is not None:
                progress(sent)
            await asyncio.sleep(0.05)
    finally:
        await producer.stop()


class Collector:
    """Reads topics from the beginning in the background; decoded JSON in ``records``."""

    def __init__(self, bootstrap: str, topics: list[str]) -> None:
        self.bootstrap = bootstrap
        self.topics = topics
        self.consumer: AIOKafkaConsumer | None = None
        self.records: list[tuple[str, bytes | None, dict[str, Any]]] = []
        #: records read so far per (topic, partition): fault tests time each partition
        self.per_partition: Counter[tuple[str, int]] = Counter()
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Collector:
        self.consumer = AIOKafkaConsumer(
            *self.topics,
            bootstrap_servers=self.bootstrap,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=20,
            enable_auto_commit=False,
            max_partition_fetch_bytes=4 * 1024 * 1024,
            fetch_max_bytes=16 * 1024 * 1024,
        )
        await self.consumer.start()
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None and self.consumer is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        await self.consumer.stop()

    async def _run(self) -> None:
        assert self.consumer is not None
        while True:
            batches = await self.consumer.getmany(timeout_ms=100)
            for tp, records in batches.items():
                self.records.extend((tp.topic, r.key, orjson.loads(r.value)) for r in records)
                self.per_partition[(tp.topic, tp.partition)] += len(records)

    def of(self, topic: str) -> list[dict[str, Any]]:
        return [value for t, _, value in self.records if t == topic]

    async def read_to_end(self, timeout: float = 30.0) -> None:
        """Wait until every record now on the topics has been read into ``records``."""
        assert self.consumer is not None
        await consumed_to_end(self.consumer, timeout)

    async def wait_for(self, what: str, done: Callable[[], bool], timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
            await asyncio.sleep(0.1)


async def end_offsets(
    consumer: AIOKafkaConsumer, tps: Sequence[TopicPartition]
) -> dict[TopicPartition, int]:
    """End offsets: ``ListOffsets(latest)`` on Apache Kafka; on the embedded broker,
    whose answer is wrong after multi-record batches, the high watermarks of a Fetch
    answer (see loopfuse.streams.worker.faust_compat.embedded_recovery)."""
    if embedded_in_use():
        from loopfuse.streams.end_offsets import fetch_end_offsets

        return await fetch_end_offsets(consumer, tps)
    ends: dict[TopicPartition, int] = await consumer.end_offsets(list(tps))
    return ends


async def consumed_to_end(consumer: AIOKafkaConsumer, timeout: float = 30.0) -> None:
    """Wait until ``consumer`` (reading in a task of its own) has read every record now
    on its assigned partitions: its positions reach the end offsets taken at the call."""
    deadline = time.monotonic() + timeout
    while not consumer.assignment():
        if time.monotonic() > deadline:
            raise AssertionError(f"no partitions assigned of {consumer.subscription()}")
        await asyncio.sleep(0.05)
    tps = list(consumer.assignment())
    ends = await end_offsets(consumer, tps)
    for tp in tps:
        while await consumer.position(tp) < ends[tp]:
            if time.monotonic() > deadline:
                raise AssertionError(f"{tp} not read to its end ({ends[tp]})")
            await asyncio.sleep(0.05)


async def read_all(
    bootstrap: str, topic: str, partitions: int, timeout: float = 60.0
) -> list[tuple[int, int, bytes | None, bytes | None]]:
    """Every record of ``topic`` now: (partition, offset, key, value), read until each
    partition's position reaches the end offset it had when the reading started."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, fetch_max_wait_ms=20
    )
    await consumer.start()
    out: list[tuple[int, int, bytes | None, bytes | None]] = []
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await end_offsets(consumer, tps)
        deadline = time.monotonic() + timeout
        behind = [tp for tp in tps if ends[tp] > 0]
        while behind:
            if time.monotonic() > deadline:
                raise AssertionError(f"{topic} not read to its ends {ends}")
            batches = await consumer.getmany(*behind, timeout_ms=100)
            for tp, records in batches.items():
                out.extend((tp.partition, r.offset, r.key, r.value) for r in records)
            behind = [tp for tp in behind if await consumer.position(tp) < ends[tp]]
    finally:
        await consumer.stop()
    return out


INPUT_ROLES = ("tool_calls", "tool_results", "compactions")


def input_partitions(settings: dict[str, str]) -> list[TopicPartition]:
    """Every partition of a worker's input topics (``partitions`` each, default 4)."""
    parts = int(settings.get("partitions", "4"))
    return [
        TopicPartition(settings[f"topic_{role}"], p) for role in INPUT_ROLES for p in range(parts)
    ]


async def committed_lag(
    bootstrap: str, group: str, tps: Sequence[TopicPartition]
) -> dict[TopicPartition, int]:
    """Per topic-partition: its end offset minus ``group``'s committed offset."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        ends = await end_offsets(consumer, tps)
    finally:
        await consumer.stop()
    committed = await committed_offsets(bootstrap, group, tps)
    return {tp: end - committed[tp] for tp, end in ends.items()}


async def committed_offsets(
    bootstrap: str, group: str, tps: Sequence[TopicPartition]
) -> dict[TopicPartition, int]:
    """``group``'s committed offset of each of ``tps`` (0 where it has none)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        # Without explicit partitions Tansu's answer fails to decode (architecture.md).
        committed = await admin.list_consumer_group_offsets(group, partitions=list(tps))
    finally:
        await admin.close()
    # No entry, or -1: nothing committed yet, which means offset 0.
    return {tp: max(committed[tp].offset, 0) if tp in committed else 0 for tp in tps}


async def input_lag(bootstrap: str, settings: dict[str, str]) -> dict[TopicPartition, int]:
    """Per input topic-partition of a worker: records on the broker not yet committed
    by the worker's group."""
    return await committed_lag(bootstrap, settings["app_id"], input_partitions(settings))


async def wait_committed(
    bootstrap: str,
    group: str,
    tps: Sequence[TopicPartition],
    timeout: float = 120.0,
    what: str = "input",
) -> None:
    """Until ``group``'s committed offsets reach the end offsets of ``tps``."""
    deadline = time.monotonic() + timeout
    while any((lag := await committed_lag(bootstrap, group, tps)).values()):
        if time.monotonic() > deadline:
            behind = {f"{tp.topic}[{tp.partition}]": n for tp, n in lag.items() if n}
            raise AssertionError(f"{what} not committed to its end in {timeout:.0f} s: {behind}")
        await asyncio.sleep(0.2)


async def worker_committed(
    bootstrap: str, settings: dict[str, str], timeout: float = 120.0
) -> None:
    """Until the worker's group has committed every input record now on the broker: each
    one judged, and its outputs and table writes acknowledged (a commit follows them)."""
    await wait_committed(bootstrap, settings["app_id"], input_partitions(settings), timeout)


def live_keys(records: Iterable[tuple[int, int, bytes | None, bytes | None]]) -> set[bytes]:
    """Compaction-aware: the last value per key wins, a tombstone removes the key."""
    live: dict[bytes, bool] = {}
    for _, _, key, value in sorted(records, key=lambda r: (r[0], r[1])):
        if key is not None:
            live[key] = value is not None
    return {k for k, alive in live.items() if alive}


async def settle(
    out: Collector, bootstrap: str, settings: dict[str, str], timeout: float = 120.0
) -> None:
    """Wait until nothing more can arrive: every input record judged and committed by
    the worker's group (its outputs are flushed before a commit), then every output
    record read. Instead of sleeping and assuming nothing more will come."""
    deadline = time.monotonic() + timeout
    await worker_committed(bootstrap, settings, timeout)
    await out.read_to_end(max(5.0, deadline - time.monotonic()))
