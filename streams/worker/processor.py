"""The session processor: input records in, session states and messages out, no Kafka.

:class:`SessionProcessor` is the worker's batch logic (decode, key check, tenants,
grouping, seq sort, watermarks, state cache, routing, dead letters, expiry on both
clocks) over a :class:`SessionStore` (the Faust table in the worker, a dict in
tests), an :class:`InputOffsets` view of the consumer and an injected clock. Its
lifecycle is in its docstring. Each session's events are applied by a session fold
(:mod:`loopfuse.streams.worker.fold`: poison isolation), whose messages
(:mod:`loopfuse.streams.worker.outgoing`) it routes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from loopfuse.schemas.decode import DEFAULT_MAX_DEPTH, EventRejected
from loopfuse.schemas.events import InputEvent, ReplyTo
from loopfuse.streams.engine import Engine, Notice, SessionState, fleet, state_codec
from loopfuse.streams.engine.fingerprint import Fingerprints
from loopfuse.streams.engine.native_step import native_for
from loopfuse.streams.engine.wire import decode_fingerprinted
from loopfuse.streams.settings import TenantTopics
from loopfuse.streams.worker.fold import NativeFold, PythonFold, SessionFold
from loopfuse.streams.worker.metrics import Metrics
from loopfuse.streams.worker.outgoing import (
    DeadLetterLog,
    Limits,
    Outgoing,
    Source,
    dead_letter,
)
from loopfuse.streams.worker.progress import InputProgress

log = logging.getLogger("loopfuse.processor")

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
            python = type(fold) is PythonFold and self.native is not None
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

    def _fold(self, key: bytes) -> SessionFold:
        """The fold of the session stored under ``key`` (a :func:`table_key`); its
        messages are keyed by the session key alone."""
        raw = self.store.get(key)
        state = self._load(key, raw)
        session_key = split_table_key(key)[1]
        # An unreadable state was logged and starts afresh: nothing to go back to.
        base = raw if state else None
        if self.native is not None and not isinstance(state, SessionState):
            return NativeFold(
                native=self.native,
                key=session_key,
                limits=self.limits,
                base=base,
                state=state,
                strike=self.strike,
            )
        return PythonFold(
            engine=self.engine,
            key=session_key,
            limits=self.limits,
            base=base,
            state=state,
            breakers=self.breakers,
            strike=self.strike,
        )

    def _settle(self, key: bytes, fold: SessionFold, partition: int, out: list[Message]) -> None:
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
