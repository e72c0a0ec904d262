"""Spec section 6, loop events: every critical, warnings once per bucket of ten per warning key."""

from __future__ import annotations

from loopfuse.schemas import parse_config
from loopfuse.streams.engine import Engine
from tests.unit.conftest import (
    call,
    engine_with,
    loop_events,
    repeat_pairs,
    run_ended,
    verdicts,
)


def test_every_critical_is_a_loop_event() -> None:
    engine = engine_with(warningThreshold=3, criticalThreshold=5)
    events = [*repeat_pairs("read", {}, 5), *[call("read", {}) for _ in range(3)]]
    outputs = engine.replay(events)
    blocks = [v for v in verdicts(outputs) if v.action == "block"]
    criticals = [e for e in loop_events(outputs) if e.level == "critical"]
    assert len(blocks) == len(criticals) == 3
    for block, event in zip(blocks, criticals, strict=True):
        assert (event.action, event.detector, event.count, event.message, event.call_id) == (
            block.action,
            block.detector,
            block.count,
            block.message,
            block.call_id,
        )


def test_warning_events_at_threshold_10_start_at_count_10() -> None:
    engine = engine_with(criticalThreshold=40, globalCircuitBreakerThreshold=50, historySize=50)
    outputs = engine.replay([call("read", {}) for _ in range(32)])
    warn_counts = [v.count for v in verdicts(outputs) if v.action == "warn"]
    assert warn_counts == list(range(10, 32))
    assert [(e.level, e.count) for e in loop_events(outputs)] == [
        ("warning", 10),
        ("warning", 20),
        ("warning", 30),
    ]


def test_warning_events_at_threshold_3_still_start_at_count_10() -> None:
    # The last published bucket starts at 0, so counts 3..9 (bucket 0) publish nothing.
    engine = engine_with(
        warningThreshold=3, criticalThreshold=40, globalCircuitBreakerThreshold=50, historySize=50
    )
    outputs = engine.replay([call("read", {}) for _ in range(22)])
    assert [v.count for v in verdicts(outputs) if v.action == "warn"] == list(range(3, 22))
    assert [e.count for e in loop_events(outputs)] == [10, 20]
    assert all(e.warning_key and e.detector == "generic_repeat" for e in loop_events(outputs))


def test_warning_keys_are_separate_per_args_and_per_run() -> None:
    engine = engine_with(
        warningThreshold=3, criticalThreshold=40, globalCircuitBreakerThreshold=50, historySize=60
    )
    events = [
        *[call("read", {"p": 1}) for _ in range(11)],
        *[call("read", {"p": 2}) for _ in range(11)],
        *[call("read", {"p": 1}, run="r2") for _ in range(11)],
    ]
    assert [(e.run_id, e.count) for e in loop_events(engine.replay(events))] == [
        ("r1", 10),
        ("r1", 10),
        ("r2", 10),
    ]


def test_at_most_256_warning_keys_per_session_oldest_dropped_first() -> None:
    def key_calls(k: int) -> list:
        return [call("read", {"k": k}) for _ in range(11)]  # the 11th warns with count 10

    def published_again(distinct_keys: int) -> bool:
        engine = engine_with(
            warningThreshold=3,
            criticalThreshold=40,
            globalCircuitBreakerThreshold=50,
            historySize=11,
        )
        first = [e for k in range(distinct_keys) for e in key_calls(k)]
        published = len(loop_events(engine.replay([*first, *key_calls(0)])))
        assert published in (distinct_keys, distinct_keys + 1)
        return published == distinct_keys + 1

    assert published_again(257)
    assert not published_again(256)


def test_loop_event_carries_the_resolved_config() -> None:
    engine = engine_with(warningThreshold=3, criticalThreshold=5)
    outputs = engine.replay([*repeat_pairs("read", {}, 5), call("read", {})])
    (event,) = loop_events(outputs)
    assert event.enforced is True
    assert event.config  # the resolved config in force travels with the audit event
    assert 5 in event.config.values() or any(
        isinstance(v, dict) and 5 in v.values() for v in event.config.values()
    )


def test_run_ended_forgets_the_run_warning_keys() -> None:
    engine = engine_with(
        warningThreshold=3, criticalThreshold=40, globalCircuitBreakerThreshold=50, historySize=11
    )
    calls = [call("read", {}) for _ in range(11)]
    again = [call("read", {}) for _ in range(11)]
    kept = engine.replay([*calls, *again])
    assert [e.count for e in loop_events(kept)] == [10]  # same key, bucket 1 already published
    freed = engine.replay([*calls, run_ended(), *again])
    # The records stay (count 11 right after run_ended), but bucket 1 is published again.
    assert [e.count for e in loop_events(freed)] == [10, 11]


def test_shadow_mode_allows_but_still_audits() -> None:
    doc = {
        "tools": {
            "loopDetection": {"enabled": True, "warningThreshold": 2, "criticalThreshold": 3}
        },
        "loopfuse": {"enforce": False},
    }
    outputs = Engine(parse_config(doc)).replay([*repeat_pairs("read", {}, 3), call("read", {})])
    assert {v.action for v in verdicts(outputs)} == {"allow"}
    (event,) = loop_events(outputs)
    assert (event.level, event.detector, event.enforced) == ("critical", "generic_repeat", False)
