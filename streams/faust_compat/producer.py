"""The producer side: table writes handed to aiokafka before a batch is acknowledged.

Faust (0.15.3) sends table writes through its ``ProducerBuffer``, whose flush gives
up after 100 ms without progress and whose size counts only messages still queued:
the one its background task has taken off the queue is invisible until aiokafka has
it. So ``buffer.size == 0`` alone let a batch be acked (its offsets committed, the
worker killed) while its last changelog record was still in that hand-off (found by
the chaos test). :func:`track_buffer_hand_off` makes the hand-off visible and
:func:`drain_table_writes` waits for it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import faust
from aiokafka.errors import KafkaError
from faust.transport.producer import ProducerBuffer

log = logging.getLogger("loopfuse.worker")

_IN_FLIGHT = "_loopfuse_in_flight"


def track_buffer_hand_off() -> None:
    """Count, per ProducerBuffer, messages between its queue and aiokafka (idempotent).

    Patched on the class before any producer starts, because the buffer's
    background task binds ``_send_pending`` once when it starts.
    """
    original = ProducerBuffer._send_pending
    if getattr(original, "_loopfuse_tracked", False):
        return

    async def _send_pending(self: ProducerBuffer, fut: Any) -> None:
        setattr(self, _IN_FLIGHT, getattr(self, _IN_FLIGHT, 0) + 1)
        try:
            await original(self, fut)
        finally:
            setattr(self, _IN_FLIGHT, getattr(self, _IN_FLIGHT) - 1)

    _send_pending._loopfuse_tracked = True  # type: ignore[attr-defined]
    ProducerBuffer._send_pending = _send_pending  # type: ignore[method-assign]


async def drain_table_writes(app: faust.App) -> None:
    """Hand every table write queued so far to aiokafka (see the module docstring)."""
    buffer = app.producer.buffer
    while buffer.size or getattr(buffer, _IN_FLIGHT, 0):
        if buffer.size:
            await buffer.flush()
        else:
            await asyncio.sleep(0.001)


def size_buffer_for_batches(app: faust.App, batch_max: int) -> None:
    """Room for one batch of table writes in Faust's producer buffer.

    Each batch writes every session it touched once and drains the buffer before it
    is acknowledged, so the buffer holds at most one batch of writes. Faust's
    threshold of 100 would make the consumer stop and flush (and log "producer
    buffer full") in every batch.
    """
    app.producer.buffer.max_messages = max(100, 2 * batch_max)


async def send_retrying(app: faust.App, messages: list[tuple[str, bytes | None, bytes]]) -> None:
    """Hand messages to the producer; a broker problem is retried, never skipped.

    Outputs were checked against the producer's request size, so what fails here is
    the broker (or the network), not the input: giving up would let the batch be
    acknowledged without its verdicts.
    """
    send = app.producer.send
    for topic, key, value in messages:
        delay = 0.1
        while True:
            try:
                await send(topic, key, value, None, None, None)
                break
            except (KafkaError, OSError) as exc:
                log.warning("cannot hand a message to the producer (%r); retrying", exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)


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
