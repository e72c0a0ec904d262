"""Invariants of the engine as a fold of each session's events (hypothesis)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from loopfuse.schemas import parse_config, validate_event
from loopfuse.streams.engine import Engine, SessionState, state_codec
from loopfuse.streams.engine.rule_state import RuleState
from tests.unit.conftest import comparable, verdicts

TOOLS = [
    ("read", {"p": 1}),
    ("read", {"p": 2}),
    ("list", {"d": 1}),
    ("command_status", {"id": 1}),
    ("process", {"action": "poll", "sessionId": "x"}),
]
OUTCOMES: list[dict[str, Any]] = [
    {"result": {"content": [{"type": "text", "text": "same"}], "details": {}}},
    {"result": {"content": [{"type": "text", "text": "other"}], "details": {}}},
    {"error": "Unknown tool: ghost"},
    {"result_hash": "h1"},
    {"result": None},
]
SMALL = {
    "enabled": True,
    "historySize": 6,
    "warningThreshold": 2,
    "criticalThreshold": 3,
    "globalCircuitBreakerThreshold": 4,
    "unknownToolThreshold": 2,
    "postCompactionGuard": {"windowSize": 2},
}

# An op is (kind, tool index, outcome index, run index); "pair" is a call and its result.
# Indices are skewed towards the first tool and outcome so that loops actually form.
_skewed = st.sampled_from([0, 0, 0, 0, 1, 1, 2, 3, 4])
ops_strategy = st.lists(
    st.tuples(
        st.sampled_from(["pair", "pair", "pair", "call", "result", "compaction", "run_ended"]),
        _skewed.filter(lambda i: i < len(TOOLS)),
        _skewed,
        st.sampled_from([0, 0, 0, 1]),
    ),
    max_size=15,  # at most 30 events: fewer than the 32 the engine parks before skipping
)
kinds_strategy = ops_strategy.map(lambda ops: [op for op in ops if op[0] != "run_ended"])


def build(
    ops: list[tuple[str, int, int, int]], *, with_seq: bool = True, session: str = "s1"
) -> list[Any]:
    """Deterministic events: ids, ts and seq follow the op index; results answer the latest
    call of the same tool and args, or are orphans."""
    events: list[Any] = []
    open_calls: dict[tuple[int, int], str] = {}
    expanded = [
        (k, *rest)
        for kind, *rest in ops
        for k in (["call", "result"] if kind == "pair" else [kind])
    ]
    for i, (kind, tool_ix, outcome_ix, run_ix) in enumerate(expanded):
        data: dict[str, Any] = {
            "type": kind,
            "event_id": f"{session}-e{i}",
            "ts": 1000 + i,
            "session_key": session,
            "run_id": f"r{run_ix}",
        }
        if with_seq:
            data["seq"] = i
        tool, args = TOOLS[tool_ix]
        if kind == "call":
            data.update(type="tool_call", call_id=f"c{i}", tool_name=tool, args=args)
            open_calls[(tool_ix, run_ix)] = f"c{i}"
        elif kind == "result":
            call_id = open_calls.pop((tool_ix, run_ix), f"orphan{i}")
            data.update(
                type="tool_result",
                call_id=call_id,
                tool_name=tool,
                args=args,
                **OUTCOMES[outcome_ix],
            )
        events.append(validate_event(data))
    return events


def small_engine(**overrides: Any) -> Engine:
    return Engine(parse_config({"tools": {"loopDetection": {**SMALL, **overrides}}}))


def fold(
    engine: Engine, events: list[Any], state: SessionState | None = None
) -> tuple[SessionState | None, list[Any]]:
    outputs: list[Any] = []
    for event in events:
        state, out = engine.step(state, event, event.ts)
        outputs += out
    return state, outputs


@settings(max_examples=250, deadline=None)
@given(ops_strategy, ops_strategy, st.booleans())
def test_replay_twice_gives_the_same_outputs(ops1: Any, ops2: Any, with_seq: bool) -> None:
    events = build(ops1, with_seq=with_seq) + build(ops2, with_seq=with_seq, session="s2")
    first = [comparable(o) for o in small_engine().replay(events)]
    second = [comparable(o) for o in small_engine().replay(events)]
    assert first == second
    call_verdicts = [v for v in verdicts(small_engine().replay(events)) if v.action != "abort"]
    assert len(call_verdicts) == sum(1 for e in events if e.type == "tool_call")


@settings(max_examples=300, deadline=None)
@given(kinds_strategy, st.data())
def test_any_interleaving_that_keeps_each_kind_in_order_gives_the_same_verdicts(
    ops: Any, data: Any
) -> None:
    events = build(ops)
    queues: dict[str, list[Any]] = {"tool_call": [], "tool_result": [], "compaction": []}
    for event in events:
        queues[event.type].append(event)
    order = data.draw(st.permutations([e.type for e in events]))
    shuffled = [queues[kind].pop(0) for kind in order]

    def as_sorted(outputs: list[Any]) -> list[Any]:
        return sorted((comparable(v) for v in verdicts(outputs)), key=repr)

    assert as_sorted(small_engine().replay(shuffled)) == as_sorted(small_engine().replay(events))


@settings(max_examples=250, deadline=None)
@given(ops_strategy, st.integers(1, 5), st.booleans())
def test_history_never_exceeds_history_size(ops: Any, size: int, with_seq: bool) -> None:
    engine = small_engine(historySize=size)
    state = None
    for event in build(ops, with_seq=with_seq):
        state, _ = engine.step(state, event, event.ts)
        assert len(state.history) <= size


@settings(max_examples=250, deadline=None)
@given(ops_strategy.filter(bool), st.data(), st.booleans())
def test_a_duplicate_event_changes_nothing(ops: Any, data: Any, with_seq: bool) -> None:
    engine = small_engine()
    events = build(ops, with_seq=with_seq)
    cut = data.draw(st.integers(1, len(events)), label="cut")
    state, outputs = fold(engine, events[:cut])
    assert state is not None
    seen = {(v.verdict_id, v.action) for v in verdicts(outputs)}
    duplicate = events[data.draw(st.integers(0, cut - 1), label="duplicate")]
    before = state_codec.encode(state)
    state, again = engine.step(state, duplicate, duplicate.ts + 5)
    assert state_codec.encode(state) == before
    assert {(v.verdict_id, v.action) for v in verdicts(again)} <= seen


@settings(max_examples=250, deadline=None)
@given(ops_strategy, ops_strategy, st.booleans())
def test_state_round_trips_through_bytes(prefix: Any, rest: Any, with_seq: bool) -> None:
    engine = small_engine()
    events = build(prefix + rest, with_seq=with_seq)
    state, _ = fold(engine, events[: len(prefix)])
    state = state or SessionState()
    raw = state_codec.encode(state)
    restored = state_codec.decode(raw)
    assert state_codec.encode(restored) == raw
    original_end, original_out = fold(engine, events[len(prefix) :], state)
    restored_end, restored_out = fold(engine, events[len(prefix) :], restored)
    assert [comparable(o) for o in restored_out] == [comparable(o) for o in original_out]
    assert restored_end is not None and original_end is not None
    assert state_codec.encode(restored_end) == state_codec.encode(original_end)


def test_round_trip_keeps_a_sticky_block() -> None:
    engine = small_engine()
    ops = [("call", 0, 0, 0), ("result", 0, 0, 0)] * 3 + [("call", 0, 0, 0)]
    state, outputs = fold(engine, build(ops, with_seq=False))
    assert verdicts(outputs)[-1].action == "block"
    restored = state_codec.decode(state_codec.encode(state))  # type: ignore[union-attr]
    again = validate_event(
        {
            "type": "tool_call",
            "event_id": "later",
            "ts": 5000,
            "session_key": "s1",
            "run_id": "r0",
            "call_id": "c-later",
            "tool_name": "read",
            "args": {"p": 1},
        }
    )
    _, out = engine.step(restored, again, again.ts)
    assert [(v.action, v.count) for v in verdicts(out)] == [("block", 3)]


# Issue 14's rules are opt-in: configured but disabled, they change nothing at all; only
# reported (shadow), they add loop events with enforced=false and change no verdict.
RULES_OFF = {
    name: {"enabled": False}
    for name in ("runEnding", "cycle", "repeatedFailure", "argumentChurn", "runCaps")
}
RULES_SHADOW = {
    "runEnding": {"shadow": True},
    "cycle": {"shadow": True},
    "repeatedFailure": {"shadow": True, "warningThreshold": 1, "criticalThreshold": 2},
    "argumentChurn": {"shadow": True},
    "runCaps": {"shadow": True, "maxToolCalls": 4, "tokensPerRun": 5, "warnAt": 0.5},
}


def rules_engine(rules: dict[str, Any]) -> Engine:
    return Engine(parse_config({"tools": {"loopDetection": SMALL}, "loopfuse": {"rules": rules}}))


@settings(max_examples=200, deadline=None)
@given(ops_strategy, st.booleans())
def test_disabled_rules_change_no_output(ops: Any, with_seq: bool) -> None:
    events = build(ops, with_seq=with_seq)
    expected = [comparable(o) for o in small_engine().replay(events)]
    assert [comparable(o) for o in rules_engine(RULES_OFF).replay(events)] == expected


@settings(max_examples=200, deadline=None)
@given(ops_strategy, st.booleans())
def test_shadow_rules_change_no_verdict(ops: Any, with_seq: bool) -> None:
    events = build(ops, with_seq=with_seq)
    plain = small_engine().replay(events)
    shadow = rules_engine(RULES_SHADOW).replay(events)
    assert [comparable(v) for v in verdicts(shadow)] == [comparable(v) for v in verdicts(plain)]
    rule_events = [
        o
        for o in shadow
        if getattr(o, "type", None) == "loop_event" and o not in plain and not o.enforced
    ]
    others = [comparable(o) for o in shadow if o not in rule_events]
    assert others == [comparable(o) for o in plain]


RULES_ENFORCED = {
    name: {key: value for key, value in rule.items() if key != "shadow"}
    for name, rule in RULES_SHADOW.items()
}


@settings(max_examples=200, deadline=None)
@given(ops_strategy, ops_strategy, st.booleans())
def test_state_with_rules_round_trips_through_bytes(prefix: Any, rest: Any, with_seq: bool) -> None:
    engine = rules_engine(RULES_ENFORCED)
    events = build(prefix + rest, with_seq=with_seq)
    state, _ = fold(engine, events[: len(prefix)])
    state = state or SessionState()
    restored = state_codec.decode(state_codec.encode(state))
    assert (restored.rules or RuleState()) == (state.rules or RuleState())  # empty: not written
    _, original_out = fold(engine, events[len(prefix) :], state)
    _, restored_out = fold(engine, events[len(prefix) :], restored)
    assert [comparable(o) for o in restored_out] == [comparable(o) for o in original_out]
