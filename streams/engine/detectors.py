"""The loop detectors: counters over a run's history and the decision table (spec 5-6).

Everything here is computed *before* the current call is recorded, over the records
of the current run only.
"""

from __future__ import annotations

from dataclasses import dataclass

from loopfuse.schemas.events import Detector, Level
from loopfuse.streams.engine.config import ResolvedConfig
from loopfuse.streams.engine.history import Record


@dataclass(frozen=True, slots=True)
class Detection:
    level: Level  # "warning" | "critical"
    detector: Detector
    count: int
    message: str
    warning_key: str
    paired_tool_name: str | None = None
    detail: str | None = None  # what the message names besides the tool (re-emission)


def message_for(detector: str, level: str, tool: str, count: int, detail: str | None) -> str:
    """The exact message texts of spec section 6 (and 7 for the guard)."""
    if detector == "unknown_tool_repeat":
        return (
            f"CRITICAL: attempted unavailable tool {detail or tool} {count} times. "
            "Stop retrying that missing tool and answer without it."
        )
    if detector == "global_circuit_breaker":
        return (
            f"CRITICAL: {tool} has repeated identical no-progress outcomes {count} times. "
            "Session execution blocked by global circuit breaker to prevent runaway loops."
        )
    if detector == "known_poll_no_progress":
        if level == "critical":
            return (
                f"CRITICAL: Called {tool} with identical arguments and no progress {count} "
                "times. This appears to be a stuck polling loop. Session execution blocked to "
                "prevent resource waste."
            )
        return (
            f"WARNING: You have called {tool} {count} times with identical arguments and no "
            "progress. Stop polling and either (1) increase wait time between checks, or (2) "
            "report the task as failed if the process is stuck."
        )
    if detector == "ping_pong":
        if level == "critical":
            return (
                "CRITICAL: You are alternating between repeated tool-call patterns "
                f"({count} consecutive calls) with no progress. This appears to be a stuck "
                "ping-pong loop. Session execution blocked to prevent resource waste."
            )
        return (
            "WARNING: You are alternating between repeated tool-call patterns "
            f"({count} consecutive calls). This looks like a ping-pong loop; stop retrying "
            "and report the task as failed."
        )
    if detector == "generic_repeat":
        if level == "critical":
            return (
                f"CRITICAL: Called {tool} with identical arguments and identical outcomes "
                f"{count} times. Session execution blocked to prevent runaway loops."
            )
        return (
            f"WARNING: You have called {tool} {count} times with identical arguments. If this "
            "is not making progress, stop retrying and report the task as failed."
        )
    if detail is not None:
        return detail  # the opt-in rules keep their whole message as the detail
    raise ValueError(f"no message for detector {detector!r}")


def guard_message(tool: str, count: int, window: int) -> str:
    return (
        f"CRITICAL: tool {tool} repeated {count} times with identical arguments and identical "
        f"results within {window} attempts after auto-compaction. The compaction did not "
        "break the loop. Aborting to prevent runaway resource use."
    )


def unknown_tool_streak(history: list[Record], tool: str) -> tuple[int, str | None]:
    streak = 0
    name: str | None = None
    for rec in reversed(history):
        if rec.tool != tool or rec.unknown is None:
            break
        if name is None:
            name = rec.unknown
        elif rec.unknown != name:
            break
        streak += 1
    return streak, name


def no_progress_streak(history: list[Record], sig: int) -> tuple[int, int]:
    """Consecutive identical outcomes of this signature; records without one are skipped."""
    streak = 0
    latest = 0
    for rec in reversed(history):
        if rec.sig != sig or not rec.result:
            continue
        if not latest:
            latest = rec.result
        elif rec.result != latest:
            break
        streak += 1
    return streak, latest


@dataclass(frozen=True, slots=True)
class PingPong:
    count: int
    paired_tool: str | None = None
    paired_sig: int = 0
    no_progress_evidence: bool = False


_NO_PING_PONG = PingPong(0)


