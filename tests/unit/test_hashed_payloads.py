"""A gateway that hashes payloads locally gets exactly the verdicts raw payloads get."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from loopfuse.schemas import parse_config, validate_event
from loopfuse.streams.engine import Engine
from loopfuse.streams.engine.fingerprint import args_hash, result_token
from tests.unit.conftest import verdicts

CALLS: list[tuple[str, dict[str, Any], Any]] = [
    (
        "process",
        {"action": "poll", "sessionId": "p1"},
        {"details": {"status": "running", "pid": 1}},
    ),
    (
        "process",
        {"action": "log", "sessionId": "p1"},
        {"details": {"totalLines": 3}, "content": []},
    ),
    ("message", {"action": "send", "to": "#ops"}, {"details": {"messageId": "m1", "ok": True}}),
    ("message", {"action": "send", "to": "#ops"}, {"details": {"messageId": "m2", "ok": True}}),
    (
        "exec",
        {"command": "make"},
        {"details": {"status": "failed", "exitCode": 2, "durationMs": 5}},
    ),
    (
        "exec",
        {"command": "make"},
        {"details": {"status": "failed", "exitCode": 2, "durationMs": 9}},
    ),
    ("read", {"path": "/a"}, {"content": [{"type": "text", "text": "A"}]}),
    ("read", {"path": "/b"}, {"content": [{"type": "text", "text": "B"}]}),
]


def events(picks: list[int], hashed: bool) -> list[Any]:
    out = []
    for i, pick in enumerate(picks):
        tool, args, result = CALLS[pick]
        common = {
            "event_id": f"e{i}",
            "session_key": "s",
            "run_id": "r",
            "ts": i,
            "call_id": f"c{i}",
            "tool_name": tool,
        }
        if hashed:
            common |= {"args_hash": args_hash(args), "args_action": args.get("action")}
            outcome = {"result_hash": result_token(tool, args, result=result)}
        else:
            common |= {"args": args}
            outcome = {"result": result}
        out.append(validate_event({"type": "tool_call", **common}))
        result_event = {"type": "tool_result", **common, **outcome, "event_id": f"r{i}"}
        out.append(validate_event(result_event))
    return out


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, len(CALLS) - 1), min_size=1, max_size=40))
def test_hashed_and_raw_payloads_give_the_same_verdicts(picks: list[int]) -> None:
    config = parse_config(
        {
            "tools": {
                "loopDetection": {"enabled": True, "warningThreshold": 3, "criticalThreshold": 6}
            }
        }
    )

    def judged(hashed: bool) -> list[tuple[Any, ...]]:
        outputs = Engine(config).replay(events(picks, hashed))
        return [(v.action, v.detector, v.count, v.message, v.args_hash) for v in verdicts(outputs)]

    assert judged(hashed=True) == judged(hashed=False)


def test_the_scenario_exercises_polls_and_sends() -> None:
    config = parse_config(
        {
            "tools": {
                "loopDetection": {"enabled": True, "warningThreshold": 3, "criticalThreshold": 6}
            }
        }
    )
    # alternating message ids are volatile: still "no progress", so the sends block
    outputs = Engine(config).replay(events([2, 3] * 4 + [0] * 7, hashed=True))
    found = {(v.tool_name, v.action, v.detector) for v in verdicts(outputs)}
    assert ("message", "block", "generic_repeat") in found
    assert ("process", "block", "known_poll_no_progress") in found
