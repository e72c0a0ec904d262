"""Poison isolation: one session's events folded so that no single event can do harm.

Whatever fails for one event - the engine, encoding one of its outputs, an output
over the size Kafka accepts, the session's state over its byte cap - dead-letters
that event with a reason code and leaves the session's state as it was before it;
every other event is judged as if the bad one had never been sent. The worker
(one fold per session per batch) and ``loopfuse replay`` (one fold per session,
checkpointed) share this code, so both judge hostile input the same way.

The state before an event is not copied before every step (that would cost as much
as the step): a fold keeps the last good state *bytes* and the events applied
since, and rebuilds the state from them when an event fails. The engine is a pure
fold, so re-applying those events gives exactly the state they gave the first time.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from schemas.events import DeadLetter
from streams.engine import Engine, LoopEvent, Notice, Output, Rejection, SessionState, Verdict
from streams.engine.state import InputEventT, StateTooLarge

log = logging.getLogger("loopfuse.processor")

#: Kafka's per-record overhead and our headroom, subtracted from the producer's
#: request size when checking an output before it is sent.
RECORD_OVERHEAD_BYTES = 1_024
#: A dead letter's reason is cut to this many characters (it may quote input).
MAX_REASON_CHARS = 1_000

OutputKind = Literal["verdict", "loop_event", "dead_letter"]


@dataclass(frozen=True, slots=True)
class Limits:
    """Byte bounds of what one session may keep and one output may weigh."""

    max_state_bytes: int = 65_536
    max_output_bytes: int = 1_000_000  # the producer's max request size
    dead_letter_original_bytes: int = 65_536
    max_identifier_bytes: int = 512

    @property
    def output_budget(self) -> int:
        return self.max_output_bytes - RECORD_OVERHEAD_BYTES

    @property
    def original_budget(self) -> int:
        """What a dead letter may quote of its input: within the output budget."""
        return max(0, min(self.dead_letter_original_bytes, self.output_budget - 16_384))


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One message to publish: which output topic, its key and its value."""

    kind: OutputKind
    key: bytes | None
    value: bytes
    detail: str  # verdict action, loop-event detector or dead-letter code (metrics)
    detector: str | None = None  # a verdict's detector (metrics)


@dataclass(frozen=True, slots=True)
class Source:
    """Where an input came from, for its dead letter."""

    topic: str | None = None
    partition: int | None = None
    offset: int | None = None
    line: int | None = None
    key: bytes | None = None
    value: bytes | None = None


def dead_letter(source: Source, code: str, reason: str, limits: Limits) -> Outgoing:
    """A dead letter for ``source``, bounded whatever the input (key, value, reason)."""
    raw = source.value or b""
    budget = limits.original_budget
    key_text = None
    if source.key is not None:
        key_text = source.key[: limits.max_identifier_bytes].decode("utf-8", "replace")
    letter = DeadLetter(
        error_code=code,
        reason=reason[:MAX_REASON_CHARS],
        source_topic=source.topic,
        partition=source.partition,
        offset=source.offset,
        line=source.line,
        key=key_text,
        original=raw[:budget].decode("utf-8", "replace"),
        original_size=len(raw),
        original_truncated=len(raw) > budget,
    )
    value = letter.model_dump_json(exclude_none=source.line is not None).encode()
    # The input's key keeps a dead letter next to its session's; an over-long one is cut.
    key = None if source.key is None else source.key[: limits.max_identifier_bytes]
    return Outgoing("dead_letter", key, value, code)


class EventFailed(Exception):
    """One event could not be judged; ``code`` is its dead-letter code."""

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


def encode_outputs(
    outputs: Sequence[Output],
    key: bytes,
    limits: Limits,
    source: Source,
    notices: list[Notice],
) -> list[Outgoing]:
    """The engine's outputs for one event as messages; raises EventFailed if one cannot be."""
    encoded: list[Outgoing] = []
    budget = limits.output_budget - len(key)
    for output in outputs:
        if isinstance(output, Verdict):
            value = output.to_json()
            item = Outgoing("verdict", key, value, output.action, output.detector)
        elif isinstance(output, LoopEvent):
            value = output.to_json()
            item = Outgoing("loop_event", key, value, output.detector)
        elif isinstance(output, Rejection):
            encoded.append(dead_letter(source, output.code, output.reason, limits))
            continue
        elif isinstance(output, Notice):
            notices.append(output)
            continue
        else:  # pragma: no cover - the engine emits nothing else
            raise EventFailed("engine_error", f"unknown engine output {type(output).__name__}")
        if len(value) > budget:
            raise EventFailed(
                "output_too_large",
                f"its {item.kind} would be {len(value)} bytes, over the producer's "
                f"request size ({limits.max_output_bytes})",
            )
        encoded.append(item)
    return encoded


