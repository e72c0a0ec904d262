"""Session state as bytes: the value of the session table and its changelog.

The format is versioned by its first byte. Every version ever written stays readable
(a changelog outlives the code that wrote it): one reader per version below. Format 5
is written where the native codec is (loopfuse.streams.engine.native), else version 4
(:data:`WRITTEN_VERSION`); both engines read and write both. Fingerprints are 64-bit
ints. The worker encodes every touched session once per batch (and decodes one it has
not cached), so the written format is the one cheapest to write and read at its size.

Layout of version 5: version 4's head, then every part of the state in version 4's
order, compact (the changelog, RocksDB and recovery pay for each byte).
Unsigned varints (LEB128, at most 64 bits) unless a width is given; ``s`` is a zigzag
varint; a *word* (a 64-bit value) is ``0`` for zero, ``1`` and its 8 bytes where first
met, ``n`` the (n-2)th word met before; a *text* is ``0`` for None, ``1``, its length
and UTF-8 where first met, ``n`` the (n-2)th text met before; counts come first::

    version:u8  touched_ms:i64  last_event_ms:i64  next_seq+1  verdict_floor
    incarnation:word
    history: count, per record: flags:u8 tool:text [sig] [run:word] [result] [call]
             [unknown:text] ts:s (from the previous record's, the first from last_event_ms)
    guards: count, per guard: run:word window remaining flags:u8 (1 first, 2 broken)
            [first: tool:text sig:word result:word]
    warnings: count, per key: key:u64 owner:word bucket
    seen_ids: count, u64 each
    decisions: count, per decision: event action detector count detail:text seq:s
    parked: count, per event: seq, length, its JSON
    skipped: count, (first, last) each
    retired: count, (incarnation:u64, next_seq) each
    pending: count, per event: length, its JSON
    rules: length, loopfuse.streams.engine.rule_state's bytes

A record's flags: bits 0-1 its sig and bits 2-3 its result (0 zero, 1 its 8 bytes
follow, 2 a word ref follows: n, the nth word met), 0x10 its run differs from the
previous record's (the first's previous is 0: so a history of one run writes its key
once), 0x20 a call hash follows (else 0), 0x40 an unknown-tool name follows (else
None); 0x80 is never set. The words and texts are met in this order, so equal states give equal bytes,
whichever codec writes them. Any value wider than its field (none the engine makes)
is written in version 4 instead. For a Python ``SessionState`` the native codec
transcodes: msgspec writes version 4's body in C, Rust makes it format 5; Rust makes
format 5 version 4's body, msgspec reads it in C (building Python objects through PyO3
costs more than msgspec does). The native fold writes format 5 straight from its own
state and reads it into one (native/src/state_bytes.rs), the same bytes.

On ``bench/engine.py --sessions 500 --calls 50`` (history 30; docs/benchmarks.md has
the runs) a median state is 692 B in format 5, 1,461 B in version 4 (699 B in version
3). Encode + decode per state: version 4 about 2 + 8 µs, format 5 native 4 + 9 µs,
format 5 in Python 40 + 41 µs, and the native fold's own checkpoint + read 2.3 + 7.7 µs.
So where the native codec is, format 5 is written (half the bytes);
without it, version 4 (format 5's writer in Python costs some 20 times msgspec's;
``encode(state, 5)`` still writes it).

Layout of version 4: a fixed head, then one MessagePack array written and read by
msgspec in C (its fields: ``_Body`` below)::

    version:u8  touched_ms:i64  last_event_ms:i64
    [next_seq+1, verdict_floor, incarnation, history, guards, warnings, seen_ids,
     decisions, parked, skipped, retired, pending, rules]

``history`` holds one array per record (loopfuse.streams.engine.history.Record, its fields in
order, the run as its 64-bit key); a decision's action and detector are indexes
into ACTIONS and DETECTORS; parked and pending events are their JSON (as
loopfuse.streams.engine.state keeps them at rest: a result's error as its ``failure``
identity, a field an older writer left out and an older reader refuses); ``rules`` is
loopfuse.streams.engine.rule_state's bytes. A state is one msgspec call each way. Version 3
wrote the history column by column with a string table and varints: about half the
bytes, but about a hundred calls each way in Python, which cost three times as much.

Layout of version 3 (uvarints unless a width is given)::

    version:u8  touched_ms:i64  last_event_ms:i64  strings  next_seq+1
    history  guards  warnings  seen_ids  decisions  verdict_floor  parked  skipped
    incarnation:u64  retired  pending
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from itertools import accumulate, starmap
from typing import Final, NamedTuple

import msgspec

from loopfuse.schemas.events import Action, Detector, InputEvent
from loopfuse.streams.engine.history import Record
from loopfuse.streams.engine.native import NATIVE
from loopfuse.streams.engine.rule_state import decode_rule_state, encode_rule_state
from loopfuse.streams.engine.state import (
    Decision,
    EventAtRest,
    Guard,
    ResultAtRest,
    SessionState,
    encode_event,
    run_key,
)

FORMAT_VERSION: Final = 5  # the newest format, read and written by both codecs
#: The native codec, or None (the pure one): read at each call, so a test can take it away.
_NATIVE_CODEC = NATIVE
#: What :func:`encode` writes by default: format 5 where the native codec is, else 4
#: (the pure writer of format 5 costs far more than msgspec's of format 4; see above).
WRITTEN_VERSION: Final = 4 if NATIVE is None else 5

# Persisted enums: a decision is stored as indexes into these tuples. Append only -
# never reorder or remove an entry, or states already written would read back as
# other verdicts.
ACTIONS: Final[tuple[Action, ...]] = ("allow", "warn", "block", "abort")
DETECTORS: Final[tuple[Detector | None, ...]] = (
    None,
    "unknown_tool_repeat",
    "global_circuit_breaker",
    "known_poll_no_progress",
    "ping_pong",
    "generic_repeat",
    "compaction_loop_persisted",
    "sequence_gap",
    # opt-in rules (docs/configuration.md: Rules)
    "tool_loop_run_ended",
    "cycle",
    "repeated_failure",
    "argument_churn",
    "run_call_cap",
    "token_budget",
    "cost_budget",
    "fleet_tool_breaker",  # the fleet-wide tool breaker
    "identical_calls",
)
_ACTION_CODE: Final = {name: code for code, name in enumerate(ACTIONS)}
_DETECTOR_CODE: Final = {name: code for code, name in enumerate(DETECTORS)}

_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")
_I64 = struct.Struct("<q")
_TWO_U64 = struct.Struct("<QQ")
_HEAD = struct.Struct("<Bqq")  # version, touched_ms, last_event_ms
_I64_MIN: Final = -(1 << 63)
_I64_MAX: Final = (1 << 63) - 1
# A format-5 history record's flags (bits 0-1 and 2-3: how its sig and result are written)
_RUN_CHANGES = 0x10
_HAS_CALL = 0x20
_HAS_UNKNOWN = 0x40

# History column layout flags (version 3).
_WIDE_REFS = 1  # string refs are 2 bytes (more than 255 strings)
_TS_INT32 = 2  # time deltas of 4 bytes (else 2, or 8 with _TS_INT64)
_TS_INT64 = 4


class _Body(NamedTuple):
    """Version 4's body, one MessagePack array: the state but its head, as msgspec writes
    and reads it in C. Typed, so that a field of another type is refused as the bytes
    are read, not met by the engine later."""

    next_seq: int  # + 1; 0 for None
    verdict_floor: int
    incarnation: int
    history: list[Record]
    # run key -> (window, remaining, (tool, sig, result) of the first result, broken)
    guards: dict[int, tuple[int, int, tuple[str, int, int] | None, bool]]
    warnings: dict[int, tuple[int, int]]
    seen_ids: list[int]
    # (event, ACTIONS index, DETECTORS index, count, detail, seq)
    decisions: list[tuple[int, int, int, int, str | None, int]]
    parked: dict[int, bytes]  # seq -> the event's JSON
    skipped: list[tuple[int, int]]
    retired: list[tuple[int, int]]
    pending: list[bytes]  # the events' JSON
    rules: bytes  # loopfuse.streams.engine.rule_state's bytes; empty: no rule touched it


_BODY_ENCODER: Final = msgspec.msgpack.Encoder()
# Events at rest as JSON (loopfuse.streams.engine.state.encode_event; formats 1 to 3 kept JSON
# too, written by the pydantic models then: the same fields, which this reads back; a
# result without ``failure``, written before it was kept, reads as None).
_EVENT_DECODER: Final = msgspec.json.Decoder(EventAtRest)
_BODY_DECODER: Final = msgspec.msgpack.Decoder(_Body)


class StateTooLarge(ValueError):
    """A session's state does not fit its byte cap even with everything sheddable gone."""


