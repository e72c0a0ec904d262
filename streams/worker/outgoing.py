"""What the worker publishes, as messages: verdicts (with their reply), loop events,
dead letters and the fleet breaker's strikes, each bounded before it is sent.

The session folds (:mod:`loopfuse.streams.worker.fold`) make these from the engine's
outputs; the processor routes them (:mod:`loopfuse.streams.worker.processor`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import msgspec
import orjson

from loopfuse.schemas.events import DeadLetter, InputEvent, ReplyTo
from loopfuse.streams.engine import LoopEvent, Notice, Output, Rejection, Verdict, fleet
from loopfuse.streams.engine.fingerprint import hash64

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
