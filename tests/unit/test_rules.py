"""The opt-in rules of issue 14 (docs/configuration.md: Rules), observed through verdicts and loop events."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from loopfuse.schemas import ConfigError, parse_config
from loopfuse.streams.engine import Engine, SessionState, state_codec
from loopfuse.streams.engine.fingerprint import result_token
from loopfuse.streams.engine.rules import RUN_ENDED_NOTICE, normalise_error
from tests.unit.conftest import (
    LOOP_BLOCK_RESULT,
    call,
    loop_events,
    pair,
    repeat_pairs,
    result,
    run_ended,
    verdicts,
)

GENERIC_3 = (
    "CRITICAL: Called read with identical arguments and identical outcomes 3 times. "
    "Session execution blocked to prevent runaway loops."
)


def rules_engine(
    rules: dict[str, Any],
    *,
    agents: list[dict[str, Any]] | None = None,
    enforce: bool = True,
    **loop: Any,
) -> Engine:
    """Detection enabled with ``loop`` fields, and ``rules`` as loopfuse.rules."""
    document: dict[str, Any] = {
        "tools": {"loopDetection": {"enabled": True, **loop}},
        "loopfuse": {"enforce": enforce, "rules": rules},
    }
    if agents is not None:
        document["agents"] = {"list": agents}
    return Engine(parse_config(document))


def decided(outputs: list[Any]) -> list[tuple[str, str | None, int]]:
    return [(v.action, v.detector, v.count) for v in verdicts(outputs)]


def events_of(outputs: list[Any]) -> list[tuple[str, str, int, bool]]:
    return [(e.action, e.detector, e.count, e.enforced) for e in loop_events(outputs)]


def stuck_read(times: int = 3, **kwargs: Any) -> list[Any]:
    """``times`` identical read pairs, then two more identical read calls."""
    return [
        *repeat_pairs("read", {"p": 1}, times, **kwargs),
        call("read", {"p": 1}, **kwargs),
        call("read", {"p": 1}, **kwargs),
    ]


# -- run endings ---------------------------------------------------------------------


def test_the_second_critical_of_a_run_ends_it() -> None:
    outputs = rules_engine({"runEnding": {}}, warningThreshold=2, criticalThreshold=3).replay(
        stuck_read()
    )
    assert decided(outputs) == [
        ("allow", None, 0),
        ("allow", None, 0),
        ("warn", "generic_repeat", 2),
        ("block", "generic_repeat", 3),
        ("block", "generic_repeat", 3),
        ("abort", "tool_loop_run_ended", 2),
    ]
    abort = verdicts(outputs)[-1]
    assert abort.message == f"{GENERIC_3} {RUN_ENDED_NOTICE}"
    assert abort.message.endswith(
        "Ending this run: the model kept repeating a blocked tool call and made no progress."
    )
    assert abort.call_id == verdicts(outputs)[-2].call_id  # the call is blocked, the run ends
    assert events_of(outputs)[-1] == ("abort", "tool_loop_run_ended", 2, True)


def test_without_the_rule_a_run_is_blocked_forever() -> None:
    outputs = rules_engine({}, warningThreshold=2, criticalThreshold=3).replay(stuck_read())
    assert "abort" not in [v.action for v in verdicts(outputs)]


def test_a_run_ending_in_shadow_is_only_reported() -> None:
    outputs = rules_engine(
        {"runEnding": {"shadow": True}}, warningThreshold=2, criticalThreshold=3
    ).replay(stuck_read())
    assert [v.action for v in verdicts(outputs)][-2:] == ["block", "block"]
    assert events_of(outputs)[-1] == ("abort", "tool_loop_run_ended", 2, False)


def test_consecutive_blocked_calls_end_the_run() -> None:
    engine = rules_engine(
        {"runEnding": {"criticalsPerRun": 10, "blockedStreak": 3}},
        warningThreshold=2,
        criticalThreshold=3,
    )
    stuck = repeat_pairs("read", {"p": 1}, 3)

    def blocked() -> list[Any]:
        return [call("read", {"p": 1}) for _ in range(2)]

    other = pair("list", {"d": 1})  # a call that runs: the streak starts again
    outputs = engine.replay(stuck + blocked() + other + blocked() + [call("read", {"p": 1})])
    assert [a for a, _, _ in decided(outputs)][-7:] == [
        "block",
        "block",
        "allow",
        "block",
        "block",
        "block",
        "abort",
    ]
    assert decided(outputs)[-1] == ("abort", "tool_loop_run_ended", 3)
    assert sum(v.action == "abort" for v in verdicts(outputs)) == 1


def test_each_run_gets_its_own_count() -> None:
    engine = rules_engine(
        {"runEnding": {"criticalsPerRun": 2}}, warningThreshold=2, criticalThreshold=3
    )
    one_each = [
        *repeat_pairs("read", {"p": 1}, 3),
        call("read", {"p": 1}),
        *repeat_pairs("read", {"p": 1}, 3, run="r2"),
        call("read", {"p": 1}, run="r2"),
    ]
    assert "abort" not in [v.action for v in verdicts(engine.replay(one_each))]


def test_run_ended_forgets_the_count() -> None:
    engine = rules_engine({"runEnding": {}}, warningThreshold=2, criticalThreshold=3)
    state, _ = fold(engine, [*repeat_pairs("read", {"p": 1}, 3), call("read", {"p": 1})])
    assert state.rules is not None and state.rules.runs
    state, _ = fold(engine, [run_ended()], state)
    assert not state.rules.runs


def test_an_agent_can_opt_out_of_a_global_rule() -> None:
    engine = rules_engine(
        {"runEnding": {}},
        warningThreshold=2,
        criticalThreshold=3,
        agents=[{"id": "free", "loopfuse": {"rules": {"runEnding": {"enabled": False}}}}],
    )
    assert "abort" in [v.action for v in verdicts(engine.replay(stuck_read(agent="bound")))]
    assert "abort" not in [v.action for v in verdicts(engine.replay(stuck_read(agent="free")))]


def test_an_agent_override_is_merged_into_the_global_rule() -> None:
    engine = rules_engine(
        {"runEnding": {"shadow": True}},
        warningThreshold=2,
        criticalThreshold=3,
        agents=[{"id": "a", "loopfuse": {"rules": {"runEnding": {"criticalsPerRun": 3}}}}],
    )
    outputs = engine.replay([*stuck_read(agent="a"), call("read", {"p": 1}, agent="a")])
    assert "abort" not in [v.action for v in verdicts(outputs)]  # still shadow
    assert events_of(outputs)[-1] == ("abort", "tool_loop_run_ended", 3, False)


# -- cycles --------------------------------------------------------------------------


def cycle_of(tools: tuple[str, ...], rounds: int) -> list[Any]:
    return [event for _ in range(rounds) for tool in tools for event in pair(tool, {"x": 1})]


def msg_cycle(level: str, period: int, n: int) -> str:
    if level == "critical":
        return (
            f"CRITICAL: You are repeating a cycle of {period} tool-call patterns ({n} "
            "consecutive calls) with no progress. This appears to be a stuck loop. "
            "Session execution blocked to prevent resource waste."
        )
    return (
        f"WARNING: You are repeating a cycle of {period} tool-call patterns ({n} "
        "consecutive calls). This looks like a loop; stop retrying and report the task "
        "as failed."
    )


def test_a_cycle_of_three_warns_then_blocks_on_no_progress_evidence() -> None:
    engine = rules_engine({"cycle": {}}, warningThreshold=4, criticalThreshold=7)
    outputs = engine.replay([*cycle_of(("a", "b", "c"), 2), call("a", {"x": 1})])
    assert decided(outputs)[3:] == [
        ("warn", "cycle", 4),
        ("warn", "cycle", 5),
        ("warn", "cycle", 6),
        ("block", "cycle", 7),
    ]
    assert verdicts(outputs)[3].message == msg_cycle("warning", 3, 4)
    assert verdicts(outputs)[-1].message == msg_cycle("critical", 3, 7)
    assert events_of(outputs) == [("block", "cycle", 7, True)]


def test_a_cycle_with_changing_results_only_warns() -> None:
    engine = rules_engine({"cycle": {}}, warningThreshold=4, criticalThreshold=7)
    events = []
    for n in range(3):
        for tool in ("a", "b", "c", "d"):
            events += pair(tool, {"x": 1}, result={"content": [], "details": {"n": n}})
    outputs = engine.replay(events)
    assert decided(outputs)[-1] == ("warn", "cycle", 12)  # 11 records of the cycle + the call
    assert verdicts(outputs)[-1].message == msg_cycle("warning", 4, 12)


def test_cycles_longer_than_max_period_are_not_looked_for() -> None:
    engine = rules_engine({"cycle": {"maxPeriod": 3}}, warningThreshold=4, criticalThreshold=7)
    outputs = engine.replay(cycle_of(("a", "b", "c", "d"), 3))
    assert {v.action for v in verdicts(outputs)} == {"allow"}


def test_ping_pong_keeps_its_own_detector_with_cycles_on() -> None:
    engine = rules_engine({"cycle": {}}, warningThreshold=4, criticalThreshold=7)
    outputs = engine.replay(cycle_of(("a", "b"), 4))
    assert {v.detector for v in verdicts(outputs)} == {None, "ping_pong"}


def test_a_shadow_cycle_reports_without_changing_verdicts() -> None:
    events = [*cycle_of(("a", "b", "c"), 2), call("a", {"x": 1})]
    shadow = rules_engine({"cycle": {"shadow": True}}, warningThreshold=4, criticalThreshold=7)
    plain = rules_engine({}, warningThreshold=4, criticalThreshold=7)
    outputs = shadow.replay(events)
    assert decided(outputs) == decided(plain.replay(events))
    assert events_of(outputs) == [("block", "cycle", 7, False)]


# -- failure identity and argument churn -----------------------------------------------


def msg_failure(level: str, tool: str, n: int) -> str:
    if level == "critical":
        return (
            f"CRITICAL: {tool} failed {n} times in a row with the same error. Session "
            "execution blocked to prevent runaway loops."
        )
    return (
        f"WARNING: {tool} failed {n} times in a row with the same error. Stop retrying "
        "it; change approach or report the task as failed."
    )


def failing_fetch(times: int) -> list[Any]:
    """``fetch`` with new args each time, failing with one error but a new request id."""
    return [
        event
        for n in range(times)
        for event in pair(
            "fetch",
            {"url": f"https://example.com/{n}"},
            error=f"upstream timeout after 30s (request id req_{n:04d}9f8e7d6c5b)",
        )
    ]


def test_the_same_error_whatever_the_args_warns_then_blocks() -> None:
    engine = rules_engine({"repeatedFailure": {}})  # 3 and 5
    outputs = engine.replay([*failing_fetch(5), call("fetch", {"url": "https://example.com/x"})])
    assert decided(outputs) == [("allow", None, 0)] * 3 + [
        ("warn", "repeated_failure", 3),
        ("warn", "repeated_failure", 4),
        ("block", "repeated_failure", 5),
    ]
    assert verdicts(outputs)[3].message == msg_failure("warning", "fetch", 3)
    assert verdicts(outputs)[-1].message == msg_failure("critical", "fetch", 5)
    assert events_of(outputs) == [("block", "repeated_failure", 5, True)]


def test_a_success_or_another_error_starts_the_count_again() -> None:
    engine = rules_engine({"repeatedFailure": {"warningThreshold": 2, "criticalThreshold": 3}})
    events = (
        failing_fetch(2)
        + pair("fetch", {"url": "u"})
        + failing_fetch(2)
        + pair("fetch", {"url": "v"}, error="HTTP 404")
        + [call("fetch", {"url": "w"})]
    )
    assert decided(engine.replay(events))[-1] == ("allow", None, 0)


def test_repeated_failure_works_without_loop_detection() -> None:
    engine = Engine(parse_config({"loopfuse": {"rules": {"repeatedFailure": {}}}}))
    outputs = engine.replay([*failing_fetch(5), call("fetch", {"url": "x"})])
    assert decided(outputs)[-1] == ("block", "repeated_failure", 5)


def failing_numbered(times: int, *, incarnation: str | None = None) -> list[Any]:
    """``failing_fetch`` numbered by seq, each error with a request id of its own."""
    events: list[Any] = []
    for n in range(times):
        args = {"url": f"https://example.com/{n}"}
        error = f"upstream timeout after 30s (request id req_{n:04d}9f8e7d6c5b)"
        events += [
            call("fetch", args, call_id=f"c{n}", seq=2 * n, ts=1_000 + 10 * n),
            result("fetch", args, call_id=f"c{n}", seq=2 * n + 1, ts=1_001 + 10 * n, error=error),
        ]
    if incarnation is not None:
        events = [msgspec.structs.replace(e, incarnation=incarnation) for e in events]
    return events


def test_a_failure_waiting_on_a_gap_still_counts() -> None:
    """A failing result that arrives before its call waits in the state without its
    error's text (nothing raw at rest), and still counts as that failure once applied."""
    engine = rules_engine({"repeatedFailure": {"warningThreshold": 2, "criticalThreshold": 3}})
    events = failing_numbered(4)
    in_order = decided(engine.replay(events))
    assert in_order[-2:] == [("warn", "repeated_failure", 2), ("block", "repeated_failure", 3)]
    # the second result before its call: it waits for seq 2, then applies
    disordered = [*events[:2], events[3], events[2], *events[4:]]
    assert decided(engine.replay(disordered)) == in_order


