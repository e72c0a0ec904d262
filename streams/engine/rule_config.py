"""Resolution of the opt-in rules (``loopfuse.rules``) in force for one agent.

Like streams/engine/config.py it works on plain dicts and never trusts them: an
agent's block is merged over the global one (each rule one level deeper, ``tools``
per tool name) and the merge is not re-validated, so a value of the wrong kind falls
back to its default.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from loopfuse.schemas.config import DetectionConfigFile
from loopfuse.streams.engine.config import ResolvedConfig, _positive_int, clamp_thresholds
from loopfuse.streams.engine.volatile import CLASSES, Pattern, mask_text

DEFAULT_CRITICALS_PER_RUN = 2  # OpenClaw's "recover once": the second critical ends the run
DEFAULT_BLOCKED_STREAK = 3  # OpenClaw's BLOCKED_STREAK_TERMINATE_THRESHOLD
DEFAULT_MAX_PERIOD = 5
DEFAULT_FAILURE_WARNING = 3
DEFAULT_FAILURE_CRITICAL = 5
DEFAULT_WARN_AT = 0.8
DEFAULT_IDENTICAL_WARNING = 10
DEFAULT_IDENTICAL_CRITICAL = 20
MAX_VOLATILE_PATTERNS = 32
DEFAULT_FLEET_SESSIONS = 20
DEFAULT_FLEET_WINDOW_SECONDS = 300

_RULES = ("runEnding", "cycle", "repeatedFailure", "argumentChurn", "runCaps")


@dataclass(frozen=True, slots=True)
class RunEnding:
    enforced: bool
    criticals_per_run: int = DEFAULT_CRITICALS_PER_RUN
    blocked_streak: int = DEFAULT_BLOCKED_STREAK


@dataclass(frozen=True, slots=True)
class Cycle:
    enforced: bool
    max_period: int = DEFAULT_MAX_PERIOD


@dataclass(frozen=True, slots=True)
class RepeatedFailure:
    enforced: bool
    warning_threshold: int = DEFAULT_FAILURE_WARNING
    critical_threshold: int = DEFAULT_FAILURE_CRITICAL


@dataclass(frozen=True, slots=True)
class ArgumentChurn:
    enforced: bool


@dataclass(frozen=True, slots=True)
class RunCaps:
    enforced: bool
    max_tool_calls: int | None = None
    tokens_per_run: int | None = None
    tokens_per_session: int | None = None
    cost_per_run: float | None = None
    cost_per_session: float | None = None
    warn_at: float = DEFAULT_WARN_AT


@dataclass(frozen=True, slots=True)
class IdenticalCalls:
    enforced: bool
    warning_threshold: int = DEFAULT_IDENTICAL_WARNING
    critical_threshold: int = DEFAULT_IDENTICAL_CRITICAL


@dataclass(frozen=True, slots=True)
class VolatileResults:
    """Masking of results (no ``enforced``: it has no shadow mode)."""

    tools: frozenset[str] | None = None  # None: every tool
    patterns: tuple[Pattern, ...] = ()

    def applies(self, tool: str) -> bool:
        return self.tools is None or tool in self.tools

    def mask(self, text: str) -> str:
        return mask_text(text, self.patterns)


@dataclass(frozen=True, slots=True)
class FleetBreaker:
    """The fleet-wide tool breaker: trips at ``sessions`` within ``window_seconds``."""

    enforced: bool
    action: Literal["warn", "block"] = "warn"
    sessions: int = DEFAULT_FLEET_SESSIONS
    window_seconds: int = DEFAULT_FLEET_WINDOW_SECONDS


@dataclass(frozen=True, slots=True)
class ToolThresholds:
    warning: int | None = None
    critical: int | None = None
    breaker: int | None = None


@dataclass(frozen=True, slots=True)
class ResolvedRules:
    """The rules in force for one agent; None everywhere means the rule is off."""

    run_ending: RunEnding | None = None
    cycle: Cycle | None = None
    repeated_failure: RepeatedFailure | None = None
    argument_churn: ArgumentChurn | None = None
    run_caps: RunCaps | None = None
    fleet_breaker: FleetBreaker | None = None
    identical_calls: IdenticalCalls | None = None
    volatile_results: VolatileResults | None = None
    exempt: frozenset[str] = frozenset()
    thresholds: tuple[tuple[str, ToolThresholds], ...] = ()
    # Derived: the per-tool configs handed out by for_tool (a config is immutable).
    _per_tool: dict[tuple[ResolvedConfig, str], ResolvedConfig] = field(
        default_factory=dict, compare=False, hash=False, repr=False
    )

    def for_tool(self, config: ResolvedConfig, tool: str) -> ResolvedConfig:
        """``config`` with this tool's own thresholds, clamped into order like the rest."""
        if not self.thresholds:
            return config
        key = (config, tool)
        cached = self._per_tool.get(key)
        if cached is not None:
            return cached
        own = dict(self.thresholds).get(tool)
        if own is None:
            return config
        warning = own.warning or config.warning_threshold
        critical, breaker = clamp_thresholds(
            warning,
            own.critical or config.critical_threshold,
            own.breaker or config.global_circuit_breaker_threshold,
        )
        resolved = replace(
            config,
            warning_threshold=warning,
            critical_threshold=critical,
            global_circuit_breaker_threshold=breaker,
        )
        if len(self._per_tool) < 1_024:  # tool names come from the wire: bound the cache
            self._per_tool[key] = resolved
        return resolved


