"""Small Kafka helpers for tests of the read-side commands (audit, tail, notify)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "audit_replay.jsonl"


def fixture_records(kind: str = "loop_event") -> list[dict[str, Any]]:
    """The ``kind`` objects of the demo-traffic fixture (loopfuse replay output)."""
    out = []
    for line in FIXTURE.read_bytes().splitlines():
        document = orjson.loads(line)
        if document.get("type") == kind:
            out.append(document)
    return out


async def new_topic(bootstrap: str, partitions: int = 2) -> str:
    topic = f"test.loop-events-{uuid.uuid4().hex[:10]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, partitions, 1)])
    finally:
        await admin.close()
    return topic


async def produce(bootstrap: str, topic: str, values: Iterable[dict[str, Any] | bytes]) -> None:
    """Publish, keyed by session like the worker, and wait until all are written."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    try:
        sent = []
        for value in values:
            if isinstance(value, bytes):
                sent.append(await producer.send(topic, value, key=b"garbage"))
            else:
                key = str(value.get("session_key", "")).encode()
                sent.append(await producer.send(topic, orjson.dumps(value), key=key))
        await asyncio.gather(*sent)
    finally:
        await producer.stop()