def test_a_failure_waiting_in_the_states_bytes_still_counts() -> None:
    """The same across a restart of the worker: the state written with the result
    waiting, and read back."""
    engine = rules_engine({"repeatedFailure": {"warningThreshold": 2, "criticalThreshold": 3}})
    events = failing_numbered(4)
    disordered = [*events[:2], events[3], events[2], *events[4:]]
    state, outputs = None, []
    for event in disordered:
        state, produced = engine.step(state, event, event.ts)
        outputs += produced
        if state.parked:
            data = state_codec.encode(state)
            assert b"upstream" not in data and b"req_" not in data  # nothing raw at rest
            state = state_codec.decode(data)
    assert decided(outputs) == decided(engine.replay(events))


def test_a_failure_pending_a_restarted_gateway_still_counts() -> None:
    """A restarted gateway's failing results wait until its seq space opens."""
    engine = rules_engine({"repeatedFailure": {"warningThreshold": 2, "criticalThreshold": 3}})
    before = failing_numbered(1, incarnation="g1")
    after = [
        msgspec.structs.replace(e, ts=e.ts + 100) for e in failing_numbered(3, incarnation="g2")
    ]
    state, outputs, waited = None, [], 0
    for event in [*before[:1], *after, before[1]]:  # g1's last result comes late
        state, produced = engine.step(state, event, event.ts, watermark_ms=0)
        outputs += produced
        waited = max(waited, len(state.pending))
    assert waited == 6  # g2's events waited for g1's seq space to close
    outputs += engine.release(state, 2_000, None)
    assert [d for d in decided(outputs) if d[1]] == [
        ("warn", "repeated_failure", 2),
        ("block", "repeated_failure", 3),
    ]


