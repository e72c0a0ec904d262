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
