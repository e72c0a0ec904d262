"""The session processor: input records in, session states and messages out, no Kafka.

:class:`SessionProcessor` is the worker's batch logic (decode, key check, grouping,
seq sort, watermarks, state cache, routing, dead letters, expiry on both clocks)
over a :class:`SessionStore` (the Faust table in the worker, a dict in tests), an
:class:`InputOffsets` view of the consumer and an injected clock. Its lifecycle is
in its docstring. It rests on *poison isolation*, below.

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

Two folds implement this: :class:`SessionFold` over the Python engine, and
:class:`NativeSessionFold` over the native one (``native_step``), used wherever
``native_for`` accepts the engine; both give the same messages and state bytes
(tests/unit/test_native_fold.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import msgspec
import orjson

from loopfuse.schemas.decode import DEFAULT_MAX_DEPTH, EventRejected, decode_event
from loopfuse.schemas.events import DeadLetter, InputEvent, ReplyTo
from loopfuse.streams.engine import (
    Engine,
    LoopEvent,
    Notice,
    Output,
    Rejection,
    SessionState,
    Verdict,
    fleet,
    state_codec,
)
from loopfuse.streams.engine.fingerprint import Fingerprints, hash64
from loopfuse.streams.engine.native import NATIVE
from loopfuse.streams.engine.native_step import NativeEngine, native_for
from loopfuse.streams.engine.state_codec import StateTooLarge
from loopfuse.streams.engine.wire import decode_fingerprinted
from loopfuse.streams.settings import TenantTopics
from loopfuse.streams.worker.metrics import Metrics
from loopfuse.streams.worker.progress import InputProgress

log = logging.getLogger("loopfuse.processor")

#: Kafka's per-record overhead and our headroom, subtracted from the producer's
#: request size when checking an output before it is sent.
RECORD_OVERHEAD_BYTES = 1_024
#: A dead letter's reason is cut to this many characters (it may quote input).
MAX_REASON_CHARS = 1_000

OutputKind = Literal["verdict", "loop_event", "dead_letter", "tool_strike"]


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


class Outgoing(msgspec.Struct, frozen=True, gc=False):
    """One message to publish: which output topic, its key and its value.

    Immutable like the rest of this module's per-event values, and built in C (a
    NamedTuple's __new__ is a Python function, a frozen dataclass sets each field
    through object.__setattr__), once per event and output.
    """

    kind: OutputKind
    key: bytes | None
    value: bytes
    detail: str  # verdict action, loop-event detector or dead-letter code (metrics)
    detector: str | None = None  # a verdict's detector (metrics)
    # Where the verdict's call asked for it (docs/wire-format.md: Reply routing); the
    # processor checks it against the reply topics it has when it sends.
    reply_to: ReplyTo | None = None


class Source(msgspec.Struct, frozen=True, gc=False):
    """Where an input came from, for its dead letter (a Struct, as Outgoing)."""

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


class DeadLetterLog:
    """The worker's log line for a dead letter: where it came from and why, rate-limited.

    Never the letter's ``original`` (the raw event: tool args, maybe secrets) and never
    its key: the dead-letter topic has those, the log (shipped to wherever logs go)
    does not. The reason may quote input, so it is shown escaped (:func:`_plain`). A
    flood of bad input (a broken gateway sends only garbage) would otherwise write a
    line per event; at most ``per_second`` lines are written per second of the
    processor's clock, and the next line written after a suppression says how many
    were left out (``loopfuse_dead_letters_total`` counts them all).
    """

    def __init__(self, per_second: int = 10) -> None:
        self.per_second = per_second
        self.window_ms: int | None = None
        self.written = 0
        self.suppressed = 0

    def letter(self, now_ms: int, code: str, value: bytes) -> None:
        if self.window_ms is None or now_ms - self.window_ms >= 1_000:
            self.flush(now_ms)
            self.window_ms, self.written = now_ms, 0
        if self.written >= self.per_second:
            self.suppressed += 1
            return
        self.written += 1
        # Parsed back only for a line that is written: the fields were just encoded.
        letter = orjson.loads(value)
        where = (
            f"line {letter.get('line')}"
            if letter.get("line") is not None
            else f"{_plain(letter.get('source_topic'), 80)}[{letter.get('partition')}]"
            f"@{letter.get('offset')}"
        )
        log.warning(
            "dead letter %s at %s: %s", _plain(code, 40), where, _plain(letter.get("reason"), 300)
        )

    def flush(self, now_ms: int) -> None:
        """Say how many lines the last window left out (the worker's timer calls this)."""
        if self.suppressed and (self.window_ms is None or now_ms - self.window_ms >= 1_000):
            log.warning(
                "dead letters: %d more log lines suppressed (at most %d a second)",
                self.suppressed,
                self.per_second,
            )
            self.suppressed = 0


def _plain(value: object, limit: int) -> str:
    """A value quoting input as one inert log line: ``repr`` escapes every control,
    bidi and other unprintable character and doubles a backslash (the worker does not
    import the operator tools' ops.plain: docs/development.md, the layers)."""
    text = repr(str(value))[1:-1]
    return text if len(text) <= limit else text[: limit - 1] + "…"


class EventFailed(Exception):
    """One event could not be judged; ``code`` is its dead-letter code."""

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


def reply_route(verdict: Verdict, asking: Sequence[InputEvent]) -> ReplyTo | None:
    """Where ``verdict`` goes: the ``reply_to`` of the event it answers, among ``asking``.

    ``asking`` is the event being applied and the events waiting in the session (a
    step may drain parked or pending events, each answered with its own verdict).
    The event answered is the one with the verdict's call id and incarnation: a
    verdict is built from its event's fields, so this is exact, and a verdict of an
    event that named no reply goes to the verdicts topic whatever the others named.
    """
    call_id, incarnation = verdict.call_id, verdict.incarnation
    for event in asking:
        if (
            event.reply_to is not None
            and getattr(event, "call_id", None) == call_id
            and event.incarnation == incarnation
        ):
            return event.reply_to
    return None


def encode_outputs(
    outputs: Sequence[Output],
    key: bytes,
    limits: Limits,
    source: Source,
    notices: list[Notice],
    asking: Sequence[InputEvent] = (),
) -> list[Outgoing]:
    """The engine's outputs for one event as messages; raises EventFailed if one cannot be.

    ``asking``: the events whose verdicts these may be, when any of them named a
    reply (see :func:`reply_route`); empty, every verdict goes to the verdicts topic.
    """
    encoded: list[Outgoing] = []
    budget = limits.output_budget - len(key)
    for output in outputs:
        # type() is: the outputs are of these exact classes, and it is the cheapest test
        if type(output) is Verdict:
            value = output.to_json()
            item = Outgoing(
                "verdict",
                key,
                value,
                output.action,
                output.detector,
                reply_route(output, asking) if asking else None,
            )
        elif type(output) is LoopEvent:
            value = output.to_json()
            item = Outgoing("loop_event", key, value, output.detector)
        elif type(output) is Rejection:
            encoded.append(dead_letter(source, output.code, output.reason, limits))
            continue
        elif type(output) is Notice:
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


def tool_strikes(outputs: Sequence[Output]) -> list[Outgoing]:
    """The fleet breaker's strikes of one step, keyed by tool (loopfuse.streams.worker.fleet_breaker).

    No args, results or session key: the session travels as a 64-bit hash, enough to
    count distinct sessions per tool.
    """
    return [
        # A gateway clock running ahead counts as now: one far-future ts must not move
        # the tool's window past every other session's hits.
        tool_strike(
            event.tool_name,
            f"{hash64(event.session_key):016x}",
            event.detector,
            min(event.event_ts, event.decided_ts),
        )
        for event in fleet.strikes(outputs)
        if event.tool_name is not None
    ]


def tool_strike(tool_name: str, session: str, detector: str, ts: int) -> Outgoing:
    """One strike record: the tool, the session's hash (hex), the detector, the time."""
    return Outgoing(
        "tool_strike",
        tool_name.encode("utf-8", "surrogatepass"),
        orjson.dumps(
            {
                "type": "tool_strike",
                "tool_name": tool_name,
                "session": session,
                "detector": detector,
                "ts": ts,
            }
        ),
        detector,
    )


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


class _WayBack:
    """What both folds share: the checkpoint, and the way back from an event that
    failed or broke the state (the last good bytes, then the steps since, again). A
    fold says how its state is encoded (``_encode``: the bytes, and the state to go on
    with), decoded and stepped again."""

    key: bytes
    limits: Limits
    base: bytes | None
    state: Any
    steps: list[_Applied]
    shed: int
    isolated: list[Outgoing]
    letters: list[Outgoing]

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

    def _encode(self, state: Any) -> tuple[bytes, Any]:
        raise NotImplementedError

    def _decode(self, data: bytes | None) -> Any:
        raise NotImplementedError

    def _step(self, state: Any, step: _Applied) -> Any:
        raise NotImplementedError

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


@dataclass
class SessionFold(_WayBack):
    """One session's state while events are applied to it, with a way back.

    ``base`` is the last state bytes known good (None: the session is new); the
    steps applied after it are kept with the clocks they ran with, so the state
    before any of them can be rebuilt exactly. An event's source carries its wire
    bytes where it has them (``Source.value``): the event is then what
    ``decode_event`` made of them with these limits. Lifecycle: ``apply`` each event (its
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
    # Dead letters of events that failed in ``apply``, sent with the next checkpoint.
    letters: list[Outgoing] = field(default_factory=list)
    # The fleet breaker (None: not configured): tools broken fleet-wide, overlaid on
    # the verdicts, and whether this session's loops strike their tools.
    breakers: Mapping[str, fleet.ToolBreaker] | None = None
    strike: bool = False

    @property
    def pending(self) -> bool:
        """Whether a restarted gateway's events wait for the input to move on."""
        return self.state is not None and bool(self.state.pending)

    def apply(
        self,
        event: InputEvent,
        source: Source,
        now_ms: int,
        watermark_ms: int | None,
        fingerprints: Fingerprints | None = None,
    ) -> list[Outgoing]:
        """Judge one event: its messages, or its dead letter (state then unchanged).
        ``fingerprints``: its tokens from the native decoder, if it made them."""
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
        """What waits in the state and may go now (see Engine.release)."""
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


@dataclass
class NativeSessionFold(_WayBack):
    """A :class:`SessionFold` on the native fold (``native_step.NativeEngine``), for an
    engine ``native_for`` accepts: the same lifecycle, messages, dead letters and
    state bytes, over a state held in Rust (``NativeState``).

    Its events are ``Judge.read``'s (the worker's native read of the wire bytes) or,
    where that read leaves an event to Python, what ``decode_event`` made of them.
    Verdicts come with the reply of the event they answer, matched as
    :func:`reply_route` does (the fold knows the events waiting in the state). The
    way back is the Python fold's: the last good bytes and the steps since, re-applied
    from each event's wire bytes (``Source.value``; the worker's events all have them).
    """

    native: NativeEngine
    key: bytes
    limits: Limits
    base: bytes | None
    state: Any  # NativeState | None
    strike: bool = False  # send the fleet breaker's strikes (only where it is configured)
    steps: list[_Applied] = field(default_factory=list)
    notices: list[Notice] = field(default_factory=list)
    shed: int = 0
    isolated: list[Outgoing] = field(default_factory=list)
    letters: list[Outgoing] = field(default_factory=list)

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
                values = self.native._event_values(event)
                state, outputs = judge.step_event_routed(self.state, values, now_ms, watermark_ms)
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
        """What waits in the state and may go now (see Engine.release)."""
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
            values = native._event_values(step.event)
            state, _ = native.judge.step_event(state, values, step.now_ms, step.watermark_ms)
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


# -- the session processor -------------------------------------------------------------


class SessionStore(Protocol):
    """Where session states live: the Faust table in the worker, a dict in tests.

    ``put`` and ``delete`` name the partition of the key: a write must go to the
    changelog partition of the session's input (co-partitioning).
    """

    def get(self, key: bytes) -> bytes | None: ...

    def put(self, key: bytes, value: bytes, partition: int) -> None: ...

    def delete(self, key: bytes, partition: int) -> None: ...

    def keys_of(self, partition: int) -> Iterable[bytes]: ...


class DictStore:
    """A SessionStore in a dict (tests; anything that needs no changelog)."""

    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}
        self.partition_of: dict[bytes, int] = {}

    def get(self, key: bytes) -> bytes | None:
        return self.data.get(key)

    def put(self, key: bytes, value: bytes, partition: int) -> None:
        self.data[key] = value
        self.partition_of[key] = partition

    def delete(self, key: bytes, partition: int) -> None:
        self.data.pop(key, None)
        self.partition_of.pop(key, None)

    def keys_of(self, partition: int) -> Iterable[bytes]:
        return [key for key, p in self.partition_of.items() if p == partition]