def test_a_hashed_error_counts_by_its_token() -> None:
    """A gateway that hashes results locally sends an error as its token: the same
    token is the same failure (and a failure, not a success that ends a streak)."""
    engine = rules_engine({"repeatedFailure": {"warningThreshold": 2, "criticalThreshold": 3}})
    token = result_token("fetch", None, error="upstream timeout")
    events = [event for n in range(3) for event in pair("fetch", {"n": n}, result_hash=token)]
    assert decided(engine.replay([*events, call("fetch", {"n": 9})]))[-2:] == [
        ("warn", "repeated_failure", 2),
        ("block", "repeated_failure", 3),
    ]
    other = result_token("fetch", None, error="upstream timeout (req 2)")
    events[-1] = msgspec.structs.replace(events[-1], result_hash=other)
    assert decided(engine.replay([*events, call("fetch", {"n": 9})]))[-1] == ("allow", None, 0)


def test_error_identity_drops_per_call_nonces_only() -> None:
    assert normalise_error(
        "timeout (request id req_0001abcdef12) at 2026-12-01T03:08:40Z"
    ) == normalise_error("timeout  (request id req_0002abcdef12) at 2026-12-01T04:00:00Z")
    assert normalise_error("HTTP 404") != normalise_error("HTTP 503")
    assert normalise_error("pid 123456 exited") == normalise_error("pid 98765 exited")
    assert normalise_error("job 550e8400-e29b-41d4-a716-446655440000 failed") == "job # failed"


