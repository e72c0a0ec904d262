"""The opt-in rules beyond OpenClaw's documented detector (docs/configuration.md: Rules).

The engine's step calls in here at three points, only for agents with a rule in
force: :meth:`RuleBook.judge` after the decision table of spec section 6 (a rule may
take over the verdict), :meth:`RuleBook.after_call` once the call's verdict is out
(tallies and run endings), and :meth:`RuleBook.on_result` for each tool result
(spend and failure identities). Core criticals always win: a rule never turns a
block of OpenClaw's table into something milder.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from xxhash import xxh3_64_intdigest

from loopfuse.schemas.config import DetectionConfigFile
from loopfuse.schemas.events import Detector, Level, ToolCall, ToolResult
from loopfuse.streams.engine.config import ResolvedConfig
from loopfuse.streams.engine.detectors import Detection
from loopfuse.streams.engine.fingerprint import ERROR_PREFIX
from loopfuse.streams.engine.history import Record
from loopfuse.streams.engine.rule_config import ResolvedRules, RulesResolver, RunCaps
from loopfuse.streams.engine.rule_state import RuleState, RunTally
from loopfuse.streams.engine.state import ResultAtRest, SessionState, run_key

#: OpenClaw's TOOL_LOOP_RUN_ENDED_NOTICE, appended to the critical that ends a run.
RUN_ENDED_NOTICE = (
    "Ending this run: the model kept repeating a blocked tool call and made no progress."
)
#: OpenClaw's MIN_STABLE_CALLS_PER_VARIANT (argument churn).
MIN_STABLE_CALLS_PER_VARIANT = 3


@dataclass(slots=True)
class Judgement:
    """What the rules make of one call, on top of the decision table's detection."""

    detection: Detection | None  # drives the verdict, as the table's detection did
    enforce: bool  # whether ``detection`` is enforced (else reported with enforced=false)
    ends_run: bool = False  # ``detection`` is a cap at its limit: the run is aborted too
    shadows: list[Detection] = field(default_factory=list)  # rules only reported


@dataclass(frozen=True, slots=True)
class RunEnd:
    """A run to abort: the verdict's and loop event's fields."""

    detector: Detector
    count: int
    message: str
    enforced: bool


