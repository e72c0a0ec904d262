"""Session state as bytes: the value of the session table and its changelog.

The format is versioned by its first byte. Every version ever written stays readable
(a changelog outlives the code that wrote it): one reader per version below, and the
writer writes the newest. Fingerprints are 64-bit ints. The worker encodes every
touched session once per batch (and decodes one it has not cached), so the newest
format is the one cheapest to write and read.

Layout of version 4: a fixed head, then one MessagePack array written and read by
msgspec in C (its fields: ``_Body`` below)::

    version:u8  touched_ms:i64  last_event_ms:i64
    [next_seq+1, verdict_floor, incarnation, history, guards, warnings, seen_ids,
     decisions, parked, skipped, retired, pending, rules]

``history`` holds one array per record (loopfuse.streams.engine.history.Record, its fields in
order, the run as its 64-bit key); a decision's action and detector are indexes
into ACTIONS and DETECTORS; parked and pending events are their JSON; ``rules`` is
loopfuse.streams.engine.rule_state's bytes. A state is one msgspec call each way. Version 3
wrote the history column by column with a string table and varints: about half the
bytes, but about a hundred calls each way, which cost three times as much.

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
from loopfuse.streams.engine.rule_state import decode_rule_state, encode_rule_state
from loopfuse.streams.engine.state import Decision, Guard, SessionState, encode_event, run_key

FORMAT_VERSION: Final = 4

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
    # opt-in rules (issue 14)
    "tool_loop_run_ended",
    "cycle",
    "repeated_failure",
    "argument_churn",
    "run_call_cap",
    "token_budget",
    "cost_budget",
    "fleet_tool_breaker",  # the fleet-wide tool breaker (issue 14)
)
_ACTION_CODE: Final = {name: code for code, name in enumerate(ACTIONS)}
_DETECTOR_CODE: Final = {name: code for code, name in enumerate(DETECTORS)}

_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")
_I64 = struct.Struct("<q")
_TWO_U64 = struct.Struct("<QQ")
_HEAD = struct.Struct("<Bqq")  # version, touched_ms, last_event_ms

# History column layout flags (version 3).
_WIDE_REFS = 1  # string refs are 2 bytes (more than 255 strings)
_TS_INT32 = 2  # time deltas of 4 bytes (else 2, or 8 with _TS_INT64)
_TS_INT64 = 4


# Version 4's body, one MessagePack array: the state but its head, as msgspec writes
# and reads it in C. Typed, so that a field of another type is refused as the bytes
# are read, not met by the engine later. Its types are values, not annotations: a
# mypyc build keeps values but erases annotations (``str | None`` became ``type``),
# and msgspec reads the types from them.
_Body = NamedTuple(  # noqa: UP014 - the functional form, see above
    "_Body",
    [
        ("next_seq", int),  # + 1; 0 for None
        ("verdict_floor", int),
        ("incarnation", int),
        ("history", list[Record]),
        # run key -> (window, remaining, (tool, sig, result) of the first result, broken)
        ("guards", dict[int, tuple[int, int, tuple[str, int, int] | None, bool]]),
        ("warnings", dict[int, tuple[int, int]]),
        ("seen_ids", list[int]),
        # (event, ACTIONS index, DETECTORS index, count, detail, seq)
        ("decisions", list[tuple[int, int, int, int, str | None, int]]),
        ("parked", dict[int, bytes]),  # seq -> the event's JSON
        ("skipped", list[tuple[int, int]]),
        ("retired", list[tuple[int, int]]),
        ("pending", list[bytes]),  # the events' JSON
        ("rules", bytes),  # loopfuse.streams.engine.rule_state's bytes; empty: no rule touched it
    ],
)

_BODY_ENCODER: Final = msgspec.msgpack.Encoder()
# Events at rest as JSON (loopfuse.streams.engine.state.encode_event; formats 1 to 3 kept JSON
# too, written by the pydantic models then: the same fields, which this reads back).
_EVENT_DECODER: Final = msgspec.json.Decoder(InputEvent)
_BODY_DECODER: Final = msgspec.msgpack.Decoder(_Body)


class StateTooLarge(ValueError):
    """A session's state does not fit its byte cap even with everything sheddable gone."""


# -- writing -------------------------------------------------------------------------


def encode(state: SessionState) -> bytes:
    """The state's bytes in the newest format."""
    rules = b""
    if state.rules is not None and not state.rules.empty():
        out = bytearray()
        encode_rule_state(out, state.rules, _uvarint)
        rules = bytes(out)
    head = _HEAD.pack(FORMAT_VERSION, state.touched_ms, state.last_event_ms)
    # _Body's fields, as a tuple (written alike): the history as its records' bytes
    return head + _BODY_ENCODER.encode(
        (
            0 if state.next_seq is None else state.next_seq + 1,
            state.verdict_floor,
            state.incarnation,
            msgspec.Raw(state.history_bytes()),
            {
                run: (guard.window, max(guard.remaining, 0), guard.first, guard.broken)
                for run, guard in state.guards.items()
            } if state.guards else {},
            state.warnings,
            state.seen_ids,
            [
                (d.event, _ACTION_CODE[d.action], _DETECTOR_CODE[d.detector], d.count,
                 d.detail, d.seq)
                for d in state.decisions
            ],
            state.parked_json() if state.parked else {},
            state.skipped,
            state.retired,
            list(map(encode_event, state.pending)),
            rules,
        )
    )


def encode_body(touched_ms: int, last_event_ms: int, body: bytes) -> bytes:
    """A state's bytes from its version-4 body as the native fold writes it
    (native/src/state_bytes.rs): what :func:`encode` writes for the same state."""
    return _HEAD.pack(FORMAT_VERSION, touched_ms, last_event_ms) + body


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
    return state, len(data)


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
    empty); since issue 14 an optional trailer of the opt-in rules' tallies
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


def _read_svarint(data: bytes, pos: int) -> tuple[int, int]:
    raw, pos = _read_uvarint(data, pos)
    return (raw >> 1) if not raw & 1 else -((raw + 1) >> 1), pos


# -- fitting a cap -------------------------------------------------------------------


def fit(state: SessionState, cap: int) -> bytes:
    """The state's bytes, shedding the oldest evidence until they fit in ``cap``.

    Identifiers are bounded at decode and every collection is capped, so with the
    default config a state fits in the default cap whatever the input; a large
    ``historySize`` or many long ids can still exceed it. Then the oldest history
    records go first (they would be trimmed next anyway), then warning buckets,
    guards, remembered verdicts and incarnations. Events waiting on a gap are never
    shed (they are input not yet applied): their bytes are capped by the engine.
    Raises StateTooLarge when nothing is left to shed.
    """
    data = encode(state)
    while len(data) > cap:
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
                f"session state is {len(data)} bytes with nothing left to shed (the cap is {cap})"
            )
        data = encode(state)
    return data
