"""The redundant-resume fix, on a stand-in for the app's flow control.

The end-to-end proof is tests/reliability/test_restart_backlog.py (a real worker
restarting onto a backlog); this pins what the patch does and does not change. The
other half of that fix (a gap never starts before a delivered offset) is pinned in
tests/unit/test_fetch_batches.py.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from mode.utils.queues import FlowControlEvent, FlowControlQueue

from loopfuse.streams.worker.faust_compat.recovery import keep_queues_on_redundant_resume


def test_a_resume_while_flowing_keeps_the_queued_messages() -> None:
    async def scenario() -> None:
        flow_control = FlowControlEvent()  # starts suspended, as Faust's does
        queue: FlowControlQueue[str] = FlowControlQueue(
            flow_control=flow_control, clear_on_resume=True
        )
        keep_queues_on_redundant_resume(SimpleNamespace(flow_control=flow_control))  # type: ignore[arg-type]
        flow_control.resume()
        queue.put_nowait("fetched after the seek")
        flow_control.resume()  # Faust's second resume at the end of recovery
        assert queue.qsize() == 1 and flow_control.is_active()
        # A real suspension (a rebalance) still discards what was queued before it.
        flow_control.suspend()
        flow_control.resume()
        assert queue.qsize() == 0 and flow_control.is_active()

    asyncio.run(scenario())
