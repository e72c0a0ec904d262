"""Session state as bytes: the value of the session table and its changelog.

The format is versioned by its first byte. Every version ever written stays readable
(a changelog outlives the code that wrote it): one reader per version below, and the
writer writes the newest. Fingerprints are 64-bit ints; strings (tool names, run ids)
are written once per state in a string table; the history is written column by
column, which lets both directions work on whole columns (``zip``, ``struct``) in C
instead of record by record in Python: the worker encodes every touched session
once per batch.

Layout of version 3 (uvarints unless a width is given; ``ref`` = 0 for None, else
1 + index in the string table)::

    version:u8  touched_ms:i64  last_event_ms:i64  strings  next_seq+1
    history  guards  warnings  seen_ids  decisions  verdict_floor  parked  skipped
    incarnation:u64  retired  pending
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from itertools import accumulate, repeat
from operator import sub
from typing import Final

from schemas.events import Action, Detector, InputEvent, input_event_adapter
from streams.engine.rule_state import decode_rule_state, encode_rule_state
from streams.engine.state import Decision, Guard, Record, SessionState, run_key

FORMAT_VERSION: Final = 3

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
# parked, skipped, incarnation, retired, pending: the end of a state with nothing waiting
_NOTHING_WAITING = struct.Struct("<BBQBB")

# History column layout flags.
_WIDE_REFS = 1  # string refs are 2 bytes (more than 255 strings)
# Time deltas between consecutive records: 2 bytes while calls come within a minute
# of each other (the common case), else 4, else 8 bytes.
_TS_INT32 = 2
_TS_INT64 = 4

_new_record = tuple.__new__  # builds Records from zipped columns without a Python call


class StateTooLarge(ValueError):
    """A session's state does not fit its byte cap even with everything sheddable gone."""


# -- writing -------------------------------------------------------------------------


def encode(state: SessionState) -> bytes:
    """The state's bytes in the newest format."""
    body = bytearray()
    _uvarint(body, 0 if state.next_seq is None else state.next_seq + 1)
    # The string table, refs in order of first use: the history's tool names and runs
    # first (most states have no other string), then as the sections below need one.
    refs: dict[str | None, int]
    if state.history:
        refs = _encode_history(body, state.history, state.touched_ms)
    else:
        refs = {None: 0}
        body.append(0)

    def ref(text: str | None) -> int:
        found = refs.get(text)
        if found is None:
            found = refs[text] = len(refs)
        return found

    guards = state.guards
    _uvarint(body, len(guards))
    for run, guard in guards.items():
        body += _U64.pack(run)
        _uvarint(body, guard.window)
        _uvarint(body, max(guard.remaining, 0))
        if guard.first is None:
            body.append(0)
        else:
            body.append(2 if guard.broken else 1)
            tool, sig, result = guard.first
            _uvarint(body, ref(tool))
            body += _TWO_U64.pack(sig, result)
    warnings = state.warnings
    _uvarint(body, len(warnings))
    for key, (run, bucket) in warnings.items():
        body += _TWO_U64.pack(key, run)
        _uvarint(body, bucket)
    seen = state.seen_ids
    _uvarint(body, len(seen))
    if seen:
        body += struct.pack(f"<{len(seen)}Q", *seen)
    if state.decisions:
        _encode_decisions(body, state.decisions, ref)
    else:
        body.append(0)
    _uvarint(body, state.verdict_floor)
    if state.parked or state.skipped or state.retired or state.pending:
        _encode_waiting(body, state)
    else:  # nothing waits on a gap or a restart: zero counts around the incarnation
        body += _NOTHING_WAITING.pack(0, 0, state.incarnation, 0, 0)
    if state.rules is not None and not state.rules.empty():
        # A tagged trailer: a session no rule touched has the bytes it had before rules.
        encode_rule_state(body, state.rules, _uvarint)

    head = bytearray(_HEAD.pack(FORMAT_VERSION, state.touched_ms, state.last_event_ms))
    _uvarint(head, len(refs) - 1)
    for text in refs:
        if text is not None:
            _blob(head, text.encode("utf-8", "surrogatepass"))
    head += body
    return bytes(head)