class RuleBook:
    """The rules of one engine: resolution per agent and the rules' logic."""

    def __init__(self, config: DetectionConfigFile) -> None:
        self.resolver = RulesResolver(config)

    def resolve(self, agent_id: str | None) -> ResolvedRules | None:
        return self.resolver.resolve(agent_id)

    # -- tool calls ------------------------------------------------------------------

    def judge(
        self,
        state: SessionState,
        event: ToolCall,
        config: ResolvedConfig,
        rules: ResolvedRules,
        run: str | None,
        sig: int,
        detection: Detection | None,
        enforce: bool,
    ) -> Judgement:
        """Enforced rule criticals beat the table's warnings; rule warnings fill its gaps."""
        if detection is not None and detection.level == "critical":
            return Judgement(detection, enforce)
        found: list[tuple[Detection, bool, bool]] = []  # (detection, enforced, ends run)
        tool = event.tool_name
        tally = state.rules.runs.get(run_key(run)) if state.rules is not None else None
        caps = rules.run_caps
        if caps is not None:
            capped = _run_cap(caps, tally, state.rules, run)
            if capped is not None:
                found.append((capped, caps.enforced, capped.level == "critical"))
        if rules.repeated_failure is not None and state.rules is not None:
            failure = state.rules.failures.get((run_key(run), _tool_hash(tool)))
            rule = rules.repeated_failure
            if failure is not None and failure[1] >= rule.warning_threshold:
                level: Level = "critical" if failure[1] >= rule.critical_threshold else "warning"
                found.append(
                    (
                        _detection(
                            level,
                            "repeated_failure",
                            failure[1],
                            _failure_message(level, tool, failure[1]),
                            f"{run or ''}:failure:{tool}:{failure[0]:016x}",
                        ),
                        rule.enforced,
                        False,
                    )
                )
        identical = rules.identical_calls
        if identical is not None:
            # like the failure streak: the calls already made, judged on the next one
            count = state.rules.identical_streak(run_key(run), sig) if state.rules else 0
            if count >= identical.warning_threshold:
                rank: Level = "critical" if count >= identical.critical_threshold else "warning"
                found.append(
                    (
                        _detection(
                            rank,
                            "identical_calls",
                            count,
                            _identical_message(rank, tool, count),
                            f"{run or ''}:identical:{sig:016x}",
                        ),
                        identical.enforced,
                        False,
                    )
                )
        if config.detection_on and (rules.cycle is not None or rules.argument_churn is not None):
            history = state.run_history(run_key(run))
            if rules.cycle is not None:
                cycle = _cycle(history, sig, config, rules.cycle.max_period, run)
                if cycle is not None:
                    found.append((cycle, rules.cycle.enforced, False))
            if rules.argument_churn is not None:
                churn = _argument_churn(history, tool, sig, config, run)
                if churn is not None:
                    found.append((churn, rules.argument_churn.enforced, False))
        if not found:
            return Judgement(detection, enforce)
        # Effective: the first enforced rule critical, else the table's warning, else
        # the first enforced rule warning. Rules that are not enforced are reported.
        chosen = next(
            (f for f in found if f[1] and f[0].level == "critical"),
            None if detection is not None else next((f for f in found if f[1]), None),
        )
        shadows = [f[0] for f in found if not f[1]]
        if chosen is None:
            return Judgement(detection, enforce, shadows=shadows)
        return Judgement(chosen[0], True, chosen[2], shadows)

    def after_call(
        self,
        state: SessionState,
        rules: ResolvedRules,
        run: str | None,
        sig: int,
        judgement: Judgement,
    ) -> RunEnd | None:
        """Count the call; the run to abort when this call ends it."""
        if state.rules is None:
            state.rules = RuleState()
        if rules.identical_calls is not None:
            state.rules.note_call(run_key(run), sig)
        tally = state.rules.tally(run_key(run))
        tally.calls += 1
        detection = judgement.detection
        if detection is not None and judgement.ends_run:
            return RunEnd(detection.detector, detection.count, detection.message, True)
        ending = rules.run_ending
        if ending is None:
            return None
        # A critical counts when it blocked the call, or, while the run ending itself is
        # only reported, when it would have: a shadow ends nothing it did not block.
        critical = detection is not None and detection.level == "critical"
        if not (critical and (judgement.enforce or not ending.enforced)):
            tally.blocked_streak = 0
            return None
        assert detection is not None
        tally.criticals += 1
        tally.blocked_streak += 1
        if tally.criticals >= ending.criticals_per_run:
            count = tally.criticals
        elif tally.blocked_streak >= ending.blocked_streak:
            count = tally.blocked_streak
        else:
            return None
        return RunEnd(
            "tool_loop_run_ended",
            count,
            f"{detection.message} {RUN_ENDED_NOTICE}",
            ending.enforced and judgement.enforce,
        )

    # -- tool results ----------------------------------------------------------------

    def on_result(
        self,
        state: SessionState,
        event: ToolResult,
        rules: ResolvedRules,
        run: str | None,
        recorded: bool,
    ) -> bool:
        """Count the result's spend and failure identity; True when its tool is exempt.

        ``recorded``: the outcome is one the history records (not the loop detector's
        own block, not "no result"); only such a success ends a failure streak.
        """
        usage = event.usage
        if rules.run_caps is not None and usage is not None:
            if state.rules is None:
                state.rules = RuleState()
            tally = state.rules.tally(run_key(run))
            tokens, cost = usage.tokens, usage.cost or 0.0
            tally.tokens += tokens
            tally.cost += cost
            state.rules.session_tokens += tokens
            state.rules.session_cost += cost
        tool = event.tool_name
        if tool in rules.exempt:
            return True
        if rules.repeated_failure is not None:
            failure = failure_of(event)
            key = (run_key(run), _tool_hash(tool))
            if failure is not None:
                if state.rules is None:
                    state.rules = RuleState()
                state.rules.note_failure(key, failure)
            elif state.rules is not None and recorded:
                state.rules.failures.pop(key, None)  # a success ends the streak
        return False


# -- failure identity ----------------------------------------------------------------

# Per-call nonces that make one failure look like many: ids, times, long numbers.
_NONCES = re.compile(
    r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"  # UUIDs
    r"|\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?"  # times
    r"|\b(?=[0-9a-z_-]*\d)(?=[0-9a-z_-]*[a-z])[0-9a-z_-]{12,}\b"  # request ids, tokens
    r"|\b[0-9a-f]{8,}\b"  # hex ids
    r"|\d{4,}(?:\.\d+)?",  # long numbers (ports, pids, byte counts, epoch times)
    re.IGNORECASE,
)
_SPACE = re.compile(r"\s+")


def normalise_error(text: str) -> str:
    """The error as its identity: nonces replaced, whitespace collapsed.

    Short numbers stay (``HTTP 404`` and ``HTTP 503`` are different failures); long
    ones, UUIDs, timestamps and id-like tokens are per-call noise.
    """
    return _SPACE.sub(" ", _NONCES.sub("#", text)).strip()


def failure_identity(text: str) -> int:
    return xxh3_64_intdigest(normalise_error(text).encode("utf-8", "surrogatepass"))