# -- writing -------------------------------------------------------------------------


def encode(state: SessionState, version: int = WRITTEN_VERSION) -> bytes:
    """The state's bytes in format ``version`` (4 or 5; by default the one this process
    writes, see WRITTEN_VERSION)."""
    if version == 5 and _NATIVE_CODEC is None:
        return _write_v5(state)
    # msgspec writes version 4's body in C (the records' bytes kept, see
    # SessionState.history_bytes), the native codec makes it format 5
    return encode_body(state.touched_ms, state.last_event_ms, _v4_body(state), version)


def encode_body(
    touched_ms: int, last_event_ms: int, body: bytes, version: int = WRITTEN_VERSION
) -> bytes:
    """A state's bytes from its version-4 body (msgspec's, or the native fold's:
    native/src/state_bytes.rs), in format ``version`` (5 only where the native codec is)."""
    native = _NATIVE_CODEC
    if version == 5 and native is not None:
        compact: bytes | None = native.compact_state(touched_ms, last_event_ms, body)
        if compact is not None:  # None: a value format 5 has no room for (none the engine makes)
            return compact
    return _HEAD.pack(4, touched_ms, last_event_ms) + body


def _v4_body(state: SessionState) -> bytes:
    """Version 4's body: the state but its head, in one msgspec call."""
    rules = _rules_bytes(state)
    # _Body's fields, as a tuple (written alike): the history as its records' bytes
    return _BODY_ENCODER.encode(
        (
            0 if state.next_seq is None else state.next_seq + 1,
            state.verdict_floor,
            state.incarnation,
            msgspec.Raw(state.history_bytes()),
            {
                run: (guard.window, max(guard.remaining, 0), guard.first, guard.broken)
                for run, guard in state.guards.items()
            }
            if state.guards
            else {},
            state.warnings,
            state.seen_ids,
            [
                (
                    d.event,
                    _ACTION_CODE[d.action],
                    _DETECTOR_CODE[d.detector],
                    d.count,
                    d.detail,
                    d.seq,
                )
                for d in state.decisions
            ],
            state.parked_json() if state.parked else {},
            state.skipped,
            state.retired,
            list(map(encode_event, state.pending)),
            rules,
        )
    )


