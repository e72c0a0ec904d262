"""The producer side: a batch's messages and table writes handed to aiokafka.

Everything a batch causes - verdicts, loop events, dead letters and its changelog
records - is handed to aiokafka's producer before the batch is acknowledged, and
Faust flushes that producer before it commits. Table writes used to go through
Faust's ``ProducerBuffer``, whose size hid the record in hand-off to aiokafka (a
batch was once acked before its last changelog record, found by the chaos test);
they now bypass it (``tables.FaustSessionStore``, :func:`send_table_writes`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection
from typing import Any

import faust
from aiokafka.errors import KafkaError
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.structs import TopicPartition
from faust.types import TP

from loopfuse.schemas.verdict_signature import VerdictSigner

log = logging.getLogger("loopfuse.worker")

Headers = list[tuple[str, bytes]]
#: (topic, key, value, partition) of a record to produce; partition None: by key.
Message = tuple[str, bytes | None, bytes, int | None]


class VerdictSigning:
    """Signs what goes to a verdict topic (``LOOPFUSE_VERDICT_KEY``; docs/wire-format.md:
    Verdict signatures): the verdicts topic and the reply topics.

    By topic, at hand-over, so that every path to those topics is covered - a routed
    reply, a v1 verdict, a fleet-breaker block, a redelivered call's verdict, one sent
    again after a broker error - whatever built it. Loop events, dead letters, strikes
    and breaker states go unsigned: no gateway acts on them.
    """

    def __init__(self, signer: VerdictSigner, topics: Collection[str]) -> None:
        self.signer = signer
        self.topics = frozenset(topics)

    def headers(self, topic: str, key: bytes | None, value: bytes | None) -> Headers | None:
        if value is None or topic not in self.topics:
            return None
        return [self.signer.header(key, value)]


async def send_retrying(
    app: faust.App,
    messages: list[Message],
    signing: VerdictSigning | None = None,
) -> None:
    """Hand messages to the producer; a broker problem is retried, never skipped.

    Outputs were checked against the producer's request size, so what fails here is
    the broker (or the network), not the input: giving up would let the batch be
    acknowledged without its verdicts.
    """
    for topic, key, value, partition in messages:
        await _hand_over(app, topic, key, value, partition, signing)


async def send_table_writes(
    app: faust.App, table: faust.Table[bytes, bytes], writes: list[tuple[int, bytes, bytes | None]]
) -> None:
    """Hand a batch's changelog records to the producer, retried like its messages.

    Each sent record's offset is kept in the table's store once the broker has it
    (what Faust's ``Collection._on_changelog_sent`` does, at-least-once): RocksDB
    recovery reads the changelog from there.
    """
    if not writes:
        return
    topic = table.changelog_topic.get_topic_name()
    store = table.data

    def persisted(sent: asyncio.Future[Any]) -> None:
        if not sent.cancelled() and sent.exception() is None:
            metadata = sent.result()
            store.set_persisted_offset(TP(metadata.topic, metadata.partition), metadata.offset)

    for partition, key, value in writes:
        sent = await _hand_over(app, topic, key, value, partition)
        sent.add_done_callback(persisted)


async def _hand_over(
    app: faust.App,
    topic: str,
    key: bytes | None,
    value: bytes | None,
    partition: int | None,
    signing: VerdictSigning | None = None,
) -> asyncio.Future[Any]:
    """One record into the producer (its delivery future), retried until it is in."""
    headers = signing.headers(topic, key, value) if signing is not None else None
    delay = 0.1
    while True:
        try:
            appended = await append_record(app, topic, key, value, partition, headers)
            if appended is not None:
                return appended
            return await app.producer.send(topic, key, value, partition, None, headers)  # type: ignore[return-value]
        except (KafkaError, OSError) as exc:
            log.warning("cannot hand a record to the producer (%r); retrying", exc)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)


#: (topic, key) -> (the topic's partition count, the key's partition): aiokafka's
#: partitioner hashes each record's key in pure Python (murmur2), and a session's key
#: comes back with each of its verdicts. Cleared when full.
_PARTITION_OF: dict[tuple[str, bytes], tuple[int, TopicPartition]] = {}
_PARTITION_CACHE_SIZE = 65_536
#: What a record's headers and batch framing may add to its key and value, at most
#: (a verdict's signature is ~100 bytes): a record nearer the request size than this
#: goes through aiokafka's send, which measures it.
_RECORD_OVERHEAD = 4_096


async def append_record(
    app: faust.App,
    topic: str,
    key: bytes | None,
    value: bytes | None,
    partition: int | None,
    headers: Headers | None,
) -> asyncio.Future[Any] | None:
    """A record appended to aiokafka's open batch for its partition (its delivery
    future), as aiokafka's ``send`` would append it; None where that ``send`` must take
    it: no producer yet, no metadata for the topic yet, a partition the metadata does
    not have, a record without key or partition, serializers or a partitioner of the
    application's own, a transaction, headers Faust would drop, a record near the
    request size.

    Faust's ``Producer.send`` and aiokafka's (the ``on_produce_message`` signal, the
    metadata wait, the partitioner's murmur2 in Python over a copy of the partition
    list each time) were a fifth of the worker's busy main thread once the judge was
    native (cProfile, bench/stream.py on 100k events over 1000 sessions). This goes to
    the accumulator's append (``_message_accumulator.add_message``), which batches,
    waits for room and fails as it does under ``send``: 6.2 µs of CPU a record where
    ``send`` takes 11.3 (bench/hand_over.py, medians).
    """
    faust_producer: Any = app.producer
    producer: Any = getattr(faust_producer, "_producer", None)
    if producer is None:
        return None
    appendable = producer.__dict__.get("_loopfuse_appendable")
    if appendable is None:  # once per aiokafka producer: nothing here changes after start
        appendable = producer._loopfuse_appendable = bool(
            getattr(faust_producer, "allow_headers", False)
            and producer._key_serializer is None
            and producer._value_serializer is None
            and type(producer._partitioner) is DefaultPartitioner
            and (producer._txn_manager is None or producer._txn_manager.transactional_id is None)
        )
    if not appendable:
        return None
    partitions = producer._metadata.partitions_for_topic(topic)
    if not partitions:
        return None
    if len(key or b"") + len(value or b"") + _RECORD_OVERHEAD > producer._max_request_size:
        return None
    if partition is None:
        if key is None:
            return None
        known = _PARTITION_OF.get((topic, key))
        if known is None or known[0] != len(partitions):
            ordered = sorted(partitions)
            picked = producer._partitioner(key, ordered, ordered)
            known = (len(partitions), TopicPartition(topic, picked))
            if len(_PARTITION_OF) >= _PARTITION_CACHE_SIZE:
                _PARTITION_OF.clear()
            _PARTITION_OF[(topic, key)] = known
        tp = known[1]
    elif partition in partitions:
        tp = TopicPartition(topic, partition)
    else:
        return None
    future: asyncio.Future[Any] = await producer._message_accumulator.add_message(
        tp, key, value, producer._request_timeout_ms / 1000, headers=headers or []
    )
    return future


class Publisher:
    """Hands the processor's messages to the producer, and checkpoints: the table
    writes they made, then the batches' acknowledgements.

    ``send`` hands a batch's messages over and keeps the batch; ``checkpoint``
    waits until the broker has every message sent so far, hands over the writes
    the store holds (the newest state of each session changed since the last
    checkpoint), then acknowledges the batches sent so far, whose offsets Faust
    commits after flushing the producer. Await ``send`` right after the processor
    call and the checkpoint's snapshot is consistent: the writes it takes are
    exactly those of the batches it acknowledges (and of the timers' calls).

    A checkpoint per batch, with its round trip to the broker, made a thousand
    sessions cost a changelog record per event; one per ``interval`` costs a record
    per session per interval. A crash loses only unacknowledged batches, which are
    judged again from the last state written, with the same verdicts.
    """

    def __init__(
        self,
        app: faust.App,
        table: faust.Table[bytes, bytes],
        store: Any,  # tables.FaustSessionStore
        ack: Callable[[list[Any]], None],
        signing: VerdictSigning | None = None,
        interval: float = 0.5,
    ) -> None:
        self.app, self.table, self.store, self.ack = app, table, store, ack
        self.signing = signing
        self.interval = interval
        self._sent: list[tuple[Message, asyncio.Future[Any]]] = []
        self._batches: list[list[Any]] = []
        self._since = time.monotonic()
        self._lock = asyncio.Lock()

    async def send(self, messages: list[Message], batch: list[Any] | None = None) -> None:
        """Hand messages to the producer; ``batch`` is acknowledged at a checkpoint."""
        sent = self._sent
        for message in messages:
            topic, key, value, partition = message
            future = await _hand_over(self.app, topic, key, value, partition, self.signing)
            sent.append((message, future))
        if batch is not None:
            self._batches.append(batch)

    @property
    def due(self) -> bool:
        """Whether a checkpoint is due: something waits for one, for ``interval``."""
        left = self.due_in()
        return left is not None and left <= 0

    def due_in(self) -> float | None:
        """Seconds until a checkpoint is due (<= 0: it is); None: nothing waits for one."""
        if not (self._batches or self._sent or self.store.holding):
            return None
        return self.interval - (time.monotonic() - self._since)

    async def checkpoint(self) -> None:
        async with self._lock:
            if not (self._sent or self._batches or self.store.holding):
                self._since = time.monotonic()
                return
            sent, batches = self._sent, self._batches
            self._sent, self._batches = [], []
            writes = self.store.take_writes()
            self._since = time.monotonic()
            # The outputs are on the broker before the state that caused them is
            # written. A redelivered event whose state was persisted changes nothing
            # and re-sends only a tool_call's verdict (the engine's rule), so an output
            # that missed the broker while its changelog record made it was lost for
            # good: the post-compaction guard's abort on a tool_result, found by chaos
            # with worker and leader kills on a three-node cluster, where the verdicts'
            # and the changelog's partitions have different leaders and land in
            # separate requests. In this order a crash between the two only means the
            # batches are judged again, with the same verdicts (duplicates, same ids).
            await _delivered(self.app, sent, self.signing)
            await send_table_writes(self.app, self.table, writes)
            for batch in batches:
                self.ack(batch)

    async def __call__(self, messages: list[Message]) -> None:
        """A timer's messages: sent and checkpointed at once (no batch waits for them)."""
        await self.send(messages)
        await self.checkpoint()


async def deliver(
    app: faust.App,
    messages: list[Message],
    signing: VerdictSigning | None = None,
) -> None:
    """Hand messages to the producer and wait until the broker has each (``acks=all``:
    the in-sync replicas); one that failed is sent again, never skipped."""
    sent = [(m, await _hand_over(app, *m, signing)) for m in messages]
    await _delivered(app, sent, signing)


async def _delivered(
    app: faust.App,
    sent: list[tuple[Message, asyncio.Future[Any]]],
    signing: VerdictSigning | None = None,
) -> None:
    """Wait until the broker has each message handed over; a failed one is sent again."""
    delay = 0.1
    while sent:
        outcomes = await asyncio.gather(*(future for _, future in sent), return_exceptions=True)
        failed = [
            m
            for (m, _), outcome in zip(sent, outcomes, strict=True)
            if isinstance(outcome, BaseException)
        ]
        if not failed:
            return
        log.warning(
            "%d records not delivered (%r); sending them again",
            len(failed),
            next(o for o in outcomes if isinstance(o, BaseException)),
        )
        await asyncio.sleep(delay)
        delay = min(delay * 2, 5.0)
        sent = [(m, await _hand_over(app, *m, signing)) for m in failed]


def idempotent_producer(app: faust.App) -> None:
    """Make the worker's producer idempotent as well as ``acks=all`` (``producer_acks=-1``).

    Faust turns idempotence on only for exactly-once transactions
    (``Producer._settings_extra``). Without it, a batch resent after a leader's crash
    (the broker had it, the answer was lost) is written twice, and a retried batch can
    land behind a later one: a session's verdicts out of order on the verdicts topic.
    Not on the embedded broker, which has no idempotent producer. Idempotent itself.
    """
    producer: Any = app.producer
    if getattr(producer, "_loopfuse_idempotent", False):
        return
    faust_extra = producer._settings_extra

    def settings_extra() -> dict[str, Any]:
        return {**faust_extra(), "acks": "all", "enable_idempotence": True}

    producer._settings_extra = settings_extra
    producer._loopfuse_idempotent = True


async def broker_metadata(app: faust.App, timeout: float = 2.0) -> Any:
    """The cluster's metadata (aiokafka ClusterMetadata), None when the broker does not answer.

    Through the producer's aiokafka client (``producer._producer.client``): the
    worker's probe asks the broker it is actually connected to.
    """
    try:
        client = app.producer._producer.client  # type: ignore[attr-defined]
        return await asyncio.wait_for(client.fetch_all_metadata(), timeout)
    except (KafkaError, OSError, TimeoutError, AttributeError):
        return None


async def unreachable_leaders(
    app: faust.App, cluster: Any, topics: list[str], timeout: float = 1.0
) -> list[str]:
    """The partitions of ``topics`` whose leader the worker cannot reach (or that have
    none), as ``topic[partition]@node``: what it cannot read from or write to.

    The broker that answered the metadata request can still be up when the partitions'
    leaders are not: with two of three nodes of a cluster down, the survivor answers
    metadata from its last image, which no controller quorum updates, so the dead
    nodes stay leaders there and no write with ``acks=all`` can succeed. Asked through
    the producer's aiokafka client, which connects to each leader node (cheap once
    connected; a refused connection on a dead node answers at once).
    """
    from aiokafka.structs import TopicPartition

    client = app.producer._producer.client  # type: ignore[attr-defined]
    leaders: dict[int, list[str]] = {}
    down: list[str] = []
    for topic in topics:
        for partition in sorted(cluster.partitions_for_topic(topic) or ()):
            leader = cluster.leader_for_partition(TopicPartition(topic, partition))
            if leader is None or leader < 0:
                down.append(f"{topic}[{partition}] (no leader)")
            else:
                leaders.setdefault(leader, []).append(f"{topic}[{partition}]")
    for node, partitions in sorted(leaders.items()):
        try:
            reachable = await asyncio.wait_for(client.ready(node), timeout)
        except (KafkaError, OSError, TimeoutError):
            reachable = False
        if not reachable:
            down.extend(f"{name}@node {node}" for name in partitions)
    return down
