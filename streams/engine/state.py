"""Per-session state: the rolling call history, guards, warning buckets, ordering.

The domain side of a session's state; its bytes (the changelog-backed table's values)
are loopfuse.streams.engine.state_codec's. Fingerprints are kept as 64-bit ints. A call id is
only kept while its record waits for a result: once the result is in, nothing can
match on it again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import attrgetter
from typing import Annotated

import msgspec
from xxhash import xxh3_64_intdigest

from loopfuse.schemas.events import (
    IDENTIFIERS_OF,
    Action,
    Compaction,
    Detector,
    InputEvent,
    RunEnded,
    ToolCall,
    ToolResult,
)
from loopfuse.streams.engine.history import Record, array_header, encode_record
from loopfuse.streams.engine.rule_state import RuleState

MAX_WARNING_KEYS = 256
MAX_SEEN_EVENT_IDS = 32
MAX_DECISIONS = 8  # verdicts other than allow, per session
MAX_GUARDS = 32  # armed post-compaction guards (one per run), oldest dropped first
MAX_RETIRED_INCARNATIONS = 8  # closed seq spaces remembered to recognise their redeliveries


class ResultAtRest(ToolResult, frozen=True, tag="tool_result"):
    """A tool_result as it waits in the state (parked on a gap, or pending a restart):
    raw args and outcome replaced by their tokens, and the error's text by ``failure``,
    its failure identity (rules.failure_identity), which the repeated-failure rule counts
    when the result is applied. Never on the wire: only the state's bytes hold it."""

    # 64 bits (msgspec bounds no int past 63: state_codec refuses a wider one as corrupt)
    failure: Annotated[int, msgspec.Meta(ge=0)] | None = None


#: An event as it waits in the state: what the state's bytes hold (as JSON).
EventAtRest = ToolCall | ResultAtRest | Compaction | RunEnded

#: Identifier fields of a waiting event, which dominate what it takes in the state:
#: read in one call.
_REST_FIELDS = {cls: attrgetter(*names) for cls, names in IDENTIFIERS_OF.items()}
_REST_FIELDS[ResultAtRest] = _REST_FIELDS[ToolResult]


def rest_size(event: InputEvent) -> int:
    """About what a waiting event (kept as fingerprints) takes in the state's bytes:
    its identifiers' UTF-8 bytes and 96."""
    text = "".join(filter(None, _REST_FIELDS[type(event)](event)))
    return 96 + (len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass")))


#: A waiting event's JSON, as the state's bytes keep it (nothing raw: it is at rest).
encode_event = msgspec.json.Encoder().encode


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
    action: Action
    detector: Detector | None
    count: int
    detail: str | None  # unknown-tool name or paired tool name, for the message
    seq: int = -1  # the tool_call's seq, -1 when it had none


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
    parked: dict[int, InputEvent] = field(default_factory=dict)
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
    pending: list[InputEvent] = field(default_factory=list)
    # What the opt-in rules count; None while no rule touched the session.
    rules: RuleState | None = None
    # Derived, never serialised: the run keys present in the history (None = recompute).
    _runs: set[int] | None = field(default=None, repr=False, compare=False)
    # Derived, never serialised: how many records of the history carry each signature.
    _sig_counts: dict[int, int] | None = field(default=None, repr=False, compare=False)
    # Derived, never serialised: about what the parked and pending events take.
    _waiting: int | None = field(default=None, repr=False, compare=False)
    # Derived, never serialised: each history record's MessagePack, in order (None =
    # not written yet). A checkpoint then writes the one or two records that changed
    # since the last, not all of them: the worker writes a session every batch.
    _record_bytes: list[bytes] | None = field(default=None, repr=False, compare=False)

    # Derived, never serialised: the earliest and latest ``ts`` of the parked events
    # (None = recompute), which decide when a gap is given up (Engine._release_gaps).
    _parked_times: tuple[int, int] | None = field(default=None, repr=False, compare=False)
    # Derived, never serialised: seq -> (parked event, its JSON as the state writes
    # it), kept while the event waits, so a checkpoint writes only what parked since.
    _parked_json: dict[int, tuple[InputEvent, bytes]] = field(
        default_factory=dict, repr=False, compare=False
    )
    # Derived, never serialised: seq -> rest_size of the parked event (measured as it
    # parks, not again as it leaves).
    _parked_sizes: dict[int, int] = field(default_factory=dict, repr=False, compare=False)

    def park(self, seq: int, event: InputEvent, *, counted: bool = False) -> None:
        """``event`` (at rest) waits for the seqs before it; ``counted``: it was waiting
        already (a restarted gateway's event, pending until its seq space opened)."""
        self.parked[seq] = event
        size = self._parked_sizes[seq] = rest_size(event)
        if not counted:
            self.note_waiting(size)
        times = self._parked_times
        if times is not None:
            ts = event.ts
            self._parked_times = (
                ts if ts < times[0] else times[0],
                ts if ts > times[1] else times[1],
            )
        elif len(self.parked) == 1:
            self._parked_times = (event.ts, event.ts)

    def park_as_read(self, seq: int, event: InputEvent, text: bytes) -> None:
        """A parked event read back from the state's bytes, with the JSON it was read
        from (written again as read)."""
        self.parked[seq] = event
        self._parked_json[seq] = (event, text)
        self._parked_times = None
        self._waiting = None

    def unpark(self, seq: int) -> InputEvent:
        """The event parked at ``seq``, no longer waiting."""
        event = self.parked.pop(seq)
        size = self._parked_sizes.pop(seq, None)
        self.note_waiting(-(rest_size(event) if size is None else size))
        self._parked_times = None  # a bound may have gone: recomputed when next asked
        self._parked_json.pop(seq, None)
        return event

    def parked_times(self) -> tuple[int, int]:
        """The earliest and the latest ``ts`` of the parked events (some are parked)."""
        times = self._parked_times
        if times is None:
            stamps = [event.ts for event in self.parked.values()]
            times = self._parked_times = (min(stamps), max(stamps))
        return times

    def parked_json(self) -> dict[int, bytes]:
        """The parked events' JSON by seq, as the state codec writes them."""
        kept = self._parked_json
        out: dict[int, bytes] = {}
        for seq, event in self.parked.items():
            known = kept.get(seq)
            if known is None or known[0] is not event:
                known = kept[seq] = (event, encode_event(event))
            out[seq] = known[1]
        return out

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

    def run_history(self, run: int) -> list[Record]:
        """The records detection may see: those of the current run (its run_key)."""
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
        written = self._record_bytes
        if written is not None:
            written.append(encode_record(record))
        excess = len(history) - history_size
        if excess > 0:
            if written is not None:
                del written[:excess]
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

    def replace(self, index: int, record: Record) -> None:
        """Put ``record`` in place of the one at ``index`` (a call's record taking its
        result): the same signature and run, so no count or run set changes."""
        self.history[index] = record
        written = self._record_bytes
        if written is not None:
            written[index] = encode_record(record)

    def forget_derived(self) -> None:
        """Drop the derived caches after the history was changed other than by append
        or replace."""
        self._runs = None
        self._sig_counts = None
        self._record_bytes = None

    def history_bytes(self) -> bytes:
        """The history as the state codec writes it: one MessagePack array of records."""
        written = self._record_bytes
        if written is None:
            written = self._record_bytes = list(map(encode_record, self.history))
        return array_header(len(written)) + b"".join(written)
