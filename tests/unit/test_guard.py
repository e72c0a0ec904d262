"""Spec section 7: the post-compaction guard."""

from __future__ import annotations

from typing import Any

import pytest

from loopfuse.schemas import parse_config
from loopfuse.streams.engine import Engine
from tests.unit.conftest import (
    actions,
    call,
    compaction,
    engine_with,
    notices,
    pair,
    result,
    run_ended,
    verdicts,
)


def abort_message(tool: str, n: int, window: int) -> str:
    return (
        f"CRITICAL: tool {tool} repeated {n} times with identical arguments and identical "
        f"results within {window} attempts after auto-compaction. The compaction did not "
        "break the loop. Aborting to prevent runaway resource use."
    )


def aborts(outputs: list[Any]) -> list[Any]:
    return [v for v in verdicts(outputs) if v.action == "abort"]


def same_results(n: int, tool: str = "read", args: Any = None, **kw: Any) -> list[Any]:
    return [result(tool, {"p": 1} if args is None else args, result="same", **kw) for _ in range(n)]


def guard_engine(window: int | None = None, **loop: Any) -> Engine:
    block: dict[str, Any] = dict(loop)
    if window is not None:
        block["postCompactionGuard"] = {"windowSize": window}
    return Engine(parse_config({"tools": {"loopDetection": block}}))


def test_aborts_when_the_first_window_results_after_compaction_are_identical() -> None:
    engine = guard_engine()
    events = [
        compaction(),
        *same_results(2),
        result("read", {"p": 1}, result="same", call_id="c-last"),
    ]
    found = aborts(engine.replay(events))
    assert len(found) == 1
    v = found[0]
    assert (v.action, v.level, v.detector, v.count) == (
        "abort",
        "critical",
        "compaction_loop_persisted",
        3,
    )
    assert (v.tool_name, v.call_id, v.run_id) == ("read", "c-last", "r1")
    assert v.message == abort_message("read", 3, 3)


def test_not_before_window_results() -> None:
    assert aborts(guard_engine().replay([compaction(), *same_results(2)])) == []


def test_window_size_one_aborts_on_the_first_result() -> None:
    outputs = guard_engine(window=1).replay([compaction(), *same_results(1)])
    assert [(v.count, v.message) for v in aborts(outputs)] == [(1, abort_message("read", 1, 1))]


def test_window_size_from_config() -> None:
    outputs = guard_engine(window=5).replay([compaction(), *same_results(4)])
    assert aborts(outputs) == []
    outputs = guard_engine(window=5).replay([compaction(), *same_results(5)])
    assert [v.message for v in aborts(outputs)] == [abort_message("read", 5, 5)]


def test_changing_results_never_abort() -> None:
    events = [compaction(), *[result("read", {"p": 1}, result=f"v{i}") for i in range(6)]]
    assert aborts(guard_engine().replay(events)) == []


def test_window_is_the_first_results_after_compaction_only() -> None:
    # One different result uses up an attempt; the later identical run is outside the window.
    events = [compaction(), result("read", {"p": 1}, result="other"), *same_results(5)]
    assert aborts(guard_engine().replay(events)) == []


def test_args_and_tool_are_part_of_the_triple() -> None:
    events = [
        compaction(),
        result("read", {"p": 1}, result="x"),
        result("read", {"p": 2}, result="x"),
        result("stat", {"p": 1}, result="x"),
    ]
    assert aborts(guard_engine().replay(events)) == []


def test_results_while_not_armed_are_ignored() -> None:
    assert aborts(guard_engine().replay(same_results(10))) == []


def test_results_before_compaction_do_not_count() -> None:
    events = [*same_results(2), compaction(), *same_results(2)]
    assert aborts(guard_engine().replay(events)) == []


def test_rearming_resets_the_window() -> None:
    rearmed = [compaction(), *same_results(2), compaction(), *same_results(2)]
    assert aborts(guard_engine().replay(rearmed)) == []
    assert len(aborts(guard_engine().replay([*rearmed, *same_results(1)]))) == 1


