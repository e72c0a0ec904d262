"""The engine's output dataclasses serialise to JSON that the wire models accept."""

from __future__ import annotations

import dataclasses

from schemas import LoopEvent as WireLoopEvent
from schemas import Verdict as WireVerdict
from schemas import parse_config
from streams.engine import Engine, LoopEvent, Verdict
from tests.unit.conftest import call, result


def test_output_fields_match_the_wire_models() -> None:
    assert {f.name for f in dataclasses.fields(Verdict)} == set(WireVerdict.model_fields)
    # ``fleet`` is only on the fleet breaker's own loop event, which the engine never
    # builds (streams.fleet_breaker does): a session's loop events stay byte-identical.
    fields = set(WireLoopEvent.model_fields) - {"fleet"}
    assert {f.name for f in dataclasses.fields(LoopEvent)} == fields


def test_engine_outputs_validate_against_the_wire_models() -> None:
    engine = Engine(
        parse_config(
            {
                "tools": {
                    "loopDetection": {
                        "enabled": True,
                        "warningThreshold": 2,
                        "criticalThreshold": 3,
                    }
                }
            }
        )
    )
    events = []
    for i in range(4):
        events.append(call("exec", {"command": "ls"}, call_id=f"c{i}"))
        events.append(result("exec", {"command": "ls"}, call_id=f"c{i}", result={"content": []}))
    outputs = engine.replay(events)
    kinds = set()
    for output in outputs:
        if isinstance(output, Verdict):
            parsed = WireVerdict.model_validate_json(output.to_json())
            assert parsed.action == output.action and parsed.message == output.message
            kinds.add(parsed.action)
        elif isinstance(output, LoopEvent):
            parsed_event = WireLoopEvent.model_validate_json(output.to_json())
            assert parsed_event.detector == output.detector
            kinds.add("loop_event")
    assert kinds == {"allow", "warn", "block", "loop_event"}