class InputOffsets(Protocol):
    """What the consumer knows of an input topic-partition (None: not known)."""

    def highwater(self, topic: str, partition: int) -> int | None:
        """End offset as of the consumer's last fetch answer."""

    def committed(self, topic: str, partition: int) -> int | None:
        """Where judging started: the group's committed offset at assignment."""

    def answered_at(self, topic: str, partition: int) -> int | None:
        """Wall time (ms) of the consumer's last fetch answer."""


class Record(Protocol):
    """One input message as the processor reads it: an aiokafka ``ConsumerRecord``
    in the worker, an :class:`InputRecord` in tests and tools."""

    @property
    def topic(self) -> str: ...

    @property
    def partition(self) -> int: ...

    @property
    def offset(self) -> int: ...

    @property
    def key(self) -> bytes | None: ...

    @property
    def value(self) -> bytes | None: ...


@dataclass(frozen=True, slots=True)
class InputRecord:
    """One input message built by hand (tests, tools): no Kafka or Faust type."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


@dataclass(frozen=True, slots=True)
class OutputTopics:
    verdicts: str
    loop_events: str
    dead_letters: str
    tool_strikes: str | None = None  # the fleet breaker's, only when it is configured
    # Reply topics -> their partition counts (docs/wire-format.md: Reply routing): a live
    # mapping the worker keeps up to date; a verdict whose call named a topic or a
    # partition not in it goes to ``verdicts``.
    replies: Mapping[str, int] | None = None


#: (topic, key, value, partition) of a message to publish; partition None: by its key.
Message = tuple[str, bytes | None, bytes, int | None]

#: How often, at most, the worker logs verdicts it could not route (they are counted).
UNROUTABLE_LOG_INTERVAL_MS = 10_000

#: Decoded states kept between batches (see SessionProcessor._load); ~2-5 KB each.
STATE_CACHE_SIZE = 20_000


#: The first byte of a named tenant's session keys in the table: never the first byte
#: of UTF-8 text, so no default-tenant session key (stored as it is) can look like one.
TENANT_MARK = b"\xff"


def table_key(tenant: str, session_key: bytes) -> bytes:
    """The session table's key of ``tenant``'s session: the session key itself for the
    default tenant (so a single-tenant deployment keeps its keys), else
    ``0xFF tenant 0xFF session_key``: equal session keys of two tenants never meet."""
    if not tenant:
        return session_key
    return TENANT_MARK + tenant.encode() + TENANT_MARK + session_key


def split_table_key(key: bytes) -> tuple[str, bytes]:
    """(tenant, session key) of a :func:`table_key`."""
    if key[:1] != TENANT_MARK:
        return "", key
    end = key.index(TENANT_MARK, 1)
    return key[1:end].decode(), key[end + 1 :]


def wall_clock_ms() -> int:
    return int(time.time() * 1000)


class SessionProcessor:
    """Input records in; table writes (through a SessionStore) and messages out.

    Lifecycle, as the worker drives it:

    1. ``assigned(partitions)`` after every rebalance: judging restarts from the
       committed offsets, so what was known of those partitions' progress goes;
    2. ``recovered(partitions)`` once the table is recovered: index the keys the
       store holds (idle expiry must know each key's partition);
    3. ``process(records)`` for each batch, in offset order per topic-partition;
    4. ``release_waiting()`` on a short timer (a restarted gateway's first call),
       ``expire_idle(partitions)`` on a long one, ``measure_lag`` per scrape.

    Every method is synchronous: nothing can interleave between reading a session's
    state and writing it back. Nothing raises because of input (loopfuse.streams.worker.processor's
    poison isolation), so a batch is never acknowledged unjudged.
    """

    def __init__(
        self,
        engine: Engine,
        inputs: Sequence[str],
        outputs: OutputTopics,
        store: SessionStore,
        offsets: InputOffsets,
        *,
        limits: Limits | None = None,
        max_event_bytes: int = 1_048_576,
        session_ttl_ms: int = 86_400_000,
        clock: Callable[[], int] = wall_clock_ms,
        metrics: Metrics | None = None,
        breakers: Mapping[str, fleet.ToolBreaker] | None = None,
        tenants: Sequence[TenantTopics] = (),
    ) -> None:
        self.engine = engine
        # ``inputs`` and ``outputs`` are the default tenant's; ``tenants`` the others
        # (docs/wire-format.md: Tenants). A record's tenant is its topic's.
        self.tenant_of_topic = dict.fromkeys(inputs, "")
        self.calls_topic = {"": inputs[0]}
        self.verdicts_topic = {"": outputs.verdicts}
        self.tenant_replies: dict[str, frozenset[str]] = {}
        for tenant in tenants:
            self.tenant_of_topic.update(dict.fromkeys(tenant.inputs, tenant.name))
            self.calls_topic[tenant.name] = tenant.tool_calls
            self.verdicts_topic[tenant.name] = tenant.verdicts
            self.tenant_replies[tenant.name] = frozenset(tenant.replies)
        # A named tenant's reply topics are its own: the default tenant may name any
        # other reply topic the worker has.
        self.claimed_replies = frozenset().union(*self.tenant_replies.values())
        self.inputs = tuple(self.tenant_of_topic)
        self.store = store
        self.offsets = offsets
        self.limits = limits or Limits()
        self.max_event_bytes = max_event_bytes
        self.session_ttl_ms = session_ttl_ms
        self.clock = clock
        self.metrics = metrics or Metrics()
        self.dead_letter_log = DeadLetterLog()
        self.progress = InputProgress(self.inputs)
        self.topic_of = {
            "verdict": outputs.verdicts,
            "loop_event": outputs.loop_events,
            "dead_letter": outputs.dead_letters,
        }
        # The fleet breaker (docs/configuration.md: Rules): strikes only when it is configured, and
        # the tools broken fleet-wide as the worker last read them (a live mapping).
        self.strike = outputs.tool_strikes is not None
        if outputs.tool_strikes is not None:
            self.topic_of["tool_strike"] = outputs.tool_strikes
        self.breakers = breakers
        # The native fold where it judges as the Python one would (native_for), with
        # the fleet breaker's overlay from the same live mapping.
        self.native = native_for(engine)
        if self.native is not None and breakers is not None:
            self.native.judge.set_breakers(breakers)
        self.replies: Mapping[str, int] = outputs.replies if outputs.replies is not None else {}
        self._unroutable_logged_ms: int | None = None
        self._unroutable_unlogged = 0
        # session key -> partition, for idle expiry (the memory store does not know
        # which partition a key belongs to; expiry must only delete keys of
        # partitions this worker actively owns).
        self.key_partition: dict[bytes, int] = {}
        # session key -> (the bytes we last wrote, the state they encode: a SessionState,
        # or a NativeState on the native fold)
        self.decoded: dict[bytes, tuple[bytes, Any]] = {}
        # Sessions whose restarted gateway's first events wait for the input to move
        # on (Engine.release): key -> partition. Re-checked every batch and by a timer,
        # since the gateway sends nothing more until it has its verdict.
        self.waiting: dict[bytes, int] = {}

    # -- lifecycle -----------------------------------------------------------------------

    def assigned(self, partitions: Iterable[int]) -> None:
        """A new assignment: judging restarts from the committed offsets."""
        # What we knew of any partition's progress may be stale (another worker may
        # have moved it on).
        self.progress.forget(partitions)
        self.metrics.input_behind.clear()  # the next idle scan sets the owned ones

    def recovered(self, partitions: Iterable[int]) -> None:
        """The store is recovered: index the keys it holds (e.g. RocksDB from disk)."""
        for partition in partitions:
            for key in self.store.keys_of(partition):
                self.key_partition.setdefault(key, partition)

    def on_changelog(self, key: bytes | None, value: bytes | None, partition: int) -> None:
        """A changelog record read during recovery (or by a standby)."""
        if key is None:
            return
        if value is None:
            self.key_partition.pop(key, None)
            self.waiting.pop(key, None)
        else:
            self.key_partition[key] = partition

    # -- batches -------------------------------------------------------------------------

    def process(self, records: Sequence[Record]) -> list[Message]:
        """One batch in, the messages to publish out; the store written.

        Poison isolation: whatever fails for one event - its bytes, its key, the
        engine, an output or the state over its size - becomes that event's dead
        letter and changes nothing else.
        """
        limits, metrics, progress = self.limits, self.metrics, self.progress
        now_ms = self.clock()
        out: list[Message] = []
        # session key -> (seq, event, its source, its tokens) in offset order
        sessions: dict[bytes, list[tuple[int | None, Any, Source, Fingerprints | None]]] = {}
        read = self.native.judge.read if self.native is not None else None
        max_event_bytes, max_identifier_bytes = self.max_event_bytes, limits.max_identifier_bytes
        tenant_of_topic = self.tenant_of_topic
        for record in records:
            value = record.value
            source = Source(
                record.topic, record.partition, record.offset, key=record.key, value=value
            )
            tenant = tenant_of_topic.get(record.topic)
            if tenant is None:  # only input topics are fetched: a wiring bug, never input
                reason = f"topic {record.topic[:80]!r} is not an input topic of this worker"
                self._emit(dead_letter(source, "invalid_event", reason, limits), out)
                continue
            fingerprints = None
            got = None
            if read is not None and value is not None:
                try:
                    got = read(value, max_event_bytes, DEFAULT_MAX_DEPTH, max_identifier_bytes)
                except Exception:  # a Python callback it made failed: Python decodes it
                    log.exception("the native read failed")
            if got is not None:  # the native read: no Python object made of the event
                event, session_key, kind, seq, ts = got
            else:
                try:
                    event, fingerprints = decode_fingerprinted(
                        value, max_bytes=max_event_bytes, max_identifier_bytes=max_identifier_bytes
                    )
                except EventRejected as exc:
                    progress.judged(record.topic, record.partition, record.offset, None)
                    self._emit(dead_letter(source, exc.code, exc.reason, limits), out)
                    continue
                except Exception as exc:  # a decoder bug must not take the partition down
                    log.exception("decoding failed")
                    progress.judged(record.topic, record.partition, record.offset, None)
                    reason = f"undecodable: {exc!r}"
                    self._emit(dead_letter(source, "invalid_event", reason, limits), out)
                    continue
                session_key, kind, seq, ts = event.key, event.type, event.seq, event.ts
            # A gateway clock running ahead counts as now: one far-future ts must not
            # move the partition's watermark and event clock for every session on it.
            progress.judged(record.topic, record.partition, record.offset, min(ts, now_ms))
            key = session_key.encode("utf-8", "surrogatepass")
            if record.key != key:
                # A message on the wrong partition would split the session's state
                # across partitions (and workers): refuse it rather than guess.
                reason = (
                    f"message key {_show_key(record.key)} is not the event's session key "
                    f"{session_key[:80]!r}: events must be keyed by session_key (else run_id)"
                )
                self._emit(dead_letter(source, "invalid_event", reason, limits), out)
                continue
            metrics.inc(metrics.events, kind)
            if tenant:
                key = table_key(tenant, key)
            sessions.setdefault(key, []).append((seq, event, source, fingerprints))

        watermarks: dict[int, int | None] = {}
        for key, items in sessions.items():
            partition = items[-1][2].partition or 0
            watermark = self._watermark(partition, watermarks)
            if len(items) > 1 and all(seq is not None for seq, _, _, _ in items):
                # The engine would park and drain them into seq order anyway; in
                # order they cost no parking.
                items.sort(key=_seq_of)
            fold = self._fold(key)
            python = type(fold) is SessionFold and self.native is not None
            for _, event, source, fingerprints in items:
                if python and not isinstance(event, InputEvent):
                    # a state only the Python fold reads (_load): its events as Python's
                    event, fingerprints = decode_fingerprinted(
                        source.value,
                        max_bytes=max_event_bytes,
                        max_identifier_bytes=max_identifier_bytes,
                    )
                fold.apply(event, source, now_ms, watermark, fingerprints)
            self._settle(key, fold, partition, out)
        self._release_waiting(now_ms, watermarks, out, skip=sessions)
        metrics.batches.inc()
        return out

    def release_waiting(self) -> list[Message]:
        """Apply what waits in sessions whose input has moved on (the timer's work)."""
        out: list[Message] = []
        now_ms = self.clock()
        self.dead_letter_log.flush(now_ms)
        if self.waiting:
            self._release_waiting(now_ms, {}, out, skip={})
        return out

    def _release_waiting(
        self,
        now_ms: int,
        watermarks: dict[int, int | None],
        out: list[Message],
        skip: Mapping[bytes, object],
    ) -> None:
        for key, partition in list(self.waiting.items()):
            if key in skip:
                continue
            tenant, session_key = split_table_key(key)
            source = Source(self.calls_topic[tenant], partition, key=session_key)
            fold = self._fold(key)
            fold.release(now_ms, self._watermark(partition, watermarks), source)
            self._settle(key, fold, partition, out)  # writes only if the state changed

    def _watermark(self, partition: int, known: dict[int, int | None]) -> int | None:
        if partition not in known:
            # After the whole batch is counted: a missing event later in this batch
            # is not late (and the seq sort applies it first anyway).
            offsets = self.offsets
            known[partition] = self.progress.watermark(
                partition, offsets.highwater, offsets.committed, offsets.answered_at
            )
        return known[partition]

    def _fold(self, key: bytes) -> SessionFold | NativeSessionFold:
        """The fold of the session stored under ``key`` (a :func:`table_key`); its
        messages are keyed by the session key alone."""
        raw = self.store.get(key)
        state = self._load(key, raw)
        session_key = split_table_key(key)[1]
        # An unreadable state was logged and starts afresh: nothing to go back to.
        if self.native is not None and not isinstance(state, SessionState):
            return NativeSessionFold(
                self.native,
                session_key,
                self.limits,
                raw if state else None,
                state,
                strike=self.strike,
            )
        return SessionFold(
            self.engine,
            session_key,
            self.limits,
            raw if state else None,
            state,
            breakers=self.breakers,
            strike=self.strike,
        )

    def _settle(
        self, key: bytes, fold: SessionFold | NativeSessionFold, partition: int, out: list[Message]
    ) -> None:
        """Write the session's state back and queue the messages of what it includes."""
        before = fold.base
        data, messages = fold.checkpoint()
        if fold.shed:
            self.metrics.shed.inc(fold.shed)
        tenant = split_table_key(key)[0]
        for message in messages:
            self._emit(message, out, tenant, partition)
        for notice in fold.notices:
            _log_notice(notice)
        state = fold.state
        if data is None or state is None:
            return
        if data != before:
            self.store.put(key, data, partition)
            self.key_partition[key] = partition
        self._remember(key, data, state)
        if fold.pending:
            self.waiting[key] = partition
        else:
            self.waiting.pop(key, None)

    def _load(self, key: bytes, raw: bytes | None) -> Any:
        """The session's state: reuse the decoded one when the store still holds our bytes.

        With ~100-event batches over many sessions most sessions appear once per
        batch, so decoding every time cost as much as the engine itself. The check
        against the stored bytes keeps this safe across recovery, deletes and
        rebalances: any other writer changes the bytes and we decode again.
        """
        cached = self.decoded.pop(key, None)
        if not raw:
            return None
        if cached is not None and (cached[0] is raw or cached[0] == raw):
            return cached[1]
        if self.native is not None:
            # in Rust, where it can be (no event waiting in it): what the route below gives
            native_state = self.native.read_natively(raw)
            if native_state is not None:
                return native_state
        try:
            state = state_codec.decode(raw)
        except Exception:
            log.exception("unreadable state of session %r: starting it afresh", key[:80])
            return None
        if self.native is None:
            return state
        try:
            return self.native.from_python(state)
        except ValueError:  # rule state (a config without rules since): the Python fold's
            return state

    def _remember(self, key: bytes, raw: bytes, state: Any) -> None:
        decoded = self.decoded
        decoded[key] = (raw, state)  # popped in _load: re-inserting keeps LRU order
        if len(decoded) > STATE_CACHE_SIZE:
            del decoded[next(iter(decoded))]

    def _emit(
        self, message: Outgoing, out: list[Message], tenant: str = "", partition: int = 0
    ) -> None:
        """Queue ``message``: a verdict of ``tenant``'s session goes to a reply topic of
        that tenant's only, else to its verdicts topic; the rest to the shared topics."""
        metrics = self.metrics
        if message.kind == "verdict":
            metrics.inc(metrics.verdicts, message.detail, message.detector or "none")
            reply = message.reply_to
            if reply is not None:
                if not self._may_reply(tenant, reply.topic):
                    self._emit(self._refused(message, reply, tenant, partition), out)
                    return
                partitions = self.replies.get(reply.topic)
                if partitions is not None and reply.partition < partitions:
                    metrics.inc(metrics.replies, "routed")
                    requester = reply.requester.encode("utf-8", "surrogatepass")
                    out.append((reply.topic, requester, message.value, reply.partition))
                    return
                self._unroutable(reply, partitions)
            out.append((self.verdicts_topic[tenant], message.key, message.value, None))
            return
        elif message.kind == "loop_event":
            metrics.inc(metrics.loop_events, message.detail)
        elif message.kind == "tool_strike":
            metrics.tool_strikes.inc()
        else:
            metrics.inc(metrics.dead_letters, message.detail)
            self.dead_letter_log.letter(self.clock(), message.detail, message.value)
        out.append((self.topic_of[message.kind], message.key, message.value, None))

    def _may_reply(self, tenant: str, topic: str) -> bool:
        """Whether a verdict of ``tenant`` may go to reply topic ``topic``: a named
        tenant's to its own reply topics only; the default tenant's to any but those
        (an unknown one then goes to the verdicts topic, as it always has)."""
        if tenant:
            return topic in self.tenant_replies[tenant]
        return topic not in self.claimed_replies

    def _refused(self, message: Outgoing, reply: ReplyTo, tenant: str, partition: int) -> Outgoing:
        """The dead letter that stands for a verdict whose call named a reply topic its
        tenant may not read: nothing is written there (the gateway's wait times out)."""
        self.metrics.inc(self.metrics.replies, "refused")
        whose = f"tenant {tenant!r}" if tenant else "the default tenant"
        reason = (
            f"the call's reply_to names topic {reply.topic[:80]!r}, which is not one of "
            f"{whose}'s reply topics: its verdict is not sent"
        )
        source = Source(self.calls_topic[tenant], partition, key=message.key, value=message.value)
        return dead_letter(source, "reply_refused", reason, self.limits)

    def _unroutable(self, reply: ReplyTo, partitions: int | None) -> None:
        """A call named a reply this worker cannot send to: its verdict goes to the
        verdicts topic (never lost), counted, and logged at most every 10 s."""
        reason = "unknown_topic" if partitions is None else "no_such_partition"
        self.metrics.inc(self.metrics.replies, reason)
        now_ms = self.clock()
        last = self._unroutable_logged_ms
        if last is not None and now_ms - last < UNROUTABLE_LOG_INTERVAL_MS:
            self._unroutable_unlogged += 1
            return
        self._unroutable_logged_ms = now_ms
        where = (
            "is not one of this worker's reply topics (LOOPFUSE_REPLY_TOPICS)"
            if partitions is None
            else f"has {partitions} partitions"
        )
        log.warning(
            "a call asked for its verdict on partition %d of %r, which %s: sent to the "
            "verdicts topic instead (%d more since the last such line)",
            reply.partition,
            reply.topic,
            where,
            self._unroutable_unlogged,
        )
        self._unroutable_unlogged = 0

    # -- timers ----------------------------------------------------------------------------

    def measure_lag(self, owned: Iterable[tuple[str, int]]) -> None:
        """Set ``loopfuse_consumer_lag`` for the input partitions this worker owns (and
        ``loopfuse_fleet_tools_broken``: the board as this worker has read it)."""
        if self.breakers is not None:
            self.metrics.tools_broken.set(len(self.breakers))
        gauge = self.metrics.consumer_lag
        gauge.clear()
        offsets = self.offsets
        for topic, partition in owned:
            lag = self.progress.lag(topic, partition, offsets.highwater, offsets.committed)
            if lag is not None:
                gauge.labels(topic, str(partition)).set(lag)

    def expire_idle(self, owned_partitions: Iterable[int]) -> int:
        """Delete the sessions of ``owned_partitions`` idle for longer than the TTL.

        A session looks idle by the wall clock whenever the worker is behind (a
        stall, a backlog after a restart, one input topic read late): its next events
        may be on the broker, unread. Deleting it would make them wait for seq 0
        forever. So a session must also be idle in event time: its newest event older
        than the TTL by the partition's event clock, the time every input topic of
        the partition is judged up to (see InputProgress.event_clock). Keys of
        partitions this worker does not actively own (standbys, or ones being
        revoked) are left to their owner.
        """
        now_ms = self.clock()
        ttl_ms = self.session_ttl_ms
        wall_cutoff = now_ms - ttl_ms
        event_cutoffs: dict[int, int] = {}
        offsets = self.offsets
        for partition in owned_partitions:
            clock = self.progress.event_clock(
                partition, offsets.highwater, offsets.committed, offsets.answered_at
            )
            behind = self.metrics.input_behind.labels(str(partition))
            if clock is None:
                behind.set(-1)
                continue
            behind.set(max(0, now_ms - clock) / 1000)
            event_cutoffs[partition] = clock - ttl_ms
        expired = 0
        for key, partition in list(self.key_partition.items()):
            event_cutoff = event_cutoffs.get(partition)
            if event_cutoff is None:
                continue  # not ours, or how far its input is judged is not known yet
            raw = self.store.get(key)
            if raw is None:
                self.key_partition.pop(key, None)
                continue
            try:
                touched_ms, last_event_ms = state_codec.idle_stamps(raw)
            except ValueError:  # unreadable: judging would start it afresh anyway
                log.warning("unreadable state of session %r: expiring it", key[:80])
            else:
                if touched_ms >= wall_cutoff or last_event_ms >= event_cutoff:
                    continue
            self.store.delete(key, partition)
            del self.key_partition[key]
            self.decoded.pop(key, None)
            self.waiting.pop(key, None)
            expired += 1
        if expired:
            self.metrics.expired.inc(expired)
            log.info("expired %d idle sessions", expired)
        return expired


def _seq_of(item: tuple[int | None, Any, Source, Fingerprints | None]) -> int:
    return item[0] or 0


def _show_key(key: bytes | None) -> str:
    if key is None:
        return "null"
    return repr(key[:80].decode("utf-8", "replace"))


def _log_notice(notice: Notice) -> None:
    log.log(
        logging.getLevelName(notice.level.upper()),
        "%s (session %r, run %r)",
        notice.message,
        notice.session_key[:80],
        (notice.run_id or "")[:80],
    )
