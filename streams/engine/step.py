"""The engine, a fold of a session's events:
``Engine.step(state, event, now_ms, watermark_ms=None) -> (state, outputs)``.

No I/O, no clock (``now_ms``, the worker's time, is passed in: it stamps
``decided_ts`` and the session's idle clock), no globals. The step applies events in
``seq`` order (parking early ones), ignores duplicates, and dispatches each applied
event to the detectors, the history and the guard. It changes the state it is given
in place (copying a state per event would cost as much as the step).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson
from msgspec import UNSET
from msgspec.structs import replace

from loopfuse.schemas.config import DetectionConfigFile
from loopfuse.schemas.events import (
    Action,
    Compaction,
    Detector,
    InputEvent,
    Level,
    RunEnded,
    ToolCall,
    ToolResult,
    unvalidated,
)
from loopfuse.streams.engine.config import ConfigResolver, ResolvedConfig
from loopfuse.streams.engine.detectors import Detection, detect, guard_message, message_for
from loopfuse.streams.engine.fingerprint import (
    Fingerprints,
    action_of,
    args_hash,
    digest,
    hash32,
    hash64,
    is_known_poll,
    result_fingerprint,
    result_token,
    signature,
    unknown_tool_name,
)
from loopfuse.streams.engine.history import Record
from loopfuse.streams.engine.outputs import (
    LoopEvent,
    Notice,
    Output,
    Rejection,
    Verdict,
)
from loopfuse.streams.engine.rule_config import ResolvedRules
from loopfuse.streams.engine.rules import Judgement, RuleBook, failure_identity
from loopfuse.streams.engine.state import (
    MAX_DECISIONS,
    MAX_GUARDS,
    MAX_RETIRED_INCARNATIONS,
    MAX_SEEN_EVENT_IDS,
    MAX_WARNING_KEYS,
    Decision,
    Guard,
    ResultAtRest,
    SessionState,
    incarnation_key,
    rest_size,
    run_key,
)

WARNING_BUCKET_SIZE = 10
DEFAULT_MAX_PARKED = 128
DEFAULT_MAX_PARKED_BYTES = 16_384
DEFAULT_GAP_TIMEOUT_MS = 30_000
MAX_SKIPPED_RANGES = 64
#: Raw args larger than this (as JSON) are left out of loop events even when
#: ``includePayloadsInLoopEvents`` is on: a loop event must stay a small message.
MAX_LOOP_EVENT_ARGS_BYTES = 65_536
#: Resolved configs rendered into loop events, kept by value (bounded).
_CONFIG_DICT_CACHE = 1_024
#: Per-agent policies and per-run keys the engine keeps (ids come from the wire).
_CACHE_BOUND = 10_000


@dataclass(frozen=True, slots=True)
class _Policy:
    """An agent's loop-detection config and rules, as every event of it reads them."""

    config: ResolvedConfig
    rules: ResolvedRules | None
    detecting: bool  # config.detection_on
    recording: bool  # config.recording_on


# Every field of an output is set: one frozenset for them all (the models are frozen).
_VERDICT_FIELDS = frozenset(Verdict.model_fields)
_LOOP_EVENT_FIELDS = frozenset(LoopEvent.model_fields)

_LEVEL_OF_ACTION: dict[Action, Level] = {
    "allow": "none",
    "warn": "warning",
    "block": "critical",
    "abort": "critical",
}


def run_scope(run_id: str | None) -> str | None:
    """Run ids are compared trimmed; an empty one is no run id."""
    if run_id is None:
        return None
    trimmed = run_id.strip()
    return trimmed or None


def verdict_id(
    session: str,
    run: str | None,
    call_id: str | None,
    action: str,
    incarnation: str | None = None,
) -> str:
    """Deterministic per (session, run, call id, action), and per gateway incarnation when
    the call carries one: a restarted gateway that reuses call ids gets new verdict ids."""
    text = f"{session}\x1f{run or ''}\x1f{call_id or ''}\x1f{action}"
    if incarnation is not None:
        text += f"\x1f{incarnation}"
    return digest(text.encode("utf-8", "surrogatepass"))


