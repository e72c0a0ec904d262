"""loopfuse's opt-in rules beyond OpenClaw's documented detector, validated strictly.

They live in loopfuse's own block, ``loopfuse.rules``, and per agent in
``agents.list[].loopfuse.rules``. Every rule is off unless its block is present
(``{}`` turns it on with its defaults); ``enabled: false`` turns it off again (an
agent can opt out of a global rule) and ``shadow: true`` only reports it (loop events
with ``enforced: false``, verdicts as if the rule were off).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    StringConstraints,
    field_validator,
    model_validator,
)

PositiveInt = Annotated[StrictInt, Field(gt=0)]
# StrictFloat takes JSON integers too (1 is 1.0), never strings or booleans.
Amount = Annotated[StrictFloat, Field(gt=0)]
Fraction = Annotated[StrictFloat, Field(gt=0, lt=1)]

#: Fields that are numbers rather than integers, and what a bad value is told.
NUMBER_FIELDS = {
    "costPerRun": "must be a positive number",
    "costPerSession": "must be a positive number",
    "warnAt": "must be a number between 0 and 1 (both excluded)",
}

_STRICT = ConfigDict(extra="forbid", frozen=True)


def threshold_order_error(
    warning: int | None, critical: int | None, breaker: int | None = None
) -> str | None:
    """What is wrong with thresholds set in one block, in OpenClaw's words, or None."""
    if warning is not None and critical is not None and warning >= critical:
        return "warningThreshold must be lower than criticalThreshold"
    if critical is not None and breaker is not None and critical >= breaker:
        return "criticalThreshold must be lower than globalCircuitBreakerThreshold"
    return None


class _Rule(BaseModel):
    model_config = _STRICT
    enabled: StrictBool | None = Field(
        default=None, description="default true once the block is present"
    )
    shadow: StrictBool | None = Field(
        default=None, description="true: only report (loop events with enforced=false)"
    )


class RunEndingRule(_Rule):
    """End a run (``abort``, detector ``tool_loop_run_ended``) instead of blocking forever."""

    criticalsPerRun: PositiveInt | None = Field(
        default=None, description="the Nth critical of a run ends it (default 2: recover once)"
    )
    blockedStreak: PositiveInt | None = Field(
        default=None, description="N consecutive calls blocked without running end it (default 3)"
    )


class CycleRule(_Rule):
    """Cycles of period 3..maxPeriod (``cycle``), judged like ping-pong (its thresholds)."""

    maxPeriod: Annotated[StrictInt, Field(ge=3, le=5)] | None = Field(
        default=None, description="longest period looked for, 3 to 5 (default 5)"
    )


class RepeatedFailureRule(_Rule):
    """The same normalised error from a tool N times in a row in a run, whatever its args."""

    warningThreshold: PositiveInt | None = None
    criticalThreshold: PositiveInt | None = None

    @model_validator(mode="after")
    def _ordered(self) -> RepeatedFailureRule:
        error = threshold_order_error(self.warningThreshold, self.criticalThreshold)
        if error is not None:
            raise ValueError(error)
        return self


class ArgumentChurnRule(_Rule):
    """OpenClaw's argument churn: args cycle through variants with one stable outcome."""


class RunCapsRule(_Rule):
    """Caps per run and budgets per run and session: warn at a fraction, abort at the cap."""

    maxToolCalls: PositiveInt | None = Field(default=None, description="tool calls per run")
    tokensPerRun: PositiveInt | None = None
    tokensPerSession: PositiveInt | None = None
    costPerRun: Amount | None = Field(default=None, description="in the unit of usage.cost")
    costPerSession: Amount | None = None
    warnAt: Fraction | None = Field(default=None, description="warn from this fraction (0.8)")


class FleetBreakerRule(_Rule):
    """The fleet-wide tool breaker: K sessions looping on one tool within a window.

    ``sessions`` and ``windowSeconds`` are the fleet's (read from the global block
    only); an agent's block may turn the breaker off, shadow it or change its action.
    """

    sessions: Annotated[StrictInt, Field(ge=2, le=1_000)] | None = Field(
        default=None, description="distinct sessions within the window that trip it (default 20)"
    )
    windowSeconds: Annotated[StrictInt, Field(ge=1, le=86_400)] | None = Field(
        default=None, description="the sliding window, in seconds of event time (default 300)"
    )
    action: Literal["warn", "block"] | None = Field(
        default=None, description="what calls to a broken tool get (default warn)"
    )


