"""Spec sections 4-6: history, counters and the decision table, observed through verdicts."""

from __future__ import annotations

from typing import Any

import pytest

from loopfuse.schemas import parse_config, validate_event
from loopfuse.streams.engine import Engine
from loopfuse.streams.engine.state import run_key
from tests.unit.conftest import (
    LOOP_BLOCK_RESULT,
    actions,
    call,
    engine_with,
    last_verdict,
    pair,
    repeat_pairs,
    result,
    run_ended,
    verdicts,
)

ALL_OFF = {"genericRepeat": False, "knownPollNoProgress": False, "pingPong": False}


def msg_unknown(u: str, n: int) -> str:
    return (
        f"CRITICAL: attempted unavailable tool {u} {n} times. "
        "Stop retrying that missing tool and answer without it."
    )


def msg_global(tool: str, n: int) -> str:
    return (
        f"CRITICAL: {tool} has repeated identical no-progress outcomes {n} times. "
        "Session execution blocked by global circuit breaker to prevent runaway loops."
    )


def msg_poll_critical(tool: str, n: int) -> str:
    return (
        f"CRITICAL: Called {tool} with identical arguments and no progress {n} times. "
        "This appears to be a stuck polling loop. "
        "Session execution blocked to prevent resource waste."
    )


def msg_poll_warning(tool: str, n: int) -> str:
    return (
        f"WARNING: You have called {tool} {n} times with identical arguments and no "
        "progress. Stop polling and either (1) increase wait time between checks, or (2) "
        "report the task as failed if the process is stuck."
    )


def msg_pingpong_critical(n: int) -> str:
    return (
        f"CRITICAL: You are alternating between repeated tool-call patterns ({n} "
        "consecutive calls) with no progress. This appears to be a stuck ping-pong loop. "
        "Session execution blocked to prevent resource waste."
    )


def msg_pingpong_warning(n: int) -> str:
    return (
        f"WARNING: You are alternating between repeated tool-call patterns ({n} "
        "consecutive calls). This looks like a ping-pong loop; stop retrying and report "
        "the task as failed."
    )


def msg_generic_critical(tool: str, n: int) -> str:
    return (
        f"CRITICAL: Called {tool} with identical arguments and identical outcomes {n} "
        "times. Session execution blocked to prevent runaway loops."
    )


def msg_generic_warning(tool: str, n: int) -> str:
    return (
        f"WARNING: You have called {tool} {n} times with identical arguments. "
        "If this is not making progress, stop retrying and report the task as failed."
    )


def assert_verdict(
    v: Any, action: str, level: str, detector: str | None, count: int, message: str | None
) -> None:
    assert (v.action, v.level, v.detector, v.count) == (action, level, detector, count)
    assert v.message == message


def unknown_tool_attempts(
    n: int, tool: str = "browser", error: str = "Unknown tool: Web_X", **kwargs: Any
) -> list[Any]:
    return [e for i in range(n) for e in pair(tool, {"i": i}, error=error, **kwargs)]


# --- row 1: unknown tool -------------------------------------------------------------------------


def test_unknown_tool_streak_blocks_at_threshold_with_differing_args() -> None:
    engine = engine_with(unknownToolThreshold=3)
    outputs = engine.replay([*unknown_tool_attempts(3), call("browser", {"i": 99})])
    assert actions(outputs) == ["allow", "allow", "allow", "block"]
    assert_verdict(
        last_verdict(outputs),
        "block",
        "critical",
        "unknown_tool_repeat",
        3,
        msg_unknown("web_x", 3),
    )


def test_unknown_tool_ignores_detector_toggles() -> None:
    engine = engine_with(unknownToolThreshold=2, detectors=ALL_OFF)
    outputs = engine.replay([*unknown_tool_attempts(2), call("browser", {"i": 7})])
    assert last_verdict(outputs).detector == "unknown_tool_repeat"


def test_unknown_tool_name_from_explicit_field_and_second_pattern() -> None:
    engine = engine_with(unknownToolThreshold=2)
    events = [
        *pair("a", {"i": 1}, error="boom", unknown_tool="ghost_tool"),
        *pair("a", {"i": 2}, error="boom", unknown_tool="ghost_tool"),
        call("a", {"i": 3}),
    ]
    assert last_verdict(engine.replay(events)).message == msg_unknown("ghost_tool", 2)
    engine = engine_with(unknownToolThreshold=2)
    events = [*unknown_tool_attempts(2, error='tool "Web.Fetch" not found'), call("browser", {})]
    assert last_verdict(engine.replay(events)).message == msg_unknown("web.fetch", 2)


