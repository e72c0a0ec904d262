"""The pure detection engine: a fold of each session's events, no I/O, no clock."""

from streams.engine.config import ConfigResolver, ResolvedConfig, resolve_config
from streams.engine.outputs import LoopEvent, Notice, Output, Rejection, Verdict
from streams.engine.state import Record, SessionState
from streams.engine.step import Engine

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
