"""What the engine emits: verdicts, loop events, rejections and notices.

Verdicts and loop events are the wire models themselves (loopfuse.schemas.events), so their
fields have one definition. The engine builds them from values it computed without
validating them again (loopfuse.schemas.events.unvalidated, in Engine._verdict and
Engine._loop_event), which costs about what a slotted dataclass does, and they
serialise with orjson (``to_json``).
"""

from __future__ import annotations

from dataclasses import dataclass

from loopfuse.schemas.events import InputEvent, LoopEvent, Verdict

__all__ = ["LoopEvent", "Notice", "Output", "Rejection", "Verdict"]


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
