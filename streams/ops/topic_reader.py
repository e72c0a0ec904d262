"""Reading loopfuse's output topics outside the worker: a snapshot, a follow, a group.

``loopfuse audit`` reads a snapshot (every partition from a time to the end offsets as
they were when it started, then stop) and ``loopfuse tail`` follows every partition
of its topics from the end, forever (:func:`verdict_topics` says where verdicts go); neither uses a consumer group, so readers never disturb each
other or the workers, and nothing is committed. ``loopfuse notify`` must not lose a
record across restarts, so it reads with a consumer group of its own
(:class:`GroupReader`) and commits what it has dealt with.

End offsets come from Fetch answers (:func:`fetch_end_offsets`) on every broker, never
``ListOffsets(latest)``: the embedded broker answers that with the last batch's base
offset + 1, so a reader starting "from the end" re-read part of the last batch (tail
printed old records, notify posted them again). The Fetch answer is right on Apache
Kafka too, and one way for every reader keeps them alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Callable, Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka import errors as kafka_errors

from loopfuse.streams.end_offsets import fetch_end_offsets

if TYPE_CHECKING:
    from loopfuse.streams.settings import Settings

log = logging.getLogger("loopfuse.topic_reader")


def verdict_topics(settings: Settings) -> tuple[str, ...]:
    """Every topic the worker writes verdicts to, for every tenant it serves
    (``LOOPFUSE_TENANTS``): each reply topic (a call that names one in ``reply_to`` is
    answered there) and each verdicts topic (every other call)."""
    return (*settings.reply_topic_names, *settings.verdict_topics)


def reader_settings(bootstrap: str | None) -> Settings:
    """The worker's settings (LOOPFUSE_* variables: topics, security), ``--bootstrap`` first."""
    from loopfuse.streams.settings import Settings

    return Settings(bootstrap_servers=bootstrap) if bootstrap else Settings()


class TopicMissing(RuntimeError):
    """The topic does not exist on the broker (yet)."""


async def _partitions(consumer: AIOKafkaConsumer, topic: str, wait: float) -> list[TopicPartition]:
    deadline = asyncio.get_running_loop().time() + wait
    # Asked by name: metadata of all topics leaves out the ones the ACLs hide, while a
    # named one comes back refused (TOPIC_AUTHORIZATION_FAILED), which says why.
    denied = TopicMissing(
        f"the broker's ACLs do not let this principal read topic {topic!r} (each role's "
        "ACLs: infra/kafka/kafka-acls.sh; README: Running in production)"
    )
    try:
        await consumer._client.add_topic(topic)
        while True:
            partitions = consumer.partitions_for_topic(topic)
            if partitions:
                return [TopicPartition(topic, p) for p in sorted(partitions)]
            if asyncio.get_running_loop().time() > deadline:
                raise TopicMissing(f"topic {topic!r} does not exist on the broker")
            await consumer._client.force_metadata_update()
            if topic in consumer._client.cluster.unauthorized_topics:
                raise denied  # not a topic to wait for: the ACLs hide it from us
            await asyncio.sleep(0.1)
    except kafka_errors.TopicAuthorizationFailedError:
        raise denied from None


async def _assign_all(consumer: AIOKafkaConsumer, topic: str, wait: float) -> list[TopicPartition]:
    tps = await _partitions(consumer, topic, wait)
    consumer.assign(tps)
    return tps


def _consumer(bootstrap: str, kafka_options: dict[str, Any]) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",  # offset 0 already deleted (retention): the log start
        fetch_max_wait_ms=100,
        **kafka_options,
    )


