"""The stream worker end to end: a real broker, the worker in a subprocess, aiokafka clients.

Each test uses its own topics and consumer group, so tests share the session broker
without seeing each other. Expected verdicts come from ``Engine.replay`` offline:
the worker must publish exactly what the engine decides, crash or no crash.
"""

from __future__ import annotations

import itertools
import signal
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from loopfuse.schemas import load_config, validate_event
from loopfuse.streams.engine import Engine, state_codec
from loopfuse.streams.engine.native import NATIVE
from loopfuse.streams.local.worker_process import WorkerProcess
from tests.support.harness import (
    CONFIG,
    ROOT,
    Collector,
    encode,
    expected_verdicts,
    new_topics,
    produce,
    read_all,
    settle,
    unique,
    without_clock,
    worker_committed,
    worker_settings,
)

pytestmark = pytest.mark.timeout(120)

FIXTURES = ROOT / "tests" / "fixtures"
POLL_MESSAGE = (
    "CRITICAL: Called process with identical arguments and no progress 5 times. "
    "This appears to be a stuck polling loop. Session execution blocked to prevent "
    "resource waste."
)


class Worker(WorkerProcess):
    """A worker on topics and a consumer group of its own, so tests share the session
    broker safely; ``settings`` are what settle() and worker_committed() read."""

    def __init__(self, bootstrap: str, kind: str, tmp: Path, **overrides: Any) -> None:
        self.topics = new_topics()
        self.settings = worker_settings(
            bootstrap, kind, self.topics, unique("loopfuse-test"), tmp / "data", **overrides
        )
        super().__init__(self.settings, log_path=tmp / f"{self.settings['app_id']}.log")

    def get(self, path: str) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.web_port}{path}", timeout=5) as resp:
            return str(resp.read().decode())


@pytest.fixture
def worker_factory(kafka_bootstrap: str, kafka_broker_kind: str, tmp_path: Path) -> Iterator[Any]:
    workers: list[Worker] = []

    def make(**overrides: Any) -> Worker:
        worker = Worker(kafka_bootstrap, kafka_broker_kind, tmp_path, **overrides)
        workers.append(worker)
        return worker

    yield make
    for worker in workers:
        worker.stop()


# -- clients --------------------------------------------------------------------------


def lines(name: str) -> list[dict[str, Any]]:
    text = (FIXTURES / name).read_text()
    return [orjson.loads(line) for line in text.splitlines() if line.strip()]


def healthy_session(key: str, n: int) -> list[dict[str, Any]]:
    """An agent reading different files and getting different content: no loop."""
    events: list[dict[str, Any]] = []
    for i in range(n):
        common = {
            "session_key": key,
            "run_id": "run-1",
            "call_id": f"h{i}",
            "tool_name": "read",
            "args": {"path": f"/src/file{i}.py"},
            "ts": 1_780_000_000_000 + i,
        }
        events.append({**common, "type": "tool_call", "event_id": f"{key}-c{i}", "seq": 2 * i})
        events.append(
            {
                **common,
                "type": "tool_result",
                "event_id": f"{key}-r{i}",
                "seq": 2 * i + 1,
                "result": {"content": f"line {i}"},
            }
        )
    return events


# -- tests ----------------------------------------------------------------------------


