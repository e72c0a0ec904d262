"""The consumer side: what the processor needs to know of Faust's consumer."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from typing import Any

import faust
from faust.types import TP

log = logging.getLogger("loopfuse.worker")


class FaustInputOffsets:
    """:class:`loopfuse.streams.worker.processor.InputOffsets` read off Faust's (aiokafka) consumer."""

    def __init__(self, app: faust.App) -> None:
        self.app = app

    def highwater(self, topic: str, partition: int) -> int | None:
        """End offset of an input partition as of the consumer's last fetch."""
        try:
            return self.app.consumer.highwater(TP(topic, partition))
        except Exception:  # not assigned (any more), or no consumer yet
            return None

    def answered_at(self, topic: str, partition: int) -> int | None:
        """Wall time (ms) of the consumer's last fetch answer for an input partition.

        aiokafka keeps it per partition (``last_poll_timestamp``) on the consumer
        Faust runs in its consumer thread (``_thread._consumer``).
        """
        consumer = aiokafka_consumer(self.app)
        if consumer is None:
            return None
        try:
            stamp = consumer.last_poll_timestamp(TP(topic, partition))
        except Exception:  # not assigned (any more)
            return None
        return int(stamp) if stamp else None

    def committed(self, topic: str, partition: int) -> int | None:
        """Where judging of an input partition started: the group's committed offset.

        Faust keeps the offsets it sought to on assignment (and has committed since)
        in ``Consumer._committed_offset``; it stores 0 as None, which means the same
        to us.
        """
        committed = getattr(self.app.consumer, "_committed_offset", None)
        return None if committed is None else committed.get(TP(topic, partition))


def aiokafka_consumer(app: faust.App) -> Any:
    """The aiokafka consumer Faust runs in its consumer thread, or None."""
    return getattr(getattr(app.consumer, "_thread", None), "_consumer", None)


def tune_fetch_wait(app: faust.App, max_wait_ms: int) -> None:
    """Bound the consumer's fetch long-poll (Faust hard-codes 1500 ms).

    Apache Kafka answers a fetch as soon as data arrives, but Tansu sleeps for the
    whole max wait when a partition has nothing new, so with Faust's value a
    verdict could wait 1.5 s. aiokafka reads ``Fetcher._fetch_max_wait_ms`` for
    every fetch request it builds, so setting it at any time takes effect.
    """
    fetcher = getattr(aiokafka_consumer(app), "_fetcher", None)
    if fetcher is not None:
        fetcher._fetch_max_wait_ms = max_wait_ms


def owned_inputs(app: faust.App, topics: tuple[str, ...]) -> list[tuple[str, int]]:
    """The (topic, partition) pairs of ``topics`` assigned to this worker now."""
    try:
        return [(tp.topic, tp.partition) for tp in app.consumer.assignment() if tp.topic in topics]
    except Exception:  # no consumer yet (starting up)
        return []


def refresh_consumer_metadata(app: faust.App) -> bool:
    """Make the worker's consumer read the cluster's metadata now; False if it could not.

    A group that joined while its topics were gone (a broker back empty, before the
    worker re-created them) holds no partitions of them, and aiokafka would notice the
    topics only at its next periodic metadata refresh (``metadata_max_age_ms``, 5 min):
    the worker would be ready and judge nothing. A refresh that sees the subscribed
    topics' partitions change makes aiokafka's coordinator rejoin the group
    (``GroupCoordinator._on_metadata_change``). The consumer lives on Faust's consumer
    thread (``AIOKafkaConsumerThread``), so the refresh is scheduled on that thread's
    loop (``thread_loop``) and not waited for: the caller's loop never blocks on it.
    """
    thread: Any = getattr(app.consumer, "_thread", None)
    loop = getattr(thread, "thread_loop", None)
    if thread is None or loop is None or loop.is_closed():
        return False

    async def refresh() -> None:
        await thread._ensure_consumer()._client.force_metadata_update()

    def done(future: concurrent.futures.Future[None]) -> None:
        if not future.cancelled() and future.exception() is not None:
            log.warning("could not refresh the consumer's metadata: %r", future.exception())

    asyncio.run_coroutine_threadsafe(refresh(), loop).add_done_callback(done)
    return True