async def read_snapshot(
    bootstrap: str,
    topic: str,
    *,
    since_ms: int | None = None,
    kafka_options: dict[str, Any] | None = None,
    wait_for_topic: float = 5.0,
) -> AsyncGenerator[bytes, None]:
    """Every record value of ``topic`` up to the end offsets as of the start, then stop.

    ``since_ms`` skips, where the broker can say so (ListOffsets by time), the part of
    each partition written before that time; callers still filter by the records'
    own times. The end offsets come from Fetch responses (``loopfuse.streams.end_offsets``): the
    embedded broker's ListOffsets is wrong after multi-record batches.
    """
    consumer = _consumer(bootstrap, kafka_options or {})
    try:
        await consumer.start()  # inside: a refused start still closes the consumer
        tps = await _assign_all(consumer, topic, wait_for_topic)
        ends = await fetch_end_offsets(consumer, tps)
        starts: dict[TopicPartition, int] = {}
        if since_ms is not None:
            with contextlib.suppress(Exception):  # unsupported: read from the beginning
                found = await consumer.offsets_for_times({tp: since_ms for tp in tps})
                starts = {tp: o.offset for tp, o in found.items() if o is not None}
        for tp in tps:
            # Offset 0, not seek_to_beginning(): the embedded broker answered that with
            # the last batch's offset once the Fetch-based end offsets had been asked.
            consumer.seek(tp, starts.get(tp, 0))
        pending = {tp for tp in tps if ends.get(tp, 0) > 0}
        for tp in list(pending):
            if await consumer.position(tp) >= ends[tp]:
                pending.discard(tp)
        while pending:
            batches = await consumer.getmany(*pending, timeout_ms=500)
            for tp, records in batches.items():
                for record in records:
                    if record.offset < ends[tp] and record.value is not None:
                        yield record.value
                if await consumer.position(tp) >= ends[tp]:
                    pending.discard(tp)
    finally:
        await consumer.stop()


async def follow(
    bootstrap: str,
    topics: tuple[str, ...],
    *,
    kafka_options: dict[str, Any] | None = None,
    on_ready: Callable[[int], None] | None = None,
    wait_for_topic: float = 30.0,
) -> AsyncGenerator[bytes, None]:
    """Record values of ``topics`` published from now on, as they arrive (never ends).

    ``on_ready(partitions)`` is called once every partition's end is resolved: from
    then on nothing published is missed, and nothing published before is shown.
    """
    consumer = _consumer(bootstrap, kafka_options or {})
    try:
        await consumer.start()  # inside: a refused start still closes the consumer
        tps = [tp for topic in topics for tp in await _partitions(consumer, topic, wait_for_topic)]
        consumer.assign(tps)
        ends = await fetch_end_offsets(consumer, tps)
        for tp in tps:
            consumer.seek(tp, ends[tp])
        if on_ready is not None:
            on_ready(len(tps))
        while True:
            batches = await consumer.getmany(timeout_ms=500)
            for records in batches.values():
                for record in records:
                    if record.value is not None:
                        yield record.value
    finally:
        await consumer.stop()


@dataclass(frozen=True, slots=True)
class TopicRecord:
    """One record of the topic a :class:`GroupReader` reads: where it is, what it holds."""

    partition: int
    offset: int
    value: bytes | None


#: Given the partitions being taken away, the offsets to commit for them first.
Revoked = Callable[[set[int]], Mapping[int, int]]


