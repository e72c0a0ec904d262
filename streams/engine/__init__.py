"""The detection engine: a fold of each session's events, no I/O, no clock.

``Engine.step(state, event, now_ms, watermark_ms=None) -> (state, outputs)`` changes
the state it is given in place (and returns it; a new one for None). Deterministic:
the same events and clocks give the same states and outputs, which is what lets the
session processor go back to a state by applying its events again.

Where the native judge is built (native/, loopfuse.streams.engine.native), it folds the
same events to the same bytes; this Python engine is the reference and the fallback.
"""

from loopfuse.streams.engine.config import ConfigResolver, ResolvedConfig, resolve_config
from loopfuse.streams.engine.history import Record
from loopfuse.streams.engine.outputs import LoopEvent, Notice, Output, Rejection, Verdict
from loopfuse.streams.engine.state import SessionState
from loopfuse.streams.engine.step import Engine

__all__ = [
    "ConfigResolver",
    "Engine",
    "LoopEvent",
    "Notice",
    "Output",
    "Record",
    "Rejection",
    "ResolvedConfig",
    "SessionState",
    "Verdict",
    "resolve_config",
]