def test_unknown_tool_streak_is_broken_by_another_tool() -> None:
    engine = engine_with(unknownToolThreshold=3)
    events = [
        *unknown_tool_attempts(2),
        *pair("search", {"q": 1}),
        *unknown_tool_attempts(2),
        call("browser", {"i": 50}),
    ]
    assert actions(engine.replay(events))[-1] == "allow"


def test_unknown_tool_streak_counts_only_records_of_the_current_tool() -> None:
    # spec reading: "another tool" means a tool other than the current call's.
    engine = engine_with(unknownToolThreshold=3)
    outputs = engine.replay([*unknown_tool_attempts(3), call("search", {"q": 1})])
    assert actions(outputs)[-1] == "allow"


def test_unknown_tool_streak_needs_the_same_missing_name() -> None:
    engine = engine_with(unknownToolThreshold=3)
    events = [
        *unknown_tool_attempts(2, error="Unknown tool: alpha"),
        *unknown_tool_attempts(1, error="Unknown tool: beta"),
        call("browser", {"i": 9}),
    ]
    assert actions(engine.replay(events))[-1] == "allow"


# --- row 2: global circuit breaker ---------------------------------------------------------------


def test_global_breaker_fires_with_every_detector_off() -> None:
    engine = engine_with(
        warningThreshold=2, criticalThreshold=3, globalCircuitBreakerThreshold=4, detectors=ALL_OFF
    )
    outputs = engine.replay([*repeat_pairs("read", {"p": "x"}, 4), call("read", {"p": "x"})])
    assert actions(outputs) == ["allow"] * 4 + ["block"]
    assert_verdict(
        last_verdict(outputs),
        "block",
        "critical",
        "global_circuit_breaker",
        4,
        msg_global("read", 4),
    )


def test_global_breaker_applies_to_known_polls_too() -> None:
    engine = engine_with(
        warningThreshold=2, criticalThreshold=3, globalCircuitBreakerThreshold=4, detectors=ALL_OFF
    )
    outputs = engine.replay(
        [*repeat_pairs("command_status", {"id": 1}, 4), call("command_status", {"id": 1})]
    )
    assert last_verdict(outputs).detector == "global_circuit_breaker"


def test_global_breaker_needs_identical_results() -> None:
    engine = engine_with(
        globalCircuitBreakerThreshold=3, warningThreshold=1, criticalThreshold=2, detectors=ALL_OFF
    )
    events = [e for i in range(6) for e in pair("read", {}, result=f"r{i % 2}")]
    assert actions(engine.replay([*events, call("read", {})])) == ["allow"] * 7


# --- rows 3-4: known polls -----------------------------------------------------------------------


def test_known_poll_warns_then_blocks_on_no_progress() -> None:
    engine = engine_with(warningThreshold=2, criticalThreshold=4)
    poll = ("command_status", {"id": "job-1"})
    outputs = engine.replay([e for _ in range(5) for e in pair(*poll)])
    v = verdicts(outputs)
    assert [x.action for x in v] == ["allow", "allow", "warn", "warn", "block"]
    assert_verdict(
        v[2], "warn", "warning", "known_poll_no_progress", 2, msg_poll_warning("command_status", 2)
    )
    assert v[3].count == 3
    assert_verdict(
        v[4],
        "block",
        "critical",
        "known_poll_no_progress",
        4,
        msg_poll_critical("command_status", 4),
    )


@pytest.mark.parametrize("action", ["poll", "log"])
def test_process_poll_and_log_are_known_polls(action: str) -> None:
    engine = engine_with(warningThreshold=2, criticalThreshold=3)
    args = {"action": action, "sessionId": "p1"}
    outputs = engine.replay([*repeat_pairs("process", args, 3), call("process", args)])
    assert_verdict(
        last_verdict(outputs),
        "block",
        "critical",
        "known_poll_no_progress",
        3,
        msg_poll_critical("process", 3),
    )


def test_known_poll_without_results_never_warns_but_a_generic_tool_does() -> None:
    polls = [call("process", {"action": "poll", "sessionId": "p1"}) for _ in range(6)]
    assert set(actions(engine_with(warningThreshold=2, criticalThreshold=3).replay(polls))) == {
        "allow"
    }
    others = [call("process", {"action": "list"}) for _ in range(3)]
    outputs = engine_with(warningThreshold=2, criticalThreshold=3).replay(others)
    assert_verdict(
        last_verdict(outputs),
        "warn",
        "warning",
        "generic_repeat",
        2,
        msg_generic_warning("process", 2),
    )


