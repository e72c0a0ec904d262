"""What the engine emits: verdicts, loop events, rejections and notices.

Verdicts and loop events are the wire models themselves (schemas.events), so their
fields have one definition. The engine builds them from values it computed without
validating them again (``verdict``, ``loop_event``), which costs about what a slotted
dataclass does, and they serialise with orjson (``to_json``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from schemas.events import (
    Action,
    Detector,
    InputEvent,
    Level,
    LoopEvent,
    Verdict,
    unvalidated,
)

__all__ = ["LoopEvent", "Notice", "Output", "Rejection", "Verdict", "loop_event", "verdict"]

_VERDICT_FIELDS = tuple(Verdict.model_fields)
_LOOP_EVENT_FIELDS = tuple(LoopEvent.model_fields)


@dataclass(frozen=True, slots=True)
class Rejection:
    """A valid event the engine cannot apply (e.g. a result for a call it never saw)."""

    code: str
    reason: str
    event: InputEvent


@dataclass(frozen=True, slots=True)
class Notice:
    """Something worth a log line (the engine itself never logs)."""

    level: str
    message: str
    session_key: str
    run_id: str | None


Output = Verdict | LoopEvent | Rejection | Notice


def verdict(
    *,
    verdict_id: str,
    session_key: str,
    run_id: str | None,
    agent_id: str | None,
    call_id: str | None,
    seq: int | None,
    incarnation: str | None,
    tool_name: str | None,
    action: Action,
    level: Level,
    detector: Detector | None,
    count: int,
    message: str | None,
    args_hash: str | None,
    paired_tool_name: str | None,
    event_ts: int,
    decided_ts: int,
) -> Verdict:
    """A Verdict of values the engine computed (typed here, so not validated again)."""
    values = {
        "type": "verdict",
        "verdict_id": verdict_id,
        "session_key": session_key,
        "run_id": run_id,
        "agent_id": agent_id,
        "call_id": call_id,
        "seq": seq,
        "incarnation": incarnation,
        "tool_name": tool_name,
        "action": action,
        "level": level,
        "detector": detector,
        "count": count,
        "message": message,
        "args_hash": args_hash,
        "paired_tool_name": paired_tool_name,
        "event_ts": event_ts,
        "decided_ts": decided_ts,
    }
    return unvalidated(Verdict, values, _VERDICT_FIELDS)


def loop_event(
    *,
    event_id: str,
    session_key: str,
    run_id: str | None,
    agent_id: str | None,
    call_id: str | None,
    seq: int | None,
    incarnation: str | None,
    tool_name: str | None,
    action: Action,
    level: Level,
    detector: Detector,
    count: int,
    message: str | None,
    args_hash: str | None,
    paired_tool_name: str | None,
    warning_key: str | None,
    config: dict[str, Any],
    enforced: bool,
    args: Any,
    event_ts: int,
    decided_ts: int,
) -> LoopEvent:
    """A LoopEvent of values the engine computed (typed here, so not validated again)."""
    values = {
        "type": "loop_event",
        "event_id": event_id,
        "session_key": session_key,
        "run_id": run_id,
        "agent_id": agent_id,
        "call_id": call_id,
        "seq": seq,
        "incarnation": incarnation,
        "tool_name": tool_name,
        "action": action,
        "level": level,
        "detector": detector,
        "count": count,
        "message": message,
        "args_hash": args_hash,
        "paired_tool_name": paired_tool_name,
        "warning_key": warning_key,
        "config": config,
        "enforced": enforced,
        "args": args,
        "event_ts": event_ts,
        "decided_ts": decided_ts,
    }
    return unvalidated(LoopEvent, values, _LOOP_EVENT_FIELDS)