def _rules_bytes(state: SessionState) -> bytes:
    if state.rules is None or state.rules.empty():
        return b""
    out = bytearray()
    encode_rule_state(out, state.rules, _uvarint)
    return bytes(out)


def _write_v5(state: SessionState) -> bytes:
    """Format 5 in Python: the bytes the native codec writes for the same state. A value
    format 5 has no room for (beyond 64 bits; none the engine makes) gives format 4."""
    try:
        return _compact(state)
    except (OverflowError, ValueError, struct.error):
        return encode(state, 4)


def _compact(state: SessionState) -> bytes:
    # Words (64-bit values) and texts are written in full where first met and as refs
    # after, in the order the layout meets them, so equal states give equal bytes (the
    # native writer, reading version 4's body in that same order, writes the same).
    strings: dict[str, int] = {}
    words: dict[int, int] = {}
    put, signed = _uvarint64, _svarint64

    def text(out: bytearray, value: str | None) -> None:
        if value is None:
            out.append(0)
            return
        ref = strings.get(value)
        if ref is not None:
            put(out, ref + 2)
            return
        strings[value] = len(strings)
        utf8 = value.encode()
        out.append(1)
        put(out, len(utf8))
        out += utf8

    def word(out: bytearray, value: int) -> None:
        if not value:
            out.append(0)
            return
        ref = words.get(value)
        if ref is not None:
            put(out, ref + 2)
            return
        packed = _U64.pack(value)  # refuses what 64 bits cannot hold, as the native writer does
        words[value] = len(words)
        out.append(1)
        out += packed

    def mode(out: bytearray, value: int) -> int:
        """A record's sig or result: 0 zero, 1 new (8 bytes), 2 a ref."""
        if not value:
            return 0
        ref = words.get(value)
        if ref is not None:
            put(out, ref)
            return 2
        packed = _U64.pack(value)
        words[value] = len(words)
        out += packed
        return 1

    out = bytearray(_HEAD.pack(5, state.touched_ms, state.last_event_ms))
    put(out, 0 if state.next_seq is None else state.next_seq + 1)
    put(out, state.verdict_floor)
    word(out, state.incarnation)
    put(out, len(state.history))
    previous_ts, previous_run = state.last_event_ms, 0
    for rec in state.history:
        at = len(out)
        out.append(0)  # the record's flags, known once its fields are written
        text(out, rec.tool)
        flags = mode(out, rec.sig)
        if rec.run != previous_run:
            flags |= _RUN_CHANGES
            word(out, rec.run)
            previous_run = rec.run
        flags |= mode(out, rec.result) << 2
        if rec.call:
            flags |= _HAS_CALL
            put(out, rec.call)
        if rec.unknown is not None:
            flags |= _HAS_UNKNOWN
            text(out, rec.unknown)
        ts = rec.ts
        if not _I64_MIN <= ts <= _I64_MAX:
            raise OverflowError("a record's ts beyond 64 bits")
        signed(out, ts - previous_ts)
        previous_ts = ts
        out[at] = flags
    put(out, len(state.guards))
    for run, guard in state.guards.items():
        word(out, run)
        put(out, guard.window)
        put(out, max(guard.remaining, 0))
        first = guard.first
        out.append((first is not None) | (guard.broken << 1))
        if first is not None:
            text(out, first[0])
            word(out, first[1])
            word(out, first[2])
    put(out, len(state.warnings))
    for key, (owner, bucket) in state.warnings.items():
        out += _U64.pack(key)
        word(out, owner)
        put(out, bucket)
    put(out, len(state.seen_ids))
    out += struct.pack(f"<{len(state.seen_ids)}Q", *state.seen_ids)
    put(out, len(state.decisions))
    for d in state.decisions:
        put(out, d.event)
        put(out, _ACTION_CODE[d.action])
        put(out, _DETECTOR_CODE[d.detector])
        put(out, d.count)
        text(out, d.detail)
        signed(out, d.seq)
    parked = state.parked_json() if state.parked else {}
    put(out, len(parked))
    for seq, json in parked.items():
        put(out, seq)
        put(out, len(json))
        out += json
    put(out, len(state.skipped))
    for first_seq, last_seq in state.skipped:
        put(out, first_seq)
        put(out, last_seq)
    put(out, len(state.retired))
    for incarnation, next_seq in state.retired:
        out += _U64.pack(incarnation)
        put(out, next_seq)
    put(out, len(state.pending))
    for json in map(encode_event, state.pending):
        put(out, len(json))
        out += json
    rules = _rules_bytes(state)
    put(out, len(rules))
    out += rules
    return bytes(out)


