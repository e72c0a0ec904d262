"""Wire-format and configuration models of loopfuse (no Kafka, no Faust)."""

from loopfuse.schemas.config import (
    ConfigError,
    DetectionConfigFile,
    LoopDetectionConfig,
    load_config,
    parse_config,
)
from loopfuse.schemas.decode import EventRejected, decode_event
from loopfuse.schemas.event_schema import input_event_adapter, validate_event
from loopfuse.schemas.events import (
    Compaction,
    DeadLetter,
    InputEvent,
    LoopEvent,
    RunEnded,
    ToolCall,
    ToolResult,
    Verdict,
)

__all__ = [
    "Compaction",
    "ConfigError",
    "DeadLetter",
    "DetectionConfigFile",
    "EventRejected",
    "InputEvent",
    "LoopDetectionConfig",
    "LoopEvent",
    "RunEnded",
    "ToolCall",
    "ToolResult",
    "Verdict",
    "decode_event",
    "input_event_adapter",
    "load_config",
    "parse_config",
    "validate_event",
]