class Engine:
    """Loop detection for any number of sessions, one ``SessionState`` each."""

    def __init__(
        self,
        config: DetectionConfigFile | None = None,
        *,
        max_parked: int = DEFAULT_MAX_PARKED,
        max_parked_bytes: int = DEFAULT_MAX_PARKED_BYTES,
        gap_timeout_ms: int = DEFAULT_GAP_TIMEOUT_MS,
    ) -> None:
        self.resolver = ConfigResolver(config)
        self.max_parked = max_parked
        self.max_parked_bytes = max_parked_bytes
        self.gap_timeout_ms = gap_timeout_ms
        self.include_payloads = self.resolver.file.loopfuse.includePayloadsInLoopEvents
        self.rules = RuleBook(self.resolver.file)  # opt-in rules (loopfuse.rules)
        self._config_dicts: dict[ResolvedConfig, dict[str, Any]] = {}
        self._policies: dict[str | None, _Policy] = {}
        self._runs: dict[str, tuple[str | None, int]] = {}
        # The event being stepped and its fingerprints from the native decoder, while
        # ``step`` runs (see _args_token): no state, only work not done twice.
        self._given: tuple[InputEvent, Fingerprints] | None = None

    def resolve(self, agent_id: str | None) -> ResolvedConfig:
        return self.resolver.resolve(agent_id)

    def _policy(self, agent_id: str | None) -> _Policy:
        """What is in force for an agent's events: one lookup per event, not three."""
        policy = self._policies.get(agent_id)
        if policy is None:
            config = self.resolver.resolve(agent_id)
            policy = _Policy(
                config, self.rules.resolve(agent_id), config.detection_on, config.recording_on
            )
            if len(self._policies) >= _CACHE_BOUND:  # agent ids come from the wire
                self._policies.clear()
            self._policies[agent_id] = policy
        return policy

    def _run(self, run_id: str | None) -> tuple[str | None, int]:
        """A run id's scope (run_scope) and its key (run_key), known once per run id:
        a session's events repeat it, and its records then share one key object."""
        if run_id is None:
            return None, 0
        known = self._runs.get(run_id)
        if known is None:
            scope = run_scope(run_id)
            known = (scope, run_key(scope))
            if len(self._runs) >= _CACHE_BOUND:  # run ids come from the wire
                self._runs.clear()
            self._runs[run_id] = known
        return known

    # -- ordering and idempotence ----------------------------------------------------

    def step(
        self,
        state: SessionState | None,
        event: InputEvent,
        now_ms: int,
        watermark_ms: int | None = None,
        fingerprints: Fingerprints | None = None,
    ) -> tuple[SessionState, list[Output]]:
        """Apply one event of a session; return its state and what to publish.

        ``state`` is changed in place and returned (a new one when it is None). If
        the step raises, ``state`` may be partly changed: a caller that goes on with
        the session must go back to its state before the event, as
        loopfuse.streams.worker.fold.SessionFold does (it keeps the last good state bytes and
        the events applied since, and rebuilds from them).

        ``watermark_ms`` is the event time up to which every input the session's
        events can come from has been read (None: no input is behind, e.g. one
        ordered file). It only decides when a ``seq`` gap is given up on, see
        :meth:`_release_gaps`.

        ``fingerprints`` are the event's tokens as loopfuse.streams.engine.wire computed them
        from its bytes (None: computed here); they are what this step would compute.
        """
        if fingerprints is None:
            return self._step(state, event, now_ms, watermark_ms)
        self._given = (event, fingerprints)
        try:
            return self._step(state, event, now_ms, watermark_ms)
        finally:
            self._given = None

    def _step(
        self,
        state: SessionState | None,
        event: InputEvent,
        now_ms: int,
        watermark_ms: int | None,
    ) -> tuple[SessionState, list[Output]]:
        if state is None:
            state = SessionState()
        outputs: list[Output] = []
        seq = event.seq
        if seq is None:
            event_hash = hash64(event.event_id)
            if event_hash in state.seen_ids:
                self._redeliver(state, event, now_ms, outputs)
                return state, outputs
            state.seen_ids.append(event_hash)
            if len(state.seen_ids) > MAX_SEEN_EVENT_IDS:
                del state.seen_ids[0]
            self._apply(state, event, now_ms, outputs)
            return state, outputs

        incarnation = incarnation_key(event.incarnation)
        if incarnation != state.incarnation:
            if state.next_seq is None and not state.parked:
                state.incarnation = incarnation  # nothing numbered yet: the first seq space
            else:
                self._other_seq_space(state, event, incarnation, now_ms, watermark_ms, outputs)
                return state, outputs
        expected = 0 if state.next_seq is None else state.next_seq
        if seq < expected:
            if _take_skipped(state.skipped, seq):
                self._apply(state, event, now_ms, outputs)  # late, but not lost
            else:
                self._redeliver(state, event, now_ms, outputs)
        elif seq in state.parked:
            pass  # the same early event again: already waiting
        elif seq > expected:
            state.next_seq = expected
            state.park(seq, self._at_rest(event))
            _touch(state, event, now_ms)  # a session waiting on a gap is not idle
            self._release_gaps(state, now_ms, watermark_ms, outputs)
        else:
            self._apply(state, event, now_ms, outputs)
            state.next_seq = seq + 1
            if state.parked:
                self._drain(state, now_ms, outputs)
        if state.pending:
            self._open_pending(state, now_ms, watermark_ms, outputs)
        return state, outputs

    def release(self, state: SessionState, now_ms: int, watermark_ms: int | None) -> list[Output]:
        """Apply what waits in ``state`` and may go now that the input moved on.

        A restarted gateway's first events wait until every input has been read past
        them (see :meth:`_open_pending`), and the next event of the session may never
        come: the gateway is waiting for the verdict. The stream adapter calls this
        for sessions with waiting events whenever its watermark may have moved.
        """
        outputs: list[Output] = []
        if state.pending:
            self._open_pending(state, now_ms, watermark_ms, outputs)
        if state.parked:
            self._release_gaps(state, now_ms, watermark_ms, outputs)
        return outputs

    # -- seq spaces (gateway incarnations) --------------------------------------------

    def _other_seq_space(
        self,
        state: SessionState,
        event: InputEvent,
        incarnation: int,
        now_ms: int,
        watermark_ms: int | None,
        outputs: list[Output],
    ) -> None:
        """An event numbered in another seq space than the current one.

        A gateway counts ``seq`` from 0 in each incarnation (each start). An event of
        a closed incarnation is a redelivery, or a straggler read late: applied once.
        An event of an unknown incarnation means the gateway restarted: the session
        goes on (history, guards, warnings) in a new seq space, which opens once the
        current one can have nothing more in flight (:meth:`_open_pending`), so a
        worker reading the topics unevenly still applies the old incarnation's last
        events first, as an uninterrupted gateway would have had them applied.
        """
        seq = event.seq
        assert seq is not None
        for index, (closed, next_seq) in enumerate(state.retired):
            if closed == incarnation:
                if seq < next_seq:
                    self._redeliver(state, event, now_ms, outputs, vouch_allow=False)
                else:
                    state.retired[index] = (closed, seq + 1)
                    self._apply(state, event, now_ms, outputs)
                return
        for waiting in state.pending:
            if waiting.seq == seq and incarnation_key(waiting.incarnation) == incarnation:
                return  # the same early event again
        resting = self._at_rest(event)
        state.pending.append(resting)
        state.note_waiting(rest_size(resting))
        _touch(state, event, now_ms)
        self._open_pending(state, now_ms, watermark_ms, outputs)

    def _open_pending(
        self, state: SessionState, now_ms: int, watermark_ms: int | None, outputs: list[Output]
    ) -> None:
        """Open the waiting incarnations' seq spaces, oldest first, when their time has come.

        The current seq space is closed once the input has been read, on every topic
        the session's events come from, up to the new incarnation's first event time
        (``watermark_ms`` None: nothing is left to read anywhere), or once too much
        waits. Then whatever of it still waits behind a gap is applied (the gap given
        up), and the new seq space starts at seq 0.
        """
        while state.pending:
            incarnation = incarnation_key(state.pending[0].incarnation)
            opening = [e for e in state.pending if incarnation_key(e.incarnation) == incarnation]
            started = min(min(e.ts for e in opening), now_ms)
            crowded = (
                len(state.parked) + len(state.pending) >= self.max_parked
                or state.waiting_bytes() > self.max_parked_bytes
            )
            if watermark_ms is not None and min(watermark_ms, now_ms) < started and not crowded:
                return
            while state.parked:
                self._give_up_gap(state, now_ms, outputs)
            state.retired.append((state.incarnation, state.next_seq or 0))
            del state.retired[:-MAX_RETIRED_INCARNATIONS]
            for decision in state.decisions:
                decision.seq = -1  # seqs of a closed space say nothing about the new one
            state.incarnation = incarnation
            state.next_seq = 0
            state.skipped.clear()
            state.verdict_floor = 0
            state.pending = [e for e in state.pending if e not in opening]
            for event in opening:
                if event.seq is not None:
                    state.park(event.seq, event, counted=True)
            self._drain(state, now_ms, outputs)
            if state.parked:
                self._release_gaps(state, now_ms, watermark_ms, outputs)

    def _at_rest(self, event: InputEvent) -> InputEvent:
        """The event as the engine keeps it while it waits: raw args and results replaced
        by their tokens (nothing raw at rest), with everything applying it needs."""
        if isinstance(event, ToolCall):
            if event.args_hash is not None:
                return event
            return replace(
                event,
                args=UNSET,
                args_hash=self._args_token(event),
                args_action=action_of(event.args, event.args_action),
            )
        if isinstance(event, ToolResult):
            token, unknown = self._result_token(event)
            error = event.error_text
            return ResultAtRest(
                event_id=event.event_id,
                session_key=event.session_key,
                run_id=event.run_id,
                agent_id=event.agent_id,
                incarnation=event.incarnation,
                seq=event.seq,
                ts=event.ts,
                reply_to=event.reply_to,
                call_id=event.call_id,
                tool_name=event.tool_name,
                args_hash=self._args_token(event) if event.has_args else None,
                result=None if token is None else UNSET,
                result_hash=token,
                unknown_tool=unknown,
                usage=event.usage,
                failure=None if error is None else failure_identity(error),
            )
        if isinstance(event, Compaction) and event.reason is not None:
            return replace(event, reason=None)
        return event

    def _drain(self, state: SessionState, now_ms: int, outputs: list[Output]) -> None:
        while state.next_seq is not None and state.next_seq in state.parked:
            event = state.unpark(state.next_seq)
            self._apply(state, event, now_ms, outputs)
            state.next_seq += 1

    def _release_gaps(
        self, state: SessionState, now_ms: int, watermark_ms: int | None, outputs: list[Output]
    ) -> None:
        """Skip a gap once too many later events wait, or the input has moved on without it.

        Topics deliver a session's events out of order, by milliseconds normally and
        by much more while a worker catches up on a backlog, when one topic can be
        read far ahead of another. So the wait is measured in *event* time, which a
        backlog does not stretch, and only as far as every input has been read: the
        gap is taken as lost once the session's parked events span
        ``gap_timeout_ms`` of gateway time *and* the watermark (the event time every
        input topic of the partition has reached) is that far past the first parked
        event too, or once ``max_parked`` events wait. Without a watermark (a single
        ordered input, e.g. replay) the parked events' own span decides.
        The skipped seqs are remembered: if the missing event shows up after all,
        it is applied late instead of being dropped as a duplicate.
        """
        while state.parked and (
            len(state.parked) >= self.max_parked
            or state.waiting_bytes() > self.max_parked_bytes
            or _waited_event_time(state, watermark_ms, now_ms) >= self.gap_timeout_ms
        ):
            self._give_up_gap(state, now_ms, outputs)

    def _give_up_gap(self, state: SessionState, now_ms: int, outputs: list[Output]) -> None:
        """Skip the first gap: say so in a loop event, apply what waited behind it."""
        first_parked = min(state.parked)
        expected = state.next_seq or 0
        missing = first_parked - expected
        trigger = state.parked[first_parked]
        state.skipped.append((expected, first_parked - 1))
        del state.skipped[:-MAX_SKIPPED_RANGES]
        outputs.append(
            self._loop_event(
                trigger,
                self.resolve(trigger.agent_id),
                action="allow",
                level="warning",
                detector="sequence_gap",
                count=missing,
                message=(
                    f"WARNING: gave up waiting for {missing} missing event(s) of this "
                    f"session (seq {expected}..{first_parked - 1}); continuing without them."
                ),
                warning_key=None,
                call_id=None,
                tool_name=None,
                args_token=None,
                paired=None,
                now_ms=now_ms,
            )
        )
        state.next_seq = first_parked
        self._drain(state, now_ms, outputs)

    def _redeliver(
        self,
        state: SessionState,
        event: InputEvent,
        now_ms: int,
        outputs: list[Output],
        *,
        vouch_allow: bool = True,
    ) -> None:
        """A duplicate changes nothing; a duplicate tool_call gets its verdict again.

        ``vouch_allow`` False: the call's seq space is closed (its gateway restarted),
        so ``verdict_floor`` says nothing about it, and nobody waits for its verdict.
        """
        if not isinstance(event, ToolCall):
            return
        event_hash = hash32(event.event_id)
        for decision in state.decisions:
            if decision.event == event_hash:
                action = decision.action
                detector = decision.detector
                level: Level = _LEVEL_OF_ACTION[action]
                message = (
                    None
                    if detector is None
                    else message_for(
                        detector, level, event.tool_name, decision.count, decision.detail
                    )
                )
                outputs.append(
                    self._verdict(
                        event,
                        now_ms,
                        action=action,
                        level=level,
                        detector=detector,
                        count=decision.count,
                        message=message,
                        args_token=self._args_token(event),
                        paired=decision.detail if detector == "ping_pong" else None,
                    )
                )
                return
        if vouch_allow and event.seq is not None and event.seq >= state.verdict_floor:
            outputs.append(
                self._verdict(
                    event, now_ms, action="allow", level="none", args_token=self._args_token(event)
                )
            )

    # -- applying events -------------------------------------------------------------

    def _apply(
        self, state: SessionState, event: InputEvent, now_ms: int, outputs: list[Output]
    ) -> None:
        _touch(state, event, now_ms)
        if type(event) is ToolCall:
            self._on_tool_call(state, event, now_ms, outputs)
        elif type(event) is Compaction:
            self._on_compaction(state, event, outputs)
        elif type(event) is RunEnded:
            self._on_run_ended(state, event)
        else:
            assert isinstance(event, ToolResult)  # as it came, or as it waited (ResultAtRest)
            self._on_tool_result(state, event, now_ms, outputs)

    def _args_token(self, event: ToolCall | ToolResult) -> str:
        if event.args_hash is not None:
            return event.args_hash
        given = self._given
        # ``is``: the tokens are the stepped event's, not those of one it releases
        if given is not None and given[0] is event and (token := given[1][0]) is not None:
            return token
        return args_hash(event.args)

    def _result_token(self, event: ToolResult) -> tuple[str | None, str | None]:
        """(outcome token or None when nothing is recorded, unknown-tool name)."""
        error = event.error_text
        unknown = event.unknown_tool.lower() if event.unknown_tool else None
        if error is not None:
            unknown = unknown or unknown_tool_name(error)
        if event.result_hash is not None:
            return event.result_hash, unknown
        send_tools = self.resolver.send_tools
        rules = self._policy(event.agent_id).rules
        volatile = None if rules is None else rules.volatile_results
        if volatile is not None and volatile.applies(event.tool_name):
            # masked before the token is taken: the native decoder's token is unmasked
            token = result_token(
                event.tool_name,
                event.args,
                result=event.result,
                error=error,
                args_action=event.args_action,
                send_tools=send_tools,
                mask=volatile.mask,
            )
            return token, unknown
        given = self._given
        if (
            given is not None
            and given[0] is event
            and given[1][2]
            and event.tool_name not in send_tools  # the native token assumes none
        ):
            return given[1][1], unknown
        token = result_token(
            event.tool_name,
            event.args,
            result=event.result,
            error=error,
            args_action=event.args_action,
            send_tools=send_tools,
        )
        return token, unknown

    def _on_tool_call(
        self, state: SessionState, event: ToolCall, now_ms: int, outputs: list[Output]
    ) -> None:
        policy = self._policy(event.agent_id)
        config, rules = policy.config, policy.rules
        run, run_hash = self._run(event.run_id)  # run_hash: how the history names it
        tool = event.tool_name
        token = self._args_token(event)
        sig = signature(tool, token)
        if rules is not None:  # exempt tools are never judged, others may have thresholds
            if tool in rules.exempt:
                outputs.append(
                    self._verdict(event, now_ms, action="allow", level="none", args_token=token)
                )
                return
            config = rules.for_tool(config, tool)  # thresholds only: policy.detecting holds
        detection: Detection | None = None
        if policy.detecting:
            history = state.run_history(run_hash)
            recent = state.recent_count(sig, history)
            # only read when a record of this signature is there (see detect)
            known_poll = recent > 0 and is_known_poll(
                tool, action_of(event.args, event.args_action)
            )
            detection = detect(history, tool, sig, token, known_poll, config, run, recent)

        enforce = self.resolver.enforce
        judgement: Judgement | None = None
        if rules is not None:  # a rule may take over the verdict
            judgement = self.rules.judge(state, event, config, rules, run, sig, detection, enforce)
            detection, enforce = judgement.detection, judgement.enforce
        critical = detection is not None and detection.level == "critical"
        if policy.recording and not (critical and enforce):
            call_hash = hash32(event.call_id) if event.call_id else 0
            state.append(
                Record(tool, sig, run_hash, call_hash, 0, None, event.ts), config.history_size
            )

        action: Action
        level: Level
        detector: Detector | None
        if detection is None or not enforce:
            action, level, detector, count, message, paired = "allow", "none", None, 0, None, None
        else:
            action = "block" if critical else "warn"
            level, detector, count = detection.level, detection.detector, detection.count
            message, paired = detection.message, detection.paired_tool_name
        outputs.append(
            self._verdict(
                event,
                now_ms,
                action=action,
                level=level,
                detector=detector,
                count=count,
                message=message,
                args_token=token,
                paired=paired,
            )
        )
        if action != "allow":
            state.decisions.append(
                Decision(
                    hash32(event.event_id),
                    action,
                    detector,
                    count,
                    detection.detail if detection is not None else None,
                    -1 if event.seq is None else event.seq,
                )
            )
            if len(state.decisions) > MAX_DECISIONS:
                forgotten = state.decisions.pop(0)
                if forgotten.seq >= 0:
                    state.verdict_floor = max(state.verdict_floor, forgotten.seq + 1)
        if detection is not None and (critical or _warning_rises(state, detection, run)):
            outputs.append(
                self._detection_event(
                    event,
                    config,
                    detection,
                    action=(
                        ("abort" if judgement is not None and judgement.ends_run else "block")
                        if critical
                        else "warn"
                    ),
                    tool_name=tool,
                    token=token,
                    now_ms=now_ms,
                    args=self._payload(event),
                    enforced=enforce,
                )
            )
        if rules is not None and judgement is not None:
            self._apply_rules(
                state, event, config, rules, run, token, sig, judgement, now_ms, outputs
            )

    def _on_tool_result(
        self, state: SessionState, event: ToolResult, now_ms: int, outputs: list[Output]
    ) -> None:
        policy = self._policy(event.agent_id)
        rules = policy.rules
        run, run_hash = self._run(event.run_id)  # guards are keyed by run hash too
        if rules is None and not policy.recording:
            return  # nothing to count, nothing to record
        token, unknown = self._result_token(event)
        if rules is not None and self.rules.on_result(state, event, rules, run, token is not None):
            return  # spend, failure identity: an exempt tool is never counted
        if not policy.recording:
            return
        if token is None:
            return  # no result at all, or the loop detector's own block: nothing recorded
        tool = event.tool_name
        result = result_fingerprint(token)
        call_hash = hash32(event.call_id) if event.call_id else 0

        history = state.history
        sig = signature(tool, self._args_token(event)) if event.has_args else 0
        for back, rec in enumerate(reversed(history)):
            if (
                rec.run == run_hash
                and not rec.result
                and rec.tool == tool
                and (not call_hash or rec.call == call_hash)
                and (not sig or rec.sig == sig)
            ):
                # The call's record takes the result; call 0: nothing can match it again.
                state.replace(~back, Record(tool, rec.sig, run_hash, 0, result, unknown, rec.ts))
                sig = rec.sig
                break
        else:
            if not sig:
                outputs.append(
                    Rejection(
                        "orphan_result",
                        f"tool_result for call {event.call_id!r} carries no args and no "
                        "pending call with that id is in the session history",
                        event,
                    )
                )
                return
            state.append(
                Record(tool, sig, run_hash, 0, result, unknown, event.ts),
                policy.config.history_size,
            )

        guard_key = run_hash
        guard = state.guards.get(guard_key)
        if guard is None:
            return
        guard.remaining -= 1
        triple = (tool, sig, result)
        if guard.first is None:
            guard.first = triple
        elif triple != guard.first:
            guard.broken = True
        repeats = guard.window - guard.remaining  # results fed, all equal unless broken
        if not guard.broken and repeats >= guard.window:
            del state.guards[guard_key]
            message = guard_message(tool, repeats, guard.window)
            enforce = self.resolver.enforce
            token = self._args_token(event) if event.has_args else None
            if enforce:
                outputs.append(
                    self._verdict(
                        event,
                        now_ms,
                        action="abort",
                        level="critical",
                        detector="compaction_loop_persisted",
                        count=repeats,
                        message=message,
                        args_token=token,
                    )
                )
            outputs.append(
                self._loop_event(
                    event,
                    policy.config,
                    action="abort",
                    level="critical",
                    detector="compaction_loop_persisted",
                    count=repeats,
                    message=message,
                    warning_key=None,
                    call_id=event.call_id,
                    tool_name=tool,
                    args_token=token,
                    paired=None,
                    now_ms=now_ms,
                )
            )
        elif guard.remaining <= 0:
            del state.guards[guard_key]

    def _on_compaction(self, state: SessionState, event: Compaction, outputs: list[Output]) -> None:
        policy = self._policy(event.agent_id)
        if not policy.recording:
            return  # the guard is on unless loop detection is explicitly disabled
        run, guard_key = self._run(event.run_id)
        window = policy.config.guard_window_size
        state.guards.pop(guard_key, None)  # arming again resets, and makes it the newest
        state.guards[guard_key] = Guard(window, window)
        if len(state.guards) > MAX_GUARDS:
            del state.guards[next(iter(state.guards))]
        outputs.append(
            Notice("info", f"post-compaction guard armed for {window} attempts", event.key, run)
        )

    def _on_run_ended(self, state: SessionState, event: RunEnded) -> None:
        run = self._run(event.run_id)[1]
        state.guards.pop(run, None)
        for key in [key for key, (owner, _) in state.warnings.items() if owner == run]:
            del state.warnings[key]
        if state.rules is not None:
            state.rules.forget_run(run)

    # -- outputs ---------------------------------------------------------------------

    def _verdict(
        self,
        event: ToolCall | ToolResult,
        now_ms: int,
        *,
        action: Action,
        level: Level,
        args_token: str | None,
        detector: Detector | None = None,
        count: int = 0,
        message: str | None = None,
        paired: str | None = None,
    ) -> Verdict:
        """The verdict on ``event`` (a call, or the result that tripped a guard)."""
        # In the model's field order: the order of the published JSON.
        values = _judgement(
            "verdict",
            "verdict_id",
            verdict_id(event.key, event.run_id, event.call_id, action, event.incarnation),
            event,
            call_id=event.call_id,
            tool_name=event.tool_name,
            action=action,
            level=level,
            detector=detector,
            count=count,
            message=message,
            args_token=args_token,
            paired=paired,
        )
        values["event_ts"] = event.ts
        values["decided_ts"] = now_ms
        return unvalidated(Verdict, values, _VERDICT_FIELDS)

    def _config_dict(self, config: ResolvedConfig) -> dict[str, Any]:
        """The config as loop events show it; cached by value (resolved configs are
        rebuilt once the resolver's cache is full, so an id() would not do)."""
        cached = self._config_dicts.get(config)
        if cached is None:
            cached = config.as_dict()
            cached["enforce"] = self.resolver.enforce
            if len(self._config_dicts) >= _CONFIG_DICT_CACHE:
                self._config_dicts.clear()
            self._config_dicts[config] = cached
        return cached

    def _detection_event(
        self,
        event: ToolCall,
        config: ResolvedConfig,
        detection: Detection,
        *,
        action: Action,
        tool_name: str,
        token: str,
        now_ms: int,
        args: Any = None,
        enforced: bool | None = None,
    ) -> LoopEvent:
        """The loop event of a call's detection: a detector's, or a rule's."""
        return self._loop_event(
            event,
            config,
            action=action,
            level=detection.level,
            detector=detection.detector,
            count=detection.count,
            message=detection.message,
            warning_key=detection.warning_key,
            call_id=event.call_id,
            tool_name=tool_name,
            args_token=token,
            paired=detection.paired_tool_name,
            now_ms=now_ms,
            args=args,
            enforced=enforced,
        )

    def _loop_event(
        self,
        event: InputEvent,
        config: ResolvedConfig,
        *,
        action: Action,
        level: Level,
        detector: Detector,
        count: int,
        message: str | None,
        warning_key: str | None,
        call_id: str | None,
        tool_name: str | None,
        args_token: str | None,
        paired: str | None,
        now_ms: int,
        args: Any = None,
        enforced: bool | None = None,
    ) -> LoopEvent:
        # In the model's field order: the order of the published JSON.
        values = _judgement(
            "loop_event",
            "event_id",
            digest(
                f"{event.key}\x1f{event.event_id}\x1f{detector}\x1f{count}".encode(
                    "utf-8", "surrogatepass"
                )
            ),
            event,
            call_id=call_id,
            tool_name=tool_name,
            action=action,
            level=level,
            detector=detector,
            count=count,
            message=message,
            args_token=args_token,
            paired=paired,
        )
        values["warning_key"] = warning_key
        values["config"] = self._config_dict(config)
        values["enforced"] = self.resolver.enforce if enforced is None else enforced
        values["args"] = args
        values["fleet"] = None  # only the fleet breaker's own event has it (never written null)
        values["event_ts"] = event.ts
        values["decided_ts"] = now_ms
        return unvalidated(LoopEvent, values, _LOOP_EVENT_FIELDS)

    def _apply_rules(
        self,
        state: SessionState,
        event: ToolCall,
        config: ResolvedConfig,
        rules: ResolvedRules,
        run: str | None,
        token: str,
        sig: int,
        judgement: Judgement,
        now_ms: int,
        outputs: list[Output],
    ) -> None:
        """Issue 14 after a call's verdict: rules only reported, tallies, run endings.

        A run ends with an ``abort`` verdict beside the call's ``block`` (the gateway
        answers the call with the block and ends the run on the abort), as the
        post-compaction guard's abort does.
        """
        for shadow in judgement.shadows:
            if shadow.level == "critical" or _warning_rises(state, shadow, run):
                outputs.append(self._rule_event(event, config, shadow, token, now_ms))
        ending = self.rules.after_call(state, rules, run, sig, judgement)
        if ending is None:
            return
        if ending.enforced:
            outputs.append(
                self._verdict(
                    event,
                    now_ms,
                    action="abort",
                    level="critical",
                    detector=ending.detector,
                    count=ending.count,
                    message=ending.message,
                    args_token=token,
                )
            )
        if ending.detector == "tool_loop_run_ended":  # a cap's own loop event says abort
            outputs.append(
                self._loop_event(
                    event,
                    config,
                    action="abort",
                    level="critical",
                    detector=ending.detector,
                    count=ending.count,
                    message=ending.message,
                    warning_key=None,
                    call_id=event.call_id,
                    tool_name=event.tool_name,
                    args_token=token,
                    paired=None,
                    now_ms=now_ms,
                    enforced=ending.enforced,
                )
            )

    def _rule_event(
        self,
        event: ToolCall,
        config: ResolvedConfig,
        detection: Detection,
        token: str,
        now_ms: int,
    ) -> LoopEvent:
        """The loop event of a rule that is only reported (``enforced: false``)."""
        return self._detection_event(
            event,
            config,
            detection,
            action="block" if detection.level == "critical" else "warn",
            tool_name=event.tool_name,
            token=token,
            now_ms=now_ms,
            enforced=False,
        )

    def _payload(self, event: ToolCall) -> Any:
        """The call's raw args for its loop event, only when configured and at hand."""
        if not self.include_payloads or event.args is UNSET:
            return None
        if (
            len(orjson.dumps(event.args, option=orjson.OPT_NON_STR_KEYS))
            > MAX_LOOP_EVENT_ARGS_BYTES
        ):
            return None
        return event.args

    # -- offline use -----------------------------------------------------------------

    def replay(self, events: Iterable[InputEvent]) -> list[Output]:
        """Run events through per-session states, using each event's time as the clock."""
        states: dict[str, SessionState] = {}
        outputs: list[Output] = []
        for event in events:
            key = event.key
            states[key], produced = self.step(states.get(key), event, event.ts)
            outputs.extend(produced)
        return outputs


