"""The pure detection engine: a fold of each session's events, no I/O, no clock.

Its modules may be compiled with mypyc (``./dev build-engine``, see
streams.compiled_engine); ``COMPILED`` says whether this process runs that build.
"""

from streams.compiled_engine import select as _select

COMPILED: bool = _select()  # before any engine module is imported

from streams.engine.config import ConfigResolver, ResolvedConfig, resolve_config  # noqa: E402
from streams.engine.history import Record  # noqa: E402
from streams.engine.outputs import LoopEvent, Notice, Output, Rejection, Verdict  # noqa: E402
from streams.engine.state import SessionState  # noqa: E402
from streams.engine.step import Engine  # noqa: E402

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
