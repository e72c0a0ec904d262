"""The fleet-wide tool breaker end to end on a real broker (issue 14 item 6): 50
sessions on two workers loop on the same tool -> one ``fleet_tool_breaker`` loop event,
and later calls to that tool are warned on both workers; another tool is untouched. And
a ``block`` breaker blocks a gateway's calls, each asked again (not sticky).

Which worker owns which partition is the group coordinator's (tests/support/pair.py);
which partition a session is on is the producer's (murmur2 of its key). Nothing is
assumed from a pause: the test waits for the breaker's strikes to be committed to
their end (after which its loop events are on the topic) and for each worker's board
to hold the breaker (``loopfuse_fleet_tools_broken`` on /metrics).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from loopfuse.streams.gateway.client import GatewayClient, Topics
from loopfuse.streams.local.worker_process import WorkerProcess
from tests.support import fleet
from tests.support.harness import (
    Collector,
    encode,
    produce,
    settle,
    unique,
    worker_settings,
)
from tests.support.pair import start_pair

pytestmark = pytest.mark.timeout(300)

PARTITIONS = 4
SESSIONS = 50
TRIP_AT = 20  # distinct sessions that trip the breaker (fewer than SESSIONS: one event still)
PROBES = 24  # fresh sessions calling each tool once after the trip


async def test_fifty_sessions_on_two_workers_break_a_tool_fleet_wide(
    kafka_bootstrap: str, kafka_broker_kind: str, tmp_path: Path
) -> None:
    topics = fleet.fleet_topics()
    settings = worker_settings(
        kafka_bootstrap,
        kafka_broker_kind,
        topics,
        unique("loopfuse-fleet"),
        tmp_path / "data",
        partitions=PARTITIONS,
        config_file=fleet.config(tmp_path / "fleet.json", TRIP_AT),
    )
    now = int(time.time() * 1000)
    prefix = unique("fleet")
    looping = [e for i in range(SESSIONS) for e in fleet.stuck(f"{prefix}-s{i}", now + i)]
    a = WorkerProcess(settings, log_path=tmp_path / "worker-a.log")
    b = WorkerProcess(settings, log_path=tmp_path / "worker-b.log")
    try:
        owned_a, owned_b = await start_pair(a, b, topics["tool_calls"], PARTITIONS)
        async with Collector(kafka_bootstrap, [topics["verdicts"], topics["loop_events"]]) as out:
            await produce(kafka_bootstrap, encode(topics, looping))
            await fleet.wait_tripped(out, topics["loop_events"], (a, b))

            probes = [
                fleet.probe(f"{prefix}-{tool}{i}", tool, now + 60_000)
                for tool in ("exec", "read")
                for i in range(PROBES)
            ]
            await produce(kafka_bootstrap, encode(topics, probes))
            await settle(out, kafka_bootstrap, settings)
            await fleet.strikes_committed(kafka_bootstrap, settings, PARTITIONS)
            await out.read_to_end()
            verdicts = out.of(topics["verdicts"])
            loop_events = out.of(topics["loop_events"])
    finally:
        a.stop()
        b.stop()

    [breaker] = [e for e in loop_events if e["detector"] == "fleet_tool_breaker"]
    assert (
        breaker["tool_name"],
        breaker["action"],
        breaker["count"],
        breaker["enforced"],
        breaker["session_key"],
        breaker["fleet"]["sessions"],
    ) == ("exec", "warn", TRIP_AT, True, "fleet", TRIP_AT)
    stuck_sessions = {e["session_key"] for e in loop_events if e["level"] == "critical"}
    assert len(stuck_sessions) == SESSIONS  # every session hit its own critical too

    by_session = {
        v["session_key"]: v
        for v in verdicts
        if v["session_key"].startswith(f"{prefix}-exec")
        or v["session_key"].startswith(f"{prefix}-read")
    }
    assert len(by_session) == 2 * PROBES
    exec_probes = [v for k, v in by_session.items() if k.startswith(f"{prefix}-exec")]
    assert {(v["action"], v["detector"], v["count"]) for v in exec_probes} == {
        ("warn", "fleet_tool_breaker", TRIP_AT)
    }
    assert all(
        v["message"].startswith("WARNING: exec is failing across the fleet") for v in exec_probes
    )
    read_probes = [v for k, v in by_session.items() if k.startswith(f"{prefix}-read")]
    assert {(v["action"], v["detector"]) for v in read_probes} == {("allow", None)}
    # Warned on both workers: probes of partitions each of them owns.
    warned_on = {fleet.partition(v["session_key"], PARTITIONS) for v in exec_probes}
    assert warned_on & owned_a and warned_on & owned_b, (warned_on, owned_a, owned_b)


async def test_a_block_breaker_blocks_a_gateways_calls_without_making_them_sticky(
    kafka_bootstrap: str, kafka_broker_kind: str, tmp_path: Path
) -> None:
    topics = fleet.fleet_topics()
    settings = worker_settings(
        kafka_bootstrap,
        kafka_broker_kind,
        topics,
        unique("loopfuse-fleet-block"),
        tmp_path / "data",
        config_file=fleet.config(tmp_path / "fleet.json", 3, action="block"),
    )
    prefix = unique("block")
    now = int(time.time() * 1000)
    looping = [e for i in range(3) for e in fleet.stuck(f"{prefix}-s{i}", now + i)]
    worker = WorkerProcess(settings, log_path=tmp_path / "worker.log").start()
    gateway_topics = Topics(
        topics["tool_calls"], topics["tool_results"], topics["compactions"], topics["verdicts"]
    )
    try:
        worker.wait_ready(90)
        async with Collector(kafka_bootstrap, [topics["loop_events"]]) as out:
            await produce(kafka_bootstrap, encode(topics, looping))
            await fleet.wait_tripped(out, topics["loop_events"], (worker,))
        async with GatewayClient(kafka_bootstrap, topics=gateway_topics, timeout=30) as gateway:
            session = gateway.session(f"{prefix}-gateway", run_id="run-1")
            first = await session.check("exec", {"command": "deploy"})
            again = await session.check("exec", {"command": "deploy"})
            other = await session.check("read", {"path": "/etc/hosts"})
    finally:
        worker.stop()
    assert (first.action, first.level, first.detector, first.count) == (
        "block",
        "critical",
        "fleet_tool_breaker",
        3,
    )
    assert first.message is not None and first.message.startswith(
        "CRITICAL: exec is failing across the fleet (3 sessions hit a loop on exec"
    )
    assert again.action == "block" and again.call_id != first.call_id
    assert gateway.stats.sticky_blocks == 0  # asked again: the breaker may have cleared
    # the breaker's raised verdicts came by reply routing: the gateway read nothing else
    assert gateway.topics.replies is not None and gateway.reply_partition is not None
    assert gateway.stats.verdicts == 3 and gateway.stats.timeouts == 0
    assert other.action == "allow"
