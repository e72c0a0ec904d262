"""Reply routing against a real worker: each gateway reads its own verdicts and no others.

docs/wire-format.md: Reply routing. A gateway names its reply partition in every
event and reads only that partition; a v1 gateway (``Topics(replies=None)``) reads
the whole verdicts topic, as before, and still gets its verdicts.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator

import pytest

from loopfuse.streams.gateway.client import GatewayClient, Topics
from loopfuse.streams.local.worker_process import WorkerProcess
from tests.support.harness import new_topics, unique, worker_settings

pytestmark = pytest.mark.timeout(300)

REPLY_PARTITIONS = 8


@pytest.fixture(scope="module")
def worker(
    kafka_bootstrap: str, kafka_broker_kind: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[WorkerProcess, Topics, dict[str, str]]]:
    """One worker with a reply topic of its own (8 partitions)."""
    roles = new_topics()
    replies = unique("rel-replies")
    topics = Topics(
        roles["tool_calls"], roles["tool_results"], roles["compactions"], roles["verdicts"], replies
    )
    tmp = tmp_path_factory.mktemp("replies")
    settings = worker_settings(
        kafka_bootstrap,
        kafka_broker_kind,
        roles,
        unique("reply-test"),
        tmp / "data",
        reply_topics=replies,
        reply_partitions=REPLY_PARTITIONS,
    )
    process = WorkerProcess(settings, log_path=tmp / "worker.log").start()
    try:
        process.wait_ready(90)
        yield process, topics, settings
    finally:
        process.stop()


async def _calls(client: GatewayClient, sessions: int, calls: int, prefix: str) -> list[str]:
    """``sessions`` sessions side by side, ``calls`` distinct calls each: their actions."""

    async def one(index: int) -> list[str]:
        session = client.session(f"{prefix}-{index}", run_id="run-1")
        return [(await session.check("read", {"path": f"/f/{n}"})).action for n in range(calls)]

    per_session = await asyncio.gather(*(one(i) for i in range(sessions)))
    return [action for actions in per_session for action in actions]


async def test_an_idle_gateway_reads_none_of_a_busy_ones_verdicts_and_all_of_its_own(
    kafka_bootstrap: str, worker: tuple[WorkerProcess, Topics, dict[str, str]]
) -> None:
    _, topics, _ = worker
    v1 = dataclasses.replace(topics, replies=None)
    async with (
        GatewayClient(kafka_bootstrap, topics=topics, timeout=60, reply_partition=0) as busy,
        GatewayClient(kafka_bootstrap, topics=topics, timeout=60, reply_partition=1) as idle,
        GatewayClient(kafka_bootstrap, topics=v1, timeout=60) as old,
    ):
        busy_actions = await _calls(busy, 20, 100, unique("busy"))  # 2,000 calls
        idle_actions = await _calls(idle, 1, 5, unique("idle"))
        old_actions = await _calls(old, 1, 5, unique("v1"))
        await asyncio.sleep(1.0)  # anything late would be read by now
    assert busy_actions == ["allow"] * 2_000 and busy.stats.verdicts == 2_000
    assert busy.stats.timeouts == 0
    # the idle gateway read its own five verdicts and nothing else
    assert idle_actions == ["allow"] * 5
    assert (idle.stats.verdicts, idle.stats.records_read, idle.stats.foreign_records) == (5, 5, 0)
    assert idle.stats.timeouts == 0
    # a v1 gateway still gets its verdicts on the verdicts topic (and reads only those:
    # the routed ones went to the reply topic)
    assert old_actions == ["allow"] * 5 and old.stats.timeouts == 0
    assert old.stats.records_read == 5


async def test_gateways_sharing_a_partition_skip_each_others_replies_unparsed(
    kafka_bootstrap: str, worker: tuple[WorkerProcess, Topics, dict[str, str]]
) -> None:
    _, topics, _ = worker
    async with (
        GatewayClient(kafka_bootstrap, topics=topics, timeout=60, reply_partition=2) as one,
        GatewayClient(kafka_bootstrap, topics=topics, timeout=60, reply_partition=2) as two,
    ):
        first, second = await asyncio.gather(
            _calls(one, 4, 25, unique("one")), _calls(two, 4, 25, unique("two"))
        )
        await asyncio.sleep(1.0)
    for client, actions in ((one, first), (two, second)):
        assert actions == ["allow"] * 100 and client.stats.verdicts == 100
        assert client.stats.timeouts == 0
        assert client.stats.foreign_records == 100  # the other's, skipped by their key
        assert client.stats.undecodable_records == 0 and client.stats.dropped_verdicts == 0


async def test_a_restarted_gateway_reads_its_new_partition_and_continues_its_sessions(
    kafka_bootstrap: str, worker: tuple[WorkerProcess, Topics, dict[str, str]]
) -> None:
    _, topics, _ = worker
    key = unique("restart")
    args = {"command": "make test"}
    async with GatewayClient(
        kafka_bootstrap, topics=topics, timeout=60, reply_partition=3
    ) as before:
        session = before.session(key, run_id="run-1")
        first = [(await session.check("exec", args)).action for _ in range(2)]
    async with GatewayClient(
        kafka_bootstrap, topics=topics, timeout=60, reply_partition=4
    ) as after:
        session = after.session(key, run_id="run-1")
        # the new incarnation's first call waits for the input to move on, then comes
        # back on the new partition; history carried over: the fourth call warns (as
        # the fourth of one gateway's does, test_gateway.py)
        second = [(await session.check("exec", args)).action for _ in range(2)]
    assert first == ["allow", "allow"] and second == ["allow", "warn"]
    assert after.stats.timeouts == 0 and after.stats.records_read == 2


async def test_calls_in_flight_when_the_worker_is_killed_are_answered_on_their_replies(
    kafka_bootstrap: str, worker: tuple[WorkerProcess, Topics, dict[str, str]]
) -> None:
    """kill -9 with calls in flight (some judged and not committed, some not judged):
    the next worker judges them again from the committed offsets and each verdict,
    a redelivered one too, goes to the partition its call named."""
    process, topics, _ = worker
    async with (
        GatewayClient(kafka_bootstrap, topics=topics, timeout=120, reply_partition=5) as one,
        GatewayClient(kafka_bootstrap, topics=topics, timeout=120, reply_partition=6) as two,
    ):
        await _calls(one, 1, 1, unique("warm"))  # the worker is judging
        base = one.stats.verdicts + two.stats.verdicts
        calls = asyncio.gather(_calls(one, 3, 30, unique("k1")), _calls(two, 3, 30, unique("k2")))
        while one.stats.verdicts + two.stats.verdicts < base + 20:
            await asyncio.sleep(0.005)
        process.kill()
        answered_before_kill = one.stats.verdicts + two.stats.verdicts - base
        await asyncio.sleep(1.0)
        process.start()
        first, second = await calls
        await asyncio.sleep(1.0)
    assert answered_before_kill < 180  # calls were in flight when it died
    assert first == ["allow"] * 90 and second == ["allow"] * 90
    assert one.stats.timeouts == 0 and two.stats.timeouts == 0
    assert one.stats.foreign_records == 0 and two.stats.foreign_records == 0
    # whatever was judged twice came back to the gateway that asked, and only there
    assert one.stats.undecodable_records == 0 and two.stats.undecodable_records == 0
    process.wait_ready(90)  # the module's next test gets a ready worker
