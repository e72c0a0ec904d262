"""The session processor driven directly: records in, messages and store writes out.

No Kafka, no Faust: a dict store, fixed offsets and an injected clock.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest

from loopfuse.schemas import parse_config
from loopfuse.streams.engine import Engine
from loopfuse.streams.worker.outgoing import Limits
from loopfuse.streams.worker.processor import (
    DictStore,
    InputRecord,
    Message,
    OutputTopics,
    SessionProcessor,
)

INPUTS = ("calls", "results", "compactions")
OUT = OutputTopics("verdicts", "loops", "dead")
NOW = 2_000_000_000_000
CONFIG = {
    "tools": {"loopDetection": {"enabled": True, "warningThreshold": 3, "criticalThreshold": 5}}
}


@dataclass
class Offsets:
    """The consumer's view: end offsets, committed offsets, fetch answer times."""

    ends: dict[tuple[str, int], int] = field(default_factory=dict)
    answered: int | None = None

    def highwater(self, topic: str, partition: int) -> int | None:
        return self.ends.get((topic, partition), 0)

    def committed(self, topic: str, partition: int) -> int | None:
        return None

    def answered_at(self, topic: str, partition: int) -> int | None:
        return self.answered


class Clock:
    def __init__(self, now: int = NOW) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def processor(engine: Engine | None = None, **kwargs: Any) -> SessionProcessor:
    offsets = kwargs.pop("offsets", Offsets())
    return SessionProcessor(
        engine or Engine(parse_config(CONFIG)),
        INPUTS,
        OUT,
        kwargs.pop("store", DictStore()),
        offsets,
        clock=kwargs.pop("clock", Clock()),
        **kwargs,
    )


class Feed:
    """Numbered input records for one topic-partition at a time."""

    def __init__(self) -> None:
        self.offsets: dict[tuple[str, int], int] = {}

    def record(
        self,
        event: dict[str, Any],
        *,
        topic: str = "calls",
        partition: int = 0,
        key: bytes | None = None,
        value: bytes | None = None,
    ) -> InputRecord:
        offset = self.offsets.get((topic, partition), 0)
        self.offsets[(topic, partition)] = offset + 1
        return InputRecord(
            topic,
            partition,
            offset,
            event["session_key"].encode() if key is None else key,
            orjson.dumps(event) if value is None else value,
        )


def calls(session: str, n: int, *, start: int = 0, ts: int = 1_000) -> list[dict[str, Any]]:
    """n identical exec calls of one session with results, seq from ``start``."""
    out = []
    for i in range(n):
        seq = start + 2 * i
        base = {
            "session_key": session,
            "run_id": "r",
            "call_id": f"c{seq}",
            "tool_name": "exec",
            "args": {"command": "make"},
            "ts": ts + seq,
        }
        out.append({**base, "type": "tool_call", "event_id": f"{session}:{seq}", "seq": seq})
        out.append(
            {
                **base,
                "type": "tool_result",
                "event_id": f"{session}:{seq + 1}",
                "seq": seq + 1,
                "result": {"content": "1 failing"},
            }
        )
    return out


def outputs(messages: list[Message], topic: str) -> list[dict[str, Any]]:
    return [orjson.loads(value) for t, _, value, _ in messages if t == topic]


def actions(messages: list[Message]) -> list[str]:
    return [v["action"] for v in outputs(messages, "verdicts")]


def test_a_session_out_of_seq_order_within_a_batch_is_judged_in_seq_order() -> None:
    feed, proc = Feed(), processor()
    events = calls("s1", 6)
    shuffled = events[1::2] + events[0::2]  # every result before every call
    messages = proc.process(
        [
            feed.record(e, topic="results" if e["type"] == "tool_result" else "calls")
            for e in shuffled
        ]
    )
    assert actions(messages) == ["allow", "allow", "allow", "warn", "warn", "block"]
    assert outputs(messages, "loops")[-1]["detector"] == "generic_repeat"
    assert not any(e["detector"] == "sequence_gap" for e in outputs(messages, "loops"))


