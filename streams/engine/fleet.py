"""The fleet-wide tool breaker as the engine sees it: which loop events strike a tool,
and a pure overlay of the broken tools on a session's verdicts (docs/configuration.md: Rules).

A session's verdict still comes from its own events (``Engine.step``); the breakers
are one more input, like the event, read by the worker from the breakers topic. The
overlay leaves the session's state alone: with or without breakers, the state after
an event is the same, so a session moved to another worker (or replayed) folds
exactly as before, and a redelivered call is overlaid again with what is known then.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from loopfuse.schemas.events import Action, Level, unvalidated
from loopfuse.streams.engine.outputs import LoopEvent, Output, Verdict
from loopfuse.streams.engine.rules import RuleBook
from loopfuse.streams.engine.step import verdict_id

#: Detectors whose warnings strike a tool too (a critical of any detector does).
_STRIKING_WARNINGS = frozenset({"unknown_tool_repeat", "repeated_failure"})
_RANK: dict[str, int] = {"allow": 0, "warn": 1, "block": 2, "abort": 3}
_LEVEL: dict[str, Level] = {"warn": "warning", "block": "critical"}


@dataclass(frozen=True, slots=True)
class ToolBreaker:
    """A tool broken fleet-wide: calls with an event time before ``until_ts`` are overlaid."""

    tool_name: str
    sessions: int
    window_seconds: int
    since_ts: int
    until_ts: int


def strikes(outputs: Sequence[Output]) -> list[LoopEvent]:
    """The loop events of one step that strike their tool: a critical, an unknown-tool
    streak or a failure identity (the breaker's own events never do: no feedback)."""
    return [
        output
        for output in outputs
        if isinstance(output, LoopEvent)
        and output.tool_name is not None
        and output.detector != "fleet_tool_breaker"
        and (output.level == "critical" or output.detector in _STRIKING_WARNINGS)
    ]


def breaker_message(action: str, tool: str, sessions: int, window_seconds: int) -> str:
    """What a call to a broken tool is told (and the breaker's loop event says)."""
    seen = f"{sessions} sessions hit a loop on {tool} within {window_seconds} s"
    if action == "block":
        return (
            f"CRITICAL: {tool} is failing across the fleet ({seen}). Calls to it are blocked "
            "fleet-wide until the failures stop: do not retry it; change approach or report "
            "the task as failed."
        )
    return (
        f"WARNING: {tool} is failing across the fleet ({seen}). Avoid retrying it; change "
        "approach or report the task as failed."
    )


def overlay(
    rules: RuleBook, outputs: list[Output], breakers: Mapping[str, ToolBreaker] | None
) -> list[Output]:
    """``outputs`` with the verdicts of calls to broken tools raised to the breaker's action.

    Only a call's ``allow`` or ``warn`` is raised, and only to something stronger
    (a session's own warning stays its own under a ``warn`` breaker); blocks and
    aborts are the session's. Each agent's rules decide: no ``fleetBreaker`` in force,
    ``shadow``, an exempt tool or an event time from ``until_ts`` on leave the
    verdict as it was. Verdicts are replaced, never mutated (outputs may be shared).
    """
    if not breakers:
        return outputs
    result = outputs
    for index, output in enumerate(outputs):
        if not isinstance(output, Verdict) or output.tool_name is None:
            continue
        breaker = breakers.get(output.tool_name)
        if breaker is None or output.event_ts >= breaker.until_ts:
            continue
        resolved = rules.resolve(output.agent_id)
        rule = None if resolved is None else resolved.fleet_breaker
        if resolved is None or rule is None or not rule.enforced:
            continue
        if output.tool_name in resolved.exempt:
            continue
        if _RANK[rule.action] <= _RANK[output.action]:
            continue
        if result is outputs:
            result = list(outputs)
        result[index] = _raised(output, rule.action, breaker)
    return result


def _raised(verdict: Verdict, action: Action, breaker: ToolBreaker) -> Verdict:
    message = breaker_message(action, breaker.tool_name, breaker.sessions, breaker.window_seconds)
    # An unvalidated copy, like every engine output (the values are the verdict's own
    # and the breaker's, both checked).
    return unvalidated(
        Verdict,
        {
            **verdict.__dict__,
            **{
                "verdict_id": verdict_id(
                    verdict.session_key,
                    verdict.run_id,
                    verdict.call_id,
                    action,
                    verdict.incarnation,
                ),
                "action": action,
                "level": _LEVEL[action],
                "detector": "fleet_tool_breaker",
                "count": breaker.sessions,
                "message": message,
                "paired_tool_name": None,
            },
        },
        verdict.__pydantic_fields_set__,
    )
