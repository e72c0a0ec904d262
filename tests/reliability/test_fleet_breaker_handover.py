"""The fleet breaker when the worker counting a tool's strikes is SIGKILLed: the other
worker takes the strike partition over, and what tripped is not tripped again.

The window's count lives in memory on the owner of the tool's strike partition; what
tripped is on the compacted breakers topic, which every worker reads. So after the
kill the survivor counts afresh (the dead owner's uncommitted strikes come to it
again, and new sessions keep striking), sees the breaker on its board, and publishes
no second ``fleet_tool_breaker`` loop event; calls to the tool stay warned.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from loopfuse.streams.local.worker_process import WorkerProcess
from tests.support import fleet
from tests.support.harness import Collector, encode, produce, settle, unique, worker_settings
from tests.support.pair import owned, start_pair

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(300)]

PARTITIONS = 4
TRIP_AT = 20


async def test_a_breaker_is_not_tripped_again_when_its_counting_worker_dies(
    kafka_bootstrap: str, kafka_broker_kind: str, tmp_path: Path
) -> None:
    topics = fleet.fleet_topics()
    settings = worker_settings(
        kafka_bootstrap,
        kafka_broker_kind,
        topics,
        unique("loopfuse-handover"),
        tmp_path / "data",
        partitions=PARTITIONS,
        config_file=fleet.config(tmp_path / "fleet.json", TRIP_AT),
    )
    now = int(time.time() * 1000)
    prefix = unique("handover")
    before = [e for i in range(30) for e in fleet.stuck(f"{prefix}-a{i}", now + i)]
    after = [e for i in range(30) for e in fleet.stuck(f"{prefix}-b{i}", now + 1_000 + i)]
    probes = [fleet.probe(f"{prefix}-probe{i}", "exec", now + 2_000) for i in range(12)]
    a = WorkerProcess(settings, log_path=tmp_path / "worker-a.log")
    b = WorkerProcess(settings, log_path=tmp_path / "worker-b.log")
    strikes = topics["tool_strikes"]
    try:
        await start_pair(a, b, topics["tool_calls"], PARTITIONS)
        exec_partition = fleet.partition("exec", PARTITIONS)
        owner, survivor = (a, b) if exec_partition in (await owned(a, strikes) or set()) else (b, a)
        assert exec_partition in (await owned(owner, strikes) or set())
        async with Collector(kafka_bootstrap, [topics["verdicts"], topics["loop_events"]]) as out:
            await produce(kafka_bootstrap, encode(topics, before))
            await fleet.wait_tripped(out, topics["loop_events"], (a, b))

            owner.kill()
            owner.stop()
            deadline = time.monotonic() + 90
            while await owned(survivor, strikes) != set(range(PARTITIONS)):
                assert time.monotonic() < deadline, f"no take-over\n{survivor.tail()}"
                await asyncio.sleep(0.5)
            await asyncio.to_thread(survivor.wait_ready, 90)

            await produce(kafka_bootstrap, encode(topics, after + probes))
            await settle(out, kafka_bootstrap, settings)
            await fleet.strikes_committed(kafka_bootstrap, settings, PARTITIONS)
            await out.read_to_end()
            verdicts = out.of(topics["verdicts"])
            loop_events = out.of(topics["loop_events"])
        assert survivor.running, survivor.tail()
    finally:
        a.stop()
        b.stop()

    breakers = [e for e in loop_events if e["detector"] == "fleet_tool_breaker"]
    assert len(breakers) == 1, breakers
    critical = {e["session_key"] for e in loop_events if e["level"] == "critical"}
    assert {f"{prefix}-b{i}" for i in range(30)} <= critical  # they did strike after the kill
    probed = [v for v in verdicts if v["session_key"].startswith(f"{prefix}-probe")]
    assert len(probed) == len(probes)
    assert {(v["action"], v["detector"]) for v in probed} == {("warn", "fleet_tool_breaker")}
