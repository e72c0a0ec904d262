"""The fleet-wide tool breaker (issue 14 item 6, docs/configuration.md: Rules) without a broker: the
overlay on verdicts, strikes, the sliding window, the breaker's own loop event and the
board every worker reads. The end-to-end test is tests/integration/test_fleet_breaker.py.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from loopfuse.schemas import ConfigError, parse_config
from loopfuse.schemas.events import LoopEvent as WireLoopEvent
from loopfuse.schemas.events import ToolStrike
from loopfuse.streams.engine import Engine
from loopfuse.streams.engine.fingerprint import hash64
from loopfuse.streams.engine.fleet import ToolBreaker, overlay, strikes
from loopfuse.streams.engine.step import verdict_id
from loopfuse.streams.ops.config_check import describe_rules
from loopfuse.streams.settings import Settings
from loopfuse.streams.worker.fleet_breaker import (
    BreakerBoard,
    FleetBreakerJudge,
    FleetWindows,
    install_fleet_breaker,
)
from loopfuse.streams.worker.processor import DictStore, InputRecord, OutputTopics, SessionProcessor
from loopfuse.streams.worker.topics import wanted_topics
from tests.unit.conftest import call, loop_events, pair, verdicts

T0 = 1_700_000_000_000
BROKEN_EXEC = {"exec": ToolBreaker("exec", 3, 60, T0, T0 + 60_000)}
WARN = (
    "WARNING: exec is failing across the fleet (3 sessions hit a loop on exec within "
    "60 s). Avoid retrying it; change approach or report the task as failed."
)
BLOCK = (
    "CRITICAL: exec is failing across the fleet (3 sessions hit a loop on exec within "
    "60 s). Calls to it are blocked fleet-wide until the failures stop: do not retry "
    "it; change approach or report the task as failed."
)


def engine(
    breaker: dict[str, Any] | None = None,
    *,
    enforce: bool = True,
    tools: dict[str, Any] | None = None,
    agents: list[dict[str, Any]] | None = None,
) -> Engine:
    rules: dict[str, Any] = {
        "fleetBreaker": {"sessions": 3, "windowSeconds": 60, **(breaker or {})}
    }
    if tools is not None:
        rules["tools"] = tools
    document: dict[str, Any] = {
        "tools": {
            "loopDetection": {"enabled": True, "warningThreshold": 3, "criticalThreshold": 5}
        },
        "loopfuse": {"enforce": enforce, "rules": rules},
    }
    if agents is not None:
        document["agents"] = {"list": agents}
    return Engine(parse_config(document))


def stuck_exec(times: int) -> list[Any]:
    """``times`` identical exec calls with identical results."""
    return [event for _ in range(times) for event in pair("exec", {"cmd": "make"}, ts=T0)]


def judged(engine: Engine, events: list[Any], breakers: dict[str, ToolBreaker]) -> list[Any]:
    """The verdicts of ``events`` (one session) with ``breakers`` overlaid."""
    state, out = None, []
    for event in events:
        state, outputs = engine.step(state, event, event.ts)
        out += overlay(engine.rules, outputs, breakers)
    return verdicts(out)


# -- config ---------------------------------------------------------------------------


def test_the_breaker_is_validated_strictly_and_resolved_with_defaults() -> None:
    with pytest.raises(ConfigError, match=r"loopfuse\.rules\.fleetBreaker\.sessions"):
        parse_config({"loopfuse": {"rules": {"fleetBreaker": {"sessions": 1}}}})
    with pytest.raises(ConfigError, match=r"fleetBreaker\.action"):
        parse_config({"loopfuse": {"rules": {"fleetBreaker": {"action": "abort"}}}})
    rule = Engine(parse_config({"loopfuse": {"rules": {"fleetBreaker": {}}}})).rules.resolver
    assert rule.fleet_breaker is not None
    assert (
        rule.fleet_breaker.sessions,
        rule.fleet_breaker.window_seconds,
        rule.fleet_breaker.action,
        rule.fleet_breaker.enforced,
    ) == (20, 300, "warn", True)
    assert Engine(parse_config({})).rules.resolver.fleet_breaker is None
    shown = describe_rules(engine({"action": "block"}).rules.resolve(None))
    assert shown == ["fleetBreaker: enforced (action=block, sessions=3, windowSeconds=60)"]


# -- the overlay on a session's verdicts -----------------------------------------------


def test_a_call_to_a_broken_tool_is_warned_with_the_breakers_message() -> None:
    the_call = call("exec", {"cmd": "make"}, ts=T0 + 1_000)
    [verdict] = judged(engine(), [the_call], BROKEN_EXEC)
    assert (verdict.action, verdict.level, verdict.detector, verdict.count) == (
        "warn",
        "warning",
        "fleet_tool_breaker",
        3,
    )
    assert verdict.message == WARN
    assert verdict.verdict_id == verdict_id("s1", "r1", the_call.call_id, "warn")


def test_a_block_breaker_blocks_a_call_the_session_only_warned() -> None:
    events = [*stuck_exec(3), call("exec", {"cmd": "make"}, ts=T0)]  # the 4th call: warned
    own = judged(engine(), events, {})
    assert [(v.action, v.detector) for v in own] == [
        ("allow", None),
        ("allow", None),
        ("allow", None),
        ("warn", "generic_repeat"),
    ]
    broken = judged(engine({"action": "block"}), events, BROKEN_EXEC)
    assert [(v.action, v.detector, v.message) for v in broken] == [
        ("block", "fleet_tool_breaker", BLOCK)
    ] * 4


def test_a_warn_breaker_keeps_the_sessions_own_warning_and_block() -> None:
    events = [*stuck_exec(5), call("exec", {"cmd": "make"}, ts=T0)]
    assert [(v.action, v.detector) for v in judged(engine(), events, BROKEN_EXEC)] == [
        ("warn", "fleet_tool_breaker")
    ] * 3 + [("warn", "generic_repeat"), ("warn", "generic_repeat"), ("block", "generic_repeat")]


def test_another_tool_expiry_shadow_opt_out_and_exemption_leave_verdicts_alone() -> None:
    def action(eng: Engine, tool: str = "exec", ts: int = T0, agent: str | None = None) -> str:
        return judged(eng, [call(tool, ts=ts, agent=agent)], BROKEN_EXEC)[0].action

    assert action(engine()) == "warn"
    assert action(engine(), tool="read") == "allow"
    assert action(engine(), ts=T0 + 60_000) == "allow"  # event time from until_ts on
    assert action(engine(), ts=T0 - 5_000) == "warn"  # a call a little before the trip
    assert action(engine({"shadow": True})) == "allow"
    assert action(engine(enforce=False)) == "allow"
    assert action(engine(tools={"exec": {"exempt": True}})) == "allow"
    opted_out = engine(
        agents=[{"id": "ops", "loopfuse": {"rules": {"fleetBreaker": {"enabled": False}}}}]
    )
    assert action(opted_out, agent="ops") == "allow"
    assert action(opted_out, agent="other") == "warn"


def test_without_breakers_the_outputs_are_the_very_same() -> None:
    outputs: list[Any] = []
    assert overlay(engine().rules, outputs, {}) is outputs


def test_without_a_fleet_breaker_no_topic_agent_or_reader_is_added() -> None:
    settings = Settings()
    assert not set(settings.fleet_topics) & set(wanted_topics(settings, fleet_breaker=False))
    assert set(settings.fleet_topics) <= set(wanted_topics(settings, fleet_breaker=True))
    app: Any = object()  # never touched: nothing is installed
    assert install_fleet_breaker(app, settings, Engine(parse_config({}))) is None


# -- strikes ----------------------------------------------------------------------------


def test_criticals_unknown_tool_streaks_and_failure_identities_strike_their_tool() -> None:
    eng = engine()
    state, out = None, []
    for event in [*stuck_exec(5), call("exec", {"cmd": "make"}, ts=T0)]:
        state, outputs = eng.step(state, event, T0)
        out += outputs
    [critical] = loop_events(out)
    assert [(e.detector, e.level) for e in strikes(out)] == [("generic_repeat", "critical")]
    kinds = [
        ("generic_repeat", "warning"),
        ("unknown_tool_repeat", "warning"),
        ("repeated_failure", "warning"),
        ("fleet_tool_breaker", "critical"),
        ("cycle", "critical"),
    ]
    events = [critical.model_copy(update={"detector": d, "level": level}) for d, level in kinds]
    assert [(e.detector, e.level) for e in strikes(events)] == [
        ("unknown_tool_repeat", "warning"),
        ("repeated_failure", "warning"),
        ("cycle", "critical"),
    ]


def test_the_processor_sends_strikes_only_when_the_breaker_is_configured() -> None:
    events = []
    for i in range(6):  # the 6th identical call is a critical: the strike
        base = {
            "session_key": "sess-1",
            "run_id": "r",
            "call_id": f"c{i}",
            "tool_name": "exec",
            "args": {"command": "secret"},
            "ts": T0 + i,
        }
        events.append({**base, "type": "tool_call", "event_id": f"e{2 * i}", "seq": 2 * i})
        events.append(
            {
                **base,
                "type": "tool_result",
                "event_id": f"e{2 * i + 1}",
                "seq": 2 * i + 1,
                "result": {"content": "failing"},
            }
        )
    records = [InputRecord("calls", 0, n, b"sess-1", orjson.dumps(e)) for n, e in enumerate(events)]

    def run(topics: OutputTopics) -> list[tuple[str, bytes | None, bytes]]:
        return SessionProcessor(
            engine(),
            ("calls", "results", "compactions"),
            topics,
            DictStore(),
            _NoOffsets(),
            clock=lambda: T0 + 1_000,
        ).process(records)

    plain = run(OutputTopics("verdicts", "loops", "dead"))
    with_breaker = run(OutputTopics("verdicts", "loops", "dead", "strikes"))
    assert [m for m in with_breaker if m[0] != "strikes"] == plain
    sent = [
        (key, ToolStrike.model_validate_json(value))
        for topic, key, value, _ in with_breaker
        if topic == "strikes"
    ]
    assert [(key, s.tool_name, s.detector, s.ts) for key, s in sent] == [
        (b"exec", "exec", "generic_repeat", T0 + 5)
    ]
    assert sent[0][1].session == f"{hash64('sess-1'):016x}"
    late_clock = SessionProcessor(
        engine(),
        ("calls", "results", "compactions"),
        OutputTopics("verdicts", "loops", "dead", "strikes"),
        DictStore(),
        _NoOffsets(),
        clock=lambda: T0 + 2,
    )
    [(_, _, value, _)] = [m for m in late_clock.process(records) if m[0] == "strikes"]
    assert ToolStrike.model_validate_json(value).ts == T0 + 2  # a clock ahead counts as now
    assert b"secret" not in b"".join(
        value for topic, _, value, _ in with_breaker if topic == "strikes"
    )


def test_the_processor_overlays_the_board_it_is_given() -> None:
    board: dict[str, ToolBreaker] = {}
    proc = SessionProcessor(
        engine(),
        ("calls", "results", "compactions"),
        OutputTopics("verdicts", "loops", "dead", "strikes"),
        DictStore(),
        _NoOffsets(),
        clock=lambda: T0,
        breakers=board,
    )

    def verdict_of(n: int) -> dict[str, Any]:
        event = {
            "type": "tool_call",
            "session_key": "s",
            "call_id": f"c{n}",
            "seq": n,
            "event_id": f"e{n}",
            "tool_name": "exec",
            "args": {"n": n},
            "ts": T0 + n,
        }
        [(_, _, value, _)] = proc.process([InputRecord("calls", 0, n, b"s", orjson.dumps(event))])
        return orjson.loads(value)  # type: ignore[no-any-return]

    assert verdict_of(0)["action"] == "allow"
    board.update(BROKEN_EXEC)  # the worker's board reader, between batches
    assert (verdict_of(1)["action"], verdict_of(1)["detector"]) == ("warn", "fleet_tool_breaker")


class _NoOffsets:
    def highwater(self, topic: str, partition: int) -> int | None:
        return None

    def committed(self, topic: str, partition: int) -> int | None:
        return None

    def answered_at(self, topic: str, partition: int) -> int | None:
        return None


# -- the window -------------------------------------------------------------------------


def test_k_distinct_sessions_within_the_window_trip_it_once() -> None:
    windows = FleetWindows(3, 60_000)
    assert windows.strike("exec", "a", T0) is None
    assert windows.strike("exec", "b", T0 + 1_000) is None
    assert windows.strike("exec", "b", T0 + 2_000) is None  # the same session again
    assert windows.strike("read", "c", T0 + 2_000) is None  # another tool
    trip = windows.strike("exec", "c", T0 + 3_000)
    assert trip is not None and trip.new
    # until: the oldest of the 3 strikes (a, at T0) plus the window
    assert trip.breaker == ToolBreaker("exec", 3, 60, T0 + 3_000, T0 + 60_000)
    assert windows.strike("exec", "c", T0 + 3_000) is None  # a redelivery changes nothing
    # Only the newest 3 strikes count: until moves with the oldest of them, and is
    # published again once it moved by a tenth of the window (6 s).
    assert [
        windows.strike("exec", s, T0 + at) for s, at in (("d", 4_000), ("e", 20_000), ("f", 30_000))
    ] == [None] * 3
    extended = windows.strike("exec", "g", T0 + 40_000)
    assert extended is not None and not extended.new  # republished, no new loop event
    assert extended.breaker == ToolBreaker("exec", 3, 60, T0 + 3_000, T0 + 80_000)


def test_strikes_further_apart_than_the_window_never_trip_and_a_cleared_tool_trips_again() -> None:
    windows = FleetWindows(3, 60_000)
    assert [windows.strike("exec", s, T0 + i * 40_000) for i, s in enumerate("abcd")] == [None] * 4
    windows = FleetWindows(2, 60_000)
    first = windows.strike("exec", "b", T0 + 1) or windows.strike("exec", "a", T0 + 2)
    assert first is not None and first.new and first.breaker.until_ts == T0 + 60_001
    assert windows.strike("exec", "c", T0 + 200_000) is None  # cleared; one session
    again = windows.strike("exec", "d", T0 + 200_001)
    assert again is not None and again.new and again.breaker.since_ts == T0 + 200_001


def test_a_trip_another_worker_published_is_not_published_again() -> None:
    published = ToolBreaker("exec", 2, 60, T0 - 10_000, T0 + 50_000)
    windows = FleetWindows(2, 60_000)
    assert windows.strike("exec", "a", T0, published) is None
    moved = windows.strike("exec", "b", T0 + 1, published)  # only extends it
    assert moved is not None and not moved.new
    assert moved.breaker == ToolBreaker("exec", 2, 60, T0 - 10_000, T0 + 60_000)


def test_windows_and_board_are_bounded() -> None:
    windows = FleetWindows(2, 60_000, max_tools=3)
    for n in range(10):
        windows.strike(f"tool{n}", "a", T0)
    assert len(windows._tools) == 3
    board = BreakerBoard(max_tools=2)
    for n in range(5):
        board.note(ToolBreaker(f"tool{n}", 2, 60, T0, T0 + n))
    assert sorted(board.broken) == ["tool3", "tool4"]  # the ones clearing last stay


# -- the breaker's loop event and state; the board -----------------------------------


def test_the_breaker_publishes_its_state_and_one_loop_event_per_trip() -> None:
    board = BreakerBoard()
    judge = FleetBreakerJudge(
        engine().rules.resolver.fleet_breaker,  # type: ignore[arg-type]
        True,
        board,
        ("breakers", "loops"),
    )

    def strike(session: str, ts: int) -> list[tuple[str, bytes | None, bytes, int | None]]:
        value = orjson.dumps(
            {
                "type": "tool_strike",
                "tool_name": "exec",
                "detector": "generic_repeat",
                "session": f"{hash64(session):016x}",
                "ts": ts,
            }
        )
        return judge.on_strike(value, T0 + 99)

    assert strike("a", T0) == [] and strike("b", T0 + 1) == []
    messages = strike("c", T0 + 2)
    assert [(topic, key) for topic, key, _, _ in messages] == [
        ("breakers", b"exec"),
        ("loops", b"exec"),
    ]
    event = WireLoopEvent.model_validate_json(messages[1][2])
    assert (
        event.detector,
        event.action,
        event.level,
        event.count,
        event.enforced,
        event.session_key,
        event.message,
    ) == ("fleet_tool_breaker", "warn", "warning", 3, True, "fleet", WARN)
    assert event.fleet is not None and (event.fleet.since_ts, event.fleet.until_ts) == (
        T0 + 2,
        T0 + 60_000,
    )
    assert board.broken["exec"].until_ts == T0 + 60_000
    assert judge.on_strike(b"not json", T0) == []

    other = BreakerBoard()  # every worker's board reads the state record
    other.apply(b"exec", messages[0][2])
    assert other.broken == board.broken
    other.apply(b"exec", None)  # a tombstone
    other.apply(b"read", b'{"tool_name": "read"}')  # invalid: ignored
    assert other.broken == {}


def test_a_shadow_breaker_says_so_in_its_loop_event() -> None:
    rule = engine({"shadow": True}).rules.resolver.fleet_breaker
    assert rule is not None and not rule.enforced
    judge = FleetBreakerJudge(rule, True, BreakerBoard(), ("breakers", "loops"))
    for n, session in enumerate("abc"):
        messages = judge.on_strike(
            orjson.dumps(
                {
                    "tool_name": "exec",
                    "detector": "repeated_failure",
                    "session": f"{hash64(session):016x}",
                    "ts": T0 + n,
                }
            ),
            T0,
        )
    assert WireLoopEvent.model_validate_json(messages[-1][2]).enforced is False
