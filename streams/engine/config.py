"""Resolution of the loopDetection config in force for one agent (spec section 1).

Validation (strict, with key paths) lives in schemas/config.py. Resolution works on
plain dicts and never trusts them: a merged global+agent block is not re-validated,
so every numeric field falls back to its default unless it is a positive integer,
and the thresholds are clamped into order.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from loopfuse.schemas.config import DetectionConfigFile, LoopDetectionConfig

DEFAULT_HISTORY_SIZE = 30
DEFAULT_WARNING_THRESHOLD = 10
DEFAULT_CRITICAL_THRESHOLD = 20
DEFAULT_UNKNOWN_TOOL_THRESHOLD = 10
DEFAULT_GLOBAL_CIRCUIT_BREAKER_THRESHOLD = 30
DEFAULT_GUARD_WINDOW_SIZE = 3

_NESTED = ("detectors", "postCompactionGuard")


@dataclass(frozen=True, slots=True)
class ResolvedConfig:
    """The loop-detection settings in force for one agent, after merge and clamping."""

    enabled: bool | None  # None: not set anywhere (detection off, recording and guard on)
    history_size: int = DEFAULT_HISTORY_SIZE
    warning_threshold: int = DEFAULT_WARNING_THRESHOLD
    critical_threshold: int = DEFAULT_CRITICAL_THRESHOLD
    unknown_tool_threshold: int = DEFAULT_UNKNOWN_TOOL_THRESHOLD
    global_circuit_breaker_threshold: int = DEFAULT_GLOBAL_CIRCUIT_BREAKER_THRESHOLD
    generic_repeat: bool = True
    known_poll_no_progress: bool = True
    ping_pong: bool = True
    guard_window_size: int = DEFAULT_GUARD_WINDOW_SIZE

    @property
    def detection_on(self) -> bool:
        return self.enabled is True

    @property
    def recording_on(self) -> bool:
        """Calls and results are recorded, and the guard runs, unless explicitly off."""
        return self.enabled is not False

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _positive_int(value: Any, default: int) -> int:
    if type(value) is int and value > 0:
        return value
    # JSON has one number type: 10.0 is the integer 10 to OpenClaw's JavaScript.
    if type(value) is float and value.is_integer() and value > 0:
        return int(value)
    return default


def clamp_thresholds(warning: int, critical: int, breaker: int) -> tuple[int, int]:
    """(critical, breaker) moved up into order over ``warning`` (spec 1.3)."""
    # Order matters: warning is never lowered; critical then breaker move up.
    if critical <= warning:
        critical = warning + 1
    if breaker <= critical:
        breaker = critical + 1
    return critical, breaker


def _flag(value: Any, default: bool) -> bool:
    return value if isinstance(value, bool) else default


def merge_blocks(
    global_block: dict[str, Any] | None, agent_block: dict[str, Any] | None
) -> dict[str, Any]:
    """Overlay an agent's block on the global one, nested objects one level deeper."""
    merged: dict[str, Any] = dict(global_block or {})
    for key, value in (agent_block or {}).items():
        base = merged.get(key)
        if key in _NESTED and isinstance(value, dict) and isinstance(base, dict):
            merged[key] = {**base, **value}
        else:
            merged[key] = value
    return merged


def resolve_config(
    global_block: dict[str, Any] | None, agent_block: dict[str, Any] | None = None
) -> ResolvedConfig:
    block = merge_blocks(global_block, agent_block)
    warning = _positive_int(block.get("warningThreshold"), DEFAULT_WARNING_THRESHOLD)
    critical = _positive_int(block.get("criticalThreshold"), DEFAULT_CRITICAL_THRESHOLD)
    breaker = _positive_int(
        block.get("globalCircuitBreakerThreshold"), DEFAULT_GLOBAL_CIRCUIT_BREAKER_THRESHOLD
    )
    critical, breaker = clamp_thresholds(warning, critical, breaker)
    detectors = block.get("detectors")
    detectors = detectors if isinstance(detectors, dict) else {}
    guard = block.get("postCompactionGuard")
    guard = guard if isinstance(guard, dict) else {}
    enabled = block.get("enabled")
    return ResolvedConfig(
        enabled=enabled if isinstance(enabled, bool) else None,
        history_size=_positive_int(block.get("historySize"), DEFAULT_HISTORY_SIZE),
        warning_threshold=warning,
        critical_threshold=critical,
        unknown_tool_threshold=_positive_int(
            block.get("unknownToolThreshold"), DEFAULT_UNKNOWN_TOOL_THRESHOLD
        ),
        global_circuit_breaker_threshold=breaker,
        generic_repeat=_flag(detectors.get("genericRepeat"), True),
        known_poll_no_progress=_flag(detectors.get("knownPollNoProgress"), True),
        ping_pong=_flag(detectors.get("pingPong"), True),
        guard_window_size=_positive_int(guard.get("windowSize"), DEFAULT_GUARD_WINDOW_SIZE),
    )


def _block_dict(block: LoopDetectionConfig | None) -> dict[str, Any] | None:
    return None if block is None else block.model_dump(exclude_none=True)


class ConfigResolver:
    """Resolved configs per agent id, computed once (a config file is immutable)."""

    def __init__(self, config: DetectionConfigFile | None = None) -> None:
        self.file = config or DetectionConfigFile()
        self._global = _block_dict(self.file.global_block)
        self._cache: dict[str | None, ResolvedConfig] = {}
        self.enforce = self.file.loopfuse.enforce
        self.send_tools = frozenset(self.file.loopfuse.providerSendTools)

    def resolve(self, agent_id: str | None) -> ResolvedConfig:
        resolved = self._cache.get(agent_id)
        if resolved is None:
            agent = _block_dict(self.file.agent_block(agent_id))
            resolved = resolve_config(self._global, agent)
            if len(self._cache) < 10_000:  # agent ids come from the wire: bound the cache
                self._cache[agent_id] = resolved
        return resolved