def _encode_history(out: bytearray, history: list[Record], base_ts: int) -> dict[str | None, int]:
    """The history, column by column; returns the string table it started."""
    tools, sigs, runs, calls, results, unknowns, times = zip(*history, strict=True)
    first_use = dict.fromkeys(tools)
    first_use.update(dict.fromkeys(runs))
    first_use.pop(None, None)
    refs: dict[str | None, int] = dict(zip(first_use, range(1, len(first_use) + 1), strict=True))
    refs[None] = 0
    count = len(tools)
    _uvarint(out, count)
    deltas = list(map(sub, times[1:], times[:-1]))
    low, high = (min(deltas), max(deltas)) if deltas else (0, 0)
    if low >= 0 and high < 2**16:
        ts_flag, ts_code = 0, "H"
    elif low >= -(2**31) and high < 2**31:
        ts_flag, ts_code = _TS_INT32, "i"
    else:
        ts_flag, ts_code = _TS_INT64, "q"
    get = refs.__getitem__
    if len(refs) > 255:  # more than 254 strings: refs take 2 bytes
        out.append(_WIDE_REFS | ts_flag)
        out += struct.pack(f"<{2 * count}H", *map(get, tools), *map(get, runs))
    else:
        out.append(ts_flag)
        out += bytes(map(get, tools))
        out += bytes(map(get, runs))
    out += struct.pack(f"<{2 * count}Q", *sigs, *results)
    _svarint(out, times[0] - base_ts)
    out += struct.pack(f"<{count - 1}{ts_code}", *deltas)
    # Pending call ids and unknown-tool names are rare: (index, value) pairs, found
    # by a scan in C first.
    if any(calls):
        pending = [(index, call) for index, call in enumerate(calls) if call]
        _uvarint(out, len(pending))
        for index, call in pending:
            _uvarint(out, index)
            out += _U32.pack(call)
    else:
        out.append(0)
    if unknowns.count(None) == count:
        out.append(0)
    else:
        unknown = [(index, name) for index, name in enumerate(unknowns) if name is not None]
        _uvarint(out, len(unknown))
        for index, name in unknown:
            _uvarint(out, index)
            ref = refs.get(name)
            if ref is None:
                ref = refs[name] = len(refs)
            _uvarint(out, ref)
    return refs


#: The JSON of events at rest (parked or pending), by identity: a session keeps them
#: across many checkpoints, and dumping each again at every one made a backlog with
#: parked events quadratic (a worker reading calls ahead of results parks hundreds).
#: Events at rest are never changed in place (Engine._at_rest builds them), and each
#: entry holds its event, so an id is not reused while its entry is here.
_AT_REST_JSON: dict[int, tuple[InputEvent, bytes]] = {}
_AT_REST_JSON_MAX: Final = 20_000


def _event_json(event: InputEvent) -> bytes:
    cached = _AT_REST_JSON.get(id(event))
    if cached is not None and cached[0] is event:
        return cached[1]
    data = event.model_dump_json(exclude_unset=True).encode()
    _remember_json(event, data)
    return data


def _remember_json(event: InputEvent, data: bytes) -> None:
    if len(_AT_REST_JSON) >= _AT_REST_JSON_MAX:
        _AT_REST_JSON.clear()  # a bound, not an LRU: refilled by the next checkpoints
    _AT_REST_JSON[id(event)] = (event, data)


def _encode_waiting(out: bytearray, state: SessionState) -> None:
    """Parked events, skipped seq ranges, the incarnation, retired ones, pending events."""
    _uvarint(out, len(state.parked))
    for seq, event in state.parked.items():
        _uvarint(out, seq)
        _blob(out, _event_json(event))
    _uvarint(out, len(state.skipped))
    for first_seq, last_seq in state.skipped:
        _uvarint(out, first_seq)
        _uvarint(out, last_seq - first_seq)
    out += _U64.pack(state.incarnation)
    _uvarint(out, len(state.retired))
    for incarnation, next_seq in state.retired:
        out += _U64.pack(incarnation)
        _uvarint(out, next_seq)
    _uvarint(out, len(state.pending))
    for event in state.pending:
        _blob(out, _event_json(event))


