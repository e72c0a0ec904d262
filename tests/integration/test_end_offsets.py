"""End offsets after multi-record batches: the Tansu ListOffsets regression (architecture.md).

Tansu 0.6 answers ListOffsets(latest) with "last batch's base offset + 1", so after
one producer batch of 100 records aiokafka's ``end_offsets()`` says 1. Faust uses
end offsets to decide when table recovery is complete, so the workaround in
loopfuse.streams.worker.faust_compat.embedded_recovery takes them from a Fetch response's high watermark instead.
On Apache Kafka both ways agree (asserted), so the worker installs the workaround only
for the embedded broker; one test here pins that Tansu still needs it.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import faust
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from faust.types import TP

from loopfuse.streams.end_offsets import fetch_end_offsets
from loopfuse.streams.worker.faust_compat.embedded_recovery import (
    end_offset_workaround_installed,
    install_end_offset_workaround,
)
from tests.support.harness import unique

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


async def _create_topic(bootstrap: str, topic: str, partitions: int = 1) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics(
            [NewTopic(topic, num_partitions=partitions, replication_factor=1)]
        )
    finally:
        await admin.close()


async def _produce_batch(bootstrap: str, topic: str, count: int, partition: int = 0) -> None:
    """Send ``count`` records without awaiting each, so they leave as one batch."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=200)
    await producer.start()
    try:
        futures = [
            await producer.send(topic, f"record-{i}".encode(), key=b"k", partition=partition)
            for i in range(count)
        ]
        await producer.flush()
        offsets = [(await fut).offset for fut in futures]
    finally:
        await producer.stop()
    assert offsets == list(range(offsets[0], offsets[0] + count))


async def _started_consumer(bootstrap: str) -> AIOKafkaConsumer:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    return consumer


async def _end_offsets_after_a_batch_of_100(bootstrap: str) -> tuple[int, int]:
    """(ListOffsets' end offset, a Fetch answer's high watermark) after one batch of 100."""
    topic = unique("lf-endoff")
    await _create_topic(bootstrap, topic)
    await _produce_batch(bootstrap, topic, 100)
    tp = TopicPartition(topic, 0)
    consumer = await _started_consumer(bootstrap)
    try:
        plain = (await consumer.end_offsets([tp]))[tp]
        fetched = await fetch_end_offsets(consumer, [tp])
    finally:
        await consumer.stop()
    return plain, fetched[tp]


async def test_batch_of_100_has_end_offset_100(
    kafka_bootstrap: str,
    kafka_broker_kind: str,
    record_property: Callable[[str, object], None],
) -> None:
    plain, fetched = await _end_offsets_after_a_batch_of_100(kafka_bootstrap)
    print(
        f"[{kafka_broker_kind}] after one batch of 100: ListOffsets end_offsets()={plain}, "
        f"fetch high watermark={fetched}"
    )
    record_property("plain_end_offset", plain)
    assert fetched == 100
    if kafka_broker_kind == "kafka":
        # Apache Kafka answers ListOffsets right: the workaround is for the embedded
        # broker only (the worker installs it only with LOOPFUSE_EMBEDDED_BROKER).
        assert plain == 100


async def test_the_embedded_broker_still_answers_list_offsets_wrongly(
    embedded_bootstrap: str,
) -> None:
    # Why the workaround exists; the day this fails, Tansu is fixed and it can go
    # (update streams/worker/faust_compat/__init__.py).
    plain, fetched = await _end_offsets_after_a_batch_of_100(embedded_bootstrap)
    assert (plain, fetched) == (1, 100)


async def test_several_batches_partitions_and_untouched_positions(kafka_bootstrap: str) -> None:
    topic = unique("lf-endoff-multi")
    await _create_topic(kafka_bootstrap, topic, partitions=3)
    await _produce_batch(kafka_bootstrap, topic, 100, partition=0)
    await _produce_batch(kafka_bootstrap, topic, 50, partition=0)
    await _produce_batch(kafka_bootstrap, topic, 1, partition=1)
    p0, p1, p2 = (TopicPartition(topic, i) for i in range(3))

    consumer = await _started_consumer(kafka_bootstrap)
    try:
        # A consumer mid-read: the end-offset lookup must not move it.
        consumer.assign([p0])
        consumer.seek(p0, 10)
        assert await fetch_end_offsets(consumer, [p0, p1, p2]) == {p0: 150, p1: 1, p2: 0}
        assert await consumer.position(p0) == 10
        batch = await consumer.getmany(p0, timeout_ms=5000, max_records=5)
        assert [msg.offset for msg in batch[p0]] == [10, 11, 12, 13, 14]
        assert await fetch_end_offsets(consumer, []) == {}
    finally:
        await consumer.stop()


def _faust_app(bootstrap: str) -> faust.App:
    return faust.App(
        unique("lf-endoff-app"),
        broker=f"kafka://{bootstrap}",
        store="memory://",
        web_enabled=False,
    )


