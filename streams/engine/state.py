"""Per-session state: the rolling call history, guards, warning buckets, ordering.

A session's state is what the stream adapter keeps in its changelog-backed table, so
it serialises to compact bytes (``to_bytes``/``from_bytes``). Fingerprints are kept
as 64-bit ints; strings (tool names, run ids) are written once per state in a
string table. A call id is only kept while its record waits for a result: once the
result is in, nothing can match on it again.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import accumulate, pairwise

from xxhash import xxh3_64_intdigest

from schemas.events import (
    Action,
    Compaction,
    Detector,
    RunEnded,
    ToolCall,
    ToolResult,
    input_event_adapter,
)
from streams.engine.rule_state import RuleState, decode_rule_state, encode_rule_state

FORMAT_VERSION = 3
# Version 1 had no ``last_event_ms``: read as 0 (unknown), so idle expiry falls back
# to the worker's clock alone for states written before the upgrade. Version 2 kept
# every guard's results and the run ids of warnings and guards as text; version 3
# keeps what decides an abort and run hashes, plus the incarnation bookkeeping.
_READABLE_VERSIONS = (1, 2, 3)
MAX_WARNING_KEYS = 256
MAX_SEEN_EVENT_IDS = 32
MAX_DECISIONS = 8  # verdicts other than allow, per session
MAX_GUARDS = 32  # armed post-compaction guards (one per run), oldest dropped first
MAX_RETIRED_INCARNATIONS = 8  # closed seq spaces remembered to recognise their redeliveries


class StateTooLarge(ValueError):
    """A session's state does not fit its byte cap even with everything sheddable gone."""


#: Identifier fields of a waiting event, which dominate what it takes in the state.
_REST_FIELDS = (
    "event_id", "session_key", "run_id", "agent_id", "incarnation", "call_id",
    "tool_name", "args_hash", "args_action", "result_hash", "unknown_tool",
)


def rest_size(event: ToolCall | ToolResult | Compaction | RunEnded) -> int:
    """About what a waiting event (kept as fingerprints) takes in the state's bytes."""
    size = 96
    fields = event.__dict__
    for name in _REST_FIELDS:
        value = fields.get(name)
        if value is not None:
            size += len(value) if value.isascii() else len(value.encode("utf-8", "surrogatepass"))
    return size


def run_key(run: str | None) -> int:
    """A run id (already scoped) as a non-zero 64-bit int; 0 for no run id."""
    if run is None:
        return 0
    return xxh3_64_intdigest(run.encode("utf-8", "surrogatepass")) | 1


def incarnation_key(incarnation: str | None) -> int:
    """A gateway incarnation as a non-zero 64-bit int; 0 for events without one (v1)."""
    if incarnation is None:
        return 0
    return xxh3_64_intdigest(incarnation.encode("utf-8", "surrogatepass")) | 1

InputEventT = ToolCall | ToolResult | Compaction | RunEnded

_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")
_I64 = struct.Struct("<q")

# History column layout flags.
_WIDE_REFS = 1  # string refs are 2 bytes (more than 255 strings)
# Time deltas between consecutive records: 2 bytes while calls come within a minute
# of each other (the common case), else 4, else 8 bytes.
_TS_INT32 = 2
_TS_INT64 = 4


@dataclass(slots=True)
class Record:
    """One call (and, once known, its outcome) in the session history."""

    tool: str
    sig: int  # call signature: tool name + args fingerprint, 64-bit
    run: str | None
    call: int  # 32-bit hash of the call id while the result is pending, else 0
    result: int  # 64-bit result fingerprint, 0 = no result yet
    unknown: str | None  # unknown-tool name carried by the result
    ts: int  # event time, epoch ms


@dataclass(slots=True)
class Guard:
    """The post-compaction guard of one run (spec section 7).

    It aborts when some (tool, sig, result) triple occurs ``window`` times among the
    first ``window`` results after arming, i.e. when all of them are the same triple.
    So the first triple and whether every later one equalled it decide everything;
    keeping every result (as the spec describes it) would let one session's state
    grow with the configured window.
    """

    window: int
    remaining: int
    first: tuple[str, int, int] | None = None  # (tool, sig, result) of the first result
    broken: bool = False  # a later result differed from the first: it can no longer trip