def _uvarint64(out: bytearray, value: int) -> None:
    """A uvarint of format 5: at most 64 bits, as the native codec reads them."""
    if 0 <= value < 0x80:
        out.append(value)
        return
    if value >> 64 or value < 0:
        raise OverflowError(f"{value} is not a 64-bit unsigned int")
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _svarint64(out: bytearray, value: int) -> None:
    """A zigzag varint of a 64-bit signed int (small either side of 0: one byte)."""
    if not _I64_MIN <= value <= _I64_MAX:
        raise OverflowError(f"{value} is not a 64-bit signed int")
    _uvarint64(out, (value << 1) if value >= 0 else ((-value) << 1) - 1)


def _uvarint(out: bytearray, value: int) -> None:
    if value < 0x80:  # most counts and small numbers: one byte
        out.append(value)
        return
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


# -- reading -------------------------------------------------------------------------


def decode(data: bytes) -> SessionState:
    """The state in ``data``, whichever format version wrote it.

    Truncated or corrupt bytes raise ValueError (and nothing else): the worker then
    starts the session afresh rather than stopping.
    """
    reader = _READERS.get(data[0]) if data else None
    if reader is None:
        raise ValueError(f"unknown session state format {data[:1]!r}")
    try:
        state, pos = reader(data)
    except (IndexError, KeyError, struct.error, OverflowError, TypeError) as exc:
        raise ValueError(f"corrupt session state: {exc!r}") from None
    if pos != len(data):
        raise ValueError(f"session state has {len(data) - pos} trailing bytes")
    return state


def idle_stamps(data: bytes) -> tuple[int, int]:
    """``(touched_ms, last_event_ms)`` of state bytes without decoding the rest.

    Idle expiry reads these for every session on every scan. Bytes too short for
    them, or of no known version, raise ValueError as :func:`decode` does.
    """
    if not data or data[0] not in _READERS or len(data) < (17 if data[0] >= 2 else 9):
        raise ValueError(f"not session state bytes: {data[:17]!r}")
    touched_ms: int = _I64.unpack_from(data, 1)[0]
    last_event_ms: int = _I64.unpack_from(data, 9)[0] if data[0] >= 2 else 0
    return touched_ms, last_event_ms


def _read_v4(data: bytes) -> tuple[SessionState, int]:
    """The head, then the body in one msgspec call."""
    _, touched_ms, last_event_ms = _HEAD.unpack_from(data, 0)
    body = _BODY_DECODER.decode(memoryview(data)[_HEAD.size :])
    return _state_of_body(body, touched_ms, last_event_ms), len(data)


def _read_v5(data: bytes) -> tuple[SessionState, int]:
    """The native codec writes the body as version 4's for msgspec to read in C; the
    pure reader reads it into the same fields. Either way the state is built and
    checked by :func:`_state_of_body`, as version 4's is."""
    _, touched_ms, last_event_ms = _HEAD.unpack_from(data, 0)
    native = _NATIVE_CODEC
    if native is None:
        body = _body_of_v5(data, last_event_ms)
    else:
        expanded: bytes | None = native.expand_state(data)
        if expanded is None:
            raise ValueError("corrupt session state (format 5)")
        body = _BODY_DECODER.decode(expanded)
    return _state_of_body(body, touched_ms, last_event_ms), len(data)


def _state_of_body(body: _Body, touched_ms: int, last_event_ms: int) -> SessionState:
    state = SessionState(
        history=body.history,
        warnings=body.warnings,
        next_seq=None if body.next_seq == 0 else body.next_seq - 1,
        skipped=body.skipped,
        seen_ids=body.seen_ids,
        verdict_floor=body.verdict_floor,
        touched_ms=touched_ms,
        last_event_ms=last_event_ms,
        incarnation=body.incarnation,
        retired=body.retired,
    )
    for run, (window, remaining, first, broken) in body.guards.items():
        state.guards[run] = Guard(window, remaining, first, broken)
    if body.decisions:
        for _event, action, detector, _count, _detail, _seq in body.decisions:
            # a negative index would read from the end: corrupt, as one past the end is
            if not (0 <= action < len(ACTIONS) and 0 <= detector < len(DETECTORS)):
                raise ValueError("corrupt session state: a decision's action or detector")
        state.decisions = [
            Decision(event, ACTIONS[action], DETECTORS[detector], count, detail, seq)
            for event, action, detector, count, detail, seq in body.decisions
        ]
    for seq, text in body.parked.items():
        state.park_as_read(seq, _event_from_json(text), text)
    state.pending.extend(map(_event_from_json, body.pending))
    if body.rules:
        state.rules, pos = decode_rule_state(body.rules, 0, _read_uvarint)
        if pos != len(body.rules):
            raise ValueError(f"session state has {len(body.rules) - pos} trailing bytes")
    return state