def ping_pong_streak(history: list[Record], sig: int) -> PingPong:
    if not history:
        return _NO_PING_PONG
    last = history[-1]
    other_sig = 0
    for rec in reversed(history[:-1]):
        if rec.sig != last.sig:
            other_sig = rec.sig
            break
    if not other_sig:
        return _NO_PING_PONG
    tail = 0
    for rec in reversed(history):
        if rec.sig != (last.sig if tail % 2 == 0 else other_sig):
            break
        tail += 1
    if tail < 2 or sig != other_sig:
        return _NO_PING_PONG
    result_last = result_other = 0
    evidence = True
    for rec in history[len(history) - tail :]:
        if not rec.result:
            evidence = False
            break
        if rec.sig == last.sig:
            if not result_last:
                result_last = rec.result
            elif rec.result != result_last:
                evidence = False
                break
        elif not result_other:
            result_other = rec.result
        elif rec.result != result_other:
            evidence = False
            break
    if not result_last or not result_other:
        evidence = False
    return PingPong(tail + 1, last.tool, last.sig, evidence)


def detect(
    history: list[Record],
    tool: str,
    sig: int,
    args_token: str,
    known_poll: bool,
    config: ResolvedConfig,
    run: str | None,
    recent: int,
) -> Detection | None:
    """The decision table of spec section 6: first match wins.

    ``recent`` is the number of records with this call's signature. When it is 0,
    every counter but the unknown-tool streak is 0 too (no-progress needs a record of
    this signature, ping-pong needs this signature to be the alternation's other
    side), which lets the common healthy call skip the history scans.
    """
    if not history:
        return None
    scope = run or ""
    unknown_count, unknown_name = unknown_tool_streak(history, tool)
    if unknown_count >= config.unknown_tool_threshold:
        return Detection(
            "critical",
            "unknown_tool_repeat",
            unknown_count,
            message_for("unknown_tool_repeat", "critical", tool, unknown_count, unknown_name),
            f"{scope}:unknown-tool:{tool}:{unknown_name}",
            detail=unknown_name,
        )
    if not recent:
        return None
    streak, latest = no_progress_streak(history, sig)
    if streak >= config.global_circuit_breaker_threshold:
        return Detection(
            "critical",
            "global_circuit_breaker",
            streak,
            message_for("global_circuit_breaker", "critical", tool, streak, None),
            f"{scope}:global:{tool}:{args_token}:{latest:016x}",
        )
    if known_poll and config.known_poll_no_progress and streak >= config.warning_threshold:
        poll_level: Level = "critical" if streak >= config.critical_threshold else "warning"
        return Detection(
            poll_level,
            "known_poll_no_progress",
            streak,
            message_for("known_poll_no_progress", poll_level, tool, streak, None),
            f"{scope}:poll:{tool}:{args_token}:{latest:016x}",
        )
    if config.ping_pong:
        pong = ping_pong_streak(history, sig)
        if pong.count >= config.warning_threshold:
            level: Level = (
                "critical"
                if pong.count >= config.critical_threshold and pong.no_progress_evidence
                else "warning"
            )
            low, high = sorted((sig, pong.paired_sig))
            return Detection(
                level,
                "ping_pong",
                pong.count,
                message_for("ping_pong", level, tool, pong.count, None),
                f"{scope}:pingpong:{low:016x}|{high:016x}",
                paired_tool_name=pong.paired_tool,
                detail=pong.paired_tool,
            )
    if not known_poll and config.generic_repeat:
        if streak >= config.critical_threshold:
            return Detection(
                "critical",
                "generic_repeat",
                streak,
                message_for("generic_repeat", "critical", tool, streak, None),
                f"{scope}:generic:{tool}:{args_token}:{latest:016x}",
            )
        if recent >= config.warning_threshold:
            return Detection(
                "warning",
                "generic_repeat",
                recent,
                message_for("generic_repeat", "warning", tool, recent, None),
                f"{scope}:generic:{tool}:{args_token}",
            )
    return None
