"""The session fold: one session's events applied to its state, with a way back.

Poison isolation: one session's events folded so that no single event can do harm.

Whatever fails for one event - the engine, encoding one of its outputs, an output
over the size Kafka accepts, the session's state over its byte cap - dead-letters
that event with a reason code and leaves the session's state as it was before it;
every other event is judged as if the bad one had never been sent. The worker
(one fold per session per batch) and ``loopfuse replay`` (one fold per session,
checkpointed) share this code, so both judge hostile input the same way.

The state before an event is not copied before every step (that would cost as much
as the step): a fold keeps the last good state *bytes* and the events applied
since (as their wire bytes where it has them), and rebuilds the state from them when
an event fails. The engine changes the state it is given, and deterministically, so
re-applying those events gives exactly the state they gave the first time.

:class:`SessionFold` holds that; :class:`PythonFold` folds over the Python engine,
:class:`NativeFold` over the native judge, wherever ``native_for`` accepts the engine;
both give the same messages and state bytes (tests/unit/test_native_fold.py).
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from loopfuse.schemas.decode import decode_event
from loopfuse.schemas.events import InputEvent, ReplyTo
from loopfuse.streams.engine import Engine, Notice, Output, SessionState, fleet, state_codec
from loopfuse.streams.engine.fingerprint import Fingerprints
from loopfuse.streams.engine.native import NATIVE
from loopfuse.streams.engine.native_step import NativeEngine
from loopfuse.streams.engine.state_codec import StateTooLarge
from loopfuse.streams.worker.outgoing import (
    EventFailed,
    Limits,
    Outgoing,
    Source,
    dead_letter,
    encode_outputs,
    tool_strike,
    tool_strikes,
)

log = logging.getLogger("loopfuse.processor")


class _Applied(msgspec.Struct, frozen=True, gc=False):
    """One step taken since ``base``: an event or a release, with its clocks.

    An event whose source has its bytes is kept as those bytes (``event`` None) and
    decoded again to go back, which is rare: its objects are freed as soon as it is
    judged, while they are in the cache, rather than at the checkpoint, long after.
    """

    event: InputEvent | None
    released: bool  # a release of what waits (Engine.release), not an event
    now_ms: int
    watermark_ms: int | None
    source: Source
    messages: list[Outgoing]


@dataclass(kw_only=True)
class SessionFold(ABC):
    """One session's state while events are applied to it, with a way back.

    ``base`` is the last state bytes known good (None: the session is new); the
    steps applied after it are kept with the clocks they ran with, so the state
    before any of them can be rebuilt exactly: the checkpoint, and the way back from
    an event that failed or broke the state, are this class's. A fold says how its
    state is encoded (``_encode``: the bytes, and the state to go on with), decoded
    and stepped again. An event's source carries its wire bytes where it has them
    (``Source.value``). Lifecycle: ``apply`` each event (its messages, or its dead
    letter), ``release`` what waits, then ``checkpoint`` for the bytes to keep (the
    table write) and the messages to send.
    """

    key: bytes  # the session key: the messages' Kafka key
    limits: Limits
    base: bytes | None
    state: Any
    strike: bool = False  # send the fleet breaker's strikes (only where it is configured)
    steps: list[_Applied] = field(default_factory=list)
    notices: list[Notice] = field(default_factory=list)
    shed: int = 0  # times the state was cut to fit its cap
    # Dead letters of the last checkpoint's isolation (events that broke the state).
    isolated: list[Outgoing] = field(default_factory=list)
    # Dead letters of events that failed in ``apply``, sent with the next checkpoint.
    letters: list[Outgoing] = field(default_factory=list)

    @property
    @abstractmethod
    def pending(self) -> bool:
        """Whether a restarted gateway's events wait for the input to move on."""

    @abstractmethod
    def apply(
        self,
        event: Any,
        source: Source,
        now_ms: int,
        watermark_ms: int | None,
        fingerprints: Fingerprints | None = None,
    ) -> list[Outgoing]:
        """Judge one event: its messages, or its dead letter (state then unchanged).
        ``fingerprints``: its tokens from the native decoder, if it made them."""

    @abstractmethod
    def release(self, now_ms: int, watermark_ms: int | None, source: Source) -> list[Outgoing]:
        """What waits in the state and may go now (see Engine.release)."""

    @abstractmethod
    def _encode(self, state: Any) -> tuple[bytes, Any]:
        """The state's bytes within the cap, and the state to go on with."""

    @abstractmethod
    def _decode(self, data: bytes | None) -> Any:
        """The state of ``data`` (None: a new session)."""

    @abstractmethod
    def _step(self, state: Any, step: _Applied) -> Any:
        """``step`` taken again on ``state``."""

    def checkpoint(self) -> tuple[bytes | None, list[Outgoing]]:
        """The state bytes to keep and the messages of every step they include.

        If the state cannot be encoded within its cap, the steps since ``base`` are
        taken again one by one, encoding after each, and the events that break it
        are dead-lettered instead (their messages are not sent).
        """
        self.isolated = []
        if self.state is None:
            return self.base, self._flush()
        try:
            data, self.state = self._encode(self.state)
        except Exception:
            return self._isolate()
        self.base = data
        return data, self._flush()

    def _flush(self) -> list[Outgoing]:
        messages = [item for step in self.steps for item in step.messages]
        messages += self.letters
        self.steps.clear()
        self.letters = []
        return messages

    def _isolate(self) -> tuple[bytes | None, list[Outgoing]]:
        steps = list(self.steps)
        self.steps.clear()
        data = self.base
        state = self._decode(data)
        messages: list[Outgoing] = []
        for step in steps:
            try:
                state = self._step(state, step)
                candidate, state = self._encode(state)
            except Exception as exc:
                code = "state_too_large" if isinstance(exc, StateTooLarge) else "engine_error"
                letter = dead_letter(step.source, code, f"session state: {exc}", self.limits)
                messages.append(letter)
                self.isolated.append(letter)
                state = self._decode(data)
                continue
            data = candidate
            messages.extend(step.messages)
        self.state = state
        self.base = data
        messages += self.letters
        self.letters = []
        return data, messages

    def _reject(self, source: Source, code: str, reason: str) -> list[Outgoing]:
        """Dead-letter an event and rebuild the state it had partly changed."""
        state = self._decode(self.base)
        for step in self.steps:
            state = self._step(state, step)
        self.state = state
        letter = dead_letter(source, code, reason, self.limits)
        self.letters.append(letter)
        return [letter]


