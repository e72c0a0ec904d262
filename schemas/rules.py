"""loopfuse's opt-in rules beyond OpenClaw's documented detector (issue 14), validated strictly.

They live in loopfuse's own block, ``loopfuse.rules``, and per agent in
``agents.list[].loopfuse.rules``. Every rule is off unless its block is present
(``{}`` turns it on with its defaults); ``enabled: false`` turns it off again (an
agent can opt out of a global rule) and ``shadow: true`` only reports it (loop events
with ``enforced: false``, verdicts as if the rule were off).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
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
    tools: dict[str, ToolRule] | None = Field(
        default=None, description="per tool name: exempt, or thresholds of its own"
    )


class AgentEntryLoopfuse(BaseModel):
    """``agents.list[].loopfuse``: an agent's overrides of loopfuse's own settings."""

    model_config = _STRICT
    rules: RulesConfig | None = None