def _judgement(
    kind: str,
    id_field: str,
    output_id: str,
    event: InputEvent,
    *,
    call_id: str | None,
    tool_name: str | None,
    action: Action,
    level: Level,
    detector: Detector | None,
    count: int,
    message: str | None,
    args_token: str | None,
    paired: str | None,
) -> dict[str, Any]:
    """The first fields of a verdict or a loop event (those they share), in their
    models' order: one dict display, which costs less than filling a dict key by key."""
    return {
        "type": kind,
        id_field: output_id,
        "session_key": event.key,
        "run_id": event.run_id,
        "agent_id": event.agent_id,
        "call_id": call_id,
        "seq": event.seq,
        "incarnation": event.incarnation,
        "tool_name": tool_name,
        "action": action,
        "level": level,
        "detector": detector,
        "count": count,
        "message": message,
        "args_hash": args_token,
        "paired_tool_name": paired,
    }


def _touch(state: SessionState, event: InputEvent, now_ms: int) -> None:
    """Stamp the session active, in worker time and in event time (idle expiry).

    A gateway clock running ahead counts as now: a future ``ts`` must not keep a
    session from ever expiring.
    """
    state.touched_ms = now_ms
    event_ms = min(event.ts, now_ms)
    if event_ms > state.last_event_ms:
        state.last_event_ms = event_ms


