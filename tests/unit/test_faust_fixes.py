"""The two Faust consumer fixes, on stand-ins for the app's flow control and consumer.

The end-to-end proof is tests/reliability/test_restart_backlog.py (a real worker
restarting onto a backlog); these pin what each patch does and does not change.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from mode.utils.queues import FlowControlEvent, FlowControlQueue

from streams.faust_compat.recovery import ignore_phantom_gaps, keep_queues_on_redundant_resume


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


@dataclass(frozen=True)
class TP:
    topic: str
    partition: int


@dataclass
class Message:
    tp: TP
    offset: int

    @property
    def topic(self) -> str:
        return self.tp.topic


@dataclass
class FakeConsumer:
    delivered: list[int] = field(default_factory=list)
    gaps: list[tuple[str, int, int]] = field(default_factory=list)

    async def callback(self, message: Any) -> None:
        self.delivered.append(message.offset)

    async def _add_gap(self, tp: Any, offset_from: int, offset_to: int) -> None:
        self.gaps.append((tp.topic, offset_from, offset_to))


def test_offsets_that_were_delivered_are_never_a_gap() -> None:
    async def scenario() -> None:
        consumer = FakeConsumer()
        ignore_phantom_gaps(SimpleNamespace(consumer=consumer), frozenset({"calls"}))  # type: ignore[arg-type]
        calls = TP("calls", 0)
        for offset in range(869, 1363):
            await consumer.callback(Message(calls, offset))
        # Faust reset its read offset to the committed 869, then sees 1363 arrive:
        await consumer._add_gap(calls, 870, 1363)
        assert consumer.gaps == []
        assert consumer.delivered == list(range(869, 1363))  # delivery itself unchanged

    asyncio.run(scenario())


def test_offsets_never_delivered_stay_a_gap() -> None:
    async def scenario() -> None:
        consumer = FakeConsumer()
        ignore_phantom_gaps(SimpleNamespace(consumer=consumer), frozenset({"calls"}))  # type: ignore[arg-type]
        calls, other = TP("calls", 1), TP("other", 0)
        await consumer.callback(Message(calls, 10))
        await consumer._add_gap(calls, 11, 15)  # e.g. transaction markers at 11..14
        await consumer._add_gap(calls, 5, 20)  # a stale read offset: only 11.. counts
        await consumer._add_gap(other, 3, 9)  # other topics: Faust's behaviour
        await consumer._add_gap(TP("calls", 2), 0, 4)  # nothing delivered there yet
        assert consumer.gaps == [
            ("calls", 11, 15),
            ("calls", 11, 20),
            ("other", 3, 9),
            ("calls", 0, 4),
        ]

    asyncio.run(scenario())
