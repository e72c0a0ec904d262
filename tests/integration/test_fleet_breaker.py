"""The fleet-wide tool breaker end to end on a real broker (issue 14 item 6): 50
sessions on two workers loop on the same tool -> one ``fleet_tool_breaker`` loop event,
and later calls to that tool are warned on both workers; another tool is untouched.

Which worker owns which partition is read from their logs (as in test_two_workers);
which partition a session is on is the producer's (murmur2 of its key). Nothing is
assumed from a pause: the test waits for the breaker's strikes to be committed to
their end (after which its loop events are on the topic) and for each worker's board
to hold the breaker (``loopfuse_fleet_tools_broken`` on /metrics).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.partitioner import murmur2

from streams.worker_process import WorkerProcess
from tests.support.harness import (
    Collector,
    encode,
    http_get,
    new_topics,
    produce,
    read_all,
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


def _config(path: Path) -> Path:
    path.write_text(orjson.dumps({
        "tools": {"loopDetection": {"enabled": True, "warningThreshold": 3,
                                    "criticalThreshold": 5}},
        "loopfuse": {"rules": {"fleetBreaker": {"sessions": TRIP_AT, "windowSeconds": 600}}},
    }).decode())
    return path


def _stuck(session: str, ts: int) -> list[dict[str, Any]]:
    """Seven identical exec calls with identical results: the 6th and 7th are criticals."""
    events: list[dict[str, Any]] = []
    for n in range(7):
        base = {"session_key": session, "run_id": "r", "call_id": f"c{n}", "tool_name": "exec",
                "args": {"command": "deploy"}, "ts": ts + n}
        events.append({**base, "type": "tool_call", "event_id": f"{session}#{2 * n}",
                       "seq": 2 * n})
        events.append({**base, "type": "tool_result", "event_id": f"{session}#{2 * n + 1}",
                       "seq": 2 * n + 1, "error": "upstream 503 (request a1b2c3d4e5f6)"})
    return events


def _probe(session: str, tool: str, ts: int) -> dict[str, Any]:
    return {"type": "tool_call", "session_key": session, "run_id": "r", "call_id": "c0",
            "seq": 0, "event_id": f"{session}#0", "tool_name": tool,
            "args": {"session": session}, "ts": ts}


def _partition(session: str) -> int:
    return (murmur2(session.encode()) & 0x7FFFFFFF) % PARTITIONS  # aiokafka's default


async def _strikes_committed(bootstrap: str, settings: dict[str, str]) -> None:
    """Until the breaker agent has committed every strike on the topic (its state and
    loop events are sent before it takes the next strike, and commits follow a flush)."""
    topic = settings["topic_tool_strikes"]
    deadline = time.monotonic() + 60
    while True:
        ends: dict[Any, int] = {}
        for partition, offset, _, _ in await read_all(bootstrap, topic, PARTITIONS, idle=0.3):
            ends[partition] = max(ends.get(partition, 0), offset + 1)
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            tps = [TopicPartition(topic, p) for p in ends]
            committed = await admin.list_consumer_group_offsets(settings["app_id"], partitions=tps)
        finally:
            await admin.close()
        behind = {tp.partition: ends[tp.partition] - (committed[tp].offset if tp in committed
                                                       else 0) for tp in tps}
        if ends and not any(behind.values()):
            return
        assert time.monotonic() < deadline, f"strikes not committed: {behind}"
        await asyncio.sleep(0.2)


def _tools_broken(worker: WorkerProcess) -> float:
    status, body = http_get(worker.web_port, "/metrics")
    for line in body.splitlines() if status == 200 else []:
        if line.startswith("loopfuse_fleet_tools_broken "):
            return float(line.split()[1])
    return -1.0


async def test_fifty_sessions_on_two_workers_break_a_tool_fleet_wide(
    kafka_bootstrap: str, kafka_broker_kind: str, tmp_path: Path
) -> None:
    topics = new_topics()
    suffix = topics["verdicts"].rsplit("-", 1)[1]
    topics |= {"tool_strikes": f"rel-strikes-{suffix}", "tool_breakers": f"rel-breakers-{suffix}"}
    settings = worker_settings(
        kafka_bootstrap, kafka_broker_kind, topics, unique("loopfuse-fleet"), tmp_path / "data",
        partitions=PARTITIONS, config_file=_config(tmp_path / "fleet.json"),
    )
    now = int(time.time() * 1000)
    prefix = unique("fleet")
    stuck = [e for i in range(SESSIONS) for e in _stuck(f"{prefix}-stuck{i}", now + i)]
    a = WorkerProcess(settings, log_path=tmp_path / "worker-a.log")
    b = WorkerProcess(settings, log_path=tmp_path / "worker-b.log")
    try:
        owned_a, owned_b = await start_pair(a, b, topics["tool_calls"], PARTITIONS)
        async with Collector(kafka_bootstrap, [topics["verdicts"], topics["loop_events"]]) as out:
            await produce(kafka_bootstrap, encode(topics, stuck))
            await out.wait_for("the breaker's loop event", lambda: any(
                e["detector"] == "fleet_tool_breaker" for e in out.of(topics["loop_events"])))
            await out.wait_for("both boards", lambda: _tools_broken(a) == _tools_broken(b) == 1)

            probes = [_probe(f"{prefix}-{tool}{i}", tool, now + 60_000)
                      for tool in ("exec", "read") for i in range(PROBES)]
            await produce(kafka_bootstrap, encode(topics, probes))
            await settle(out, kafka_bootstrap, settings)
            await _strikes_committed(kafka_bootstrap, settings)
            await out.read_to_end()
            verdicts = out.of(topics["verdicts"])
            loop_events = out.of(topics["loop_events"])
    finally:
        a.stop()
        b.stop()

    [breaker] = [e for e in loop_events if e["detector"] == "fleet_tool_breaker"]
    assert (breaker["tool_name"], breaker["action"], breaker["count"], breaker["enforced"],
            breaker["session_key"], breaker["fleet"]["sessions"]) == (
        "exec", "warn", TRIP_AT, True, "fleet", TRIP_AT)
    stuck_sessions = {e["session_key"] for e in loop_events if e["level"] == "critical"}
    assert len(stuck_sessions) == SESSIONS  # every session hit its own critical too

    by_session = {v["session_key"]: v for v in verdicts if v["session_key"].startswith(
        f"{prefix}-exec") or v["session_key"].startswith(f"{prefix}-read")}
    assert len(by_session) == 2 * PROBES
    exec_probes = [v for k, v in by_session.items() if k.startswith(f"{prefix}-exec")]
    assert {(v["action"], v["detector"], v["count"]) for v in exec_probes} == {
        ("warn", "fleet_tool_breaker", TRIP_AT)}
    assert all(v["message"].startswith("WARNING: exec is failing across the fleet")
               for v in exec_probes)
    read_probes = [v for k, v in by_session.items() if k.startswith(f"{prefix}-read")]
    assert {(v["action"], v["detector"]) for v in read_probes} == {("allow", None)}
    # Warned on both workers: probes of partitions each of them owns.
    warned_on = {_partition(v["session_key"]) for v in exec_probes}
    assert warned_on & owned_a and warned_on & owned_b, (warned_on, owned_a, owned_b)