@dataclass(slots=True)
class _Applied:
    """One step taken since ``base``: an event (None: a release), with its clocks."""

    event: InputEventT | None
    now_ms: int
    watermark_ms: int | None
    source: Source
    messages: list[Outgoing]


@dataclass
class SessionFold:
    """One session's state while events are applied to it, with a way back.

    ``base`` is the last state bytes known good (None: the session is new); the
    steps applied after it are kept with the clocks they ran with, so the state
    before any of them can be rebuilt exactly. Lifecycle: ``apply`` each event (its
    messages, or its dead letter), ``release`` what waits, then ``checkpoint`` for
    the bytes to keep (the table write) and the messages to send.
    """

    engine: Engine
    key: bytes
    limits: Limits
    base: bytes | None
    state: SessionState | None
    steps: list[_Applied] = field(default_factory=list)
    notices: list[Notice] = field(default_factory=list)
    shed: int = 0  # times the state was cut to fit its cap
    # Dead letters of the last checkpoint's isolation (events that broke the state).
    isolated: list[Outgoing] = field(default_factory=list)

    def apply(
        self, event: InputEventT, source: Source, now_ms: int, watermark_ms: int | None
    ) -> list[Outgoing]:
        """Judge one event: its messages, or its dead letter (state then unchanged)."""
        try:
            state, outputs = self.engine.step(self.state, event, now_ms, watermark_ms)
            encoded = encode_outputs(outputs, self.key, self.limits, source, self.notices)
        except EventFailed as exc:
            return self._reject(source, exc.code, exc.reason)
        except Exception as exc:  # an engine bug must not take the partition down
            log.exception("engine failed on event %r", event.event_id[:80])
            return self._reject(source, "engine_error", f"engine error: {exc!r}")
        self.state = state
        self.steps.append(_Applied(event, now_ms, watermark_ms, source, encoded))
        return encoded

    def release(self, now_ms: int, watermark_ms: int | None, source: Source) -> list[Outgoing]:
        """What waits in the state and may go now (see Engine.release)."""
        if self.state is None or not (self.state.pending or self.state.parked):
            return []
        try:
            outputs = self.engine.release(self.state, now_ms, watermark_ms)
            encoded = encode_outputs(outputs, self.key, self.limits, source, self.notices)
        except Exception as exc:
            log.exception("engine failed releasing the waiting events of a session")
            return self._reject(source, "engine_error", f"engine error: {exc!r}")
        self.steps.append(_Applied(None, now_ms, watermark_ms, source, encoded))
        return encoded

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
            data = self._encode(self.state)
        except Exception:
            return self._isolate()
        self.base = data
        return data, self._flush()

    # -- internals ---------------------------------------------------------------------

    def _encode(self, state: SessionState) -> bytes:
        before = len(state.history)
        data = state.fit(self.limits.max_state_bytes)
        if len(state.history) < before:
            self.shed += 1
        return data

    def _flush(self) -> list[Outgoing]:
        messages = [item for step in self.steps for item in step.messages]
        self.steps.clear()
        return messages

    def _step(self, state: SessionState | None, step: _Applied) -> SessionState:
        if step.event is None:
            assert state is not None
            self.engine.release(state, step.now_ms, step.watermark_ms)
            return state
        state, _ = self.engine.step(state, step.event, step.now_ms, step.watermark_ms)
        return state

    def _isolate(self) -> tuple[bytes | None, list[Outgoing]]:
        steps = list(self.steps)
        self.steps.clear()
        data = self.base
        state = _decode(data)
        messages: list[Outgoing] = []
        for step in steps:
            try:
                state = self._step(state, step)
                candidate = self._encode(state)
            except Exception as exc:
                code = "state_too_large" if isinstance(exc, StateTooLarge) else "engine_error"
                letter = dead_letter(step.source, code, f"session state: {exc}", self.limits)
                messages.append(letter)
                self.isolated.append(letter)
                state = _decode(data)
                continue
            data = candidate
            messages.extend(step.messages)
        self.state = state
        self.base = data
        return data, messages

    def _reject(self, source: Source, code: str, reason: str) -> list[Outgoing]:
        """Dead-letter an event and rebuild the state it had partly changed."""
        state = _decode(self.base)
        for step in self.steps:
            state = self._step(state, step)
        self.state = state
        return [dead_letter(source, code, reason, self.limits)]


def _decode(data: bytes | None) -> SessionState | None:
    return None if data is None else SessionState.from_bytes(data)