@dataclass(slots=True)
class Decision:
    """A past verdict other than allow, enough to re-emit it for a redelivered tool_call."""

    event: int  # 32-bit hash of the event id (only tells redeliveries apart)
    action: int  # index into ACTIONS
    detector: int  # index into DETECTORS, 0 = none
    count: int
    detail: str | None  # unknown-tool name or paired tool name, for the message
    seq: int = -1  # the tool_call's seq, -1 when it had none


ACTIONS: tuple[Action, ...] = ("allow", "warn", "block", "abort")
DETECTORS: tuple[Detector | None, ...] = (
    None,
    "unknown_tool_repeat",
    "global_circuit_breaker",
    "known_poll_no_progress",
    "ping_pong",
    "generic_repeat",
    "compaction_loop_persisted",
    "sequence_gap",
    # opt-in rules (issue 14): appended, so the codes of stored decisions keep their meaning
    "tool_loop_run_ended",
    "cycle",
    "repeated_failure",
    "argument_churn",
    "run_call_cap",
    "token_budget",
    "cost_budget",
    "fleet_tool_breaker",
)


@dataclass(slots=True)
class SessionState:
    history: list[Record] = field(default_factory=list)
    # run_key(run) -> its guard; insertion order = age (at most MAX_GUARDS)
    guards: dict[int, Guard] = field(default_factory=dict)
    # warning key hash -> (run_key(run), last published bucket); insertion order = age
    warnings: dict[int, tuple[int, int]] = field(default_factory=dict)
    next_seq: int | None = None
    # seq -> early event, applied once the gap before it fills. Kept as fingerprints
    # (raw args and results replaced by their tokens): nothing raw is at rest.
    parked: dict[int, InputEventT] = field(default_factory=dict)
    # seq ranges (first, last) given up on: an event of one that still arrives is
    # applied late rather than dropped as a duplicate
    skipped: list[tuple[int, int]] = field(default_factory=list)
    seen_ids: list[int] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)
    # Every tool_call with a seq at or above this one that is not in ``decisions``
    # was allowed: a redelivered one gets "allow" again without storing every verdict.
    verdict_floor: int = 0
    # Worker clock of the last event applied or parked (idle expiry, history deltas).
    touched_ms: int = 0
    # Gateway clock (``ts``) of the newest event applied or parked, at most the worker
    # clock: idle expiry measures a session's silence in event time too, so a worker
    # that reads one input late does not take a live session for an idle one.
    last_event_ms: int = 0
    # The seq space events are applied in: incarnation_key of the gateway's
    # incarnation (0: events without one). A gateway that restarts counts seq from 0
    # again under a new incarnation; see Engine.step.
    incarnation: int = 0
    # Closed seq spaces, oldest first: (incarnation key, next seq), so that their
    # redelivered events are recognised as duplicates.
    retired: list[tuple[int, int]] = field(default_factory=list)
    # Events of seq spaces not opened yet (a restarted gateway's first events, waiting
    # until the input can hold nothing more of the current one), in arrival order,
    # as fingerprints like ``parked``.
    pending: list[InputEventT] = field(default_factory=list)
    # What the opt-in rules (issue 14) count; None while no rule touched the session.
    rules: RuleState | None = None
    # Derived, never serialised: the run ids present in the history (None = recompute).
    _runs: set[str | None] | None = field(default=None, repr=False, compare=False)
    # Derived, never serialised: how many records of the history carry each signature.
    _sig_counts: dict[int, int] | None = field(default=None, repr=False, compare=False)
    # Derived, never serialised: about what the parked and pending events take.
    _waiting: int | None = field(default=None, repr=False, compare=False)

    def waiting_bytes(self) -> int:
        """About what the events waiting on a gap or a restart take (see rest_size)."""
        if self._waiting is None:
            self._waiting = sum(map(rest_size, self.parked.values())) + sum(
                map(rest_size, self.pending)
            )
        return self._waiting

    def note_waiting(self, delta: int) -> None:
        """An event joined (+) or left (-) the waiting ones."""
        if self._waiting is not None:
            self._waiting += delta

    def recent_count(self, sig: int, history: list[Record]) -> int:
        """Records with this signature in ``history`` (a run's view of the history)."""
        if history is not self.history:
            return sum(1 for rec in history if rec.sig == sig)
        counts = self._sig_counts
        if counts is None:
            counts = self._sig_counts = {}
            for rec in self.history:
                counts[rec.sig] = counts.get(rec.sig, 0) + 1
        return counts.get(sig, 0)

    def run_history(self, run: str | None) -> list[Record]:
        """The records detection may see: those of the current run."""
        runs = self._runs
        if runs is None:
            runs = self._runs = {rec.run for rec in self.history}
        if len(runs) == 1 and run in runs:
            return self.history  # the common case: one run per session history
        return [rec for rec in self.history if rec.run == run]

    def append(self, record: Record, history_size: int) -> None:
        """Add a record and trim the history oldest-first to ``history_size``."""
        history = self.history
        history.append(record)
        if self._runs is not None:
            self._runs.add(record.run)
        counts = self._sig_counts
        if counts is not None:
            counts[record.sig] = counts.get(record.sig, 0) + 1
        excess = len(history) - history_size
        if excess > 0:
            if counts is not None:
                for rec in history[:excess]:
                    left = counts[rec.sig] - 1
                    if left:
                        counts[rec.sig] = left
                    else:
                        del counts[rec.sig]
            # One record leaving while the next is of the same run changes no run set.
            same_runs = excess == 1 and history[0].run == history[1].run
            del history[:excess]
            if not same_runs:
                self._runs = None  # a run may have left the history: recompute lazily

    def forget_derived(self) -> None:
        """Drop the derived caches after the history was changed other than by append."""
        self._runs = None
        self._sig_counts = None

    def fit(self, cap: int) -> bytes:
        """The state's bytes, shedding the oldest evidence until they fit in ``cap``.

        Identifiers are bounded at decode and every collection is capped, so with
        the default config a state fits in the default cap whatever the input; a
        large ``historySize`` or many long ids can still exceed it. Then the oldest
        history records go first (they would be trimmed next anyway), then warning
        buckets, guards, remembered verdicts and incarnations. Events waiting on a
        gap are never shed (they are input not yet applied): their bytes are capped
        by the engine. Raises StateTooLarge when nothing is left to shed.
        """
        data = self.to_bytes()
        while len(data) > cap:
            if len(self.history) > 1:
                del self.history[: max(1, len(self.history) // 4)]
                self.forget_derived()
            elif self.warnings:
                for key in list(self.warnings)[: max(1, len(self.warnings) // 2)]:
                    del self.warnings[key]
            elif self.guards:
                for run in list(self.guards)[: max(1, len(self.guards) // 2)]:
                    del self.guards[run]
            elif self.rules is not None and self.rules.sheddable():
                self.rules.shed()
            elif self.decisions:
                self.decisions.clear()
                # no verdict is vouched for any more: none is re-sent for a redelivery
                self.verdict_floor = max(self.verdict_floor, self.next_seq or 0)
            elif self.retired or self.history or self.seen_ids:
                self.retired.clear()
                self.history.clear()
                self.seen_ids.clear()
                self.forget_derived()
            else:
                raise StateTooLarge(
                    f"session state is {len(data)} bytes with nothing left to shed "
                    f"(the cap is {cap})"
                )
            data = self.to_bytes()
        return data

    # -- serialisation -------------------------------------------------------------

    def to_bytes(self) -> bytes:
        strings: dict[str, int] = {}

        def ref(text: str | None) -> int:
            """0 for None, else 1 + index in the string table."""
            if text is None:
                return 0
            index = strings.get(text)
            if index is None:
                index = strings[text] = len(strings)
            return index + 1

        body = bytearray()
        _uvarint(body, 0 if self.next_seq is None else self.next_seq + 1)
        _encode_history(body, self.history, strings, ref, self.touched_ms)
        _uvarint(body, len(self.guards))
        for run, guard in self.guards.items():
            body += _U64.pack(run)
            _uvarint(body, guard.window)
            _uvarint(body, max(guard.remaining, 0))
            if guard.first is None:
                body.append(0)
            else:
                body.append(2 if guard.broken else 1)
                tool, sig, result = guard.first
                _uvarint(body, ref(tool))
                body += _U64.pack(sig)
                body += _U64.pack(result)
        _uvarint(body, len(self.warnings))
        for key, (run, bucket) in self.warnings.items():
            body += _U64.pack(key)
            body += _U64.pack(run)
            _uvarint(body, bucket)
        _uvarint(body, len(self.seen_ids))
        for event_hash in self.seen_ids:
            body += _U64.pack(event_hash)
        _encode_decisions(body, self.decisions, ref)
        _uvarint(body, self.verdict_floor)
        _uvarint(body, len(self.parked))
        for seq, event in self.parked.items():
            payload = event.model_dump_json(exclude_unset=True).encode()
            _uvarint(body, seq)
            _uvarint(body, len(payload))
            body += payload
        _uvarint(body, len(self.skipped))
        for first, last in self.skipped:
            _uvarint(body, first)
            _uvarint(body, last - first)
        body += _U64.pack(self.incarnation)
        _uvarint(body, len(self.retired))
        for incarnation, next_seq in self.retired:
            body += _U64.pack(incarnation)
            _uvarint(body, next_seq)
        _uvarint(body, len(self.pending))
        for event in self.pending:
            payload = event.model_dump_json(exclude_unset=True).encode()
            _uvarint(body, len(payload))
            body += payload
        if self.rules is not None and not self.rules.empty():
            encode_rule_state(body, self.rules, _uvarint)

        head = bytearray((FORMAT_VERSION,))
        head += _I64.pack(self.touched_ms)
        head += _I64.pack(self.last_event_ms)
        _uvarint(head, len(strings))
        for text in strings:
            encoded = text.encode("utf-8", "surrogatepass")
            _uvarint(head, len(encoded))
            head += encoded
        return bytes(head + body)

    @classmethod
    def from_bytes(cls, data: bytes) -> SessionState:
        if not data or data[0] not in _READABLE_VERSIONS:
            raise ValueError(f"unknown session state format {data[:1]!r}")
        view = memoryview(data)
        pos = 1
        touched_ms = _I64.unpack_from(data, pos)[0]
        pos += 8
        last_event_ms = 0
        if data[0] >= 2:
            last_event_ms = _I64.unpack_from(data, pos)[0]
            pos += 8
        count, pos = _read_uvarint(data, pos)
        strings: list[str | None] = [None]
        for _ in range(count):
            length, pos = _read_uvarint(data, pos)
            strings.append(bytes(view[pos : pos + length]).decode("utf-8", "surrogatepass"))
            pos += length

        state = cls(touched_ms=touched_ms, last_event_ms=last_event_ms)
        raw_seq, pos = _read_uvarint(data, pos)
        state.next_seq = None if raw_seq == 0 else raw_seq - 1
        pos = _decode_history(data, pos, strings, state.history, touched_ms)
        version = data[0]
        count, pos = _read_uvarint(data, pos)
        for _ in range(count):
            if version >= 3:
                run = _U64.unpack_from(data, pos)[0]
                pos += 8
                window, pos = _read_uvarint(data, pos)
                remaining, pos = _read_uvarint(data, pos)
                guard = Guard(window, remaining)
                flag = data[pos]
                pos += 1
                if flag:
                    index, pos = _read_uvarint(data, pos)
                    sig, result = struct.unpack_from("<QQ", data, pos)
                    pos += 16
                    guard.first = (strings[index] or "", sig, result)
                    guard.broken = flag == 2
            else:  # versions 1-2: the run as text and every result fed to the guard
                index, pos = _read_uvarint(data, pos)
                run = run_key(strings[index])
                window, pos = _read_uvarint(data, pos)
                remaining, pos = _read_uvarint(data, pos)
                seen_count, pos = _read_uvarint(data, pos)
                guard = Guard(window, remaining)
                for _ in range(seen_count):
                    index, pos = _read_uvarint(data, pos)
                    sig, result = struct.unpack_from("<QQ", data, pos)
                    pos += 16
                    triple = (strings[index] or "", sig, result)
                    if guard.first is None:
                        guard.first = triple
                    elif triple != guard.first:
                        guard.broken = True
            state.guards[run] = guard
        count, pos = _read_uvarint(data, pos)
        for _ in range(count):
            key = _U64.unpack_from(data, pos)[0]
            pos += 8
            if version >= 3:
                owner = _U64.unpack_from(data, pos)[0]
                pos += 8
            else:
                index, pos = _read_uvarint(data, pos)
                owner = run_key(strings[index])
            bucket, pos = _read_uvarint(data, pos)
            state.warnings[key] = (owner, bucket)
        count, pos = _read_uvarint(data, pos)
        for _ in range(count):
            state.seen_ids.append(_U64.unpack_from(data, pos)[0])
            pos += 8
        pos = _decode_decisions(data, pos, strings, state.decisions)
        state.verdict_floor, pos = _read_uvarint(data, pos)
        count, pos = _read_uvarint(data, pos)
        for _ in range(count):
            seq, pos = _read_uvarint(data, pos)
            length, pos = _read_uvarint(data, pos)
            state.parked[seq] = input_event_adapter.validate_json(bytes(view[pos : pos + length]))
            pos += length
        count, pos = _read_uvarint(data, pos)
        for _ in range(count):
            first, pos = _read_uvarint(data, pos)
            span, pos = _read_uvarint(data, pos)
            state.skipped.append((first, first + span))
        if version >= 3:
            state.incarnation = _U64.unpack_from(data, pos)[0]
            pos += 8
            count, pos = _read_uvarint(data, pos)
            for _ in range(count):
                incarnation = _U64.unpack_from(data, pos)[0]
                next_seq, pos = _read_uvarint(data, pos + 8)
                state.retired.append((incarnation, next_seq))
            count, pos = _read_uvarint(data, pos)
            for _ in range(count):
                length, pos = _read_uvarint(data, pos)
                state.pending.append(
                    input_event_adapter.validate_json(bytes(view[pos : pos + length]))
                )
                pos += length
            if pos < len(data):
                state.rules, pos = decode_rule_state(data, pos, _read_uvarint)
        if pos != len(data):
            raise ValueError(f"session state has {len(data) - pos} trailing bytes")
        return state

    @staticmethod
    def idle_stamps(data: bytes) -> tuple[int, int]:
        """``(touched_ms, last_event_ms)`` of serialised state without decoding the rest.

        Idle expiry reads these for every session on every scan.
        """
        touched_ms = _I64.unpack_from(data, 1)[0]
        last_event_ms = _I64.unpack_from(data, 9)[0] if data[0] >= 2 else 0
        return touched_ms, last_event_ms


def _uvarint(out: bytearray, value: int) -> None:
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _svarint(out: bytearray, value: int) -> None:
    _uvarint(out, (value << 1) if value >= 0 else ((-value) << 1) - 1)


def _read_uvarint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


def _read_svarint(data: bytes, pos: int) -> tuple[int, int]:
    raw, pos = _read_uvarint(data, pos)
    return (raw >> 1) if not raw & 1 else -((raw + 1) >> 1), pos


def _encode_history(
    out: bytearray,
    history: list[Record],
    strings: dict[str, int],
    ref: Callable[[str | None], int],
    base_ts: int,
) -> None:
    """The history column by column: one struct call per column, not per record.

    Most of a state's bytes and of its encoding time are here, and the adapter
    encodes every touched session once per batch.
    """
    count = len(history)
    _uvarint(out, count)
    if not count:
        return
    for text in {rec.tool for rec in history} | {rec.run for rec in history}:
        ref(text)
    tools = [strings[rec.tool] + 1 for rec in history]
    runs = [0 if rec.run is None else strings[rec.run] + 1 for rec in history]
    times = [rec.ts for rec in history]
    deltas = [b - a for a, b in pairwise(times)]
    low, high = (min(deltas), max(deltas)) if deltas else (0, 0)
    if low >= 0 and high < 2**16:
        ts_flag, ts_code = 0, "H"
    elif low >= -(2**31) and high < 2**31:
        ts_flag, ts_code = _TS_INT32, "i"
    else:
        ts_flag, ts_code = _TS_INT64, "q"
    flags = (_WIDE_REFS if len(strings) > 254 else 0) | ts_flag
    ref_code = "H" if flags & _WIDE_REFS else "B"
    out.append(flags)
    out += struct.pack(f"<{count}{ref_code}", *tools)
    out += struct.pack(f"<{count}{ref_code}", *runs)
    out += struct.pack(f"<{count}Q", *[rec.sig for rec in history])
    out += struct.pack(f"<{count}Q", *[rec.result for rec in history])
    _svarint(out, times[0] - base_ts)
    out += struct.pack(f"<{count - 1}{ts_code}", *deltas)
    # Pending call ids and unknown-tool names are rare: (index, value) pairs.
    pending = [(index, rec.call) for index, rec in enumerate(history) if rec.call]
    _uvarint(out, len(pending))
    for index, call in pending:
        _uvarint(out, index)
        out += _U32.pack(call)
    unknown = [(index, rec.unknown) for index, rec in enumerate(history) if rec.unknown is not None]
    _uvarint(out, len(unknown))
    for index, name in unknown:
        _uvarint(out, index)
        _uvarint(out, ref(name))


def _decode_history(
    data: bytes, pos: int, strings: list[str | None], history: list[Record], base_ts: int
) -> int:
    count, pos = _read_uvarint(data, pos)
    if not count:
        return pos
    flags = data[pos]
    pos += 1
    ref_code = "H" if flags & _WIDE_REFS else "B"
    ref_size = 2 if flags & _WIDE_REFS else 1
    tools = struct.unpack_from(f"<{count}{ref_code}", data, pos)
    pos += count * ref_size
    runs = struct.unpack_from(f"<{count}{ref_code}", data, pos)
    pos += count * ref_size
    sigs = struct.unpack_from(f"<{count}Q", data, pos)
    pos += count * 8
    results = struct.unpack_from(f"<{count}Q", data, pos)
    pos += count * 8
    first_delta, pos = _read_svarint(data, pos)
    ts_code, ts_size = (
        ("q", 8) if flags & _TS_INT64 else ("i", 4) if flags & _TS_INT32 else ("H", 2)
    )
    deltas = struct.unpack_from(f"<{count - 1}{ts_code}", data, pos)
    pos += (count - 1) * ts_size
    times = accumulate(deltas, initial=base_ts + first_delta)
    history.extend(
        Record(strings[tool] or "", sig, strings[run], 0, result, None, ts)
        for tool, run, sig, result, ts in zip(tools, runs, sigs, results, times, strict=False)
    )
    pending, pos = _read_uvarint(data, pos)
    for _ in range(pending):
        index, pos = _read_uvarint(data, pos)
        history[-count + index].call = _U32.unpack_from(data, pos)[0]
        pos += 4
    unknown, pos = _read_uvarint(data, pos)
    for _ in range(unknown):
        index, pos = _read_uvarint(data, pos)
        name, pos = _read_uvarint(data, pos)
        history[-count + index].unknown = strings[name]
    return pos


def _encode_decisions(
    out: bytearray, decisions: list[Decision], ref: Callable[[str | None], int]
) -> None:
    """Column by column, like the history: one struct call per column."""
    count = len(decisions)
    _uvarint(out, count)
    if not count:
        return
    counts = [d.count for d in decisions]
    wide = max(counts) > 0xFFFF
    out.append(1 if wide else 0)
    out += struct.pack(f"<{count}I", *[d.event for d in decisions])
    out += bytes(d.action for d in decisions)
    out += bytes(d.detector for d in decisions)
    out += struct.pack(f"<{count}{'I' if wide else 'H'}", *counts)
    out += struct.pack(f"<{count}q", *[d.seq for d in decisions])
    details = [(index, d.detail) for index, d in enumerate(decisions) if d.detail is not None]
    _uvarint(out, len(details))
    for index, detail in details:
        _uvarint(out, index)
        _uvarint(out, ref(detail))


def _decode_decisions(
    data: bytes, pos: int, strings: list[str | None], decisions: list[Decision]
) -> int:
    count, pos = _read_uvarint(data, pos)
    if not count:
        return pos
    wide = data[pos]
    pos += 1
    events = struct.unpack_from(f"<{count}I", data, pos)
    pos += 4 * count
    actions = data[pos : pos + count]
    detectors = data[pos + count : pos + 2 * count]
    pos += 2 * count
    counts = struct.unpack_from(f"<{count}{'I' if wide else 'H'}", data, pos)
    pos += (4 if wide else 2) * count
    seqs = struct.unpack_from(f"<{count}q", data, pos)
    pos += 8 * count
    decisions.extend(map(Decision, events, actions, detectors, counts, [None] * count, seqs))
    details, pos = _read_uvarint(data, pos)
    for _ in range(details):
        index, pos = _read_uvarint(data, pos)
        ref, pos = _read_uvarint(data, pos)
        decisions[-count + index].detail = strings[ref]
    return pos