def _body_of_v5(data: bytes, last_event_ms: int) -> _Body:
    """Format 5's body as version 4's fields (the pure reader; see the layout above).
    Whatever it accepts the native codec accepts, and gives the same fields."""
    read, signed, _count = _read_uvarint64, _read_svarint64, _read_count64
    strings: list[str] = []
    words: list[int] = []

    def text(pos: int) -> tuple[str | None, int]:
        tag, pos = read(data, pos)
        if tag > 1:
            return strings[tag - 2], pos
        if not tag:
            return None, pos
        length, pos = _count(data, pos)
        strings.append(data[pos : pos + length].decode())  # strict UTF-8, as Rust's str
        return strings[-1], pos + length

    def word(pos: int) -> tuple[int, int]:
        tag, pos = read(data, pos)
        if tag > 1:
            return words[tag - 2], pos
        if not tag:
            return 0, pos
        words.append(_U64.unpack_from(data, pos)[0])
        return words[-1], pos + 8

    def field(mode: int, pos: int) -> tuple[int, int]:
        if mode == 1:
            words.append(_U64.unpack_from(data, pos)[0])
            return words[-1], pos + 8
        if mode == 2:
            ref, pos = read(data, pos)
            return words[ref], pos
        if mode:
            raise ValueError("corrupt session state: a record's flags")
        return 0, pos

    next_seq, pos = read(data, _HEAD.size)
    verdict_floor, pos = read(data, pos)
    incarnation, pos = word(pos)

    count, pos = _count(data, pos)
    history: list[Record] = []
    ts, run = last_event_ms, 0
    for _ in range(count):
        flags = data[pos]
        tool, pos = text(pos + 1)
        sig, pos = field(flags & 3, pos)
        if flags & _RUN_CHANGES:
            run, pos = word(pos)
        result, pos = field((flags >> 2) & 3, pos)
        call_hash = unknown = None
        if flags & _HAS_CALL:
            call_hash, pos = read(data, pos)
        if flags & _HAS_UNKNOWN:
            unknown, pos = text(pos)
        delta, pos = signed(data, pos)
        ts += delta
        if tool is None or flags > 0x7F or not _I64_MIN <= ts <= _I64_MAX:
            raise ValueError("corrupt session state: a history record")
        history.append(Record(tool, sig, run, call_hash or 0, result, unknown, ts))

    count, pos = _count(data, pos)
    guards: dict[int, tuple[int, int, tuple[str, int, int] | None, bool]] = {}
    for _ in range(count):
        key, pos = word(pos)
        window, pos = read(data, pos)
        remaining, pos = read(data, pos)
        flags = data[pos]
        pos += 1
        first: tuple[str, int, int] | None = None
        if flags & 1:
            tool, pos = text(pos)
            sig, pos = word(pos)
            result, pos = word(pos)
            if tool is None:
                raise ValueError("corrupt session state: a guard's first result")
            first = (tool, sig, result)
        if flags > 3:
            raise ValueError("corrupt session state: a guard's flags")
        guards[key] = (window, remaining, first, flags > 1)

    count, pos = _count(data, pos)
    warnings: dict[int, tuple[int, int]] = {}
    for _ in range(count):
        key = _U64.unpack_from(data, pos)[0]
        owner, pos = word(pos + 8)
        bucket, pos = read(data, pos)
        warnings[key] = (owner, bucket)

    count, pos = _count(data, pos)
    seen_ids = list(struct.unpack_from(f"<{count}Q", data, pos))
    pos += 8 * count

    count, pos = _count(data, pos)
    decisions: list[tuple[int, int, int, int, str | None, int]] = []
    for _ in range(count):
        event, pos = read(data, pos)
        action, pos = read(data, pos)
        detector, pos = read(data, pos)
        times, pos = read(data, pos)
        detail, pos = text(pos)
        seq, pos = signed(data, pos)
        decisions.append((event, action, detector, times, detail, seq))

    count, pos = _count(data, pos)
    parked: dict[int, bytes] = {}
    for _ in range(count):
        seq, pos = read(data, pos)
        length, pos = _count(data, pos)
        parked[seq] = data[pos : pos + length]
        pos += length

    skipped: list[tuple[int, int]] = []
    count, pos = _count(data, pos)
    for _ in range(count):
        first_seq, pos = read(data, pos)
        last_seq, pos = read(data, pos)
        skipped.append((first_seq, last_seq))

    retired: list[tuple[int, int]] = []
    count, pos = _count(data, pos)
    for _ in range(count):
        key = _U64.unpack_from(data, pos)[0]
        seq, pos = read(data, pos + 8)
        retired.append((key, seq))

    pending: list[bytes] = []
    count, pos = _count(data, pos)
    for _ in range(count):
        length, pos = _count(data, pos)
        pending.append(data[pos : pos + length])
        pos += length

    length, pos = _count(data, pos)
    rules = data[pos : pos + length]
    if pos + length != len(data):
        raise ValueError(f"session state has {len(data) - pos - length} trailing bytes")
    return _Body(
        next_seq,
        verdict_floor,
        incarnation,
        history,
        guards,
        warnings,
        seen_ids,
        decisions,
        parked,
        skipped,
        retired,
        pending,
        rules,
    )