def failure_of(event: ToolResult) -> int | None:
    """The identity of the failure a result reports; None for a success.

    From the error's text; from what the state kept of it while the result waited
    (``ResultAtRest.failure``); else, for a gateway that hashes results locally and sent
    an error's token (``error:...``, fingerprint.result_token), from the token: the same
    text, exactly, is the same failure (without the text its nonces cannot be told).
    """
    error = event.error_text
    if error is not None:
        return failure_identity(error)
    if type(event) is ResultAtRest and event.failure is not None:
        return event.failure
    token = event.result_hash
    if token is not None and token.startswith(ERROR_PREFIX):
        return xxh3_64_intdigest(token.encode("utf-8", "surrogatepass"))
    return None


def _tool_hash(tool: str) -> int:
    return xxh3_64_intdigest(tool.encode("utf-8", "surrogatepass"))


# -- cycles --------------------------------------------------------------------------


def _primitive(pattern: list[int]) -> bool:
    """Not a repeat of a shorter pattern (ABAB is ping-pong, AAA generic repeat)."""
    size = len(pattern)
    return not any(
        size % d == 0 and all(pattern[i] == pattern[i % d] for i in range(size))
        for d in range(1, size)
    )


def cycle_streak(history: list[Record], sig: int, period: int) -> tuple[int, bool]:
    """(count, no-progress evidence) of a cycle of ``period`` that ``sig`` continues.

    Ping-pong generalised (spec 5): the tail is how many records from the end repeat
    the last ``period`` signatures; the current call must be the next one of the
    cycle, and the count is the tail plus the call. Evidence: every record of the
    tail has a result and each position of the cycle always had the same one.
    """
    size = len(history)
    if size < period:
        return 0, False
    sigs = [rec.sig for rec in history[size - period :]]
    if sig != sigs[0] or not _primitive(sigs):
        return 0, False
    tail = period
    while tail < size and history[size - 1 - tail].sig == sigs[period - 1 - tail % period]:
        tail += 1
    results: list[int] = [0] * period
    evidence = True
    for index in range(tail):
        rec = history[size - 1 - index]
        slot = (period - 1 - index) % period
        if not rec.result or (results[slot] and rec.result != results[slot]):
            evidence = False
            break
        results[slot] = rec.result
    return tail + 1, evidence


def _cycle(
    history: list[Record], sig: int, config: ResolvedConfig, max_period: int, run: str | None
) -> Detection | None:
    best = (0, False, 0)
    for period in range(3, max_period + 1):
        count, evidence = cycle_streak(history, sig, period)
        if count > best[0]:
            best = (count, evidence, period)
    count, evidence, period = best
    if count < config.warning_threshold:
        return None
    level: Level = "critical" if count >= config.critical_threshold and evidence else "warning"
    members = sorted({rec.sig for rec in history[len(history) - period :]})
    key = "|".join(f"{member:016x}" for member in members)
    return _detection(
        level, "cycle", count, _cycle_message(level, period, count), f"{run or ''}:cycle:{key}"
    )


# -- argument churn (OpenClaw's tool-loop-argument-churn.ts, no-progress variant) -----


def argument_churn_streak(history: list[Record], tool: str, sig: int) -> tuple[int, int]:
    """(count, variants) of OpenClaw's no-progress argument churn, else (0, 0).

    Walking back over this tool's latest records (another tool ends the walk, records
    without a result are skipped), every record must be a no-progress repeat (its
    signature had the same result before in the run) and each signature must keep
    one result. Churn: more than one variant, each seen at least 3 times, all with
    the same result, and the current call continues one of them.
    """
    no_progress: list[bool] = []
    seen: dict[int, set[int]] = {}
    for rec in history:
        results = seen.setdefault(rec.sig, set())
        no_progress.append(bool(rec.result) and rec.result in results)
        if rec.result:
            results.add(rec.result)
    outcomes: dict[int, tuple[int, int]] = {}  # sig -> (result, count)
    for index in range(len(history) - 1, -1, -1):
        rec = history[index]
        if rec.tool != tool:
            break
        if not rec.result:
            continue
        if not no_progress[index]:
            break
        previous = outcomes.get(rec.sig)
        if previous is not None and previous[0] != rec.result:
            break
        outcomes[rec.sig] = (rec.result, (previous[1] if previous else 0) + 1)
    total = sum(count for _, count in outcomes.values())
    stable = [
        (result, count)
        for result, count in outcomes.values()
        if count >= MIN_STABLE_CALLS_PER_VARIANT
    ]
    current = outcomes.get(sig)
    churn = (
        len(stable) > 1
        and sum(count for _, count in stable) == total
        and len({result for result, _ in stable}) == 1
        and current is not None
        and current[1] >= MIN_STABLE_CALLS_PER_VARIANT
    )
    return (total, len(stable)) if churn else (0, 0)


