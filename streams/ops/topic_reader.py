"""Reading loopfuse's output topics outside the worker: a snapshot, or a follow from the end.

Used by ``loopfuse audit`` (every partition from a time to the end offsets as they were
when it started, then stop), ``loopfuse tail`` and ``loopfuse notify`` (every partition
from the end, forever). No consumer group: readers never disturb each other or the
workers, and nothing is committed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Callable
from typing import TYPE_CHECKING, Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from loopfuse.streams.end_offsets import fetch_end_offsets

if TYPE_CHECKING:
    from loopfuse.streams.settings import Settings


def reader_settings(bootstrap: str | None) -> Settings:
    """The worker's settings (LOOPFUSE_* variables: topics, security), ``--bootstrap`` first."""
    from loopfuse.streams.settings import Settings

    return Settings(bootstrap_servers=bootstrap) if bootstrap else Settings()


class TopicMissing(RuntimeError):
    """The topic does not exist on the broker (yet)."""


async def _assign_all(consumer: AIOKafkaConsumer, topic: str, wait: float) -> list[TopicPartition]:
    deadline = asyncio.get_running_loop().time() + wait
    while True:
        partitions = consumer.partitions_for_topic(topic)
        if partitions:
            tps = [TopicPartition(topic, p) for p in sorted(partitions)]
            consumer.assign(tps)
            return tps
        if asyncio.get_running_loop().time() > deadline:
            raise TopicMissing(f"topic {topic!r} does not exist on the broker")
        await consumer._client.force_metadata_update()
        await asyncio.sleep(0.1)


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
    own times. The end offsets come from Fetch responses (``loopfuse.streams.worker.faust_compat.end_offsets``): the
    embedded broker's ListOffsets is wrong after multi-record batches.
    """
    consumer = _consumer(bootstrap, kafka_options or {})
    await consumer.start()
    try:
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
    topic: str,
    *,
    kafka_options: dict[str, Any] | None = None,
    on_ready: Callable[[int], None] | None = None,
    wait_for_topic: float = 30.0,
) -> AsyncGenerator[bytes, None]:
    """Record values of ``topic`` published from now on, as they arrive (never ends).

    ``on_ready(partitions)`` is called once every partition's end is resolved: from
    then on nothing published is missed.
    """
    consumer = _consumer(bootstrap, kafka_options or {})
    await consumer.start()
    try:
        tps = await _assign_all(consumer, topic, wait_for_topic)
        await consumer.seek_to_end(*tps)
        for tp in tps:
            await consumer.position(tp)
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