def test_known_poll_with_changing_results_is_not_flagged() -> None:
    engine = engine_with(warningThreshold=2, criticalThreshold=3)
    events = [e for i in range(6) for e in pair("command_status", {"id": 1}, result=f"line {i}")]
    assert set(actions(engine.replay(events))) == {"allow"}


def test_known_poll_detector_off_leaves_polls_to_the_global_breaker() -> None:
    engine = engine_with(
        warningThreshold=2, criticalThreshold=3, detectors={"knownPollNoProgress": False}
    )
    outputs = engine.replay(
        [*repeat_pairs("command_status", {"id": 1}, 5), call("command_status", {"id": 1})]
    )
    assert set(actions(outputs)) == {"allow"}


def test_known_poll_by_args_action_when_args_are_hashed() -> None:
    engine = engine_with(warningThreshold=2, criticalThreshold=3)
    events = [call("process", args_hash="h-poll", args_action="poll") for _ in range(4)]
    assert set(actions(engine.replay(events))) == {"allow"}  # a known poll: no recent-count warn


# --- rows 5-6: ping-pong -------------------------------------------------------------------------


def ping_pong(n: int, *, same_results: bool = True, with_results: bool = True) -> list[Any]:
    """n alternating calls read{p:1} / list{d:1}; the i-th result varies unless same_results."""
    events: list[Any] = []
    for i in range(n):
        tool, args = ("read", {"p": 1}) if i % 2 == 0 else ("list", {"d": 1})
        if with_results:
            events += pair(tool, args, result=tool if same_results else f"{tool}{i}")
        else:
            events.append(call(tool, args))
    return events


def test_ping_pong_warns_at_warning_threshold_with_paired_tool() -> None:
    engine = engine_with(warningThreshold=3, criticalThreshold=5)
    v = verdicts(engine.replay(ping_pong(4)))
    assert [x.action for x in v] == ["allow", "allow", "warn", "warn"]
    assert_verdict(v[2], "warn", "warning", "ping_pong", 3, msg_pingpong_warning(3))
    assert (v[2].tool_name, v[2].paired_tool_name) == ("read", "list")
    assert (v[3].count, v[3].paired_tool_name) == (4, "read")


def test_ping_pong_below_warning_threshold_is_allowed() -> None:
    engine = engine_with(warningThreshold=4, criticalThreshold=5)
    assert actions(engine.replay(ping_pong(3))) == ["allow"] * 3


def test_ping_pong_blocks_at_critical_with_no_progress_evidence() -> None:
    engine = engine_with(warningThreshold=3, criticalThreshold=5)
    v = verdicts(engine.replay(ping_pong(5)))
    assert_verdict(v[-1], "block", "critical", "ping_pong", 5, msg_pingpong_critical(5))
    assert v[-1].paired_tool_name == "list"


@pytest.mark.parametrize(
    "kwargs",
    [{"same_results": False}, {"with_results": False}],
    ids=["changing-results", "no-results"],
)
def test_ping_pong_without_evidence_only_warns(kwargs: dict[str, bool]) -> None:
    engine = engine_with(warningThreshold=3, criticalThreshold=5)
    v = verdicts(engine.replay(ping_pong(7, **kwargs)))
    assert [x.count for x in v[2:]] == [3, 4, 5, 6, 7]
    assert_verdict(v[-1], "warn", "warning", "ping_pong", 7, msg_pingpong_warning(7))


def test_ping_pong_needs_the_current_call_to_continue_the_alternation() -> None:
    engine = engine_with(warningThreshold=3, criticalThreshold=5)
    outputs = engine.replay([*ping_pong(4), call("grep", {"x": 1})])
    assert actions(outputs)[-1] == "allow"


def test_ping_pong_off() -> None:
    engine = engine_with(warningThreshold=3, criticalThreshold=5, detectors={"pingPong": False})
    assert set(actions(engine.replay(ping_pong(6)))) == {"allow"}