def _argument_churn(
    history: list[Record], tool: str, sig: int, config: ResolvedConfig, run: str | None
) -> Detection | None:
    count, variants = argument_churn_streak(history, tool, sig)
    if count < config.warning_threshold:
        return None
    return _detection(
        "warning",
        "argument_churn",
        count,
        _churn_message(tool, variants, count),
        f"{run or ''}:argument-churn:{tool}",
    )


# -- run caps and budgets ------------------------------------------------------------


def _run_cap(
    caps: RunCaps, tally: RunTally | None, rules: RuleState | None, run: str | None
) -> Detection | None:
    """The first cap reached (critical), else the first past its warning fraction."""
    calls = (tally.calls if tally else 0) + 1  # this call included
    checks: list[tuple[Detector, str, float, float | None]] = [
        ("run_call_cap", "run", calls, caps.max_tool_calls),
        ("token_budget", "run", tally.tokens if tally else 0, caps.tokens_per_run),
        ("token_budget", "session", rules.session_tokens if rules else 0, caps.tokens_per_session),
        ("cost_budget", "run", tally.cost if tally else 0.0, caps.cost_per_run),
        ("cost_budget", "session", rules.session_cost if rules else 0.0, caps.cost_per_session),
    ]
    warning: Detection | None = None
    for detector, scope, used, cap in checks:
        if cap is None:
            continue
        over = used > cap if detector == "run_call_cap" else used >= cap
        if over:
            return _cap_detection("critical", detector, scope, used, cap, run)
        # rounded: 0.7 * 10 is 7.000000000000001 in binary, and the 7th call must warn
        if warning is None and used >= round(caps.warn_at * cap, 9):
            warning = _cap_detection("warning", detector, scope, used, cap, run)
    return warning


def _cap_detection(
    level: Level, detector: Detector, scope: str, used: float, cap: float, run: str | None
) -> Detection:
    if detector == "run_call_cap":
        count = int(used)
        message = (
            f"CRITICAL: this run reached its cap of {int(cap)} tool calls. Ending this run to "
            "prevent runaway resource use."
            if level == "critical"
            else f"WARNING: this run has made {int(used)} of its {int(cap)} allowed tool calls. "
            "Finish the task or report it as failed before the cap ends the run."
        )
    else:
        count = math.floor(used * 100 / cap)  # percent of the budget used
        spent = (
            f"{_amount(used)} tokens of its budget of {_amount(cap)}"
            if detector == "token_budget"
            else f"{_amount(used)} of its cost budget of {_amount(cap)}"
        )
        message = (
            f"CRITICAL: this {scope} has used {spent}. Ending this run to prevent runaway "
            "resource use."
            if level == "critical"
            else f"WARNING: this {scope} has used {spent} ({count}%). Finish the task or "
            "report it as failed before the budget ends the run."
        )
    return _detection(level, detector, count, message, f"{run or ''}:{detector}:{scope}")


def _amount(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


# -- messages ------------------------------------------------------------------------


def _detection(level: Level, detector: Detector, count: int, message: str, key: str) -> Detection:
    # The whole message is the detail: a redelivered call gets it back (message_for).
    return Detection(level, detector, count, message, key, detail=message)


def _cycle_message(level: Level, period: int, count: int) -> str:
    if level == "critical":
        return (
            f"CRITICAL: You are repeating a cycle of {period} tool-call patterns ({count} "
            "consecutive calls) with no progress. This appears to be a stuck loop. Session "
            "execution blocked to prevent resource waste."
        )
    return (
        f"WARNING: You are repeating a cycle of {period} tool-call patterns ({count} "
        "consecutive calls). This looks like a loop; stop retrying and report the task as "
        "failed."
    )


def _failure_message(level: Level, tool: str, count: int) -> str:
    if level == "critical":
        return (
            f"CRITICAL: {tool} failed {count} times in a row with the same error. Session "
            "execution blocked to prevent runaway loops."
        )
    return (
        f"WARNING: {tool} failed {count} times in a row with the same error. Stop retrying "
        "it; change approach or report the task as failed."
    )


def _identical_message(level: Level, tool: str, count: int) -> str:
    if level == "critical":
        return (
            f"CRITICAL: You have called {tool} {count} times in a row with identical "
            "arguments. Session execution blocked to prevent runaway loops."
        )
    return (
        f"WARNING: You have called {tool} {count} times in a row with identical arguments. "
        "If this is not making progress, stop retrying and report the task as failed."
    )


def _churn_message(tool: str, variants: int, count: int) -> str:
    """OpenClaw's exact text (buildArgumentChurnWarning)."""
    return (
        f"WARNING: {tool} has cycled through {variants} repeated argument patterns with the "
        f"same stable outcome {count} times. Continued churn is treated as stalled run "
        "activity, but this tool call remains allowed."
    )