def _read_guards(data: bytes, pos: int, strings: list[str | None], state: SessionState) -> int:
    """Guards keep what decides an abort, runs as hashes (version 3)."""
    count, pos = _read_count(data, pos)
    for _ in range(count):
        run = _U64.unpack_from(data, pos)[0]
        window, pos = _read_uvarint(data, pos + 8)
        remaining, pos = _read_uvarint(data, pos)
        guard = Guard(window, remaining)
        flag = data[pos]
        pos += 1
        if flag:
            index, pos = _read_uvarint(data, pos)
            sig, result = _TWO_U64.unpack_from(data, pos)
            pos += 16
            guard.first = (_text(strings, index), sig, result)
            guard.broken = flag == 2
        state.guards[run] = guard
    return pos


def _read_warnings(data: bytes, pos: int, state: SessionState) -> int:
    """Warning buckets, runs as hashes (version 3)."""
    count, pos = _read_count(data, pos)
    for _ in range(count):
        key, owner = _TWO_U64.unpack_from(data, pos)
        bucket, pos = _read_uvarint(data, pos + 16)
        state.warnings[key] = (owner, bucket)
    return pos


def _read_seen_ids(data: bytes, pos: int, state: SessionState) -> int:
    count, pos = _read_count(data, pos)
    state.seen_ids.extend(struct.unpack_from(f"<{count}Q", data, pos))
    return pos + 8 * count


def _read_parked_and_skipped(data: bytes, pos: int, state: SessionState) -> int:
    count, pos = _read_count(data, pos)
    for _ in range(count):
        seq, pos = _read_uvarint(data, pos)
        state.parked[seq], pos = _read_event(data, pos)
    count, pos = _read_count(data, pos)
    for _ in range(count):
        first, pos = _read_uvarint(data, pos)
        span, pos = _read_uvarint(data, pos)
        state.skipped.append((first, first + span))
    return pos


def _read_retired_and_pending(data: bytes, pos: int, state: SessionState) -> int:
    count, pos = _read_count(data, pos)
    for _ in range(count):
        incarnation = _U64.unpack_from(data, pos)[0]
        next_seq, pos = _read_uvarint(data, pos + 8)
        state.retired.append((incarnation, next_seq))
    count, pos = _read_count(data, pos)
    for _ in range(count):
        event, pos = _read_event(data, pos)
        state.pending.append(event)
    return pos


def _read_v3(data: bytes) -> tuple[SessionState, int]:
    """Every count and number a varint; no sections bits (each part is there, maybe
    empty), then an optional trailer of the opt-in rules' tallies
    (additive: bytes written before it still read)."""
    touched_ms, last_event_ms = _I64.unpack_from(data, 1)[0], _I64.unpack_from(data, 9)[0]
    strings, pos = _read_strings(data, 17)
    state = SessionState(touched_ms=touched_ms, last_event_ms=last_event_ms)
    pos = _read_common_head(data, pos, strings, state)
    pos = _read_guards(data, pos, strings, state)
    pos = _read_warnings(data, pos, state)
    pos = _read_common_tail(data, pos, strings, state)
    state.incarnation = _U64.unpack_from(data, pos)[0]
    pos = _read_retired_and_pending(data, pos + 8, state)
    if pos < len(data):  # the opt-in rules' trailer (loopfuse.streams.engine.rule_state)
        state.rules, pos = decode_rule_state(data, pos, _read_uvarint)
    return state, pos


def _read_v2(data: bytes) -> tuple[SessionState, int]:
    """Version 2 kept every result fed to a guard, and the run ids of guards and
    warnings as text; no incarnations."""
    touched_ms, last_event_ms = _I64.unpack_from(data, 1)[0], _I64.unpack_from(data, 9)[0]
    return _read_before_v3(
        data, 17, SessionState(touched_ms=touched_ms, last_event_ms=last_event_ms)
    )


def _read_v1(data: bytes) -> tuple[SessionState, int]:
    """Version 1 is version 2 without ``last_event_ms``: read as 0 (unknown), so idle
    expiry falls back to the worker's clock alone for such states."""
    return _read_before_v3(data, 9, SessionState(touched_ms=_I64.unpack_from(data, 1)[0]))


def _read_before_v3(data: bytes, pos: int, state: SessionState) -> tuple[SessionState, int]:
    strings, pos = _read_strings(data, pos)
    pos = _read_common_head(data, pos, strings, state)
    count, pos = _read_count(data, pos)
    for _ in range(count):
        index, pos = _read_uvarint(data, pos)
        run = run_key(_ref(strings, index))
        window, pos = _read_uvarint(data, pos)
        remaining, pos = _read_uvarint(data, pos)
        seen_count, pos = _read_count(data, pos)
        guard = Guard(window, remaining)
        for _ in range(seen_count):
            index, pos = _read_uvarint(data, pos)
            sig, result = _TWO_U64.unpack_from(data, pos)
            pos += 16
            triple = (_text(strings, index), sig, result)
            if guard.first is None:
                guard.first = triple
            elif triple != guard.first:
                guard.broken = True
        state.guards[run] = guard
    count, pos = _read_count(data, pos)
    for _ in range(count):
        key = _U64.unpack_from(data, pos)[0]
        index, pos = _read_uvarint(data, pos + 8)
        bucket, pos = _read_uvarint(data, pos)
        state.warnings[key] = (run_key(_ref(strings, index)), bucket)
    return state, _read_common_tail(data, pos, strings, state)