def msg_churn(tool: str, variants: int, n: int) -> str:
    return (
        f"WARNING: {tool} has cycled through {variants} repeated argument patterns with "
        f"the same stable outcome {n} times. Continued churn is treated as stalled run "
        "activity, but this tool call remains allowed."
    )


def test_argument_churn_warns_as_openclaw_does() -> None:
    same = {"content": [{"type": "text", "text": "no results"}], "details": {}}
    engine = rules_engine({"argumentChurn": {}}, warningThreshold=8)
    events = []
    for _ in range(2):
        for q in ("a", "b", "c"):
            events += repeat_pairs("search", {"q": q}, 3, result=same)
    outputs = engine.replay([*events, call("search", {"q": "a"})])
    # Each variant's first call is not a no-progress repeat, so the walk back stops at
    # the first round's c: 9 calls of the second round and 2 of the first.
    assert decided(outputs)[-3:] == [
        ("warn", "argument_churn", 9),
        ("warn", "argument_churn", 10),
        ("warn", "argument_churn", 11),
    ]
    assert verdicts(outputs)[-1].message == msg_churn("search", 3, 11)
    assert events_of(outputs) == [("warn", "argument_churn", 10, True)]
    # a new argument is a possible way out: no churn warning for it
    fresh = engine.replay([*events, call("search", {"q": "new"})])
    assert verdicts(fresh)[-1].action == "allow"


# -- per-tool rules ------------------------------------------------------------------


def test_an_exempt_tool_is_never_counted_or_judged() -> None:
    engine = rules_engine(
        {"tools": {"read": {"exempt": True}}}, warningThreshold=2, criticalThreshold=3
    )
    state, outputs = fold(engine, stuck_read(5))
    assert {v.action for v in verdicts(outputs)} == {"allow"}
    assert state.history == []
    # an exempt tool between two calls does not break a ping-pong
    outputs = engine.replay(
        pair("a", {})
        + pair("read", {})
        + pair("b", {})
        + pair("read", {})
        + pair("a", {})
        + [call("b", {})]
    )
    assert decided(outputs)[-1] == ("block", "ping_pong", 4)


def test_a_tool_with_its_own_thresholds() -> None:
    engine = rules_engine({"tools": {"exec": {"warningThreshold": 2, "criticalThreshold": 3}}})
    outputs = engine.replay(
        [
            *repeat_pairs("exec", {"c": 1}, 3),
            call("exec", {"c": 1}),
            *repeat_pairs("read", {"p": 1}, 3),
            call("read", {"p": 1}),
        ]
    )
    assert decided(outputs)[:4] == [
        ("allow", None, 0),
        ("allow", None, 0),
        ("warn", "generic_repeat", 2),
        ("block", "generic_repeat", 3),
    ]
    assert {v.action for v in verdicts(outputs)[4:]} == {"allow"}
    assert loop_events(outputs)[0].config["critical_threshold"] == 3


def test_per_tool_thresholds_are_clamped_into_order() -> None:
    engine = rules_engine({"tools": {"exec": {"criticalThreshold": 5}}}, warningThreshold=8)
    outputs = engine.replay([*repeat_pairs("exec", {"c": 1}, 9), call("exec", {"c": 1})])
    assert decided(outputs)[-1] == ("block", "generic_repeat", 9)  # critical 5 -> 9


def test_an_agent_adds_a_tool_rule_to_the_global_ones() -> None:
    engine = rules_engine(
        {"tools": {"read": {"exempt": True}}},
        warningThreshold=2,
        criticalThreshold=3,
        agents=[{"id": "a", "loopfuse": {"rules": {"tools": {"exec": {"exempt": True}}}}}],
    )
    for tool in ("read", "exec"):
        outputs = engine.replay(repeat_pairs(tool, {}, 4, agent="a"))
        assert {v.action for v in verdicts(outputs)} == {"allow"}
    assert "block" in [v.action for v in verdicts(engine.replay(repeat_pairs("exec", {}, 4)))]


