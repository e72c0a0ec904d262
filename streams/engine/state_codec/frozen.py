"""The readers of versions 1 to 3, frozen: no worker writes them any more, and a
changelog may still hold them (a changelog outlives the code that wrote it). Their
layouts are in docs/wire-format.md (Session state bytes).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from itertools import accumulate, starmap
from typing import Final

from loopfuse.schemas.events import InputEvent
from loopfuse.streams.engine.history import Record
from loopfuse.streams.engine.rule_state import decode_rule_state
from loopfuse.streams.engine.state import Decision, Guard, SessionState, run_key
from loopfuse.streams.engine.state_codec.body import (
    ACTIONS,
    DETECTORS,
    U64,
    event_from_json,
)
from loopfuse.streams.engine.state_codec.varint import (
    read_count,
    read_svarint,
    read_uvarint,
)

_U32: Final = struct.Struct("<I")
_I64: Final = struct.Struct("<q")
_TWO_U64: Final = struct.Struct("<QQ")
# History column layout flags (version 3).
_WIDE_REFS: Final = 1  # string refs are 2 bytes (more than 255 strings)
_TS_INT32: Final = 2  # time deltas of 4 bytes (else 2, or 8 with _TS_INT64)
_TS_INT64: Final = 4


def _read_guards(data: bytes, pos: int, strings: list[str | None], state: SessionState) -> int:
    """Guards keep what decides an abort, runs as hashes (version 3)."""
    count, pos = read_count(data, pos)
    for _ in range(count):
        run = U64.unpack_from(data, pos)[0]
        window, pos = read_uvarint(data, pos + 8)
        remaining, pos = read_uvarint(data, pos)
        guard = Guard(window, remaining)
        flag = data[pos]
        pos += 1
        if flag:
            index, pos = read_uvarint(data, pos)
            sig, result = _TWO_U64.unpack_from(data, pos)
            pos += 16
            guard.first = (_text(strings, index), sig, result)
            guard.broken = flag == 2
        state.guards[run] = guard
    return pos


def _read_warnings(data: bytes, pos: int, state: SessionState) -> int:
    """Warning buckets, runs as hashes (version 3)."""
    count, pos = read_count(data, pos)
    for _ in range(count):
        key, owner = _TWO_U64.unpack_from(data, pos)
        bucket, pos = read_uvarint(data, pos + 16)
        state.warnings[key] = (owner, bucket)
    return pos


def _read_seen_ids(data: bytes, pos: int, state: SessionState) -> int:
    count, pos = read_count(data, pos)
    state.seen_ids.extend(struct.unpack_from(f"<{count}Q", data, pos))
    return pos + 8 * count


def _read_parked_and_skipped(data: bytes, pos: int, state: SessionState) -> int:
    count, pos = read_count(data, pos)
    for _ in range(count):
        seq, pos = read_uvarint(data, pos)
        state.parked[seq], pos = _read_event(data, pos)
    count, pos = read_count(data, pos)
    for _ in range(count):
        first, pos = read_uvarint(data, pos)
        span, pos = read_uvarint(data, pos)
        state.skipped.append((first, first + span))
    return pos


def _read_retired_and_pending(data: bytes, pos: int, state: SessionState) -> int:
    count, pos = read_count(data, pos)
    for _ in range(count):
        incarnation = U64.unpack_from(data, pos)[0]
        next_seq, pos = read_uvarint(data, pos + 8)
        state.retired.append((incarnation, next_seq))
    count, pos = read_count(data, pos)
    for _ in range(count):
        event, pos = _read_event(data, pos)
        state.pending.append(event)
    return pos


def read_v3(data: bytes) -> tuple[SessionState, int]:
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
    state.incarnation = U64.unpack_from(data, pos)[0]
    pos = _read_retired_and_pending(data, pos + 8, state)
    if pos < len(data):  # the opt-in rules' trailer (loopfuse.streams.engine.rule_state)
        state.rules, pos = decode_rule_state(data, pos, read_uvarint)
    return state, pos


def read_v2(data: bytes) -> tuple[SessionState, int]:
    """Version 2 kept every result fed to a guard, and the run ids of guards and
    warnings as text; no incarnations."""
    touched_ms, last_event_ms = _I64.unpack_from(data, 1)[0], _I64.unpack_from(data, 9)[0]
    return _read_before_v3(
        data, 17, SessionState(touched_ms=touched_ms, last_event_ms=last_event_ms)
    )


def read_v1(data: bytes) -> tuple[SessionState, int]:
    """Version 1 is version 2 without ``last_event_ms``: read as 0 (unknown), so idle
    expiry falls back to the worker's clock alone for such states."""
    return _read_before_v3(data, 9, SessionState(touched_ms=_I64.unpack_from(data, 1)[0]))


