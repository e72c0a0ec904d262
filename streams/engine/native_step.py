"""The native fold (native/src/session.rs) behind the Python engine's API.

A session's events folded in Rust, over a state held in Rust (``NativeState``), for
every config (:func:`native_for` decides, once per engine): the decision table and the
guard, provider send tools, payloads in loop events (the call's args written as orjson
writes them), and the opt-in rules (their tallies are part of the native state,
their resolution per agent is Python's, handed over once per agent by
:meth:`NativeEngine._policy_values`). Its outputs are the Python engine's, byte for byte:
verdicts and loop events as their published JSON, notices and rejections as their
fields (tests/unit/test_native_identity.py runs the engine corpus through both).

An event goes in as its wire bytes; where the native decoder leaves an event to the
Python decoder (an RFC 3339 ``ts``, a big integer, a lone surrogate, every rejection),
Python decodes it and computes its tokens, and the fold takes those. A state writes
its bytes natively, the events waiting in it included (:meth:`NativeEngine.checkpoint`:
format 5 straight from the native state), and converts to the Python engine's
``SessionState`` and back (:meth:`NativeEngine.to_python`,
:meth:`NativeEngine.from_python`) for the rest: a waiting event with a usage cost, and
shedding over the cap. A state's bytes are read natively too (:meth:`NativeEngine.read`),
but for an event waiting in them and older formats, which the Python reader reads.

Where it runs: ``loopfuse replay`` (streams/replay.py), and the worker's session fold
(the worker's ``NativeFold``, streams/worker/fold.py: events read natively from their bytes,
``Judge.read``, verdicts with the reply of the event they answer, and the fleet breaker's
overlay on them from the worker's live breakers, ``Judge.set_breakers``; loop events
with the strike each makes).
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any

import orjson
from msgspec import UNSET

from loopfuse.schemas.decode import (
    DEFAULT_MAX_DEPTH,
    DEFAULT_MAX_EVENT_BYTES,
    decode_event,
)
from loopfuse.schemas.events import (
    DEFAULT_MAX_IDENTIFIER_BYTES,
    Compaction,
    Detector,
    InputEvent,
    Level,
    ReplyTo,
    RunEnded,
    ToolCall,
    ToolResult,
    Usage,
)
from loopfuse.streams.engine import state_codec
from loopfuse.streams.engine.config import ResolvedConfig
from loopfuse.streams.engine.fingerprint import action_of, unknown_tool_name
from loopfuse.streams.engine.history import Record
from loopfuse.streams.engine.native import NATIVE
from loopfuse.streams.engine.rule_config import ResolvedRules
from loopfuse.streams.engine.rule_state import decode_rule_state
from loopfuse.streams.engine.rules import _cap_detection, failure_identity
from loopfuse.streams.engine.state import Decision, Guard, ResultAtRest, SessionState
from loopfuse.streams.engine.state_codec.body import ACTIONS, DETECTORS, rules_bytes
from loopfuse.streams.engine.state_codec.varint import read_uvarint
from loopfuse.streams.engine.step import Engine


class ReplayStop(IntEnum):
    """Why ``Judge.replay_lines`` stopped (native/src/session_py.rs's REPLAY_*)."""

    DONE = 0
    LEFT = 1
    FAILED = 2
    CHECKPOINT = 3


#: One output of a native step: ("verdict" | "loop_event", its JSON) or
#: ("notice", level, message, session key, run id) or ("rejection", code, reason,
#: event id).
NativeOutput = tuple[Any, ...]


def native_for(engine: Engine) -> NativeEngine | None:
    """The native fold for this engine, or None where the Python engine must judge: no
    native build, or an engine of another class (a test's wrapper, whose own step
    would be bypassed)."""
    if NATIVE is None or not hasattr(NATIVE, "Judge"):
        return None
    if not isinstance(engine, Engine):  # a wrapper (tests' failing engines): its own step
        return None
    return NativeEngine(engine)


class NativeEngine:
    """The native fold with the settings and config of a Python ``Engine``."""

    def __init__(self, engine: Engine) -> None:
        assert NATIVE is not None
        self.engine = engine
        self.judge = self.judge_from(NATIVE)

    def judge_from(self, module: Any) -> Any:
        """A ``Judge`` of this engine's settings from a native module (the checkout's
        build, or an installed wheel's: tests/integration/test_native_wheel.py)."""
        engine = self.engine
        return module.Judge(
            self._policy_values,
            unknown_tool_name,
            failure_identity,
            _cap_values,
            sorted(engine.resolver.send_tools),
            engine.include_payloads,
            engine.resolver.enforce,
            engine.max_parked,
            engine.max_parked_bytes,
            engine.gap_timeout_ms,
        )

    def _policy_values(self, agent_id: str | None) -> tuple[Any, ...]:
        """An agent's config and rules as the native fold reads them (session_py.rs's
        ConfigFields and RulesTuple), once per agent."""
        engine = self.engine
        config = engine.resolve(agent_id)
        rules = engine.rules.resolve(agent_id)
        return _config_fields(config), None if rules is None else _rules_values(rules, config)

    def step(
        self,
        state: Any,
        raw: bytes,
        now_ms: int,
        watermark_ms: int | None,
        *,
        max_bytes: int = DEFAULT_MAX_EVENT_BYTES,
        max_depth: int = DEFAULT_MAX_DEPTH,
        max_identifier_bytes: int = DEFAULT_MAX_IDENTIFIER_BYTES,
    ) -> tuple[Any, list[NativeOutput]]:
        """One event from its wire bytes: (the state, changed in place or new, and the
        outputs). Raises EventRejected, as ``decode_event`` does, for bytes it rejects
        (the state then unchanged)."""
        got = self.judge.step_raw(
            state, raw, now_ms, watermark_ms, max_bytes, max_depth, max_identifier_bytes
        )
        if got is not None:
            return got  # type: ignore[no-any-return]
        event = decode_event(
            raw,
            max_bytes=max_bytes,
            max_depth=max_depth,
            max_identifier_bytes=max_identifier_bytes,
        )
        return self.judge.step_event(  # type: ignore[no-any-return]
            state, self._event_values(event), now_ms, watermark_ms
        )

    def replay_lines(
        self,
        states: dict[str, Any],
        lines: list[bytes],
        start: int,
        *,
        max_bytes: int,
        max_depth: int,
        max_identifier_bytes: int,
        checkpoint_every: int,
        max_state_bytes: int,
    ) -> tuple[list[Any], int, ReplayStop, Any]:
        """Replay's steps over ``lines[start:]`` (``replay_step``'s, each line's trailing
        CRs and LFs left out) in one call, until a line needs Python: (outputs, next,
        why it stopped at ``lines[next]``, a value). Outputs as ``replay_step`` gives
        them, but a rejection's last field is its line's index. ``ReplayStop.LEFT``:
        that line is the Python decoder's (not stepped: ``replay_step`` it);
        ``FAILED``: its step raised the value (its dead letter, then go on past it);
        ``CHECKPOINT``: the previous line's session (the value, its key) needs
        :meth:`checkpoint` first; ``DONE``: no line left."""
        outputs, next_line, stop, value = self.judge.replay_lines(
            states,
            lines,
            start,
            max_bytes,
            max_depth,
            max_identifier_bytes,
            checkpoint_every,
            max_state_bytes,
        )
        return outputs, next_line, ReplayStop(stop), value

    def replay_step(
        self,
        states: dict[str, Any],
        raw: bytes,
        *,
        max_bytes: int,
        max_depth: int,
        max_identifier_bytes: int,
        checkpoint_every: int,
        max_state_bytes: int,
    ) -> tuple[str, list[Any], bool]:
        """Replay's step: one event, its own time as the clock, no watermark, its
        session's state in ``states``. (session key, outputs, whether its state needs
        :meth:`checkpoint` now), verdicts and loop events among the outputs as their
        bytes alone; raises EventRejected as ``decode_event`` does. Every
        ``checkpoint_every`` steps of a session its state's bytes are written natively,
        and only one over ``max_state_bytes`` or holding a waiting event with a usage
        cost needs Python's."""
        got = self.judge.replay_step(
            states,
            raw,
            max_bytes,
            max_depth,
            max_identifier_bytes,
            checkpoint_every,
            max_state_bytes,
        )
        if got is not None:
            return got  # type: ignore[no-any-return]
        event = decode_event(
            raw,
            max_bytes=max_bytes,
            max_depth=max_depth,
            max_identifier_bytes=max_identifier_bytes,
        )
        key = event.key
        states[key], outputs = self.judge.step_event(
            states.get(key), self._event_values(event), event.ts, None
        )
        bare = [o[1] if o[0] in ("verdict", "loop_event") else o for o in outputs]
        return key, bare, states[key].counted(checkpoint_every, max_state_bytes)

    def checkpoint(self, state: Any, cap: int) -> tuple[bytes, Any]:
        """The state's bytes as the Python engine writes them (``state_codec.fit``), and
        the state to go on with: the same object, or, when it had to shed evidence to
        fit ``cap``, a new one with what is left. Raises StateTooLarge as ``fit`` does."""
        data: bytes | None = state.checkpoint(cap)  # format 5 from Rust, if it fits (as fit)
        if data is not None:
            return data, state
        # a waiting event has a usage cost, or it is over its cap (rare): as the Python
        # engine's, which fit may shed from, and back (the round trip is exact:
        # tests/unit/test_native_step.py)
        python = self.to_python(state)
        before = state_codec.shed_marks(python)
        data = state_codec.fit(python, cap)
        if state_codec.shed_marks(python) == before:
            return data, state  # nothing shed: the state goes on as it is
        return data, self.from_python(python)

    def read(self, data: bytes) -> Any:
        """A native state from its bytes, as ``from_python(state_codec.decode(data))``
        builds it: read in Rust where they are format 4 or 5 with no event waiting in
        them (``NativeState.read``), else through the Python reader. Raises ValueError
        as ``decode`` does."""
        state = self.read_natively(data)
        return self.from_python(state_codec.decode(data)) if state is None else state

    @staticmethod
    def read_natively(data: bytes) -> Any:
        """A native state from its bytes where Rust reads them (see :meth:`read`), else
        None: the Python reader's to read or refuse."""
        assert NATIVE is not None
        return NATIVE.NativeState.read(data)

    def release(self, state: Any, now_ms: int, watermark_ms: int | None) -> list[NativeOutput]:
        """Engine.release: what waits in ``state`` and may go now."""
        return self.judge.release(state, now_ms, watermark_ms)  # type: ignore[no-any-return]

    def step_event(
        self,
        state: Any,
        event: InputEvent,
        now_ms: int,
        watermark_ms: int | None,
        *,
        routed: bool = False,
    ) -> tuple[Any, list[Any]]:
        """Engine.step of an event Python decoded (not the native read's); ``routed``:
        each verdict with the reply of the event it answers."""
        values = self._event_values(event)
        if routed:
            return self.judge.step_event_routed(state, values, now_ms, watermark_ms)  # type: ignore[no-any-return]
        return self.judge.step_event(state, values, now_ms, watermark_ms)  # type: ignore[no-any-return]

    def _event_values(self, event: InputEvent) -> tuple[Any, ...]:
        """An event Python decoded, with the tokens the Python engine computes for it."""
        reply = event.reply_to
        head = (
            event.type,
            event.event_id,
            event.session_key,
            event.run_id,
            event.agent_id,
            event.incarnation,
            event.seq,
            event.ts,
            None if reply is None else (reply.topic, reply.partition, reply.requester),
        )
        engine = self.engine
        if isinstance(event, ToolCall):
            body: tuple[Any, ...] = (
                event.call_id,
                event.tool_name,
                engine._args_token(event),
                action_of(event.args, event.args_action),
                None,
                None,
                None,
                _payload_json(engine._payload(event)),
                None,
            )
        elif isinstance(event, ToolResult):
            outcome, unknown = engine._result_token(event)
            usage = event.usage
            body = (
                event.call_id,
                event.tool_name,
                engine._args_token(event) if event.has_args else None,
                outcome,
                unknown,
                None
                if usage is None
                else (usage.input_tokens, usage.output_tokens, usage.total_tokens, usage.cost),
                event.error_text,
                None,
                event.failure if type(event) is ResultAtRest else None,
            )
        else:
            body = (None,) * 9
        return head, body

    # -- the state as the Python engine's ------------------------------------------------

    @staticmethod
    def to_python(native: Any) -> SessionState:
        """The Python engine's SessionState equal to a native one (its events at rest as
        ``Engine._at_rest`` keeps them)."""
        (history, guards, warnings, next_seq, parked, skipped, seen_ids, decisions), rest = (
            native.export()
        )
        verdict_floor, touched_ms, last_event_ms, incarnation, retired, pending, rules = rest
        state = SessionState(
            history=[Record(*values) for values in history],
            warnings={key: (run, bucket) for key, run, bucket in warnings},
            next_seq=next_seq,
            skipped=list(skipped),
            seen_ids=list(seen_ids),
            decisions=[
                Decision(event, ACTIONS[action], DETECTORS[detector], count, detail, seq)
                for event, action, detector, count, detail, seq in decisions
            ],
            verdict_floor=verdict_floor,
            touched_ms=touched_ms,
            last_event_ms=last_event_ms,
            incarnation=incarnation,
            retired=list(retired),
            pending=[_at_rest(values) for values in pending],
        )
        for run, window, remaining, first, broken in guards:
            state.guards[run] = Guard(window, remaining, first, broken)
        for seq, values in parked:
            state.park(seq, _at_rest(values))
        if rules:
            state.rules, _ = decode_rule_state(rules, 0, read_uvarint)
        return state

    @staticmethod
    def from_python(state: SessionState) -> Any:
        """A native state equal to a Python one (read back from a state's bytes)."""
        assert NATIVE is not None
        order = (
            [(r.tool, r.sig, r.run, r.call, r.result, r.unknown, r.ts) for r in state.history],
            [(run, g.window, g.remaining, g.first, g.broken) for run, g in state.guards.items()],
            [(key, run, bucket) for key, (run, bucket) in state.warnings.items()],
            state.next_seq,
            [(seq, _values_at_rest(event)) for seq, event in state.parked.items()],
            state.skipped,
            state.seen_ids,
            [
                (
                    d.event,
                    ACTIONS.index(d.action),
                    DETECTORS.index(d.detector),
                    d.count,
                    d.detail,
                    d.seq,
                )
                for d in state.decisions
            ],
        )
        rest = (
            state.verdict_floor,
            state.touched_ms,
            state.last_event_ms,
            state.incarnation,
            state.retired,
            [_values_at_rest(event) for event in state.pending],
            rules_bytes(state),
        )
        return NATIVE.NativeState.import_values((order, rest))


def _at_rest(values: tuple[Any, ...]) -> InputEvent:
    """A native event at rest as the Python engine keeps it (``Engine._at_rest``)."""
    (kind, event_id, session_key, run_id, agent_id, incarnation, seq, ts, reply), body = values
    common: dict[str, Any] = {
        "event_id": event_id,
        "session_key": session_key,
        "run_id": run_id,
        "agent_id": agent_id,
        "incarnation": incarnation,
        "seq": seq,
        "ts": ts,
        "reply_to": None if reply is None else ReplyTo(*reply),
    }
    call_id, tool_name, token, fourth, unknown, usage, _error, _args, failure = body
    if kind == "tool_call":
        return ToolCall(
            **common, call_id=call_id, tool_name=tool_name, args_hash=token, args_action=fourth
        )
    if kind == "tool_result":
        return ResultAtRest(
            **common,
            call_id=call_id,
            tool_name=tool_name,
            args_hash=token,
            result=None if fourth is None else UNSET,
            result_hash=fourth,
            unknown_tool=unknown,
            usage=None if usage is None else Usage(*usage),
            failure=failure,
        )
    if kind == "compaction":
        return Compaction(**common)
    return RunEnded(**common)


def _payload_json(args: Any) -> bytes | None:
    """A loop event's ``args`` (``Engine._payload``: None when not configured or too
    large) as the JSON the native fold writes into it, as ``LoopEvent.to_json`` would."""
    return None if args is None else orjson.dumps(args)


def _values_at_rest(event: InputEvent) -> tuple[Any, ...]:
    """A Python event at rest (as the Python engine parks it) as the native fold's."""
    reply = event.reply_to
    head = (
        event.type,
        event.event_id,
        event.session_key,
        event.run_id,
        event.agent_id,
        event.incarnation,
        event.seq,
        event.ts,
        None if reply is None else (reply.topic, reply.partition, reply.requester),
    )
    if isinstance(event, ToolCall):
        return head, (
            event.call_id,
            event.tool_name,
            event.args_hash,
            event.args_action,
            None,
            None,
            None,
            None,
            None,
        )
    if isinstance(event, ToolResult):
        usage = event.usage
        return head, (
            event.call_id,
            event.tool_name,
            event.args_hash,
            event.result_hash,
            event.unknown_tool,
            None
            if usage is None
            else (usage.input_tokens, usage.output_tokens, usage.total_tokens, usage.cost),
            None,
            None,
            event.failure if type(event) is ResultAtRest else None,
        )
    return head, (None,) * 9


# -- an agent's config and rules, as the native fold reads them ----------------------

#: Counts and caps past these never differ from them (a session makes fewer calls):
#: bounded so that the native fold's unsigned ints hold them.
_U64_MAX = 2**64 - 1
_U128_MAX = 2**128 - 1


def _config_fields(config: ResolvedConfig) -> tuple[Any, ...]:
    return (
        config.enabled,
        config.history_size,
        config.warning_threshold,
        config.critical_threshold,
        config.unknown_tool_threshold,
        config.global_circuit_breaker_threshold,
        config.generic_repeat,
        config.known_poll_no_progress,
        config.ping_pong,
        config.guard_window_size,
    )


def _rules_values(rules: ResolvedRules, config: ResolvedConfig) -> tuple[Any, ...]:
    """session_py.rs's RulesTuple: each rule's settings, None where it is off; a cap with
    the amount that warns as rules.py's ``_run_cap`` computes it."""
    ending, cycle, failure, churn, caps, fleet = (
        rules.run_ending,
        rules.cycle,
        rules.repeated_failure,
        rules.argument_churn,
        rules.run_caps,
        rules.fleet_breaker,
    )
    identical, volatile = rules.identical_calls, rules.volatile_results

    def cap(limit: float | None, bound: int) -> tuple[Any, float] | None:
        if limit is None or caps is None:
            return None
        # rounded: 0.7 * 10 is 7.000000000000001 in binary, and the 7th call must warn
        warn_from = round(caps.warn_at * limit, 9)
        return (min(limit, bound) if isinstance(limit, int) else limit), warn_from

    return (
        None
        if ending is None
        else (
            ending.enforced,
            min(ending.criticals_per_run, _U64_MAX),
            min(ending.blocked_streak, _U64_MAX),
        ),
        None if cycle is None else (cycle.enforced, cycle.max_period),
        None
        if failure is None
        else (
            failure.enforced,
            min(failure.warning_threshold, _U64_MAX),
            min(failure.critical_threshold, _U64_MAX),
        ),
        None if churn is None else churn.enforced,
        None
        if caps is None
        else (
            caps.enforced,
            cap(caps.max_tool_calls, _U128_MAX),
            cap(caps.tokens_per_run, _U128_MAX),
            cap(caps.tokens_per_session, _U128_MAX),
            cap(caps.cost_per_run, 0),
            cap(caps.cost_per_session, 0),
        ),
        None if fleet is None else (fleet.enforced, fleet.action),
        sorted(rules.exempt),
        [(tool, _config_fields(rules.for_tool(config, tool))) for tool, _ in rules.thresholds],
        None
        if identical is None
        else (
            identical.enforced,
            min(identical.warning_threshold, _U64_MAX),
            min(identical.critical_threshold, _U64_MAX),
        ),
        None
        if volatile is None
        else (
            None if volatile.tools is None else sorted(volatile.tools),
            list(volatile.patterns),
        ),
    )


def _cap_values(
    level: Level, detector: Detector, scope: str, used: float, cap: float, run: str | None
) -> tuple[int, str, str]:
    """rules.py's ``_cap_detection`` as the native fold takes it: (count, message, key)."""
    found = _cap_detection(level, detector, scope, used, cap, run)
    return found.count, found.message, found.warning_key