# -- run caps and budgets ------------------------------------------------------------


def test_a_run_warns_near_its_call_cap_and_ends_past_it() -> None:
    engine = Engine(parse_config({"loopfuse": {"rules": {"runCaps": {"maxToolCalls": 5}}}}))
    outputs = engine.replay([e for n in range(6) for e in pair("read", {"n": n})])
    assert decided(outputs) == [("allow", None, 0)] * 3 + [
        ("warn", "run_call_cap", 4),
        ("warn", "run_call_cap", 5),
        ("block", "run_call_cap", 6),
        ("abort", "run_call_cap", 6),
    ]
    assert verdicts(outputs)[3].message == (
        "WARNING: this run has made 4 of its 5 allowed tool calls. Finish the task or report "
        "it as failed before the cap ends the run."
    )
    assert verdicts(outputs)[-1].message == (
        "CRITICAL: this run reached its cap of 5 tool calls. Ending this run to prevent "
        "runaway resource use."
    )
    assert events_of(outputs) == [("abort", "run_call_cap", 6, True)]


def test_the_warning_fraction_is_exact() -> None:
    engine = Engine(
        parse_config({"loopfuse": {"rules": {"runCaps": {"maxToolCalls": 10, "warnAt": 0.7}}}})
    )
    outputs = engine.replay([e for n in range(7) for e in pair("read", {"n": n})])
    assert decided(outputs)[-2:] == [("allow", None, 0), ("warn", "run_call_cap", 7)]


def spend(tokens: int, cost: float, n: int, **kwargs: Any) -> list[Any]:
    return [
        call("llm", {"n": n}, call_id=f"c{n}", **kwargs),
        result(
            "llm",
            {"n": n},
            call_id=f"c{n}",
            **kwargs,
            usage={"input_tokens": tokens - 10, "output_tokens": 10, "cost": cost},
        ),
    ]


def test_a_token_budget_per_run_warns_then_aborts() -> None:
    engine = Engine(
        parse_config({"loopfuse": {"rules": {"runCaps": {"tokensPerRun": 1000, "warnAt": 0.5}}}})
    )
    events = [e for n in range(4) for e in spend(300, 0.01, n)] + [call("llm", {"n": 9})]
    outputs = engine.replay(events)
    assert decided(outputs) == [
        ("allow", None, 0),
        ("allow", None, 0),
        ("warn", "token_budget", 60),
        ("warn", "token_budget", 90),
        ("block", "token_budget", 120),
        ("abort", "token_budget", 120),
    ]
    assert verdicts(outputs)[2].message == (
        "WARNING: this run has used 600 tokens of its budget of 1000 (60%). Finish the task "
        "or report it as failed before the budget ends the run."
    )
    assert verdicts(outputs)[-1].message == (
        "CRITICAL: this run has used 1200 tokens of its budget of 1000. Ending this run to "
        "prevent runaway resource use."
    )


def test_a_cost_budget_per_session_spans_runs() -> None:
    engine = Engine(parse_config({"loopfuse": {"rules": {"runCaps": {"costPerSession": 0.05}}}}))
    events = [e for n in range(3) for e in spend(100, 0.02, n, run=f"r{n}")]
    outputs = engine.replay([*events, call("llm", {}, run="r9")])
    assert decided(outputs)[-2:] == [("block", "cost_budget", 120), ("abort", "cost_budget", 120)]
    assert verdicts(outputs)[-1].message == (
        "CRITICAL: this session has used 0.06 of its cost budget of 0.05. Ending this run "
        "to prevent runaway resource use."
    )


def test_usage_is_ignored_without_run_caps_and_by_v1_consumers() -> None:
    events = [e for n in range(3) for e in spend(10_000, 5.0, n)]
    assert decided(Engine().replay(events)) == [("allow", None, 0)] * 3
    assert b"usage" in msgspec.json.encode(events[1])


def test_a_shadow_cap_changes_no_verdict() -> None:
    engine = Engine(
        parse_config({"loopfuse": {"rules": {"runCaps": {"maxToolCalls": 2, "shadow": True}}}})
    )
    outputs = engine.replay([e for n in range(4) for e in pair("read", {"n": n})])
    assert {v.action for v in verdicts(outputs)} == {"allow"}
    assert events_of(outputs) == [
        ("block", "run_call_cap", 3, False),
        ("block", "run_call_cap", 4, False),
    ]


def test_global_shadow_mode_reports_rules_as_not_enforced() -> None:
    engine = rules_engine({"runCaps": {"maxToolCalls": 2}}, enforce=False)
    outputs = engine.replay([e for n in range(3) for e in pair("read", {"n": n})])
    assert {v.action for v in verdicts(outputs)} == {"allow"}
    assert events_of(outputs) == [("block", "run_call_cap", 3, False)]


# -- state, redelivery, config errors --------------------------------------------------


