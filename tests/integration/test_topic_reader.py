"""Readers that start "from the end" start there on both brokers.

The embedded broker answers ``ListOffsets(latest)`` with the last batch's base offset
+ 1, so after one batch of 100 records a reader seeking to the end that way started at
offset 1 and showed 99 old records (``loopfuse tail``) or posted them (notify).
"""

from __future__ import annotations

import asyncio
import io
import uuid

import pytest

from loopfuse.streams.ops import topic_reader
from loopfuse.streams.ops.tail import Filters, tail
from loopfuse.streams.ops.topic_reader import GroupReader, TopicRecord
from tests.support.kafka import new_topic, produce
from tests.support.webhook import critical_loop_events

BROKERS = ["kafka_bootstrap", "embedded_bootstrap"]


@pytest.mark.parametrize("broker", BROKERS)
async def test_tail_starts_at_the_end_after_a_batch(
    broker: str, request: pytest.FixtureRequest
) -> None:
    bootstrap = request.getfixturevalue(broker)
    topic = await new_topic(bootstrap, partitions=1)
    old, (new,) = critical_loop_events(100, "old"), critical_loop_events(1, "new")
    await produce(bootstrap, topic, old)  # one producer batch
    out = io.StringIO()
    reading = asyncio.create_task(tail(bootstrap, (topic,), "loop_event", Filters(), out, count=1))
    await asyncio.sleep(3)  # tail resolves the end, then waits
    await produce(bootstrap, topic, [new])
    await asyncio.wait_for(reading, 30)

    (line,) = out.getvalue().splitlines()
    assert f" {new['session_key']} " in line


@pytest.mark.parametrize("broker", BROKERS)
async def test_a_new_group_starts_at_the_end_and_a_restart_where_it_committed(
    broker: str, request: pytest.FixtureRequest
) -> None:
    bootstrap = request.getfixturevalue(broker)
    topic, group = await new_topic(bootstrap, partitions=1), f"test-{uuid.uuid4().hex[:8]}"
    await produce(bootstrap, topic, critical_loop_events(100, "old"))  # one producer batch
    assigned: list[list[int]] = []

    async def read(count: int) -> list[TopicRecord]:
        assigned.clear()
        reader = GroupReader(bootstrap, topic, group, assigned=assigned.append)
        await reader.start()
        got: list[TopicRecord] = []
        try:
            async with asyncio.timeout(60):
                while len(got) < count or not assigned:
                    got += await reader.records(0.2)
            if got:
                assert await reader.commit({0: got[-1].offset + 1})
        finally:
            await reader.stop()
        return got

    assert await read(0) == []  # joined: its start (the end) is committed
    await produce(bootstrap, topic, critical_loop_events(3, "new"))  # while it is away
    got = await read(3)
    assert [r.offset for r in got] == [100, 101, 102]
    await produce(bootstrap, topic, critical_loop_events(1, "later"))
    assert [r.offset for r in await read(1)] == [103]


@pytest.mark.parametrize("broker", BROKERS)
async def test_a_new_group_reads_nothing_old_while_its_start_is_being_found(
    broker: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """aiokafka fetches while the assignment hook awaits: a fresh partition it reset to
    the log start was read from offset 0 before the hook moved it to the end (CI saw
    the 100 old records once). A slow end makes that window wide every time."""
    bootstrap = request.getfixturevalue(broker)
    topic, group = await new_topic(bootstrap, partitions=1), f"test-{uuid.uuid4().hex[:8]}"
    await produce(bootstrap, topic, critical_loop_events(100, "old"))
    real_end_offsets = topic_reader.fetch_end_offsets

    async def slow_end_offsets(*args: object, **kwargs: object) -> object:
        await asyncio.sleep(2)
        return await real_end_offsets(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(topic_reader, "fetch_end_offsets", slow_end_offsets)
    assigned: list[list[int]] = []
    reader = GroupReader(bootstrap, topic, group, assigned=assigned.append)
    await reader.start()
    got: list[TopicRecord] = []
    try:
        async with asyncio.timeout(60):
            while not assigned:
                got += await reader.records(0.2)
        got += await reader.records(1.0)  # anything fetched in the window shows now
        await produce(bootstrap, topic, critical_loop_events(1, "new"))
        async with asyncio.timeout(30):
            while len(got) < 1:
                got += await reader.records(0.2)
    finally:
        await reader.stop()
    assert [r.offset for r in got] == [100]