def _encode_decisions(
    out: bytearray, decisions: list[Decision], ref: Callable[[str | None], int]
) -> None:
    """Column by column, like the history."""
    count = len(decisions)
    _uvarint(out, count)
    if not count:
        return
    counts = [d.count for d in decisions]
    wide = max(counts) > 0xFFFF
    out.append(1 if wide else 0)
    out += struct.pack(f"<{count}I", *[d.event for d in decisions])
    out += bytes(_ACTION_CODE[d.action] for d in decisions)
    out += bytes(_DETECTOR_CODE[d.detector] for d in decisions)
    out += struct.pack(f"<{count}{'I' if wide else 'H'}", *counts)
    out += struct.pack(f"<{count}q", *[d.seq for d in decisions])
    details = [(index, d.detail) for index, d in enumerate(decisions) if d.detail is not None]
    _uvarint(out, len(details))
    for index, detail in details:
        _uvarint(out, index)
        _uvarint(out, ref(detail))


def _uvarint(out: bytearray, value: int) -> None:
    if value < 0x80:  # most counts and small numbers: one byte
        out.append(value)
        return
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _svarint(out: bytearray, value: int) -> None:
    _uvarint(out, (value << 1) if value >= 0 else ((-value) << 1) - 1)


def _blob(out: bytearray, data: bytes) -> None:
    _uvarint(out, len(data))
    out += data


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

    Idle expiry reads these for every session on every scan.
    """
    touched_ms: int = _I64.unpack_from(data, 1)[0]
    last_event_ms: int = _I64.unpack_from(data, 9)[0] if data[0] >= 2 else 0
    return touched_ms, last_event_ms


def _read_v3(data: bytes) -> tuple[SessionState, int]:
    """Guards keep what decides an abort, runs as hashes; incarnation bookkeeping; and
    since issue 14 an optional trailer of the opt-in rules' tallies (additive: bytes
    written before it still read)."""
    touched_ms, last_event_ms = _I64.unpack_from(data, 1)[0], _I64.unpack_from(data, 9)[0]
    strings, pos = _read_strings(data, 17)
    state = SessionState(touched_ms=touched_ms, last_event_ms=last_event_ms)
    pos = _read_common_head(data, pos, strings, state)
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
    count, pos = _read_count(data, pos)
    for _ in range(count):
        key, owner = _TWO_U64.unpack_from(data, pos)
        bucket, pos = _read_uvarint(data, pos + 16)
        state.warnings[key] = (owner, bucket)
    pos = _read_common_tail(data, pos, strings, state)
    state.incarnation = _U64.unpack_from(data, pos)[0]
    pos += 8
    count, pos = _read_count(data, pos)
    for _ in range(count):
        incarnation = _U64.unpack_from(data, pos)[0]
        next_seq, pos = _read_uvarint(data, pos + 8)
        state.retired.append((incarnation, next_seq))
    count, pos = _read_count(data, pos)
    for _ in range(count):
        event, pos = _read_event(data, pos)
        state.pending.append(event)
    if pos < len(data):  # the opt-in rules' trailer (streams.engine.rule_state)
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
}


def _read_common_head(data: bytes, pos: int, strings: list[str | None], state: SessionState) -> int:
    """next_seq and the history: the same in every version."""
    raw_seq, pos = _read_uvarint(data, pos)
    state.next_seq = None if raw_seq == 0 else raw_seq - 1
    return _read_history(data, pos, strings, state.history, state.touched_ms)


def _read_common_tail(data: bytes, pos: int, strings: list[str | None], state: SessionState) -> int:
    """Seen event ids to skipped seq ranges: the same in every version."""
    count, pos = _read_count(data, pos)
    state.seen_ids.extend(struct.unpack_from(f"<{count}Q", data, pos))
    pos += 8 * count
    pos = _read_decisions(data, pos, strings, state.decisions)
    state.verdict_floor, pos = _read_uvarint(data, pos)
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
        map(
            _new_record,
            repeat(Record),
            zip(
                map(ref, tool_refs),
                columns[:count],
                map(ref, run_refs),
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
    """An event waiting on a gap or a restart (kept as its JSON, fingerprints only)."""
    length, pos = _read_count(data, pos)
    text = data[pos : pos + length]
    event = input_event_adapter.validate_json(text)
    _remember_json(event, text)  # encoded again as read
    return event, pos + length


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
