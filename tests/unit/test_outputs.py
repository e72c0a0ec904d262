"""The engine's verdicts and loop events are the wire models, published in their field order."""

from __future__ import annotations

import orjson

from schemas import LoopEvent as WireLoopEvent
from schemas import Verdict as WireVerdict
from streams.engine import LoopEvent, Verdict
from tests.unit.conftest import call, engine_with, result


def test_the_engine_outputs_are_the_wire_models() -> None:
    assert Verdict is WireVerdict and LoopEvent is WireLoopEvent


def test_engine_outputs_validate_against_the_wire_models() -> None:
    engine = engine_with(warningThreshold=2, criticalThreshold=3)
    events = []
    for i in range(4):
        events.append(call("exec", {"command": "ls"}, call_id=f"c{i}"))
        events.append(result("exec", {"command": "ls"}, call_id=f"c{i}", result={"content": []}))
    outputs = engine.replay(events)
    kinds = set()
    for output in outputs:
        if isinstance(output, Verdict | LoopEvent):
            # every field, in the model's order, as pydantic itself would write it; a
            # loop event's ``fleet`` only on the fleet breaker's own event
            fields = [name for name in type(output).model_fields if name != "fleet"]
            assert list(orjson.loads(output.to_json())) == fields
            assert output.to_json() == output.model_dump_json(exclude={"fleet"}).encode()
        if isinstance(output, Verdict):
            parsed = WireVerdict.model_validate_json(output.to_json())
            assert parsed.action == output.action and parsed.message == output.message
            kinds.add(parsed.action)
        elif isinstance(output, LoopEvent):
            parsed_event = WireLoopEvent.model_validate_json(output.to_json())
            assert parsed_event.detector == output.detector
            kinds.add("loop_event")
    assert kinds == {"allow", "warn", "block", "loop_event"}


def test_a_loop_event_with_fleet_carries_it() -> None:
    event = WireLoopEvent.model_validate_json(
        b'{"type":"loop_event","event_id":"e","session_key":"fleet","run_id":null,'
        b'"agent_id":null,"call_id":null,"seq":null,"tool_name":"exec","action":"warn",'
        b'"level":"warning","detector":"fleet_tool_breaker","count":20,"message":"m",'
        b'"args_hash":null,"warning_key":null,"config":{},"fleet":{"sessions":20,'
        b'"window_seconds":300,"since_ts":1,"until_ts":2},"event_ts":1,"decided_ts":1}'
    )
    assert orjson.loads(event.to_json())["fleet"] == {
        "sessions": 20, "window_seconds": 300, "since_ts": 1, "until_ts": 2
    }
    assert event.to_json() == event.model_dump_json().encode()
