"""The engine's verdicts and loop events are the wire models, published in their field order."""

from __future__ import annotations

import orjson

from loopfuse.schemas import EventRejected, decode_event, parse_config
from loopfuse.schemas import LoopEvent as WireLoopEvent
from loopfuse.schemas import Verdict as WireVerdict
from loopfuse.streams.engine import Engine, LoopEvent, SessionState, Verdict
from loopfuse.streams.engine.fleet import ToolBreaker, overlay
from tests.support.engine_corpus import corpora
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
        "sessions": 20,
        "window_seconds": 300,
        "since_ts": 1,
        "until_ts": 2,
    }
    assert event.to_json() == event.model_dump_json().encode()


def test_every_output_of_the_corpus_is_its_wire_model_field_for_field() -> None:
    """Every way the engine builds a verdict or loop event - calls, results that trip a
    guard, gaps given up, rules (reported or enforced, run endings), the fleet breaker's
    raise - gives the wire model itself: its fields in order, values it validates."""
    breakers = {"exec": ToolBreaker("exec", 3, 60, 0, 2**52)}
    fleet_config = parse_config(
        {
            "tools": {"loopDetection": {"enabled": True}},
            "loopfuse": {"rules": {"fleetBreaker": {"action": "block"}}},
        }
    )
    seen: set[tuple[str, str | None]] = set()
    cases = [*corpora(), ("fleet", fleet_config, corpora()[-1][2])]
    for name, config, lines in cases:
        engine = Engine(config, max_parked=16, gap_timeout_ms=5_000)
        states: dict[str, SessionState] = {}
        for line in lines:
            try:
                event = decode_event(line)
            except EventRejected:
                continue
            states[event.key], outputs = engine.step(states.get(event.key), event, event.ts)
            if name == "fleet":
                outputs = overlay(engine.rules, outputs, breakers)
            for output in outputs:
                if not isinstance(output, Verdict | LoopEvent):
                    continue
                model = type(output)
                assert list(output.__dict__) == list(model.model_fields), name
                assert model.model_validate(output.__dict__) == output, name
                assert (
                    output.to_json()
                    == output.model_dump_json(
                        exclude={"fleet"} if output.__dict__.get("fleet") is None else None
                    ).encode()
                )
                seen.add((model.__name__, output.action if model is Verdict else output.detector))
                if model is Verdict and output.detector == "fleet_tool_breaker":
                    seen.add(("raised", name))
    assert ("raised", "fleet") in seen
    assert {("Verdict", action) for action in ("allow", "warn", "block", "abort")} <= seen
    detectors = {detector for kind, detector in seen if kind == "LoopEvent"}
    assert {
        "sequence_gap",
        "compaction_loop_persisted",
        "cycle",
        "tool_loop_run_ended",
        "generic_repeat",
        "unknown_tool_repeat",
    } <= detectors, detectors