@dataclass(kw_only=True)
class PythonFold(SessionFold):
    """The fold over the Python engine (:class:`Engine`): the reference, and what
    judges a config or a state the native judge does not take."""

    engine: Engine
    state: SessionState | None
    # The fleet breaker (None: not configured): tools broken fleet-wide, overlaid on
    # the verdicts.
    breakers: Mapping[str, fleet.ToolBreaker] | None = None

    @property
    def pending(self) -> bool:
        return self.state is not None and bool(self.state.pending)

    def apply(
        self,
        event: InputEvent,
        source: Source,
        now_ms: int,
        watermark_ms: int | None,
        fingerprints: Fingerprints | None = None,
    ) -> list[Outgoing]:
        asking = _asking(event, self.state)  # before the step drains what waits
        try:
            state, outputs = self.engine.step(self.state, event, now_ms, watermark_ms, fingerprints)
            encoded = self._encode_outputs(outputs, source, asking)
        except EventFailed as exc:
            return self._reject(source, exc.code, exc.reason)
        except Exception as exc:  # an engine bug must not take the partition down
            log.exception("engine failed on event %r", event.event_id[:80])
            return self._reject(source, "engine_error", f"engine error: {exc!r}")
        self.state = state
        kept = None if source.value is not None else event
        self.steps.append(_Applied(kept, False, now_ms, watermark_ms, source, encoded))
        return encoded

    def release(self, now_ms: int, watermark_ms: int | None, source: Source) -> list[Outgoing]:
        if self.state is None or not (self.state.pending or self.state.parked):
            return []
        asking = _asking(None, self.state)
        try:
            outputs = self.engine.release(self.state, now_ms, watermark_ms)
            encoded = self._encode_outputs(outputs, source, asking)
        except Exception as exc:
            log.exception("engine failed releasing the waiting events of a session")
            return self._reject(source, "engine_error", f"engine error: {exc!r}")
        self.steps.append(_Applied(None, True, now_ms, watermark_ms, source, encoded))
        return encoded

    # -- internals ---------------------------------------------------------------------

    def _encode_outputs(
        self, outputs: list[Output], source: Source, asking: Sequence[InputEvent]
    ) -> list[Outgoing]:
        if self.breakers:
            outputs = fleet.overlay(self.engine.rules, outputs, self.breakers)
        encoded = encode_outputs(outputs, self.key, self.limits, source, self.notices, asking)
        if self.strike:
            encoded += tool_strikes(outputs)
        return encoded

    def _encode(self, state: SessionState) -> tuple[bytes, SessionState]:
        before = state_codec.shed_marks(state)
        data = state_codec.fit(state, self.limits.max_state_bytes)  # sheds in place
        if state_codec.shed_marks(state) != before:  # not only history: whatever fit cut
            self.shed += 1
        return data, state

    def _decode(self, data: bytes | None) -> SessionState | None:
        return None if data is None else state_codec.decode(data)

    def _step(self, state: SessionState | None, step: _Applied) -> SessionState:
        if step.released:
            assert state is not None
            self.engine.release(state, step.now_ms, step.watermark_ms)
            return state
        event = step.event
        if event is None:  # kept as its bytes, which decoded to it before
            value = step.source.value
            assert value is not None
            event = decode_event(
                value, max_bytes=len(value), max_identifier_bytes=self.limits.max_identifier_bytes
            )
        state, _ = self.engine.step(state, event, step.now_ms, step.watermark_ms)
        return state


#: The native reader's event (Judge.read), which only Judge.step_read takes.
_READ_EVENT: type | None = getattr(NATIVE, "ReadEvent", None)