_READERS: Final[dict[int, Callable[[bytes], tuple[SessionState, int]]]] = {
    1: _read_v1,
    2: _read_v2,
    3: _read_v3,
    4: _read_v4,
    5: _read_v5,
}


def _read_common_head(data: bytes, pos: int, strings: list[str | None], state: SessionState) -> int:
    """next_seq and the history: the same in versions 1 to 3."""
    raw_seq, pos = _read_uvarint(data, pos)
    state.next_seq = None if raw_seq == 0 else raw_seq - 1
    return _read_history(data, pos, strings, state.history, state.touched_ms)


def _read_common_tail(data: bytes, pos: int, strings: list[str | None], state: SessionState) -> int:
    """Seen event ids to skipped seq ranges: the same in versions 1 to 3."""
    pos = _read_seen_ids(data, pos, state)
    pos = _read_decisions(data, pos, strings, state.decisions)
    state.verdict_floor, pos = _read_uvarint(data, pos)
    return _read_parked_and_skipped(data, pos, state)


def _read_strings(data: bytes, pos: int) -> tuple[list[str | None], int]:
    count, pos = _read_count(data, pos)
    strings: list[str | None] = [None]
    for _ in range(count):
        length, pos = _read_count(data, pos)
        strings.append(data[pos : pos + length].decode("utf-8", "surrogatepass"))
        pos += length
    return strings, pos


def _read_history(
    data: bytes, pos: int, strings: list[str | None], history: list[Record], base_ts: int
) -> int:
    count, pos = _read_count(data, pos)
    if not count:
        return pos
    flags = data[pos]
    pos += 1
    ref = strings.__getitem__
    tool_refs: Sequence[int]
    run_refs: Sequence[int]
    if flags & _WIDE_REFS:
        refs = struct.unpack_from(f"<{2 * count}H", data, pos)
        pos += 4 * count
        tool_refs, run_refs = refs[:count], refs[count:]
    else:
        tool_refs, run_refs = data[pos : pos + count], data[pos + count : pos + 2 * count]
        pos += 2 * count
    if 0 in tool_refs:
        raise ValueError("corrupt session state: a history record without a tool name")
    columns = struct.unpack_from(f"<{2 * count}Q", data, pos)
    pos += 16 * count
    first_delta, pos = _read_svarint(data, pos)
    ts_code, ts_size = (
        ("q", 8) if flags & _TS_INT64 else ("i", 4) if flags & _TS_INT32 else ("H", 2)
    )
    deltas = struct.unpack_from(f"<{count - 1}{ts_code}", data, pos)
    pos += (count - 1) * ts_size
    calls = [0] * count
    pending, pos = _read_count(data, pos)
    for _ in range(pending):
        index, pos = _read_uvarint(data, pos)
        calls[index] = _U32.unpack_from(data, pos)[0]
        pos += 4
    unknowns: list[str | None] = [None] * count
    unknown, pos = _read_count(data, pos)
    for _ in range(unknown):
        index, pos = _read_uvarint(data, pos)
        name, pos = _read_uvarint(data, pos)
        unknowns[index] = strings[name]
    history.extend(
        starmap(
            Record,
            zip(
                map(ref, tool_refs),
                columns[:count],
                map(run_key, map(ref, run_refs)),  # version 4 keeps runs as keys
                calls,
                columns[count:],
                unknowns,
                accumulate(deltas, initial=base_ts + first_delta),
                strict=True,
            ),
        )
    )
    return pos


def _read_decisions(
    data: bytes, pos: int, strings: list[str | None], decisions: list[Decision]
) -> int:
    count, pos = _read_count(data, pos)
    if not count:
        return pos
    wide = data[pos]
    pos += 1
    events = struct.unpack_from(f"<{count}I", data, pos)
    pos += 4 * count
    actions = [ACTIONS[code] for code in data[pos : pos + count]]
    detectors = [DETECTORS[code] for code in data[pos + count : pos + 2 * count]]
    if len(detectors) != count:
        raise ValueError("corrupt session state: decisions cut short")
    pos += 2 * count
    counts = struct.unpack_from(f"<{count}{'I' if wide else 'H'}", data, pos)
    pos += (4 if wide else 2) * count
    seqs = struct.unpack_from(f"<{count}q", data, pos)
    pos += 8 * count
    details: list[str | None] = [None] * count
    detail_count, pos = _read_count(data, pos)
    for _ in range(detail_count):
        index, pos = _read_uvarint(data, pos)
        ref, pos = _read_uvarint(data, pos)
        details[index] = strings[ref]
    decisions.extend(map(Decision, events, actions, detectors, counts, details, seqs))
    return pos


