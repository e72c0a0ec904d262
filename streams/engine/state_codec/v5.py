"""Format 5: version 4's head, then every part of the state in version 4's order,
compact (the changelog, RocksDB and recovery pay for each byte); its layout is in
docs/wire-format.md (Session state bytes).

The native codec writes and reads it where it is built (a Python ``SessionState`` is
transcoded: msgspec writes version 4's body in C, Rust makes it format 5, and back;
the native fold writes format 5 straight from its own state: native/src/state_bytes.rs,
the same bytes). The pure writer and reader here give the same bytes and fields; the
pure writer costs some 20 times msgspec's version 4, so without the native codec the
pure engine writes version 4 (``encode(state, 5)`` still writes format 5).
"""

from __future__ import annotations

import struct
from typing import Any, Final

from loopfuse.streams.engine.history import Record
from loopfuse.streams.engine.state import SessionState, encode_event
from loopfuse.streams.engine.state_codec.body import (
    ACTION_CODE,
    BODY_DECODER,
    DETECTOR_CODE,
    HEAD,
    U64,
    Body,
    rules_bytes,
    state_of_body,
)
from loopfuse.streams.engine.state_codec.varint import (
    I64_MAX,
    I64_MIN,
    read_count64,
    read_svarint64,
    read_uvarint64,
    write_svarint64,
    write_uvarint64,
)

# A record's flags (bits 0-1 and 2-3: how its sig and result are written)
_RUN_CHANGES: Final = 0x10
_HAS_CALL: Final = 0x20
_HAS_UNKNOWN: Final = 0x40


def write(state: SessionState) -> bytes:
    """Format 5 in Python: the bytes the native codec writes for the same state. Raises
    OverflowError (or ValueError, struct.error) for a value format 5 has no room for
    (beyond 64 bits; none the engine makes): the caller writes version 4 instead."""
    # Words (64-bit values) and texts are written in full where first met and as refs
    # after, in the order the layout meets them, so equal states give equal bytes (the
    # native writer, reading version 4's body in that same order, writes the same).
    strings: dict[str, int] = {}
    words: dict[int, int] = {}
    put, signed = write_uvarint64, write_svarint64

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
        packed = U64.pack(value)  # refuses what 64 bits cannot hold, as the native writer does
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
        packed = U64.pack(value)
        words[value] = len(words)
        out += packed
        return 1

    out = bytearray(HEAD.pack(5, state.touched_ms, state.last_event_ms))
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
        if not I64_MIN <= ts <= I64_MAX:
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
        out += U64.pack(key)
        word(out, owner)
        put(out, bucket)
    put(out, len(state.seen_ids))
    out += struct.pack(f"<{len(state.seen_ids)}Q", *state.seen_ids)
    put(out, len(state.decisions))
    for d in state.decisions:
        put(out, d.event)
        put(out, ACTION_CODE[d.action])
        put(out, DETECTOR_CODE[d.detector])
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
        out += U64.pack(incarnation)
        put(out, next_seq)
    put(out, len(state.pending))
    for json in map(encode_event, state.pending):
        put(out, len(json))
        out += json
    rules = rules_bytes(state)
    put(out, len(rules))
    out += rules
    return bytes(out)


def read(data: bytes, native: Any) -> tuple[SessionState, int]:
    """``native`` (the native codec, or None) expands the body to version 4's for msgspec
    to read in C; the pure reader reads it into the same fields. Either way the state is built and
    checked by :func:`state_of_body`, as version 4's is."""
    _, touched_ms, last_event_ms = HEAD.unpack_from(data, 0)
    if native is None:
        body = _body(data, last_event_ms)
    else:
        expanded: bytes | None = native.expand_state(data)
        if expanded is None:
            raise ValueError("corrupt session state (format 5)")
        body = BODY_DECODER.decode(expanded)
    return state_of_body(body, touched_ms, last_event_ms), len(data)


def _body(data: bytes, last_event_ms: int) -> Body:
    """Format 5's body as version 4's fields (the pure reader).
    Whatever it accepts the native codec accepts, and gives the same fields."""
    read, signed, _count = read_uvarint64, read_svarint64, read_count64
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
        words.append(U64.unpack_from(data, pos)[0])
        return words[-1], pos + 8

    def field(mode: int, pos: int) -> tuple[int, int]:
        if mode == 1:
            words.append(U64.unpack_from(data, pos)[0])
            return words[-1], pos + 8
        if mode == 2:
            ref, pos = read(data, pos)
            return words[ref], pos
        if mode:
            raise ValueError("corrupt session state: a record's flags")
        return 0, pos

    next_seq, pos = read(data, HEAD.size)
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
        if tool is None or flags > 0x7F or not I64_MIN <= ts <= I64_MAX:
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
        key = U64.unpack_from(data, pos)[0]
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
        key = U64.unpack_from(data, pos)[0]
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
    return Body(
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