def _waited_event_time(state: SessionState, watermark_ms: int | None, now_ms: int) -> int:
    """How long, in event time, the input has moved on since the first parked event.

    A gateway clock running ahead counts as the worker's now: one event with a
    far-future ``ts`` must not give every gap up at once.
    """
    first, last = state.parked_times()
    reached = min(last, now_ms)
    if watermark_ms is not None and watermark_ms < reached:
        reached = watermark_ms
    return reached - min(first, now_ms)


def _take_skipped(skipped: list[tuple[int, int]], seq: int) -> bool:
    """Whether ``seq`` lies in a gap given up on; if so, take it out of the gap."""
    for index, (first, last) in enumerate(skipped):
        if first <= seq <= last:
            pieces = [(first, seq - 1)] if seq > first else []
            if seq < last:
                pieces.append((seq + 1, last))
            skipped[index : index + 1] = pieces
            del skipped[:-MAX_SKIPPED_RANGES]  # a split must not grow past the cap
            return True
    return False


def _warning_rises(state: SessionState, detection: Detection, run: str | None) -> bool:
    """Publish a warning once per bucket of 10 per warning key (OpenClaw's de-dup)."""
    key = hash64(detection.warning_key)
    bucket = detection.count // WARNING_BUCKET_SIZE
    last = state.warnings.get(key)
    if bucket <= (last[1] if last is not None else 0):
        return False
    state.warnings[key] = (run_key(run), bucket)  # an existing key keeps its age (JS Map)
    if len(state.warnings) > MAX_WARNING_KEYS:
        del state.warnings[next(iter(state.warnings))]
    return True