@dataclass(kw_only=True)
class NativeFold(SessionFold):
    """The fold over the native judge (``native_step.NativeEngine``), for an engine
    ``native_for`` accepts: the same messages, dead letters and state bytes as
    :class:`PythonFold` (tests/unit/test_native_fold.py), over a state held in Rust
    (``NativeState``).

    Its events are ``Judge.read``'s (the worker's native read of the wire bytes) or,
    where that read leaves an event to Python, what ``decode_event`` made of them.
    Verdicts come with the reply of the event they answer, matched as
    :func:`reply_route` does (the judge knows the events waiting in the state).
    """

    native: NativeEngine

    @property
    def pending(self) -> bool:
        return self.state is not None and bool(self.state.has_pending)

    def apply(
        self,
        event: Any,  # Judge.read's event, or an InputEvent the native read left to Python
        source: Source,
        now_ms: int,
        watermark_ms: int | None,
        fingerprints: Fingerprints | None = None,  # the Python fold's; the native makes its own
    ) -> list[Outgoing]:
        judge = self.native.judge
        try:
            if type(event) is _READ_EVENT:
                state, outputs = judge.step_read(self.state, event, now_ms, watermark_ms)
            else:
                state, outputs = self.native.step_event(
                    self.state, event, now_ms, watermark_ms, routed=True
                )
            encoded = self._encode_outputs(outputs, source)
        except EventFailed as exc:
            return self._reject(source, exc.code, exc.reason)
        except Exception as exc:  # an engine bug must not take the partition down
            log.exception("engine failed on an event of session %r", self.key[:80])
            return self._reject(source, "engine_error", f"engine error: {exc!r}")
        self.state = state
        kept = None if source.value is not None or type(event) is _READ_EVENT else event
        self.steps.append(_Applied(kept, False, now_ms, watermark_ms, source, encoded))
        return encoded

    def release(self, now_ms: int, watermark_ms: int | None, source: Source) -> list[Outgoing]:
        if self.state is None or not self.state.waiting:
            return []
        try:
            outputs = self.native.judge.release_routed(self.state, now_ms, watermark_ms)
            encoded = self._encode_outputs(outputs, source)
        except Exception as exc:
            log.exception("engine failed releasing the waiting events of a session")
            return self._reject(source, "engine_error", f"engine error: {exc!r}")
        self.steps.append(_Applied(None, True, now_ms, watermark_ms, source, encoded))
        return encoded

    # -- internals ---------------------------------------------------------------------

    def _encode_outputs(self, outputs: list[Any], source: Source) -> list[Outgoing]:
        """encode_outputs for the native fold's outputs (Shape::Routed in session_py.rs)."""
        key, limits = self.key, self.limits
        encoded: list[Outgoing] = []
        strikes: list[Outgoing] = []
        budget = limits.output_budget - len(key)
        for output in outputs:
            kind = output[0]
            if kind == "verdict":
                _, value, action, detector, reply = output
                item = Outgoing(
                    "verdict",
                    key,
                    value,
                    action,
                    detector,
                    None if reply is None else ReplyTo(*reply),
                )
            elif kind == "loop_event":
                _, value, detector, strike = output
                item = Outgoing("loop_event", key, value, detector)
                if strike is not None and self.strike:
                    strikes.append(tool_strike(strike[0], strike[1], detector, strike[2]))
            elif kind == "rejection":
                encoded.append(dead_letter(source, output[1], output[2], limits))
                continue
            else:  # a notice
                self.notices.append(Notice(*output[1:]))
                continue
            if len(item.value) > budget:
                raise EventFailed(
                    "output_too_large",
                    f"its {item.kind} would be {len(item.value)} bytes, over the producer's "
                    f"request size ({limits.max_output_bytes})",
                )
            encoded.append(item)
        return encoded + strikes

    def _encode(self, state: Any) -> tuple[bytes, Any]:
        data, kept = self.native.checkpoint(state, self.limits.max_state_bytes)
        if kept is not state:  # it shed evidence to fit its cap
            self.shed += 1
        return data, kept

    def _decode(self, data: bytes | None) -> Any:
        return None if data is None else self.native.read(data)

    def _step(self, state: Any, step: _Applied) -> Any:
        native = self.native
        if step.released:
            assert state is not None
            native.release(state, step.now_ms, step.watermark_ms)
            return state
        value = step.source.value
        if value is None:  # an event with no bytes (kept as Python decoded it)
            assert step.event is not None
            state, _ = native.step_event(state, step.event, step.now_ms, step.watermark_ms)
            return state
        state, _ = native.step(
            state,
            value,
            step.now_ms,
            step.watermark_ms,
            max_bytes=len(value),
            max_identifier_bytes=self.limits.max_identifier_bytes,
        )
        return state


def _asking(event: InputEvent | None, state: SessionState | None) -> Sequence[InputEvent]:
    """The events a step's verdicts may answer, when one of them named a reply; else ()."""
    waiting: list[InputEvent] = []
    if state is not None and (state.parked or state.pending):
        waiting = [*state.parked.values(), *state.pending]
    if event is not None:
        if not waiting:
            return (event,) if event.reply_to is not None else ()
        waiting.append(event)
    return waiting if any(e.reply_to is not None for e in waiting) else ()