def test_ping_pong_between_two_tools_with_the_same_args() -> None:
    # Different tool, same args -> different signature, so this is an alternation.
    engine = engine_with(warningThreshold=3, criticalThreshold=5)
    events = [call("read" if i % 2 == 0 else "stat", {"path": "/x"}) for i in range(3)]
    assert last_verdict(engine.replay(events)).detector == "ping_pong"


# --- rows 7-8: generic repeat --------------------------------------------------------------------


def test_generic_warns_at_warning_threshold_then_blocks_at_critical() -> None:
    engine = engine_with(warningThreshold=3, criticalThreshold=5)
    v = verdicts(engine.replay(repeat_pairs("read", {"p": "a"}, 6)))
    assert [x.action for x in v] == ["allow", "allow", "allow", "warn", "warn", "block"]
    assert_verdict(v[3], "warn", "warning", "generic_repeat", 3, msg_generic_warning("read", 3))
    assert_verdict(v[4], "warn", "warning", "generic_repeat", 4, msg_generic_warning("read", 4))
    assert_verdict(v[5], "block", "critical", "generic_repeat", 5, msg_generic_critical("read", 5))


def test_generic_warns_whatever_the_results_but_never_blocks_on_changing_results() -> None:
    engine = engine_with(warningThreshold=3, criticalThreshold=5)
    events = [e for i in range(12) for e in pair("read", {"p": "a"}, result=f"v{i}")]
    v = verdicts(engine.replay(events))
    assert [x.action for x in v] == ["allow"] * 3 + ["warn"] * 9
    assert [x.count for x in v[3:]] == list(range(3, 12))


def test_generic_off() -> None:
    engine = engine_with(
        warningThreshold=3, criticalThreshold=5, detectors={"genericRepeat": False}
    )
    assert set(actions(engine.replay(repeat_pairs("read", {}, 8)))) == {"allow"}


def test_different_args_do_not_count_as_repeats() -> None:
    engine = engine_with(warningThreshold=2, criticalThreshold=3)
    events = [e for i in range(6) for e in pair("read", {"p": i})]
    assert set(actions(engine.replay(events))) == {"allow"}


def test_defaults_10_20_30() -> None:
    engine = Engine(parse_config({"tools": {"loopDetection": {"enabled": True}}}))
    v = verdicts(engine.replay(repeat_pairs("exec_tool", {"cmd": "ls"}, 21)))
    assert [x.action for x in v] == ["allow"] * 10 + ["warn"] * 10 + ["block"]
    assert (v[10].count, v[19].count) == (10, 19)
    assert_verdict(
        v[20], "block", "critical", "generic_repeat", 20, msg_generic_critical("exec_tool", 20)
    )


# --- a critical call is not recorded -------------------------------------------------------------


def test_block_stays_until_args_change() -> None:
    engine = engine_with(warningThreshold=3, criticalThreshold=5)
    events = [
        *repeat_pairs("read", {"p": "a"}, 5),
        call("read", {"p": "a"}),
        result("read", {"p": "a"}, result=LOOP_BLOCK_RESULT),
        call("read", {"p": "a"}),
        call("read", {"p": "a"}),
        call("read", {"p": "b"}),
    ]
    v = verdicts(engine.replay(events))
    assert [(x.action, x.count) for x in v[5:]] == [
        ("block", 5),
        ("block", 5),
        ("block", 5),
        ("allow", 0),
    ]


def test_blocked_call_does_not_grow_history() -> None:
    engine = engine_with(warningThreshold=2, criticalThreshold=3)
    state = None
    for event in [*repeat_pairs("read", {}, 3), call("read", {})]:
        state, _ = engine.step(state, event, event.ts)
    size = len(state.history)
    again = call("read", {})
    state, outputs = engine.step(state, again, again.ts)
    assert last_verdict(outputs).action == "block"
    assert len(state.history) == size


def test_other_blocked_results_escalate() -> None:
    veto = {
        "content": [{"type": "text", "text": "denied"}],
        "details": {"status": "blocked", "deniedReason": "plugin", "reason": "denied"},
    }
    engine = engine_with(warningThreshold=2, criticalThreshold=3)
    outputs = engine.replay(
        [*repeat_pairs("exec", {"c": "rm"}, 3, result=veto), call("exec", {"c": "rm"})]
    )
    assert last_verdict(outputs).action == "block"


# --- history and scope ---------------------------------------------------------------------------


def test_results_without_a_seen_call_append_records() -> None:
    engine = engine_with(warningThreshold=2, criticalThreshold=3)
    events = [result("read", {"p": 1}) for _ in range(3)]
    assert last_verdict(engine.replay([*events, call("read", {"p": 1})])).action == "block"