class GroupReader:
    """One topic read with a consumer group: it resumes where the group committed.

    The reader commits only what it is told to (:meth:`commit`), so its caller decides
    when a record counts as done; a record read but not committed is read again after
    a restart or a rebalance (at least once). A partition the group has never
    committed starts at its end as of the assignment, and that position is committed
    at once, so what is published while the reader is down later is still read. A
    committed offset that retention has deleted restarts at the log start.

    Pausing stops fetching but keeps calling the broker, so the reader stays in the
    group while its caller is busy (an outage of whatever it feeds): back-pressure
    rather than a dropped record or a rebalance.
    """

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        group_id: str,
        *,
        kafka_options: dict[str, Any] | None = None,
        wait_for_topic: float = 30.0,
        revoked: Revoked | None = None,
        assigned: Callable[[list[int]], None] | None = None,
        max_records: int = 500,
    ) -> None:
        self.topic = topic
        self.wait_for_topic = wait_for_topic
        self.max_records = max_records
        self._revoked = revoked
        self._assigned = assigned
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            group_id=group_id,
            enable_auto_commit=False,
            # Only for a committed offset that is out of range (retention deleted it):
            # the log start, losing nothing more. A partition never committed is
            # positioned by _Positioning instead.
            auto_offset_reset="earliest",
            fetch_max_wait_ms=100,
            max_poll_records=max_records,
            **(kafka_options or {}),
        )
        self.paused = False

    async def start(self) -> int:
        """Connect and join the group; returns the topic's partition count."""
        try:
            await self.consumer.start()  # inside: a refused start still closes it
            tps = await _partitions(self.consumer, self.topic, self.wait_for_topic)
            self.consumer.subscribe([self.topic], listener=_Positioning(self))
        except BaseException:
            await self.consumer.stop()
            raise
        return len(tps)

    async def records(self, timeout: float) -> list[TopicRecord]:
        """The next records (in offset order per partition), or none after ``timeout`` s."""
        if self.paused:
            self.consumer.pause(*self.consumer.assignment())  # new ones after a rebalance
        batches = await self.consumer.getmany(
            timeout_ms=int(timeout * 1000), max_records=self.max_records
        )
        return [
            TopicRecord(tp.partition, record.offset, record.value)
            for tp, records in batches.items()
            for record in records
        ]

    def pause(self) -> None:
        if not self.paused:
            self.paused = True
            self.consumer.pause(*self.consumer.assignment())

    def resume(self) -> None:
        if self.paused:
            self.paused = False
            self.consumer.resume(*self.consumer.assignment())

    async def commit(self, offsets: Mapping[int, int]) -> bool:
        """Commit ``partition -> next offset to read``; False when the group moved on
        (the partitions went to another member: it reads them from the last commit)."""
        owned = {tp.partition for tp in self.consumer.assignment()}
        wanted = {TopicPartition(self.topic, p): o for p, o in offsets.items() if p in owned}
        if not wanted:
            return not offsets
        try:
            await self.consumer.commit(wanted)
        except (kafka_errors.CommitFailedError, kafka_errors.IllegalStateError):
            return False
        return len(wanted) == len(offsets)

    async def stop(self) -> None:
        """Leave the group, committing nothing more."""
        await self.consumer.stop()


class _Positioning(ConsumerRebalanceListener):  # type: ignore[misc]
    """The group reader's rebalance hooks: commit before a partition goes, position a
    partition the group never committed at its end when it comes."""

    def __init__(self, reader: GroupReader) -> None:
        self.reader = reader

    async def on_partitions_revoked(self, revoked: Collection[TopicPartition]) -> None:
        reader = self.reader
        if reader._revoked is None or not revoked:
            return
        offsets = reader._revoked({tp.partition for tp in revoked})
        wanted = {TopicPartition(reader.topic, p): o for p, o in offsets.items()}
        if wanted:
            try:
                await reader.consumer.commit(wanted)
            except kafka_errors.KafkaError as exc:
                # The new owner reads from the previous commit: duplicates, not loss.
                log.warning("could not commit before a rebalance: %s", type(exc).__name__)

    async def on_partitions_assigned(self, assigned: Collection[TopicPartition]) -> None:
        reader = self.reader
        consumer = reader.consumer
        # aiokafka's fetcher runs while this hook awaits: it finds no committed offset
        # for a fresh partition, resets it to auto_offset_reset (earliest) and fetches
        # from 0, so a new group's first read returned the whole topic (seen on Apache
        # Kafka when the end took a while to learn). Paused before the first await, a
        # partition is fetched only from where it is positioned below.
        consumer.pause(*assigned)
        fresh = [tp for tp in sorted(assigned) if await consumer.committed(tp) is None]
        if fresh:
            ends = await fetch_end_offsets(consumer, fresh)
            for tp in fresh:
                consumer.seek(tp, ends[tp])
            try:
                await consumer.commit({tp: ends[tp] for tp in fresh})
            except kafka_errors.KafkaError as exc:
                # Read from the end anyway; a restart before the next commit starts at
                # the end again (what was published in between is then not read).
                log.warning("could not commit the start positions: %s", type(exc).__name__)
        if not reader.paused:
            consumer.resume(*assigned)
        if reader._assigned is not None:
            reader._assigned(sorted(tp.partition for tp in assigned))