def fold(
    engine: Engine, events: list[Any], state: SessionState | None = None
) -> tuple[SessionState, list[Any]]:
    outputs: list[Any] = []
    for event in events:
        state, out = engine.step(state, event, event.ts)
        outputs += out
    assert state is not None
    return state, outputs


def test_rule_counts_survive_the_state_bytes() -> None:
    engine = rules_engine(
        {"runEnding": {}, "repeatedFailure": {}, "runCaps": {"tokensPerSession": 10_000}},
        warningThreshold=2,
        criticalThreshold=3,
    )
    events = (
        spend(500, 0.5, 1)
        + failing_fetch(2)
        + repeat_pairs("read", {"p": 1}, 3)
        + [call("read", {"p": 1})]
    )
    state, _ = fold(engine, events)
    restored = state_codec.decode(state_codec.encode(state))
    assert restored.rules == state.rules
    _, outputs = fold(engine, [call("read", {"p": 1})], restored)
    assert decided(outputs)[-1] == ("abort", "tool_loop_run_ended", 2)


def test_a_session_no_rule_touched_keeps_its_old_bytes() -> None:
    events = repeat_pairs("read", {"p": 1}, 4)
    with_rules, _ = fold(rules_engine({"cycle": {}}), events)
    without, _ = fold(rules_engine({}), events)
    assert with_rules.rules is not None  # the call tally
    with_rules.rules = None
    assert state_codec.encode(with_rules) == state_codec.encode(without)


def test_a_redelivered_call_gets_the_rule_verdict_again() -> None:
    engine = rules_engine({"repeatedFailure": {}})
    last = call("fetch", {"url": "x"})
    state, first = fold(engine, [*failing_fetch(5), last])
    _, again = fold(engine, [last], state)
    assert [(v.action, v.message) for v in verdicts(again)] == [
        ("block", msg_failure("critical", "fetch", 5))
    ]
    assert verdicts(first)[-1].verdict_id == verdicts(again)[0].verdict_id


def test_a_blocked_result_does_not_end_a_failure_streak() -> None:
    engine = rules_engine({"repeatedFailure": {}})
    blocked = pair("fetch", {"url": "x"}, result=LOOP_BLOCK_RESULT)
    outputs = engine.replay(failing_fetch(5) + blocked + [call("fetch", {"url": "y"})])
    assert decided(outputs)[-1] == ("block", "repeated_failure", 5)