def _read_event(data: bytes, pos: int) -> tuple[InputEvent, int]:
    """An event waiting on a gap or a restart (versions 1 to 3: length and JSON)."""
    length, pos = _read_count(data, pos)
    return _event_from_json(data[pos : pos + length]), pos + length


def _event_from_json(text: bytes) -> InputEvent:
    """An event at rest (kept as its JSON, fingerprints only)."""
    try:
        event: InputEvent = _EVENT_DECODER.decode(text)
    except msgspec.MsgspecError as exc:
        raise ValueError(f"corrupt session state: an event at rest: {exc}") from None
    if type(event) is ResultAtRest and event.failure is not None and event.failure >> 64:
        raise ValueError("corrupt session state: a failure identity beyond 64 bits")
    return event


def _ref(strings: list[str | None], index: int) -> str | None:
    return strings[index]


def _text(strings: list[str | None], index: int) -> str:
    return strings[index] or ""


def _read_uvarint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


def _read_count(data: bytes, pos: int) -> tuple[int, int]:
    """A length or an item count: each item takes a byte at least, so more than the
    bytes left means corrupt data (and must not allocate or loop for that long)."""
    count, pos = _read_uvarint(data, pos)
    if count > len(data) - pos:
        raise ValueError(f"corrupt session state: a count of {count} at byte {pos}")
    return count, pos


def _read_uvarint64(data: bytes, pos: int) -> tuple[int, int]:
    """A uvarint of format 5: more than 64 bits is corrupt (the native codec's limit)."""
    byte = data[pos]
    if byte < 0x80:  # most refs and counts
        return byte, pos + 1
    value, end = _read_uvarint(data, pos)
    if value >> 64 or end - pos > 10:
        raise ValueError(f"corrupt session state: a varint of more than 64 bits at byte {pos}")
    return value, end


def _read_count64(data: bytes, pos: int) -> tuple[int, int]:
    """A count of format 5 (:func:`_read_count` of a 64-bit varint)."""
    count, pos = _read_uvarint64(data, pos)
    if count > len(data) - pos:
        raise ValueError(f"corrupt session state: a count of {count} at byte {pos}")
    return count, pos


def _read_svarint64(data: bytes, pos: int) -> tuple[int, int]:
    raw, pos = _read_uvarint64(data, pos)
    return (raw >> 1) if not raw & 1 else -((raw + 1) >> 1), pos


def _read_svarint(data: bytes, pos: int) -> tuple[int, int]:
    raw, pos = _read_uvarint(data, pos)
    return (raw >> 1) if not raw & 1 else -((raw + 1) >> 1), pos


# -- fitting a cap -------------------------------------------------------------------


def shed_marks(state: SessionState) -> tuple[int, ...]:
    """What :func:`fit` sheds from, counted: each of its steps lessens one, so a state
    was cut to fit when these changed."""
    rules = state.rules
    return (
        len(state.history),
        len(state.warnings),
        len(state.guards),
        len(state.decisions),
        state.verdict_floor,
        len(state.retired),
        len(state.seen_ids),
        0 if rules is None else len(rules.runs),
        0 if rules is None else len(rules.failures),
    )


def fit(state: SessionState, cap: int, version: int = WRITTEN_VERSION) -> bytes:
    """The state's bytes (format ``version``), shedding the oldest evidence until they
    fit in ``cap``.

    Identifiers are bounded at decode and every collection is capped, so with the
    default config a state fits in the default cap whatever the input; a large
    ``historySize`` or many long ids can still exceed it. Then the oldest history
    records go first (they would be trimmed next anyway), then warning buckets,
    guards, remembered verdicts and incarnations. Events waiting on a gap are never
    shed (they are input not yet applied): their bytes are capped by the engine.
    Raises StateTooLarge when nothing is left to shed.

    The cap is held to version 4's bytes, whichever format is written (format 5's are
    fewer): so a pure engine (writing 4) and a native one (writing 5) shed at the same
    events, and their verdicts stay the same however large a history is configured.
    """
    body = _v4_body(state)
    while _HEAD.size + len(body) > cap:
        if len(state.history) > 1:
            del state.history[: max(1, len(state.history) // 4)]
            state.forget_derived()
        elif state.warnings:
            for key in list(state.warnings)[: max(1, len(state.warnings) // 2)]:
                del state.warnings[key]
        elif state.guards:
            for run in list(state.guards)[: max(1, len(state.guards) // 2)]:
                del state.guards[run]
        elif state.rules is not None and state.rules.sheddable():
            state.rules.shed()
        elif state.decisions:
            state.decisions.clear()
            # no verdict is vouched for any more: none is re-sent for a redelivery
            state.verdict_floor = max(state.verdict_floor, state.next_seq or 0)
        elif state.retired or state.history or state.seen_ids:
            state.retired.clear()
            state.history.clear()
            state.seen_ids.clear()
            state.forget_derived()
        else:
            raise StateTooLarge(
                f"session state is {_HEAD.size + len(body)} bytes with nothing left to shed "
                f"(the cap is {cap})"
            )
        body = _v4_body(state)
    if version == 5 and _NATIVE_CODEC is None:
        return _write_v5(state)
    return encode_body(state.touched_ms, state.last_event_ms, body, version)