async def test_verdicts_loop_events_and_dead_letters(
    worker_factory: Any, kafka_bootstrap: str
) -> None:
    worker = worker_factory()
    worker.start()
    worker.wait_ready()
    # the start-up log names the engine that judges (the native judge where it is built)
    judged_by = "the native judge" if NATIVE is not None else "the Python engine"
    assert f"sessions are judged by {judged_by}" in worker.tail(100_000), worker.tail()
    t = worker.topics
    looping = lines("polling_loop.jsonl")
    healthy = healthy_session("agent:docs:main", 4)
    # Any event type on any input topic is routed by its "type": send the healthy
    # session's results to the tool-calls topic.
    healthy_msgs = [(t["tool_calls"], b"agent:docs:main", orjson.dumps(e)) for e in healthy]
    garbage: list[tuple[str, bytes | None, bytes | None]] = [
        (t["tool_calls"], b"bad", b"{not json"),
        (t["tool_results"], b"bad", orjson.dumps({"type": "tool_call", "event_id": 7})),
        (t["compactions"], None, b""),
        (t["compactions"], b"tombstone", None),
        (t["tool_calls"], b"bad", orjson.dumps({"type": "tool_dance", "event_id": "x"})),
        (t["tool_calls"], None, orjson.dumps(looping[0] | {"event_id": "unkeyed"})),
    ]
    after = {
        "type": "tool_call",
        "event_id": "after-garbage",
        "session_key": "bad",
        "call_id": "c1",
        "tool_name": "exec",
        "args": {"cmd": "ls"},
        "ts": 1,
    }
    async with Collector(
        kafka_bootstrap, [t["verdicts"], t["loop_events"], t["dead_letters"]]
    ) as out:
        await produce(kafka_bootstrap, encode(worker.topics, looping) + healthy_msgs + garbage)
        await produce(kafka_bootstrap, [(t["tool_calls"], b"bad", orjson.dumps(after))])
        want = len(expected_verdicts(looping)) + len(expected_verdicts(healthy)) + 1
        await out.wait_for("verdicts", lambda: len(out.of(t["verdicts"])) >= want)
        await out.wait_for("dead letters", lambda: len(out.of(t["dead_letters"])) >= len(garbage))
        await out.wait_for("a loop event", lambda: out.of(t["loop_events"]))
        await settle(out, kafka_bootstrap, worker.settings)  # exactly these, nothing more
        metrics = worker.get("/metrics")

    by_session: dict[str, list[dict[str, Any]]] = {}
    for v in out.of(t["verdicts"]):
        by_session.setdefault(v["session_key"], []).append(without_clock(v))
    assert by_session["agent:ops:main"] == expected_verdicts(looping)
    block = by_session["agent:ops:main"][-1]
    assert (block["action"], block["detector"], block["count"], block["message"]) == (
        "block",
        "known_poll_no_progress",
        5,
        POLL_MESSAGE,
    )
    assert [v["action"] for v in by_session["agent:docs:main"]] == ["allow"] * 4
    assert [v["call_id"] for v in by_session["bad"]] == ["c1"]  # judged after the garbage

    (loop_event,) = out.of(t["loop_events"])
    assert (loop_event["detector"], loop_event["action"], loop_event["message"]) == (
        "known_poll_no_progress",
        "block",
        POLL_MESSAGE,
    )
    letters = sorted(out.of(t["dead_letters"]), key=lambda d: (d["source_topic"], d["offset"]))
    codes = {(d["source_topic"], d["error_code"]) for d in letters}
    assert codes == {
        (t["tool_calls"], "invalid_json"),
        (t["tool_results"], "invalid_event"),
        (t["compactions"], "empty_message"),
        (t["tool_calls"], "unknown_type"),
        (t["tool_calls"], "invalid_event"),
    }
    assert len(letters) == len(garbage)
    assert all(
        d["reason"] and d["partition"] is not None and d["offset"] is not None for d in letters
    )
    (bad_json,) = [d for d in letters if d["error_code"] == "invalid_json"]
    assert bad_json["original"] == "{not json"
    (unkeyed,) = [d for d in letters if d["original"] and "unkeyed" in d["original"]]
    assert "message key null is not the event's session key" in unkeyed["reason"]

    assert (
        'loopfuse_verdicts_total{action="block",detector="known_poll_no_progress"} 1.0' in metrics
    )
    assert 'loopfuse_dead_letters_total{reason="invalid_json"} 1.0' in metrics
    assert "agent:ops:main" not in metrics  # no session ids as labels
    assert f'loopfuse_consumer_lag{{partition="0",topic="{t["tool_calls"]}"}} 0.0' in metrics

    # Only what operators need is served: no table contents, no cluster layout.
    assert worker.get("/livez") == '{"live":true}'
    for path in ("/table/sessions/", "/router/", "/", "/stats/", "/graph/"):
        with pytest.raises(urllib.error.HTTPError) as missing:
            worker.get(path)
        assert missing.value.code == 404, path

    partitions = await partition_counts(kafka_bootstrap, list(t.values()))
    assert set(partitions.values()) == {4}, partitions


