"""``faust_compat.producer.append_record``: the worker's records handed to aiokafka's
accumulator past Faust's and aiokafka's ``send`` land on the partition that ``send``
picks, with their headers, each once; the records it cannot take (an unknown topic or
partition) are left to ``send``. On the worker's own Faust producer and the session's
broker."""

from __future__ import annotations

from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer

from loopfuse.streams.settings import Settings
from loopfuse.streams.worker.app import create_app
from loopfuse.streams.worker.faust_compat.producer import append_record
from tests.support.harness import create_topics, unique

pytestmark = pytest.mark.timeout(120)

PARTITIONS = 6


async def test_appended_records_land_where_aiokafka_s_send_puts_them(
    kafka_bootstrap: str, kafka_broker_kind: str, tmp_path: Path
) -> None:
    topic = unique("rel-hand-over")
    await create_topics(kafka_bootstrap, [topic], PARTITIONS)
    settings = Settings(
        bootstrap_servers=kafka_bootstrap,
        data_dir=tmp_path,
        embedded_broker=kafka_broker_kind == "tansu",
    )
    app = create_app(settings)
    await app.producer.start()
    try:
        aiokafka_producer = app.producer._producer  # type: ignore[attr-defined]
        first = await app.producer.send(topic, b"key", b"first", None, None, None)
        await first
        records = {f"session-{n}".encode(): f"verdict {n}".encode() for n in range(300)}
        futures = []
        for key, value in records.items():
            appended = await append_record(app, topic, key, value, None, [("sig", key)])
            assert appended is not None, "the worker's records must not fall back to send"
            futures.append(appended)
        explicit = await append_record(app, topic, b"routed", b"to 5", 5, None)
        assert explicit is not None
        assert await append_record(app, topic, b"routed", b"nowhere", PARTITIONS, None) is None
        assert await append_record(app, unique("rel-unknown"), b"k", b"v", None, None) is None
        delivered = [await future for future in futures]
        assert (await explicit).partition == 5
        expected = [
            aiokafka_producer._partition(topic, None, key, value, key, value)
            for key, value in records.items()
        ]
        assert [metadata.partition for metadata in delivered] == expected
        assert len(set(expected)) == PARTITIONS  # the keys spread over every partition
    finally:
        await app.producer.stop()

    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=kafka_bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    try:
        seen: dict[bytes, tuple[bytes, int, list[tuple[str, bytes]]]] = {}
        count = 0
        while count < len(records) + 2:
            batches = await consumer.getmany(timeout_ms=5_000)
            assert batches, f"only {count} records came back"
            for tp, messages in batches.items():
                for message in messages:
                    count += 1
                    assert message.key not in seen, message
                    seen[message.key] = (message.value, tp.partition, list(message.headers))
    finally:
        await consumer.stop()
    assert count == len(records) + 2  # the first record, the 300 and the routed one
    for (key, value), partition in zip(records.items(), expected, strict=True):
        assert seen[key] == (value, partition, [("sig", key)])
    assert seen[b"routed"] == (b"to 5", 5, [])