def test_result_fills_the_matching_call_record() -> None:
    engine = engine_with()
    state = None
    for event in [
        call("a", {"x": 1}, call_id="c1"),
        call("b", {}, call_id="c2"),
        result("a", {"x": 1}, call_id="c1", result="done"),
    ]:
        state, _ = engine.step(state, event, event.ts)
    assert [r.tool for r in state.history] == ["a", "b"]
    assert state.history[0].result and not state.history[1].result


def test_detection_only_sees_the_current_run() -> None:
    engine = engine_with(warningThreshold=3, criticalThreshold=5)
    events = [
        *repeat_pairs("read", {}, 5, run="r1"),
        call("read", {}, run="r2"),
        call("read", {}, run="r1"),
    ]
    v = verdicts(engine.replay(events))
    assert v[-2].action == "allow"
    assert_verdict(v[-1], "block", "critical", "generic_repeat", 5, msg_generic_critical("read", 5))


def test_run_id_is_trimmed() -> None:
    engine = engine_with(warningThreshold=2, criticalThreshold=3)
    outputs = engine.replay([*repeat_pairs("read", {}, 3, run="r1"), call("read", {}, run=" r1 ")])
    assert last_verdict(outputs).action == "block"


def test_records_without_run_id_only_match_calls_without_one() -> None:
    engine = engine_with(warningThreshold=2, criticalThreshold=3)
    no_run = repeat_pairs("read", {}, 3, run=None)
    outputs = engine.replay([*no_run, call("read", {}, run="r1"), call("read", {}, run=None)])
    assert actions(outputs)[-2:] == ["allow", "block"]


def test_history_is_per_session() -> None:
    engine = engine_with(warningThreshold=2, criticalThreshold=3)
    outputs = engine.replay(
        [*repeat_pairs("read", {}, 3, session="s1"), call("read", {}, session="s2")]
    )
    assert last_verdict(outputs).action == "allow"


def test_history_is_trimmed_to_history_size() -> None:
    small = engine_with(historySize=2, warningThreshold=3, criticalThreshold=5)
    assert set(actions(small.replay([call("read", {}) for _ in range(10)]))) == {"allow"}
    enough = engine_with(historySize=3, warningThreshold=3, criticalThreshold=5)
    assert actions(enough.replay([call("read", {}) for _ in range(4)]))[-1] == "warn"


def test_history_is_trimmed_oldest_first_across_runs() -> None:
    engine = engine_with(historySize=4)
    state = None
    for event in [call("a", {"i": i}, run="r1") for i in range(3)] + [
        call("a", {"i": i}, run="r2") for i in range(3)
    ]:
        state, _ = engine.step(state, event, event.ts)
    r1, r2 = run_key("r1"), run_key("r2")
    assert [r.run for r in state.history] == [r1, r2, r2, r2]


# --- enabled -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "engine_factory",
    [
        pytest.param(lambda: Engine(), id="no-config"),
        pytest.param(
            lambda: Engine(parse_config({"tools": {"loopDetection": {"enabled": False}}})),
            id="enabled-false",
        ),
        pytest.param(
            lambda: Engine(
                parse_config(
                    {"tools": {"loopDetection": {"warningThreshold": 2, "criticalThreshold": 3}}}
                )
            ),
            id="enabled-unset",
        ),
    ],
)
def test_detection_off_always_allows(engine_factory: Any) -> None:
    engine = engine_factory()
    events = [*repeat_pairs("read", {}, 35), *unknown_tool_attempts(12), *ping_pong(12)]
    v = verdicts(engine.replay(events))
    assert len(v) == 35 + 12 + 12
    assert {(x.action, x.level, x.detector, x.count, x.message) for x in v} == {
        ("allow", "none", None, 0, None)
    }


def test_enabled_false_records_nothing() -> None:
    engine = Engine(parse_config({"tools": {"loopDetection": {"enabled": False}}}))
    state = None
    for event in repeat_pairs("read", {}, 3):
        state, _ = engine.step(state, event, event.ts)
    assert len(state.history) == 0


def test_enabled_unset_still_records_calls() -> None:
    engine = Engine()
    state = None
    for event in [call("read", {"i": i}) for i in range(3)]:
        state, _ = engine.step(state, event, event.ts)
    assert [r.tool for r in state.history] == ["read"] * 3