def test_an_event_under_another_sessions_key_is_dead_lettered_and_the_rest_judged() -> None:
    feed, proc = Feed(), processor()
    events = calls("s1", 2)
    records = [feed.record(events[0], key=b"someone-else")]
    records += [feed.record(e) for e in calls("s2", 1)]
    messages = proc.process(records)
    (letter,) = outputs(messages, "dead")
    assert (
        letter["error_code"] == "invalid_event"
        and "is not the event's session key" in (letter["reason"])
    )
    assert (letter["source_topic"], letter["offset"]) == ("calls", 0)
    assert [v["session_key"] for v in outputs(messages, "verdicts")] == ["s2"]
    assert proc.store.get(b"s1") is None


class FlakyEngine:
    """The real engine, except that it fails (half-way through) on marked events.

    A wrapper, not a subclass: the processor takes the native fold for an ``Engine``
    (native_step.native_for), and a wrapper keeps its own step.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def step(
        self,
        state: Any,
        event: Any,
        now_ms: int,
        watermark_ms: int | None = None,
        fingerprints: Any = None,
    ) -> Any:
        if event.call_id == "boom":
            state, _ = self.engine.step(
                state, event, now_ms, watermark_ms, fingerprints
            )  # partly applied...
            raise RuntimeError("engine bug")  # ...then a bug
        return self.engine.step(state, event, now_ms, watermark_ms, fingerprints)


def test_an_engine_error_dead_letters_the_event_and_keeps_the_state_before_it() -> None:
    feed, proc = Feed(), processor(FlakyEngine(Engine(parse_config(CONFIG))))  # type: ignore[arg-type]
    events = calls("s1", 6)
    boom = {**events[4], "call_id": "boom", "seq": None, "event_id": "boom"}
    messages = proc.process([feed.record(e) for e in [*events[:4], boom, *events[4:]]])
    (letter,) = outputs(messages, "dead")
    assert letter["error_code"] == "engine_error" and "engine bug" in letter["reason"]
    # as if the bad event had never been sent
    clean = processor().process([Feed().record(e) for e in events])
    assert (
        actions(messages) == actions(clean) == ["allow", "allow", "allow", "warn", "warn", "block"]
    )
    # the whole state: history, seen event ids, clocks - nothing of the bad event
    assert proc.store.get(b"s1") == _state_of(processor(), events)


def _state_of(proc: SessionProcessor, events: list[dict[str, Any]]) -> bytes:
    feed = Feed()
    proc.process([feed.record(e) for e in events])
    return proc.store.get(events[0]["session_key"].encode()) or b""


def test_outputs_over_the_producer_size_are_dead_lettered_not_sent() -> None:
    feed = Feed()
    proc = processor(limits=Limits(max_output_bytes=4_096 + 1_024, max_identifier_bytes=4_096))
    big = {**calls("s1", 1)[0], "tool_name": "t" * 4_000}
    messages = proc.process([feed.record(big), *[feed.record(e) for e in calls("s2", 1)]])
    (letter,) = outputs(messages, "dead")
    assert letter["error_code"] == "output_too_large"
    assert [v["session_key"] for v in outputs(messages, "verdicts")] == ["s2"]


def test_a_foreign_write_to_the_store_invalidates_the_decoded_state() -> None:
    """Another worker (after a rebalance) wrote the session: its bytes win."""
    feed, store = Feed(), DictStore()
    proc = processor(store=store)
    proc.process([feed.record(e) for e in calls("s1", 2)])  # cached: 2 calls
    store.put(b"s1", _state_of(processor(), calls("s1", 4)), 0)  # someone else's 4 calls
    messages = proc.process([feed.record(e) for e in calls("s1", 1, start=8)])
    assert actions(messages) == ["warn"]  # the 5th call: it counts the foreign 4 calls
    proc.store.delete(b"s1", 0)  # gone (expired elsewhere): start afresh
    messages = proc.process([feed.record(e) for e in calls("s1", 1, start=0)])
    assert actions(messages) == ["allow"]


def _idle_case(event_clock_ms: int | None, wall_ms: int) -> bool:
    """Whether a session last active at NOW (ts NOW) is expired at ``wall_ms``."""
    feed = Feed()
    offsets = Offsets(answered=event_clock_ms)
    clock = Clock(NOW)
    proc = processor(offsets=offsets, clock=clock, session_ttl_ms=60_000)
    proc.process([feed.record(e) for e in calls("s1", 1, ts=NOW)])
    offsets.ends = dict(feed.offsets)  # every input judged to its end
    clock.now = wall_ms
    return proc.expire_idle([0]) == 1


def test_a_session_expires_only_when_idle_by_both_clocks() -> None:
    later = NOW + 61_000
    assert _idle_case(event_clock_ms=later, wall_ms=later)  # idle by both: gone
    assert not _idle_case(event_clock_ms=NOW + 1_000, wall_ms=later)  # input read late
    assert not _idle_case(event_clock_ms=later, wall_ms=NOW + 1_000)  # wall clock: recent
    assert not _idle_case(event_clock_ms=None, wall_ms=later)  # no fetch answer yet


def test_an_unreadable_state_is_expired_and_the_scan_goes_on() -> None:
    feed, offsets, clock = Feed(), Offsets(answered=NOW + 61_000), Clock(NOW)
    proc = processor(offsets=offsets, clock=clock, session_ttl_ms=60_000)
    proc.process([feed.record(e) for e in calls("s1", 1, ts=NOW) + calls("s2", 1, ts=NOW)])
    proc.store.put(b"s1", b"\x04\x00", 0)  # cut short: no idle stamps to read
    offsets.ends = dict(feed.offsets)
    clock.now = NOW + 61_000
    assert proc.expire_idle([0]) == 2
    assert proc.store.get(b"s1") is None and proc.store.get(b"s2") is None


def test_a_restarted_gateways_first_call_is_released_by_the_timer() -> None:
    feed, offsets = Feed(), Offsets()
    proc = processor(offsets=offsets)
    proc.process([feed.record(e) for e in calls("s1", 2)])
    restarted = {**calls("s1", 1, ts=5_000)[0], "incarnation": "gw-2", "event_id": "gw-2:0"}
    # The results topic has records the worker has not read: the call waits.
    offsets.ends = {**feed.offsets, ("results", 0): 99}
    assert actions(proc.process([feed.record(restarted)])) == []
    assert proc.waiting == {b"s1": 0}
    assert proc.release_waiting() == []  # still behind
    offsets.ends = dict(feed.offsets)  # everything read: nothing of the old gateway left
    messages = proc.release_waiting()
    assert [(v["action"], v["incarnation"]) for v in outputs(messages, "verdicts")] == [
        ("allow", "gw-2")
    ]
    assert proc.waiting == {}


def test_a_dead_letters_log_line_has_where_and_why_never_the_raw_event(
    caplog: pytest.LogCaptureFixture,
) -> None:
    feed, clock = Feed(), Clock()
    proc = processor(clock=clock)
    secret = {**calls("s1", 1)[0], "args": {"command": "deploy", "api_key": "sk-live-SECRET"}}
    with caplog.at_level(logging.WARNING, logger="loopfuse.processor"):
        proc.process([feed.record(secret, key=b"someone-else\x1b]0;owned\x07")])
    (line,) = caplog.messages
    assert line.startswith("dead letter invalid_event at calls[0]@0: message key ")
    assert "SECRET" not in line and "api_key" not in line and "deploy" not in line
    assert "\x1b" not in line and "\x07" not in line  # the key quoted in the reason, escaped


def test_a_flood_of_dead_letters_logs_a_few_lines_and_how_many_it_left_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    feed, clock = Feed(), Clock()
    proc = processor(clock=clock)
    with caplog.at_level(logging.WARNING, logger="loopfuse.processor"):
        proc.process([feed.record({}, key=b"k", value=b"not json") for _ in range(500)])
        clock.now += 1_000
        proc.release_waiting()  # the worker's timer
    assert len(outputs := [m for m in caplog.messages if m.startswith("dead letter ")]) == 10
    assert all("calls[0]@" in m for m in outputs)
    assert caplog.messages[-1] == (
        "dead letters: 490 more log lines suppressed (at most 10 a second)"
    )