class IdenticalCallsRule(_Rule):
    """An unbroken run of byte-identical calls (same tool, same args), whatever the results."""

    warningThreshold: PositiveInt | None = Field(default=None, description="default 10")
    criticalThreshold: PositiveInt | None = Field(default=None, description="default 20")

    @model_validator(mode="after")
    def _ordered(self) -> IdenticalCallsRule:
        error = threshold_order_error(self.warningThreshold, self.criticalThreshold)
        if error is not None:
            raise ValueError(error)
        return self


class VolatilePattern(BaseModel):
    """A token to mask: the run of ``chars`` right after each ``prefix``."""

    model_config = _STRICT
    prefix: StrictStr = Field(
        description="1 to 64 printable ASCII characters, as they appear in the output"
    )
    chars: Literal["digits", "hex", "alnum", "id"] = Field(
        description="digits 0-9; hex 0-9a-fA-F; alnum letters and digits; id: alnum, _ . -"
    )

    @field_validator("prefix")
    @classmethod
    def _printable(cls, prefix: str) -> str:
        if not 0 < len(prefix) <= 64 or not all(" " <= c <= "~" for c in prefix):
            raise ValueError("must be 1 to 64 printable ASCII characters")
        return prefix


class VolatileResultsRule(_Rule):
    """Mask tokens that change on every call (times, durations, ids, PIDs, ports,
    temporary paths, ages) before a result's outcome token is taken."""

    tools: (
        Annotated[
            list[Annotated[StrictStr, StringConstraints(min_length=1)]], Field(max_length=256)
        ]
        | None
    ) = Field(default=None, description="only these tools' results (default: every tool's)")
    patterns: Annotated[list[VolatilePattern], Field(max_length=32)] | None = Field(
        default=None, description="more tokens to mask, after a literal prefix"
    )

    @model_validator(mode="after")
    def _no_shadow(self) -> VolatileResultsRule:
        if self.shadow:
            raise ValueError(
                "volatileResults has no shadow mode: it changes what the history records; "
                "try it on recorded events with loopfuse replay"
            )
        return self


class ToolRule(BaseModel):
    """One tool's rule: exempt it, or judge it with its own thresholds."""

    model_config = _STRICT
    exempt: StrictBool | None = Field(default=None, description="never counted or judged")
    warningThreshold: PositiveInt | None = None
    criticalThreshold: PositiveInt | None = None
    globalCircuitBreakerThreshold: PositiveInt | None = None

    @model_validator(mode="after")
    def _ordered(self) -> ToolRule:
        error = threshold_order_error(
            self.warningThreshold, self.criticalThreshold, self.globalCircuitBreakerThreshold
        )
        if error is not None:
            raise ValueError(error)
        return self


class RulesConfig(BaseModel):
    """``loopfuse.rules``: every rule opt-in; an agent's block is merged over it."""

    model_config = _STRICT
    runEnding: RunEndingRule | None = None
    cycle: CycleRule | None = None
    repeatedFailure: RepeatedFailureRule | None = None
    argumentChurn: ArgumentChurnRule | None = None
    runCaps: RunCapsRule | None = None
    identicalCalls: IdenticalCallsRule | None = Field(
        default=None, description="warn and block N identical calls in a row, whatever the results"
    )
    volatileResults: VolatileResultsRule | None = Field(
        default=None, description="mask per-call noise in results before comparing them"
    )
    fleetBreaker: FleetBreakerRule | None = Field(
        default=None, description="warn or block a tool that loops in many sessions at once"
    )
    tools: dict[str, ToolRule] | None = Field(
        default=None, description="per tool name: exempt, or thresholds of its own"
    )


class AgentEntryLoopfuse(BaseModel):
    """``agents.list[].loopfuse``: an agent's overrides of loopfuse's own settings."""

    model_config = _STRICT
    rules: RulesConfig | None = None