@pytest.mark.parametrize(
    ("rules", "error"),
    [
        (
            {"runEnding": {"criticalsPerRun": 0}},
            "loopfuse.rules.runEnding.criticalsPerRun: must be a positive integer (got 0)",
        ),
        (
            {"cycle": {"maxPeriod": 6}},
            "loopfuse.rules.cycle.maxPeriod: Input should be less than or equal to 5",
        ),
        (
            {"repeatedFailure": {"warningThreshold": 5, "criticalThreshold": 5}},
            "loopfuse.rules.repeatedFailure: warningThreshold must be lower than criticalThreshold",
        ),
        (
            {"runCaps": {"warnAt": 1}},
            "loopfuse.rules.runCaps.warnAt: must be a number between 0 and 1 (both excluded) (got 1)",
        ),
        (
            {"runCaps": {"costPerRun": "5"}},
            "loopfuse.rules.runCaps.costPerRun: must be a positive number (got '5')",
        ),
        (
            {"tools": {"exec": {"exempt": "yes"}}},
            "loopfuse.rules.tools.exec.exempt: Input should be a valid boolean",
        ),
        ({"tools": {"exec": {"limit": 3}}}, "loopfuse.rules.tools.exec.limit: unknown key"),
        ({"cycles": {}}, "loopfuse.rules.cycles: unknown key"),
    ],
)
def test_config_errors_name_their_key_path(rules: dict[str, Any], error: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({"loopfuse": {"rules": rules}})
    assert str(caught.value) == error


def test_agent_rule_errors_name_their_key_path() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(
            {
                "agents": {
                    "list": [{"id": "a", "loopfuse": {"rules": {"runCaps": {"maxToolCalls": -1}}}}]
                }
            }
        )
    assert str(caught.value) == (
        "agents.list[0].loopfuse.rules.runCaps.maxToolCalls: must be a positive integer (got -1)"
    )


# -- the gateway client --------------------------------------------------------------


async def test_the_gateway_answers_the_call_with_the_block_and_ends_the_run() -> None:
    import asyncio

    from loopfuse.streams.gateway.client import GatewayClient, _Pending

    client = GatewayClient("localhost:1")  # never started: verdicts are handed in directly
    engine = rules_engine({"runEnding": {}}, warningThreshold=2, criticalThreshold=3)
    events = [*repeat_pairs("read", {"p": 1}, 3), call("read", {"p": 1})]
    # the call the gateway waits on, as this client numbers it
    last = msgspec.structs.replace(call("read", {"p": 1}, seq=0), incarnation=client.incarnation)
    state, _ = fold(engine, events)
    _, outputs = fold(engine, [last], state)
    block, abort = verdicts(outputs)
    assert (block.action, abort.action, abort.detector) == ("block", "abort", "tool_loop_run_ended")

    waiting: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    client._pending[("s1", last.call_id)] = _Pending(waiting, 0, last.incarnation, block.args_hash)
    aborted: list[Any] = []
    client.on_abort("s1", "r1", aborted.append)
    # what the session would have noted when it published the call
    client._watched[("s1", "r1")].note(
        {"incarnation": last.incarnation, "seq": 0, "call_id": last.call_id}
    )
    for verdict in (block, abort, abort):  # the abort redelivered: it fires once
        client._deliver(verdict.to_json())
    assert waiting.result().action == "block"
    assert [(v.detector, v.message) for v in aborted] == [("tool_loop_run_ended", abort.message)]


# -- the documentation ---------------------------------------------------------------

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "rules"


@pytest.mark.parametrize(
    ("name", "detector", "enforced"),
    [
        ("run-ending", "tool_loop_run_ended", True),
        ("cycle", "cycle", True),
        ("repeated-failure", "repeated_failure", True),
        ("argument-churn", "argument_churn", True),
        ("per-tool", "generic_repeat", True),
        ("run-caps", "token_budget", True),
        ("shadow", "repeated_failure", False),
        ("volatile-results", "generic_repeat", True),
        ("identical-calls", "identical_calls", True),
    ],
)
def test_each_example_shows_its_rule(name: str, detector: str, enforced: bool) -> None:
    from loopfuse.schemas import decode_event, load_config

    engine = Engine(load_config(EXAMPLES / f"{name}.json5"))
    lines = (EXAMPLES / f"{name}.jsonl").read_text().splitlines()
    outputs = engine.replay([decode_event(line.encode()) for line in lines])
    assert (detector, enforced) in [(e.detector, e.enforced) for e in loop_events(outputs)]


def test_every_rules_example_in_the_docs_is_valid() -> None:
    import re

    import json5

    docs = (EXAMPLES.parents[1] / "docs" / "configuration.md").read_text()
    section = docs[docs.index("## Rules beyond") : docs.index("## Worker settings")]
    blocks = re.findall(r"```json5\n(.*?)```", section, re.S)
    assert len(blocks) == 9
    for block in blocks:
        assert parse_config(json5.loads(block)).loopfuse.rules is not None


def test_config_check_shows_the_rules_each_agent_gets() -> None:
    import io

    from loopfuse.streams.ops.config_check import render_check

    config = parse_config(
        {
            "loopfuse": {"rules": {"runEnding": {}, "tools": {"read": {"exempt": True}}}},
            "agents": {"list": [{"id": "a", "loopfuse": {"rules": {"cycle": {"shadow": True}}}}]},
        }
    )
    out = io.StringIO()
    render_check(config, "c.json5", "a", out)
    assert [line.strip() for line in out.getvalue().splitlines() if "rule " in line] == [
        "rule runEnding: enforced (criticalsPerRun=2, blockedStreak=3)",
        "rule cycle: shadow (maxPeriod=5)",
        "rule exempt tools: read",
    ]


def test_fit_sheds_the_oldest_run_tallies_before_remembered_verdicts() -> None:
    from loopfuse.streams.engine.rule_state import MAX_RUN_TALLIES

    engine = rules_engine({"runCaps": {"maxToolCalls": 100}})
    events = [call("read", {"n": n}, run=f"run-{n}") for n in range(MAX_RUN_TALLIES + 5)]
    state, _ = fold(engine, events)
    assert state.rules is not None and len(state.rules.runs) == MAX_RUN_TALLIES
    state.history.clear()
    size = len(state_codec.encode(state))
    state_codec.fit(state, size - 1)
    assert 0 < len(state.rules.runs) < MAX_RUN_TALLIES


# -- volatile results and identical calls ----------------------------------------------


def build(attempt: int) -> dict[str, Any]:
    """A failed build's exec result: the same failure, a new time and duration each time."""
    text = (
        f"[2026-12-01T10:00:{attempt:02d}Z] make: *** [app] Error 1 (pid {4000 + attempt})\n"
        f"failed after {1 + attempt * 0.37:.2f}s"
    )
    return {"details": {"status": "completed", "exitCode": 2, "aggregated": text}}


def retried_build(times: int, tool: str = "exec") -> list[Any]:
    return [
        event
        for attempt in range(times)
        for event in pair(tool, {"command": "make"}, result=build(attempt))
    ]


def test_a_retried_build_whose_output_only_changes_in_times_is_blocked() -> None:
    loop = {"warningThreshold": 3, "criticalThreshold": 5}
    without = rules_engine({}, **loop).replay(retried_build(6))
    assert "block" not in [v.action for v in verdicts(without)]  # OpenClaw's verdicts
    masked = rules_engine({"volatileResults": {}}, **loop).replay(retried_build(6))
    assert decided(masked)[-1] == ("block", "generic_repeat", 5)
    assert verdicts(masked)[-1].message == (
        "CRITICAL: Called exec with identical arguments and identical outcomes 5 times. "
        "Session execution blocked to prevent runaway loops."
    )


def test_volatile_results_mask_only_the_tools_in_scope() -> None:
    loop = {"warningThreshold": 3, "criticalThreshold": 5}
    engine = rules_engine({"volatileResults": {"tools": ["bash"]}}, **loop)
    assert "block" not in [v.action for v in verdicts(engine.replay(retried_build(6)))]
    assert decided(engine.replay(retried_build(6, "bash")))[-1][0] == "block"


def test_a_result_that_really_changes_is_progress_under_volatile_results() -> None:
    loop = {"warningThreshold": 3, "criticalThreshold": 5}
    pages = [
        event
        for page in range(8)
        for event in pair(
            "exec",
            {"command": "tail -n 3 build.log"},
            result={"content": [{"type": "text", "text": f"step {page} of 40 done in 0.{page}s"}]},
        )
    ]
    outputs = rules_engine({"volatileResults": {}}, **loop).replay(pages)
    assert "block" not in [v.action for v in verdicts(outputs)]


def test_volatile_results_have_no_shadow_mode() -> None:
    with pytest.raises(ConfigError, match="volatileResults has no shadow mode"):
        parse_config({"loopfuse": {"rules": {"volatileResults": {"shadow": True}}}})
    with pytest.raises(ConfigError, match="prefix"):
        parse_config(
            {
                "loopfuse": {
                    "rules": {"volatileResults": {"patterns": [{"prefix": "", "chars": "hex"}]}}
                }
            }
        )


def polls(times: int, tool: str = "queue_depth") -> list[Any]:
    """The same call ``times`` times, each result different (a depth that keeps moving)."""
    return [
        event
        for n in range(times)
        for event in pair(
            tool, {"queue": "orders"}, result={"content": [{"type": "text", "text": f"{n}"}]}
        )
    ]


IDENTICAL_5 = (
    "CRITICAL: You have called queue_depth 5 times in a row with identical arguments. "
    "Session execution blocked to prevent runaway loops."
)


def test_identical_calls_are_warned_and_blocked_whatever_the_results() -> None:
    engine = rules_engine({"identicalCalls": {"warningThreshold": 3, "criticalThreshold": 5}})
    outputs = engine.replay(polls(7))
    assert decided(outputs) == [
        ("allow", None, 0),
        ("allow", None, 0),
        ("allow", None, 0),
        ("warn", "identical_calls", 3),
        ("warn", "identical_calls", 4),
        ("block", "identical_calls", 5),
        ("block", "identical_calls", 6),
    ]
    assert verdicts(outputs)[5].message == IDENTICAL_5
    assert verdicts(outputs)[3].message == (
        "WARNING: You have called queue_depth 3 times in a row with identical arguments. "
        "If this is not making progress, stop retrying and report the task as failed."
    )
    assert events_of(outputs)[0] == ("block", "identical_calls", 5, True)


def test_another_call_or_another_run_starts_the_identical_count_again() -> None:
    engine = rules_engine({"identicalCalls": {"warningThreshold": 3, "criticalThreshold": 5}})
    events = [*polls(4), *pair("read", {"p": 1}), *polls(4), *polls(2)]
    other_run = [call("queue_depth", {"queue": "orders"}, run="r2")]
    actions = [a for a, _, _ in decided(engine.replay(events + other_run))]
    assert actions == [
        *("allow", "allow", "allow", "warn"),
        "allow",  # read
        *("allow", "allow", "allow", "warn", "warn", "block"),
        "allow",  # another run
    ]


def test_identical_calls_in_shadow_are_only_reported() -> None:
    engine = rules_engine(
        {"identicalCalls": {"warningThreshold": 3, "criticalThreshold": 5, "shadow": True}}
    )
    outputs = engine.replay(polls(6))
    assert {v.action for v in verdicts(outputs)} == {"allow"}
    assert events_of(outputs) == [("block", "identical_calls", 5, False)]


def test_identical_call_streaks_round_trip_and_leave_other_states_as_they_were() -> None:
    streaks, _ = fold(rules_engine({"identicalCalls": {}}), polls(3))
    assert streaks.rules is not None and next(iter(streaks.rules.identical.values()))[1] == 3
    again = state_codec.decode(state_codec.encode(streaks))
    assert again.rules is not None and again.rules.identical == streaks.rules.identical
    caps, _ = fold(rules_engine({"runCaps": {"maxToolCalls": 100}}), polls(3))
    assert caps.rules is not None and not caps.rules.identical
    # no streaks: the rule trailer is version 1, as before the rule existed
    assert b"R\x01" in state_codec.encode(caps)


def test_volatile_results_mask_errors_but_not_a_gateway_hash() -> None:
    loop = {"warningThreshold": 3, "criticalThreshold": 5}
    engine = rules_engine({"volatileResults": {}}, **loop)
    timeouts = [
        event
        for n in range(6)
        for event in pair(
            "fetch",
            {"url": "u"},
            error=f"timeout after {30 + n}ms (request {n:08x}-1a2b-4c3d-9e8f-0123456789ab)",
        )
    ]
    assert decided(engine.replay(timeouts))[-1][0] == "block"
    hashed = [
        event for n in range(6) for event in pair("fetch", {"url": "u"}, result_hash=f"{n:032x}")
    ]
    assert "block" not in [v.action for v in verdicts(engine.replay(hashed))]