@dataclass(frozen=True, slots=True)
class RangeRecord:
    """One record of a :func:`read_range`: where it is, its broker time, what it holds."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    value: bytes | None


@dataclass
class ReadBudget:
    """How much a :func:`read_range` may read: record bytes and a wall-clock deadline
    (``asyncio`` loop time). ``stopped`` says which ran out first (None: neither)."""

    max_bytes: int | None = None
    deadline: float | None = None
    used_bytes: int = 0
    stopped: str | None = None

    def take(self, size: int) -> bool:
        """Count ``size`` more bytes; False (and ``stopped``) once they are over."""
        if self.max_bytes is not None and self.used_bytes + size > self.max_bytes:
            self.stopped = "bytes"
            return False
        self.used_bytes += size
        return True

    def expired(self, now: float) -> bool:
        if self.deadline is not None and now >= self.deadline:
            self.stopped = "time"
            return True
        return False


async def read_range(
    bootstrap: str,
    topics: Collection[str],
    *,
    since_ms: int | None = None,
    until_ms: int | None = None,
    offsets: Mapping[tuple[str, int], int] | None = None,
    budget: ReadBudget | None = None,
    kafka_options: dict[str, Any] | None = None,
    wait_for_topic: float = 5.0,
) -> AsyncGenerator[RangeRecord, None]:
    """The records of ``topics`` in a range, without a group: from ``offsets`` (per
    topic and partition) or else the first record at or after ``since_ms`` (broker
    time), up to the first record after ``until_ms`` or else the end offsets as of the
    start; then stop. A partition given neither an offset nor ``since_ms`` is read from
    its start when ``offsets`` is None, and not at all when it is given. ``budget``
    stops the read early (in offset order per partition: what was read is a prefix).
    """
    consumer = _consumer(bootstrap, kafka_options or {})
    budget = budget or ReadBudget()
    loop = asyncio.get_running_loop()
    try:
        await consumer.start()  # inside: a refused start still closes the consumer
        tps = [tp for topic in topics for tp in await _partitions(consumer, topic, wait_for_topic)]
        consumer.assign(tps)
        ends = await fetch_end_offsets(consumer, tps)
        if until_ms is not None:
            after = await consumer.offsets_for_times({tp: until_ms + 1 for tp in tps})
            ends = {
                tp: ends[tp] if after.get(tp) is None else min(ends[tp], after[tp].offset)
                for tp in tps
            }
        starts: dict[TopicPartition, int] = {}
        if since_ms is not None:
            found = await consumer.offsets_for_times({tp: since_ms for tp in tps})
            # no record at or after since_ms: nothing of the partition is in the range
            starts = {tp: ends[tp] if o is None else o.offset for tp, o in found.items()}
        given = offsets or {}
        for tp in tps:
            if (tp.topic, tp.partition) in given:
                starts[tp] = given[(tp.topic, tp.partition)]
            elif offsets is not None and since_ms is None:
                starts[tp] = ends[tp]
            consumer.seek(tp, min(starts.get(tp, 0), ends[tp]))
        pending = {tp for tp in tps if ends[tp] > 0}
        for tp in list(pending):
            if await consumer.position(tp) >= ends[tp]:
                pending.discard(tp)
        while pending and not budget.expired(loop.time()):
            batches = await consumer.getmany(*pending, timeout_ms=500)
            for tp, records in batches.items():
                for record in records:
                    if record.offset >= ends[tp]:
                        break
                    if not budget.take(len(record.value or b"")):
                        return
                    yield RangeRecord(
                        tp.topic, tp.partition, record.offset, record.timestamp, record.value
                    )
                if await consumer.position(tp) >= ends[tp]:
                    pending.discard(tp)
    finally:
        await consumer.stop()