async def test_restart_after_sigkill_gives_the_verdicts_of_an_uninterrupted_run(
    worker_factory: Any, kafka_bootstrap: str
) -> None:
    worker = worker_factory(commit_interval=0.5)
    sessions = [
        [
            e | {"session_key": f"loop-{n}", "event_id": f"{n}-{e['event_id']}"}
            for e in lines("polling_loop.jsonl")
        ]
        for n in range(6)
    ]
    # Interleave the sessions, then cut the stream in three: before the crash,
    # around it, after the restart.
    events = [e for group in zip(*sessions, strict=True) for e in group]
    first, second, third = events[:24], events[24:48], events[48:]
    expected = expected_verdicts(events)
    t = worker.topics

    worker.start()
    worker.wait_ready()
    async with Collector(kafka_bootstrap, [t["verdicts"]]) as out:
        await produce(kafka_bootstrap, encode(worker.topics, first))
        await out.wait_for("first verdicts", lambda: len(out.of(t["verdicts"])) >= 12)
        # Committed: after the kill, these sessions' state must come from the changelog.
        await worker_committed(kafka_bootstrap, worker.settings)
        await produce(kafka_bootstrap, encode(worker.topics, second))
        await out.wait_for("some later verdict", lambda: len(out.of(t["verdicts"])) > 12)
        assert worker.send(signal.SIGKILL) == -signal.SIGKILL

        worker.start()
        worker.wait_ready()
        await produce(kafka_bootstrap, encode(worker.topics, third))
        distinct = lambda: {v["verdict_id"] for v in out.of(t["verdicts"])}  # noqa: E731
        await out.wait_for("all verdicts", lambda: len(distinct()) >= len(expected))
        await settle(out, kafka_bootstrap, worker.settings)  # anything extra (a wrong verdict)

    got: dict[str, dict[str, Any]] = {}
    for verdict in out.of(t["verdicts"]):
        # Redelivery after the crash re-emits the same verdict (same id, same content).
        previous = got.setdefault(verdict["verdict_id"], without_clock(verdict))
        assert previous == without_clock(verdict)
    assert sorted(got.values(), key=order) == sorted(expected, key=order)
    assert worker.send(signal.SIGTERM) == 0  # clean shutdown


@pytest.mark.parametrize("store", ["memory://", "rocksdb://"])
async def test_a_restart_onto_a_written_changelog_restores_every_session(
    worker_factory: Any, kafka_bootstrap: str, store: str
) -> None:
    """Recovery at fetch speed (faust_compat.recovery.ChangelogRestore) restores each
    session: 300 sessions whose history only the changelog holds (written there, as
    the worker writes it) are each judged on their next call as an uninterrupted run
    judges it - a looping history gets its warning or block."""
    worker = worker_factory(store=store)
    t = worker.topics
    engine = Engine(load_config(CONFIG))
    history: dict[str, list[dict[str, Any]]] = {}
    probes: list[dict[str, Any]] = []
    for n in range(300):
        key = f"restored-{n}"
        events = [
            e | {"session_key": key, "event_id": f"{n}-{e['event_id']}"}
            for e in lines("polling_loop.jsonl")
        ]
        calls = [i for i, e in enumerate(events) if e["type"] == "tool_call"]
        cut = calls[3 + n % (len(calls) - 3)]  # 3 or more calls of history
        history[key], probes = events[:cut], [*probes, events[cut]]
    changelog = []
    for key, events in history.items():
        state = None
        for event in events:
            parsed = validate_event(event)
            state, _ = engine.step(state, parsed, parsed.ts)
        assert state is not None
        changelog.append(
            (
                f"{worker.env['LOOPFUSE_APP_ID']}-sessions-changelog",
                key.encode(),
                state_codec.encode(state),
            )
        )

    worker.start()
    worker.wait_ready()  # creates the changelog topic
    assert worker.send(signal.SIGTERM) == 0
    await produce(kafka_bootstrap, changelog)  # the producer partitions keys as the table
    worker.start()
    worker.wait_ready()  # recovered
    async with Collector(kafka_bootstrap, [t["verdicts"]]) as out:
        await produce(kafka_bootstrap, encode(worker.topics, probes))
        await out.wait_for("a verdict per probe", lambda: len(out.of(t["verdicts"])) >= 300)
        await settle(out, kafka_bootstrap, worker.settings)  # anything extra (a wrong verdict)
    expected = {
        key: expected_verdicts([*events, probe])[-1]
        for (key, events), probe in zip(history.items(), probes, strict=True)
    }
    got = {v["session_key"]: without_clock(v) for v in out.of(t["verdicts"])}
    assert got == expected
    # Without its history each probe would be allowed: every one is warned or blocked.
    assert {v["action"] for v in got.values()} == {"warn", "block"}