def test_per_agent_enable() -> None:
    engine = Engine(
        parse_config(
            {
                "tools": {"loopDetection": {"enabled": False}},
                "agents": {
                    "list": [
                        {
                            "id": "safe-runner",
                            "tools": {"loopDetection": {"enabled": True, "warningThreshold": 3}},
                        }
                    ]
                },
            }
        )
    )
    calls = [call("read", {}, agent="safe-runner", session="a") for _ in range(4)]
    v = verdicts(engine.replay(calls))
    assert_verdict(v[-1], "warn", "warning", "generic_repeat", 3, msg_generic_warning("read", 3))
    others = [call("read", {}, agent="other", session="b") for _ in range(25)]
    assert set(actions(engine.replay(others))) == {"allow"}


def test_verdict_copies_identity_from_the_call() -> None:
    engine = engine_with()
    event = call("read", {"p": 1}, session="s9", run="r9", agent="ag", call_id="cid", seq=0)
    v = last_verdict(engine.replay([event]))
    assert (v.session_key, v.run_id, v.agent_id, v.call_id, v.seq, v.tool_name, v.event_ts) == (
        "s9",
        "r9",
        "ag",
        "cid",
        0,
        "read",
        event.ts,
    )
    assert (v.action, v.level, v.detector, v.count, v.message) == ("allow", "none", None, 0, None)


# --- first match wins ----------------------------------------------------------------------------


def test_unknown_tool_row_comes_before_generic_repeat() -> None:
    engine = engine_with(warningThreshold=2, criticalThreshold=3, unknownToolThreshold=3)
    events = [
        *repeat_pairs("browser", {"u": 1}, 3, error="Unknown tool: browser"),
        call("browser", {"u": 1}),
    ]
    assert last_verdict(engine.replay(events)).detector == "unknown_tool_repeat"


def test_global_breaker_row_comes_before_known_poll() -> None:
    # Results are recorded even without a call, so the streak can pass the critical threshold.
    engine = engine_with(warningThreshold=2, criticalThreshold=3, globalCircuitBreakerThreshold=4)
    events = [
        *[result("command_status", {"id": 1}) for _ in range(5)],
        call("command_status", {"id": 1}),
    ]
    assert_verdict(
        last_verdict(engine.replay(events)),
        "block",
        "critical",
        "global_circuit_breaker",
        5,
        msg_global("command_status", 5),
    )


# --- wire details that change what is recorded ------------------------------------------------


def test_result_without_args_matches_its_call_by_call_id() -> None:
    engine = engine_with(warningThreshold=2, criticalThreshold=3)
    events: list[Any] = []
    for i in range(3):
        events.append(call("read", {"p": 1}, call_id=f"c{i}"))
        events.append(
            validate_event(
                {
                    "type": "tool_result",
                    "event_id": f"res-{i}",
                    "ts": 1,
                    "session_key": "s1",
                    "run_id": "r1",
                    "call_id": f"c{i}",
                    "tool_name": "read",
                    "result": "same",
                }
            )
        )
    assert last_verdict(engine.replay([*events, call("read", {"p": 1})])).action == "block"


def test_result_without_args_for_an_unseen_call_is_rejected() -> None:
    # spec reading: the args are "needed when no call with that id was seen"; without them
    # the result cannot be attributed, so it is rejected (dead letter "orphan_result").
    orphan = validate_event(
        {
            "type": "tool_result",
            "event_id": "o1",
            "ts": 1,
            "session_key": "s1",
            "run_id": "r1",
            "call_id": "never-seen",
            "tool_name": "read",
            "result": "x",
        }
    )
    outputs = engine_with().replay([orphan])
    assert [getattr(o, "code", None) for o in outputs] == ["orphan_result"]


def test_run_ended_keeps_the_records_in_the_session_history() -> None:
    engine = engine_with()
    state = None
    for event in [call("a", {}), call("b", {}), run_ended()]:
        state, _ = engine.step(state, event, event.ts)
    assert [r.tool for r in state.history] == ["a", "b"]


def test_verdict_id_is_deterministic_per_call_and_action() -> None:
    first = last_verdict(engine_with().replay([call("read", {}, call_id="c1")]))
    again = last_verdict(engine_with().replay([call("read", {}, call_id="c1")]))
    other = last_verdict(engine_with().replay([call("read", {}, call_id="c2")]))
    assert first.verdict_id == again.verdict_id != other.verdict_id
