"""What the engine emits, as plain slotted dataclasses.

They mirror ``schemas.events.Verdict`` and ``schemas.events.LoopEvent`` field for field
(tests/unit/test_outputs.py keeps them in step), but cost a fraction of a pydantic
model to build and serialise with orjson directly, which matters on the per-event
path (not frozen: a frozen dataclass's __init__ costs twice as much). Consumers
validate the JSON with the schemas models.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import orjson

from schemas.events import Action, Detector, Level


@dataclass(slots=True, kw_only=True)
class Verdict:
    type: Literal["verdict"] = "verdict"
    verdict_id: str
    session_key: str
    run_id: str | None
    agent_id: str | None
    call_id: str | None
    seq: int | None
    incarnation: str | None = None
    tool_name: str | None
    action: Action
    level: Level
    detector: Detector | None
    count: int
    message: str | None
    args_hash: str | None
    paired_tool_name: str | None
    event_ts: int
    decided_ts: int

    def to_json(self) -> bytes:
        return orjson.dumps(self)


@dataclass(slots=True, kw_only=True)
class LoopEvent:
    type: Literal["loop_event"] = "loop_event"
    event_id: str
    session_key: str
    run_id: str | None
    agent_id: str | None
    call_id: str | None
    seq: int | None
    incarnation: str | None = None
    tool_name: str | None
    action: Action
    level: Level
    detector: Detector
    count: int
    message: str | None
    args_hash: str | None
    paired_tool_name: str | None
    warning_key: str | None
    config: dict[str, Any]
    enforced: bool
    args: Any = None
    event_ts: int
    decided_ts: int

    def to_json(self) -> bytes:
        return orjson.dumps(self)