def merge_rules(
    global_block: dict[str, Any] | None, agent_block: dict[str, Any] | None
) -> dict[str, Any]:
    """An agent's rules over the global ones: each rule one level deeper, tools per name."""
    merged: dict[str, Any] = _overlay(global_block or {}, agent_block or {}, depth=1)
    return merged


def _overlay(base: Any, value: Any, depth: int) -> Any:
    """``value`` over ``base``, objects merged key by key ``depth`` levels down
    (``tools`` one more: a tool's own block is merged too)."""
    if depth < 0 or not (isinstance(base, dict) and isinstance(value, dict)):
        return value
    merged = dict(base)
    for key, own in value.items():
        deeper = depth + 1 if depth == 1 and key == "tools" else depth
        merged[key] = _overlay(merged[key], own, deeper - 1) if key in merged else own
    return merged


def _amount(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if value > 0 and math.isfinite(value) else None


def _optional_int(value: Any) -> int | None:
    resolved = _positive_int(value, 0)
    return resolved or None


def resolve_rules(block: dict[str, Any], enforce: bool) -> ResolvedRules | None:
    """The rules of a merged block; None when no rule and no tool rule is in force."""

    def rule(name: str) -> tuple[dict[str, Any], bool] | None:
        raw = block.get(name)
        if not isinstance(raw, dict) or raw.get("enabled") is False:
            return None
        return raw, enforce and raw.get("shadow") is not True

    ending = rule("runEnding")
    cycle = rule("cycle")
    failure = rule("repeatedFailure")
    churn = rule("argumentChurn")
    caps = rule("runCaps")
    fleet = rule("fleetBreaker")
    identical = rule("identicalCalls")
    volatile = rule("volatileResults")
    exempt: set[str] = set()
    thresholds: list[tuple[str, ToolThresholds]] = []
    tools = block.get("tools")
    for name, own in (tools if isinstance(tools, dict) else {}).items():
        if not isinstance(own, dict):
            continue
        if own.get("exempt") is True:
            exempt.add(name)
            continue
        limits = ToolThresholds(
            _optional_int(own.get("warningThreshold")),
            _optional_int(own.get("criticalThreshold")),
            _optional_int(own.get("globalCircuitBreakerThreshold")),
        )
        if limits != ToolThresholds():
            thresholds.append((name, limits))
    if not (
        ending
        or cycle
        or failure
        or churn
        or caps
        or fleet
        or identical
        or volatile
        or exempt
        or thresholds
    ):
        return None
    max_period = (cycle[0] if cycle else {}).get("maxPeriod")
    failure_warning = _positive_int(
        (failure[0] if failure else {}).get("warningThreshold"), DEFAULT_FAILURE_WARNING
    )
    failure_critical = _positive_int(
        (failure[0] if failure else {}).get("criticalThreshold"), DEFAULT_FAILURE_CRITICAL
    )
    warn_at = _amount((caps[0] if caps else {}).get("warnAt"))
    return ResolvedRules(
        run_ending=None
        if ending is None
        else RunEnding(
            ending[1],
            _positive_int(ending[0].get("criticalsPerRun"), DEFAULT_CRITICALS_PER_RUN),
            _positive_int(ending[0].get("blockedStreak"), DEFAULT_BLOCKED_STREAK),
        ),
        cycle=None
        if cycle is None
        else Cycle(
            cycle[1],
            max_period if type(max_period) is int and 3 <= max_period <= 5 else DEFAULT_MAX_PERIOD,
        ),
        repeated_failure=None
        if failure is None
        else RepeatedFailure(
            failure[1],
            failure_warning,
            # like OpenClaw's thresholds: warning is never lowered, critical moves up
            max(failure_critical, failure_warning + 1),
        ),
        argument_churn=None if churn is None else ArgumentChurn(churn[1]),
        run_caps=None
        if caps is None
        else RunCaps(
            caps[1],
            _optional_int(caps[0].get("maxToolCalls")),
            _optional_int(caps[0].get("tokensPerRun")),
            _optional_int(caps[0].get("tokensPerSession")),
            _amount(caps[0].get("costPerRun")),
            _amount(caps[0].get("costPerSession")),
            warn_at if warn_at is not None and warn_at < 1 else DEFAULT_WARN_AT,
        ),
        fleet_breaker=None if fleet is None else _fleet_breaker(*fleet),
        identical_calls=None if identical is None else _identical_calls(*identical),
        volatile_results=None if volatile is None else _volatile_results(volatile[0]),
        exempt=frozenset(exempt),
        thresholds=tuple(thresholds),
    )


def _fleet_breaker(raw: dict[str, Any], enforced: bool) -> FleetBreaker:
    sessions, window = raw.get("sessions"), raw.get("windowSeconds")
    return FleetBreaker(
        enforced,
        "block" if raw.get("action") == "block" else "warn",
        sessions if type(sessions) is int and 2 <= sessions <= 1_000 else DEFAULT_FLEET_SESSIONS,
        window if type(window) is int and 1 <= window <= 86_400 else DEFAULT_FLEET_WINDOW_SECONDS,
    )


def _identical_calls(raw: dict[str, Any], enforced: bool) -> IdenticalCalls:
    warning = _positive_int(raw.get("warningThreshold"), DEFAULT_IDENTICAL_WARNING)
    critical = _positive_int(raw.get("criticalThreshold"), DEFAULT_IDENTICAL_CRITICAL)
    # like OpenClaw's thresholds: warning is never lowered, critical moves up
    return IdenticalCalls(enforced, warning, max(critical, warning + 1))


def _volatile_results(raw: dict[str, Any]) -> VolatileResults:
    """The rule's scope and patterns; entries of the wrong kind are left out."""
    tools = raw.get("tools")
    scope = (
        frozenset(name for name in tools if isinstance(name, str) and name)
        if isinstance(tools, list)
        else None
    )
    patterns: list[Pattern] = []
    listed = raw.get("patterns")
    for entry in listed if isinstance(listed, list) else []:
        if not isinstance(entry, dict):
            continue
        prefix, chars = entry.get("prefix"), entry.get("chars")
        if (
            isinstance(prefix, str)
            and 0 < len(prefix) <= 64
            and all(" " <= c <= "~" for c in prefix)
            and chars in CLASSES
        ):
            patterns.append((prefix, chars))
    return VolatileResults(scope, tuple(patterns[:MAX_VOLATILE_PATTERNS]))


class RulesResolver:
    """Resolved rules per agent id, computed once (a config file is immutable)."""

    def __init__(self, config: DetectionConfigFile) -> None:
        self.file = config
        rules = config.loopfuse.rules
        self._global = None if rules is None else rules.model_dump(exclude_none=True)
        self._agents = any(
            agent.loopfuse is not None and agent.loopfuse.rules is not None
            for agent in (config.agents.entries if config.agents else [])
        )
        self._enforce = config.loopfuse.enforce
        self._cache: dict[str | None, ResolvedRules | None] = {}

    @property
    def configured(self) -> bool:
        """Whether any rule block exists at all (else every agent resolves to None)."""
        return self._global is not None or self._agents

    @property
    def fleet_breaker(self) -> FleetBreaker | None:
        """The fleet's breaker (the global block's: trips are fleet-wide), or None."""
        if self._global is None:
            return None
        rules = resolve_rules(self._global, self._enforce)
        return None if rules is None else rules.fleet_breaker

    def resolve(self, agent_id: str | None) -> ResolvedRules | None:
        if not self.configured:
            return None
        if agent_id in self._cache:
            return self._cache[agent_id]
        agent = self.file.agent_rules(agent_id)
        own = None if agent is None else agent.model_dump(exclude_none=True)
        block = merge_rules(self._global, own)
        resolved = resolve_rules(block, self._enforce)
        if len(self._cache) < 10_000:  # agent ids come from the wire: bound the cache
            self._cache[agent_id] = resolved
        return resolved