async def test_faust_recovery_highwaters_use_fetch(kafka_bootstrap: str) -> None:
    """Faust's recovery path (Recovery._build_highwaters -> consumer.highwaters)
    sees the real end offset once the workaround is installed.

    Only the consumer thread is started: no worker, no group join (nothing is
    subscribed), so this takes milliseconds.
    """
    topic = unique("lf-endoff-faust")
    await _create_topic(kafka_bootstrap, topic)
    await _produce_batch(kafka_bootstrap, topic, 100)
    tp = TP(topic, 0)

    app = _faust_app(kafka_bootstrap)
    untouched_app = _faust_app(kafka_bootstrap)
    install_end_offset_workaround(app)
    install_end_offset_workaround(app)  # idempotent
    assert end_offset_workaround_installed(app)
    assert not end_offset_workaround_installed(untouched_app)

    plain_consumer = await _started_consumer(kafka_bootstrap)
    threads: list[Any] = []
    try:
        plain = (await plain_consumer.end_offsets([tp]))[tp]
        for each in (app, untouched_app):
            thread = each.consumer._thread
            await thread.start()
            threads.append(thread)

        assert await app.consumer.highwaters(tp) == {tp: 100}
        # The exact call recovery makes; it stores "end offset - 1".
        recovered: Counter[TP] = Counter()
        await app.tables.recovery._build_highwaters(app.consumer, {tp}, recovered, "active")
        assert recovered == {tp: 99}

        # Apps without the workaround keep Faust's ListOffsets path.
        assert await untouched_app.consumer.highwaters(tp) == {tp: plain}
    finally:
        await asyncio.gather(*(thread.stop() for thread in threads))
        await plain_consumer.stop()


async def test_faust_worker_recovers_every_update_of_a_batched_changelog(
    kafka_bootstrap: str,
    tmp_path: Path,
) -> None:
    """End to end: a changelog written as one batch of 100 is fully recovered.

    Without the workaround, on Tansu, recovery believes the changelog ends at
    offset 1 and the table comes back with 1 key out of 100 (measured).
    """
    app_id = unique("lf-recover")
    app = faust.App(
        app_id,
        broker=f"kafka://{kafka_bootstrap}",
        store="memory://",
        datadir=str(tmp_path),  # not the checkout
        web_enabled=False,
        topic_partitions=1,
        # Tansu makes every group join wait half the session timeout.
        broker_session_timeout=6,
        broker_heartbeat_interval=1,
    )
    table = app.Table("sessions", default=int, partitions=1, key_type=str, value_type=int)
    source = app.topic(f"{app_id}-in", partitions=1, key_type=str, value_type=str)

    @app.agent(source)
    async def count(stream: Any) -> None:  # gives the worker an assignment
        async for key, _ in stream.items():
            table[key] += 1

    install_end_offset_workaround(app)
    changelog = f"{app_id}-sessions-changelog"
    await _create_topic(kafka_bootstrap, changelog)
    await _create_topic(kafka_bootstrap, f"{app_id}-in")
    # What a previous worker left behind: 100 table updates in one batch
    # (keys and values in Faust's default JSON serialisation).
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, linger_ms=200)
    await producer.start()
    try:
        futures = [
            await producer.send(changelog, key=f'"s{i}"'.encode(), value=b"1", partition=0)
            for i in range(100)
        ]
        await producer.flush()
        await asyncio.gather(*futures)
    finally:
        await producer.stop()

    await app.start()
    try:
        await asyncio.wait_for(app.tables.recovery.completed.wait(), timeout=60)
        assert len(table) == 100
    finally:
        await app.stop()


def test_fetch_response_reading_covers_lso_and_out_of_range() -> None:
    """The response paths Tansu never takes (it has no transactions and never
    reports OFFSET_OUT_OF_RANGE), checked on hand-made FetchResponse v11 tuples:
    (partition, error, high_watermark, last_stable_offset, log_start,
    aborted, preferred_replica, records)."""
    from types import SimpleNamespace

    from loopfuse.streams.end_offsets import _read_fetch_response

    a, b, c = (TopicPartition("t", i) for i in range(3))
    response = SimpleNamespace(
        API_VERSION=11,
        topics=[
            (
                "t",
                [
                    (0, 0, 120, 110, 0, [], -1, b""),
                    (1, 1, -1, -1, -1, [], -1, b""),  # OFFSET_OUT_OF_RANGE
                    (2, 6, -1, -1, -1, [], -1, b""),  # NOT_LEADER_FOR_PARTITION
                ],
            )
        ],
    )
    for read_committed, expected in ((False, 120), (True, 110)):
        positions = {a: 0, b: 0, c: 0}
        found: dict[TopicPartition, int] = {}
        out_of_range: list[TopicPartition] = []
        refresh = _read_fetch_response(response, positions, found, out_of_range, read_committed)
        assert found == {a: expected}
        assert out_of_range == [b]
        assert positions == {b: 0, c: 0}  # still pending
        assert refresh  # not-leader asks for fresh metadata
