"""A faster hand-off of fetched messages from Faust's consumer to its streams.

Faust's fetch loop delivers every message with ``wait_first(deliver(message),
suspend_flow.wait())`` so that a rebalance can interrupt a delivery that is stuck
waiting for flow control. mode's ``wait_first`` wraps each of those, plus the
service's stopped/crashed events, in a task: four tasks and an ``asyncio.wait``
per message. Profiling the worker showed this as the largest single cost on the
per-event path; skipping it nearly doubled throughput (bench/stream.py: 3.6k ->
6.7k events/s on the same broker and run conditions).

The shortcut is taken only when the delivery cannot block: flow control is
active, the flow is not suspended, the service is neither stopping nor crashed,
and Faust's producer buffer is below the size at which delivery waits for it to
drain. Under those conditions Faust's ``on_message`` runs to completion without
ever yielding to the event loop (flow-control acquire returns at once, decoding is
synchronous, the queue put is ``put_nowait``), so nothing - no rebalance - can
interleave with it, and awaiting it directly is equivalent to racing it against
``suspend_flow``. In every other case the original ``wait_first`` runs.
"""

from __future__ import annotations

import asyncio
from typing import Any

import faust
from mode.services import WaitResults

_INSTALLED = "_loopfuse_fast_delivery"


def install_fast_delivery(app: faust.App) -> None:
    """Give ``app``'s consumer the shortcut; idempotent, per consumer instance."""
    consumer: Any = app.consumer
    if getattr(consumer, _INSTALLED, False):
        return
    original = consumer.wait_first
    suspend_flow = consumer.suspend_flow
    stopped, crashed = consumer._stopped, consumer._crashed
    flow_control = app.flow_control
    buffer = app.producer.buffer

    async def wait_first(*coros: Any, timeout: Any = None) -> WaitResults:
        if (
            len(coros) == 2
            and timeout is None
            and flow_control.is_active()
            and not suspend_flow.is_set()
            and not stopped.is_set()
            and not crashed.is_set()
            and buffer.size <= buffer.max_messages
        ):
            deliver, suspended = coros
            suspended.close()  # the never-awaited suspend_flow.wait() coroutine
            result = await deliver
            return WaitResults([deliver], [result], False)
        return await original(*coros, timeout=timeout)  # type: ignore[no-any-return]

    consumer.wait_first = wait_first
    setattr(consumer, _INSTALLED, True)


class FetchBatches:
    """Input messages handed to an agent a fetch at a time, not message by message.

    Faust delivers every fetched message through its conductor, a channel queue and
    stream iteration - a dozen coroutine hops per message - and ``take_events``
    waits up to ``within`` for a batch to fill, though the fetch that brought the
    messages is already complete. Here the consumer's delivery callback appends the
    input topics' messages to a buffer, and the agent takes everything buffered at
    once (at most ``max_batch``): a batch is what the last fetches brought, with no
    wait for more.

    Faust still owns the rest: the consumer group and assignment, seeks, commits
    (of acknowledged offsets only; :meth:`ack` after a batch's outputs are handed
    to the producer), rebalances (the buffer is a flow-control queue: a suspension
    clears it, and every message in it is tracked, so a revocation waits for the
    batch in progress), tables and recovery. Messages of other topics (changelogs)
    go Faust's way.
    """

    def __init__(
        self, app: faust.App, topics: frozenset[str], max_batch: int, restore: Any = None
    ) -> None:
        self.app = app
        # streams.faust_compat.recovery.ChangelogRestore: changelog records during recovery
        self.restore = restore
        self.topics = topics
        self.max_batch = max_batch
        self._buffer: list[Any] = []
        self._ready = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        # A flow-control queue: clear() is all FlowControlEvent calls on it.
        app.flow_control.manage_queue(self)  # type: ignore[arg-type]

    def install(self) -> None:
        """Take over delivery of the input topics; call before the fetcher starts
        (it binds the delivery callback once), and before ``ignore_phantom_gaps``,
        which must see every delivered message. Idempotent per consumer."""
        consumer: Any = self.app.consumer
        if getattr(consumer, _FETCH_INSTALLED, False):
            return
        callback = consumer.callback
        track = consumer.track_message
        topics, buffer = self.topics, self._buffer
        restore = self.restore

        async def deliver(message: Any) -> Any:
            if message.topic not in topics:
                if restore is not None and restore.take(message):
                    return None
                return await callback(message)
            track(message)  # pending until acked: a revocation waits for it
            buffer.append(message)
            self._ready.set()
            if len(buffer) >= 4 * self.max_batch:
                self._room.clear()
                await self._room.wait()  # back-pressure on the fetch loop
            return None

        consumer.callback = deliver
        setattr(consumer, _FETCH_INSTALLED, True)

    async def take(self) -> list[Any]:
        """The next batch: every message buffered (at most ``max_batch``); waits for one."""
        while not self._buffer:
            self._ready.clear()
            await self._ready.wait()
        batch = self._buffer[: self.max_batch]
        del self._buffer[: self.max_batch]
        if len(self._buffer) < 4 * self.max_batch:
            self._room.set()
        return batch

    def ack(self, batch: list[Any]) -> None:
        """The batch's outputs are handed to the producer: its offsets may be committed."""
        ack = self.app.consumer.ack
        for message in batch:
            ack(message)

    def clear(self) -> None:
        """Flow control suspended (a rebalance): drop what was not taken yet.

        Those messages are fetched again from the committed offsets by whoever owns
        their partitions next; dropping them untracks them too (the consumer keeps
        unacked messages in a weak set).
        """
        self._buffer.clear()
        self._room.set()


_FETCH_INSTALLED = "_loopfuse_fetch_batches"