def _read_before_v3(data: bytes, pos: int, state: SessionState) -> tuple[SessionState, int]:
    strings, pos = _read_strings(data, pos)
    pos = _read_common_head(data, pos, strings, state)
    count, pos = read_count(data, pos)
    for _ in range(count):
        index, pos = read_uvarint(data, pos)
        run = run_key(_ref(strings, index))
        window, pos = read_uvarint(data, pos)
        remaining, pos = read_uvarint(data, pos)
        seen_count, pos = read_count(data, pos)
        guard = Guard(window, remaining)
        for _ in range(seen_count):
            index, pos = read_uvarint(data, pos)
            sig, result = _TWO_U64.unpack_from(data, pos)
            pos += 16
            triple = (_text(strings, index), sig, result)
            if guard.first is None:
                guard.first = triple
            elif triple != guard.first:
                guard.broken = True
        state.guards[run] = guard
    count, pos = read_count(data, pos)
    for _ in range(count):
        key = U64.unpack_from(data, pos)[0]
        index, pos = read_uvarint(data, pos + 8)
        bucket, pos = read_uvarint(data, pos)
        state.warnings[key] = (run_key(_ref(strings, index)), bucket)
    return state, _read_common_tail(data, pos, strings, state)


def _read_common_head(data: bytes, pos: int, strings: list[str | None], state: SessionState) -> int:
    """next_seq and the history: the same in versions 1 to 3."""
    raw_seq, pos = read_uvarint(data, pos)
    state.next_seq = None if raw_seq == 0 else raw_seq - 1
    return _read_history(data, pos, strings, state.history, state.touched_ms)


def _read_common_tail(data: bytes, pos: int, strings: list[str | None], state: SessionState) -> int:
    """Seen event ids to skipped seq ranges: the same in versions 1 to 3."""
    pos = _read_seen_ids(data, pos, state)
    pos = _read_decisions(data, pos, strings, state.decisions)
    state.verdict_floor, pos = read_uvarint(data, pos)
    return _read_parked_and_skipped(data, pos, state)


def _read_strings(data: bytes, pos: int) -> tuple[list[str | None], int]:
    count, pos = read_count(data, pos)
    strings: list[str | None] = [None]
    for _ in range(count):
        length, pos = read_count(data, pos)
        strings.append(data[pos : pos + length].decode("utf-8", "surrogatepass"))
        pos += length
    return strings, pos


def _read_history(
    data: bytes, pos: int, strings: list[str | None], history: list[Record], base_ts: int
) -> int:
    count, pos = read_count(data, pos)
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
    first_delta, pos = read_svarint(data, pos)
    ts_code, ts_size = (
        ("q", 8) if flags & _TS_INT64 else ("i", 4) if flags & _TS_INT32 else ("H", 2)
    )
    deltas = struct.unpack_from(f"<{count - 1}{ts_code}", data, pos)
    pos += (count - 1) * ts_size
    calls = [0] * count
    pending, pos = read_count(data, pos)
    for _ in range(pending):
        index, pos = read_uvarint(data, pos)
        calls[index] = _U32.unpack_from(data, pos)[0]
        pos += 4
    unknowns: list[str | None] = [None] * count
    unknown, pos = read_count(data, pos)
    for _ in range(unknown):
        index, pos = read_uvarint(data, pos)
        name, pos = read_uvarint(data, pos)
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
    count, pos = read_count(data, pos)
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
    detail_count, pos = read_count(data, pos)
    for _ in range(detail_count):
        index, pos = read_uvarint(data, pos)
        ref, pos = read_uvarint(data, pos)
        details[index] = strings[ref]
    decisions.extend(map(Decision, events, actions, detectors, counts, details, seqs))
    return pos


def _read_event(data: bytes, pos: int) -> tuple[InputEvent, int]:
    """An event waiting on a gap or a restart (versions 1 to 3: length and JSON)."""
    length, pos = read_count(data, pos)
    return event_from_json(data[pos : pos + length]), pos + length


def _ref(strings: list[str | None], index: int) -> str | None:
    return strings[index]


def _text(strings: list[str | None], index: int) -> str:
    return strings[index] or ""
