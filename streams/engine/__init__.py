"""The detection engine: a fold of each session's events, no I/O, no clock.

``Engine.step(state, event, now_ms, watermark_ms=None) -> (state, outputs)`` changes
the state it is given in place (and returns it; a new one for None). Deterministic:
the same events and clocks give the same states and outputs, which is what lets the
session processor go back to a state by applying its events again.

Its modules may be compiled with mypyc (``./dev build-engine``, see
loopfuse.streams.local.compiled_engine); ``COMPILED`` says whether this process runs that build.
"""

from loopfuse.streams.engine.compiled import select as _select

COMPILED: bool = _select()  # before any engine module is imported

from loopfuse.streams.engine.config import ConfigResolver, ResolvedConfig, resolve_config  # noqa: E402
from loopfuse.streams.engine.history import Record  # noqa: E402
from loopfuse.streams.engine.outputs import LoopEvent, Notice, Output, Rejection, Verdict  # noqa: E402
from loopfuse.streams.engine.state import SessionState  # noqa: E402
from loopfuse.streams.engine.step import Engine  # noqa: E402

__all__ = [
    "COMPILED",
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