def test_results_without_fingerprint_are_not_fed() -> None:
    loop_block = {"content": [], "details": {"status": "blocked", "deniedReason": "tool-loop"}}
    events = [
        compaction(),
        *[result("read", {"p": 1}, result=loop_block) for _ in range(3)],
        *[result("read", {"p": 1}, result=None) for _ in range(3)],
    ]
    assert aborts(guard_engine().replay(events)) == []


def test_guard_is_per_run() -> None:
    events = [compaction(run="r1"), *same_results(3, run="r2")]
    assert aborts(guard_engine().replay(events)) == []


def test_guard_works_from_call_and_result_pairs_and_errors() -> None:
    events = [compaction(), *[e for _ in range(3) for e in pair("exec", {"c": 1}, error="boom")]]
    outputs = guard_engine().replay(events)
    assert [v.tool_name for v in aborts(outputs)] == ["exec"]
    assert actions(outputs).count("abort") == 1


@pytest.mark.parametrize(
    "engine_factory",
    [
        pytest.param(lambda: Engine(), id="no-config-file"),
        pytest.param(lambda: Engine(parse_config({"gateway": {"port": 1}})), id="no-loop-block"),
        pytest.param(lambda: guard_engine(historySize=5), id="enabled-unset"),
        pytest.param(lambda: engine_with(), id="enabled-true"),
    ],
)
def test_guard_is_on_unless_enabled_is_explicitly_false(engine_factory: Any) -> None:
    outputs = engine_factory().replay([compaction(), *same_results(3)])
    assert len(aborts(outputs)) == 1
    assert [n.message for n in notices(outputs)] == ["post-compaction guard armed for 3 attempts"]


def test_guard_off_when_enabled_is_false() -> None:
    outputs = guard_engine(enabled=False).replay([compaction(), *same_results(5)])
    assert aborts(outputs) == []
    # spec reading: a guard that is off is never armed, so there is nothing to log.
    assert not any("armed" in n.message for n in notices(outputs))


def test_per_agent_disable_and_window() -> None:
    engine = Engine(
        parse_config(
            {
                "agents": {
                    "list": [
                        {"id": "off", "tools": {"loopDetection": {"enabled": False}}},
                        {
                            "id": "one",
                            "tools": {"loopDetection": {"postCompactionGuard": {"windowSize": 1}}},
                        },
                    ]
                }
            }
        )
    )
    off = engine.replay(
        [compaction(agent="off", session="a"), *same_results(3, agent="off", session="a")]
    )
    assert aborts(off) == []
    one = engine.replay(
        [compaction(agent="one", session="b"), *same_results(1, agent="one", session="b")]
    )
    assert len(aborts(one)) == 1
    assert [n.message for n in notices(one)] == ["post-compaction guard armed for 1 attempts"]


def test_notice_on_every_arming() -> None:
    outputs = guard_engine(window=4).replay([compaction(), compaction(reason="timeout")])
    assert [n.message for n in notices(outputs)] == [
        "post-compaction guard armed for 4 attempts"
    ] * 2


def test_guard_does_not_change_call_verdicts() -> None:
    outputs = guard_engine().replay([compaction(), call("read", {"p": 1}), *same_results(3)])
    assert actions(outputs) == ["allow", "abort"]


def test_abort_is_a_loop_event() -> None:
    outputs = guard_engine().replay([compaction(), *same_results(3)])
    events = [o for o in outputs if getattr(o, "type", None) == "loop_event"]
    assert [(e.action, e.detector, e.count) for e in events] == [
        ("abort", "compaction_loop_persisted", 3)
    ]


def test_run_ended_disarms_the_guard() -> None:
    events = [compaction(), *same_results(1), run_ended(), *same_results(2)]
    assert aborts(guard_engine().replay(events)) == []
