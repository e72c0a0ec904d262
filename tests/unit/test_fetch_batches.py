"""FetchBatches' bookkeeping, on a stand-in for Faust's consumer and flow control.

The hand-off takes a fetch's input records as a whole and does, once per partition,
what Faust's fetch loop and ``Consumer.ack`` do per message: read offsets, gaps,
the acked lists commits come from, and the unacknowledged set a revocation waits
on. The end-to-end proofs are the worker tests and the chaos runs; these pin each
rule against what Faust itself would have done.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any
from weakref import WeakSet

from faust.types import TP
from mode.utils.queues import FlowControlEvent

from loopfuse.streams.worker.faust_compat.delivery import FetchBatches


@dataclass(frozen=True)
class Record:  # the fields of aiokafka's ConsumerRecord the hand-off reads
    topic: str
    partition: int
    offset: int
    key: bytes | None = b"k"
    value: bytes | None = b"{}"
    timestamp: int = 0  # ms, the producer's CreateTime


@dataclass
class StandInConsumer:
    """The attributes of faust.transport.consumer.Consumer the hand-off uses."""

    fetches: list[dict[Any, list[Record]]] = field(default_factory=list)
    flow_active: bool = True
    gaps: list[tuple[TP, int, int]] = field(default_factory=list)
    given_to_faust: list[Any] = field(default_factory=list)
    _read_offset: defaultdict[TP, int | None] = field(
        default_factory=lambda: defaultdict(lambda: None)
    )
    _committed_offset: defaultdict[TP, int | None] = field(
        default_factory=lambda: defaultdict(lambda: None)
    )
    _acked: defaultdict[TP, list[int]] = field(default_factory=lambda: defaultdict(list))
    _acked_index: defaultdict[TP, set[int]] = field(default_factory=lambda: defaultdict(set))
    _n_acked: int = 0
    _unacked_messages: WeakSet[Any] = field(default_factory=WeakSet)
    _waiting_for_ack: Any = None
    _buffered_partitions: set[TP] = field(default_factory=set)
    highwaters: dict[TP, int] = field(default_factory=dict)

    def highwater(self, tp: TP) -> int | None:
        return self.highwaters.get(tp)

    async def _wait_next_records(self, timeout: float) -> tuple[dict[Any, Any], set[TP] | None]:
        return self.fetches.pop(0), None

    async def callback(self, message: Any) -> None:
        self.given_to_faust.append(message)

    async def _add_gap(self, tp: TP, offset_from: int, offset_to: int) -> None:
        self.gaps.append((tp, offset_from, offset_to))


def installed(consumer: StandInConsumer, max_batch: int = 100) -> FetchBatches:
    app = SimpleNamespace(
        consumer=consumer, flow_control=FlowControlEvent(), consumer_generation_id=1
    )
    fetches = FetchBatches(app, frozenset({"calls"}), max_batch)  # type: ignore[arg-type]
    fetches.install()
    return fetches


def records(partition: int, *offsets: int, topic: str = "calls") -> list[Record]:
    return [Record(topic, partition, offset) for offset in offsets]


def timed(topic: str, *stamps: int, first: int = 0) -> list[Record]:
    """Records of partition 0 of ``topic`` at offsets first.., produced at ``stamps``."""
    return [Record(topic, 0, first + n, timestamp=ts) for n, ts in enumerate(stamps)]


def two_topics(consumer: StandInConsumer) -> FetchBatches:
    app = SimpleNamespace(
        consumer=consumer, flow_control=FlowControlEvent(), consumer_generation_id=1
    )
    fetches = FetchBatches(app, frozenset({"calls", "results"}), 100)  # type: ignore[arg-type]
    fetches.install()
    return fetches


CALLS0, CALLS1 = TP("calls", 0), TP("calls", 1)


def test_a_fetch_reaches_the_agent_whole_and_other_topics_go_faust_s_way() -> None:
    async def scenario() -> None:
        changelog = TP("changelog", 0)
        consumer = StandInConsumer(
            fetches=[
                {
                    CALLS0: records(0, 0, 1, 2),
                    CALLS1: records(1, 5, 6),
                    changelog: records(0, 9, topic="changelog"),
                }
            ]
        )
        fetches = installed(consumer)
        left, _ = await consumer._wait_next_records(1.0)
        assert list(left) == [changelog]  # Faust's loop iterates what is left
        batch = await fetches.take()
        # Partitions interleaved record by record, as Faust's scheduler delivers them
        # (a session's calls and results are on two topics; see the next test).
        assert [(r.partition, r.offset) for r in batch] == [(0, 0), (1, 5), (0, 1), (1, 6), (0, 2)]
        assert consumer._read_offset[CALLS0] == 2 and consumer._read_offset[CALLS1] == 6
        assert fetches.delivered == {CALLS0: 2, CALLS1: 6}

    asyncio.run(scenario())


RESULTS0 = TP("results", 0)


def test_calls_and_results_are_judged_in_the_order_they_were_produced() -> None:
    async def scenario() -> None:
        consumer = StandInConsumer(
            fetches=[
                {
                    CALLS0: timed("calls", 10, 30, 50),
                    RESULTS0: timed("results", 20, 40, 60),
                }
            ]
        )
        fetches = two_topics(consumer)
        await consumer._wait_next_records(1.0)
        batch = await fetches.take()
        assert [(r.topic, r.timestamp) for r in batch] == [
            ("calls", 10),
            ("results", 20),
            ("calls", 30),
            ("results", 40),
            ("calls", 50),
            ("results", 60),
        ]

    asyncio.run(scenario())


def test_calls_fetched_ahead_wait_for_the_results_still_on_the_broker() -> None:
    """The backlog case: a fetch brings calls further than results (a byte bound per
    partition); the later calls wait for the next fetch instead of being parked."""

    async def scenario() -> None:
        consumer = StandInConsumer(
            fetches=[
                {CALLS0: timed("calls", 10, 30, 50, 70), RESULTS0: timed("results", 20)},
                {RESULTS0: timed("results", 40, 60, 80, first=1)},
            ]
        )
        consumer.highwaters = {CALLS0: 4, RESULTS0: 4}  # results 1..3 not fetched yet
        fetches = two_topics(consumer)
        await consumer._wait_next_records(1.0)
        first = await fetches.take()
        # Up to the last result fetched; calls 30.. wait (results 1..3 are unfetched).
        assert [(r.topic, r.timestamp) for r in first] == [("calls", 10), ("results", 20)]
        await consumer._wait_next_records(1.0)
        second = await fetches.take()
        assert [(r.topic, r.timestamp) for r in second] == [
            ("calls", 30),
            ("results", 40),
            ("calls", 50),
            ("results", 60),
            ("calls", 70),
            ("results", 80),
        ]
        assert not fetches.alignment.holding

    asyncio.run(scenario())


def test_records_are_held_only_while_a_sibling_has_unfetched_records_and_not_for_long() -> None:
    async def scenario() -> None:
        consumer = StandInConsumer(
            fetches=[
                {CALLS0: timed("calls", 10, 30)},
                {CALLS0: timed("calls", 50, first=2)},
            ]
        )
        consumer.highwaters = {CALLS0: 2, RESULTS0: 0}  # nothing on the results topic
        fetches = two_topics(consumer)
        await consumer._wait_next_records(1.0)
        assert [r.timestamp for r in await fetches.take()] == [10, 30]  # not held
        consumer.highwaters[RESULTS0] = 5  # results arrive on the broker, not fetched
        fetches.alignment.hold_seconds = 0.05
        await consumer._wait_next_records(1.0)
        assert fetches.alignment.holding and not fetches._buffer
        await asyncio.sleep(0.06)
        # A fetch answer with other topics' records only, after the hold bound.
        consumer.fetches.append({TP("changelog", 0): records(0, 7, topic="changelog")})
        await consumer._wait_next_records(1.0)
        assert [r.timestamp for r in await fetches.take()] == [50]

    asyncio.run(scenario())


def test_records_below_the_read_offset_are_dropped_and_missing_offsets_are_gaps() -> None:
    async def scenario() -> None:
        consumer = StandInConsumer(fetches=[{CALLS0: records(0, 3, 4, 5, 8, 9, 12)}])
        consumer._read_offset[CALLS0] = 4  # Faust keeps offsets >= its read offset
        fetches = installed(consumer)
        await consumer._wait_next_records(1.0)
        batch = await fetches.take()
        assert [r.offset for r in batch] == [4, 5, 8, 9, 12]
        # As Faust's loop: _add_gap(tp, previous + 1, offset) for every hole.
        assert consumer.gaps == [(CALLS0, 6, 8), (CALLS0, 10, 12)]

    asyncio.run(scenario())


def test_offsets_already_delivered_are_never_a_gap() -> None:
    """perform_seek resets the read offset to the committed one while records past it
    were delivered: Faust's loop then counted those offsets as a gap (committed as if
    judged). Only offsets never delivered are one."""

    async def scenario() -> None:
        consumer = StandInConsumer(
            fetches=[
                {CALLS0: records(0, *range(869, 1363))},
                {CALLS0: records(0, 1363, 1364)},
                {CALLS0: records(0, 1370)},
            ]
        )
        fetches = installed(consumer, max_batch=1_000)
        await consumer._wait_next_records(1.0)
        consumer._read_offset[CALLS0] = 869  # perform_seek, to the committed offset
        await consumer._wait_next_records(1.0)
        assert consumer.gaps == []
        await consumer._wait_next_records(1.0)  # 1365..1369 were never delivered
        assert consumer.gaps == [(CALLS0, 1365, 1370)]
        assert len(await fetches.take()) == 494 + 3

    asyncio.run(scenario())


def test_nothing_is_taken_while_flow_is_stopped() -> None:
    async def scenario() -> None:
        consumer = StandInConsumer(fetches=[{CALLS0: records(0, 0, 1)}], flow_active=False)
        fetches = installed(consumer)
        left, _ = await consumer._wait_next_records(1.0)
        assert CALLS0 in left  # Faust's loop drops them (flow stopped): fetched again later
        assert not fetches._buffer and consumer._read_offset[CALLS0] is None

    asyncio.run(scenario())


def test_ack_records_the_batch_as_faust_s_ack_would_and_releases_a_revocation() -> None:
    async def scenario() -> None:
        consumer = StandInConsumer(fetches=[{CALLS0: records(0, 7, 8, 9), CALLS1: records(1, 0)}])
        consumer._committed_offset[CALLS0] = 8  # 7 was committed meanwhile (a seek back)
        consumer._acked_index[CALLS1].add(0)  # acked before
        fetches = installed(consumer)
        await consumer._wait_next_records(1.0)
        batch = await fetches.take()
        # A revocation waits (Consumer.wait_empty) while the batch is being judged.
        assert len(consumer._unacked_messages) == 1
        [in_flight] = list(consumer._unacked_messages)
        assert not in_flight.acked
        fetches.ack(batch)
        assert consumer._acked[CALLS0] == [8, 9] and consumer._acked_index[CALLS0] == {8, 9}
        assert consumer._acked[CALLS1] == []
        assert consumer._n_acked == 2
        assert in_flight.acked and len(consumer._unacked_messages) == 0

    asyncio.run(scenario())


def test_an_offset_judged_twice_in_a_batch_is_acked_once() -> None:
    """A seek back can bring records again while their first copies still wait: the
    acked list must hold each offset once, or Faust's commit (which takes the first
    run of consecutive offsets) advances one offset per commit."""

    async def scenario() -> None:
        consumer = StandInConsumer(
            fetches=[{CALLS0: records(0, 5, 6, 7)}, {CALLS0: records(0, 5, 6, 7)}]
        )
        fetches = installed(consumer)
        await consumer._wait_next_records(1.0)
        consumer._read_offset[CALLS0] = 5  # what Faust's seek to the committed 5 sets
        await consumer._wait_next_records(1.0)
        batch = await fetches.take()
        assert [r.offset for r in batch] == [5, 6, 7, 5, 6, 7]
        fetches.ack(batch)
        assert consumer._acked[CALLS0] == [5, 6, 7] and consumer._n_acked == 3

    asyncio.run(scenario())


def test_a_full_buffer_holds_the_fetch_loop_until_the_agent_takes() -> None:
    async def scenario() -> None:
        consumer = StandInConsumer(fetches=[{CALLS0: records(0, *range(8))}])
        fetches = installed(consumer, max_batch=2)
        fetching = asyncio.create_task(consumer._wait_next_records(1.0))
        await asyncio.sleep(0.01)
        assert not fetching.done()  # 8 buffered >= 4 batches of 2: back-pressure
        assert len(await fetches.take()) == 2
        await asyncio.wait_for(fetching, 1.0)

    asyncio.run(scenario())


def test_a_suspension_drops_what_was_not_taken() -> None:
    async def scenario() -> None:
        consumer = StandInConsumer(fetches=[{CALLS0: records(0, 0, 1)}])
        fetches = installed(consumer)
        await consumer._wait_next_records(1.0)
        fetches.clear()  # what FlowControlEvent.suspend calls on its queues
        taking = asyncio.create_task(fetches.take())
        await asyncio.sleep(0.01)
        assert not taking.done()
        taking.cancel()

    asyncio.run(scenario())


def test_a_tenants_records_are_never_held_for_another_tenants_unfetched_ones() -> None:
    async def scenario() -> None:
        other_results = TP("results.acme", 0)
        consumer = StandInConsumer(fetches=[{CALLS0: timed("calls", 10, 30)}])
        # tenant acme's results partition has a backlog this worker has not fetched
        consumer.highwaters = {CALLS0: 2, RESULTS0: 0, other_results: 500}
        app = SimpleNamespace(
            consumer=consumer, flow_control=FlowControlEvent(), consumer_generation_id=1
        )
        topics = frozenset({"calls", "results", "calls.acme", "results.acme"})
        fetches = FetchBatches(
            app,  # type: ignore[arg-type]
            topics,
            100,
            aligned=[("calls", "results"), ("calls.acme", "results.acme")],
        )
        fetches.install()
        await consumer._wait_next_records(1.0)
        assert [r.timestamp for r in await fetches.take(0)] == [10, 30]  # not held

    asyncio.run(scenario())


def test_take_gives_up_after_its_timeout_and_a_suspension_wakes_it() -> None:
    async def scenario() -> None:
        fetches = installed(StandInConsumer())
        started = asyncio.get_running_loop().time()
        assert await fetches.take(0.05) == []
        assert asyncio.get_running_loop().time() - started >= 0.04
        # a rebalance suspends the flow (clear): the agent waiting to take wakes at once
        waiting = asyncio.ensure_future(fetches.take())
        await asyncio.sleep(0.01)
        assert not waiting.done()
        fetches.clear()
        assert await asyncio.wait_for(waiting, 1.0) == []

    asyncio.run(scenario())