async def test_a_rocksdb_worker_keeps_the_offset_of_each_partition_s_last_changelog_write(
    worker_factory: Any, kafka_bootstrap: str, tmp_path: Path
) -> None:
    """A RocksDB store keeps, per partition, the offset of the last changelog record
    the worker wrote (faust_compat.producer.send_table_writes does what Faust's
    ``_on_changelog_sent`` did): a restart reads the changelog only from there."""
    from rocksdict import AccessType, Options, Rdict

    worker = worker_factory(store="rocksdb://")
    t = worker.topics
    events = [
        e | {"session_key": f"kept-{n}", "event_id": f"{n}-{e['event_id']}"}
        for n in range(12)
        for e in lines("polling_loop.jsonl")
    ]
    calls = sum(1 for e in events if e["type"] == "tool_call")
    worker.start()
    worker.wait_ready()
    async with Collector(kafka_bootstrap, [t["verdicts"]]) as out:
        await produce(kafka_bootstrap, encode(worker.topics, events))
        await out.wait_for("every verdict", lambda: len(out.of(t["verdicts"])) >= calls)
    assert worker.send(signal.SIGTERM) == 0  # a clean stop: every write acknowledged

    changelog = f"{worker.env['LOOPFUSE_APP_ID']}-sessions-changelog"
    written: dict[int, int] = {}
    for partition, offset, _, _ in await read_all(kafka_bootstrap, changelog, 4):
        written[partition] = max(offset, written.get(partition, -1))
    assert len(written) > 1  # the sessions spread over partitions
    kept: dict[int, int] = {}
    for path in (tmp_path / "data").rglob("sessions-*.db"):
        db = Rdict(str(path), options=Options(raw_mode=True), access_type=AccessType.read_only())
        try:
            offset = db.get(b"__faust\0offset__")
        finally:
            db.close()
        if offset is not None:
            kept[int(path.name.removesuffix(".db").rsplit("-", 1)[1])] = int(offset)
    assert kept == written


async def test_a_backlog_writes_each_session_s_state_per_checkpoint_and_a_restart_goes_on(
    worker_factory: Any, kafka_bootstrap: str
) -> None:
    """With input waiting, a session's state is written at a checkpoint
    (LOOPFUSE_CHECKPOINT_INTERVAL), not after each batch it appears in: 100
    sessions' interleaved backlog, judged ten events a batch, writes a record or two
    per session where a write per batch would be one per event. The last record of
    each session is the state an uninterrupted run reaches: a worker restarted on
    the changelog judges each session's next call as that run does."""
    worker = worker_factory(batch_max=10, checkpoint_interval=60)
    t = worker.topics
    history: dict[str, list[dict[str, Any]]] = {}
    probes: list[dict[str, Any]] = []
    for n in range(100):
        key = f"backlog-{n}"
        events = [
            e | {"session_key": key, "event_id": f"{n}-{e['event_id']}"}
            for e in lines("polling_loop.jsonl")
        ]
        calls = [i for i, e in enumerate(events) if e["type"] == "tool_call"]
        cut = calls[3 + n % (len(calls) - 3)]  # 3 or more calls of history
        history[key], probes = events[:cut], [*probes, events[cut]]
    backlog = [e for group in itertools.zip_longest(*history.values()) for e in group if e]
    calls = sum(1 for e in backlog if e["type"] == "tool_call")
    worker.start()
    worker.wait_ready()  # creates the topics
    assert worker.send(signal.SIGTERM) == 0
    await produce(kafka_bootstrap, encode(t, backlog))  # while no worker runs: a backlog

    worker.start()
    worker.wait_ready()
    async with Collector(kafka_bootstrap, [t["verdicts"]]) as out:
        await out.wait_for("every verdict", lambda: len(out.of(t["verdicts"])) >= calls)
    assert worker.send(signal.SIGTERM) == 0
    changelog = f"{worker.env['LOOPFUSE_APP_ID']}-sessions-changelog"
    records = await read_all(kafka_bootstrap, changelog, 4)
    assert {key for _, _, key, _ in records} == {key.encode() for key in history}
    assert len(records) <= 2 * len(history) < len(backlog) // 3, (len(records), len(backlog))

    worker.start()
    worker.wait_ready()  # recovered from those records
    async with Collector(kafka_bootstrap, [t["verdicts"]]) as out:
        await produce(kafka_bootstrap, encode(t, probes))
        await out.wait_for("a verdict per probe", lambda: len(out.of(t["verdicts"])) >= 100)
        await settle(out, kafka_bootstrap, worker.settings)  # anything extra (a wrong verdict)
    expected = {
        key: expected_verdicts([*events, probe])[-1]
        for (key, events), probe in zip(history.items(), probes, strict=True)
    }
    got = {v["session_key"]: without_clock(v) for v in out.of(t["verdicts"])}
    assert got == expected
    assert {v["action"] for v in got.values()} == {"warn", "block"}  # from their history


def order(verdict: dict[str, Any]) -> tuple[str, int]:
    return (verdict["session_key"], verdict["seq"])


async def test_topics_created_once_and_mismatch_is_a_clear_start_up_error(
    worker_factory: Any, kafka_bootstrap: str
) -> None:
    worker = worker_factory(partitions=3)
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(worker.topics["tool_results"], 2, 1)])
    finally:
        await admin.close()

    worker.start()
    assert worker.proc is not None
    code = worker.proc.wait(60)
    message = worker.tail()
    assert code == 2, message
    assert f"topic '{worker.topics['tool_results']}' has 2 partitions, expected 3" in message
    counts = await partition_counts(kafka_bootstrap, [worker.topics["tool_calls"]])
    assert counts == {worker.topics["tool_calls"]: 3}  # the others were created right


async def partition_counts(bootstrap: str, topics: list[str]) -> dict[str, int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        described = await admin.describe_topics(topics)
    finally:
        await admin.close()
    return {d["topic"]: len(d["partitions"]) for d in described}


async def test_a_seq_gap_is_given_up_once_later_events_span_the_gap_timeout(
    worker_factory: Any, kafka_bootstrap: str
) -> None:
    worker = worker_factory(sequence_gap_timeout_seconds=1)
    worker.start()
    worker.wait_ready()
    t = worker.topics
    # seq 0 is lost on the way; seq 1 and 2 wait for it until they span 1 s of event time.
    call = {
        "type": "tool_call",
        "session_key": "gappy",
        "tool_name": "read",
        "args": {"path": "/a"},
    }
    waiting = [
        call | {"event_id": "gap-1", "seq": 1, "call_id": "c1", "ts": 1_000},
        call | {"event_id": "gap-2", "seq": 2, "call_id": "c2", "ts": 2_000},
    ]
    lost = call | {"event_id": "gap-0", "seq": 0, "call_id": "c0", "ts": 500}
    async with Collector(kafka_bootstrap, [t["verdicts"], t["loop_events"]]) as out:
        await produce(
            kafka_bootstrap, [(t["tool_calls"], b"gappy", orjson.dumps(e)) for e in waiting]
        )
        await out.wait_for("the parked calls' verdicts", lambda: len(out.of(t["verdicts"])) >= 2)
        await out.wait_for("a sequence_gap loop event", lambda: out.of(t["loop_events"]))
        await produce(kafka_bootstrap, [(t["tool_calls"], b"gappy", orjson.dumps(lost))])
        await out.wait_for("the late call's verdict", lambda: len(out.of(t["verdicts"])) >= 3)
        await settle(out, kafka_bootstrap, worker.settings)  # a second gap event would show
    assert [v["call_id"] for v in out.of(t["verdicts"])] == ["c1", "c2", "c0"]
    (gap,) = out.of(t["loop_events"])
    assert (gap["detector"], gap["count"]) == ("sequence_gap", 1)
