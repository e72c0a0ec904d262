"""Helpers of the fleet breaker's broker tests: its config, stuck sessions, probes, and
ways to know (never guess by waiting) that the breaker is done and every board has it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
from aiokafka import TopicPartition
from aiokafka.partitioner import murmur2

from loopfuse.streams.local.worker_process import WorkerProcess
from tests.support.harness import Collector, http_get, new_topics, wait_committed


def fleet_topics() -> dict[str, str]:
    """Fresh topics of every role, the fleet breaker's two included."""
    topics = new_topics()
    suffix = topics["verdicts"].rsplit("-", 1)[1]
    return topics | {
        "tool_strikes": f"rel-strikes-{suffix}",
        "tool_breakers": f"rel-breakers-{suffix}",
    }


def config(path: Path, trip_at: int, action: str = "warn") -> Path:
    """A config file with detection (warning 3, critical 5) and the fleet breaker."""
    path.write_text(
        orjson.dumps(
            {
                "tools": {
                    "loopDetection": {
                        "enabled": True,
                        "warningThreshold": 3,
                        "criticalThreshold": 5,
                    }
                },
                "loopfuse": {
                    "rules": {
                        "fleetBreaker": {
                            "sessions": trip_at,
                            "windowSeconds": 600,
                            "action": action,
                        }
                    }
                },
            }
        ).decode()
    )
    return path


def stuck(session: str, ts: int) -> list[dict[str, Any]]:
    """Seven identical exec calls with identical results: the 6th and 7th are criticals."""
    events: list[dict[str, Any]] = []
    for n in range(7):
        base = {
            "session_key": session,
            "run_id": "r",
            "call_id": f"c{n}",
            "tool_name": "exec",
            "args": {"command": "deploy"},
            "ts": ts + n,
        }
        events.append({**base, "type": "tool_call", "event_id": f"{session}#{2 * n}", "seq": 2 * n})
        events.append(
            {
                **base,
                "type": "tool_result",
                "event_id": f"{session}#{2 * n + 1}",
                "seq": 2 * n + 1,
                "error": "upstream 503 (request a1b2c3d4e5f6)",
            }
        )
    return events


def probe(session: str, tool: str, ts: int) -> dict[str, Any]:
    """A fresh session's first call of ``tool``."""
    return {
        "type": "tool_call",
        "session_key": session,
        "run_id": "r",
        "call_id": "c0",
        "seq": 0,
        "event_id": f"{session}#0",
        "tool_name": tool,
        "args": {"session": session},
        "ts": ts,
    }


def partition(key: str, partitions: int) -> int:
    """The partition aiokafka's default partitioner gives ``key``."""
    return (murmur2(key.encode()) & 0x7FFFFFFF) % partitions  # aiokafka's default


async def strikes_committed(bootstrap: str, settings: dict[str, str], partitions: int) -> None:
    """Until the breaker agent has committed every strike on the topic (its state and
    loop events are sent before it takes the next strike, and commits follow a flush)."""
    topic = settings["topic_tool_strikes"]
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    await wait_committed(bootstrap, settings["app_id"], tps, 60, what="strikes")


def tools_broken(worker: WorkerProcess) -> float:
    """``loopfuse_fleet_tools_broken`` of a worker (-1: no answer)."""
    status, body = http_get(worker.web_port, "/metrics")
    for line in body.splitlines() if status == 200 else []:
        if line.startswith("loopfuse_fleet_tools_broken "):
            return float(line.split()[1])
    return -1.0


async def wait_tripped(out: Collector, loop_events: str, workers: Sequence[WorkerProcess]) -> None:
    """Until the breaker's loop event is out and every worker's board holds the breaker."""
    await out.wait_for(
        "the breaker's loop event",
        lambda: any(e["detector"] == "fleet_tool_breaker" for e in out.of(loop_events)),
    )
    await out.wait_for("every board", lambda: all(tools_broken(w) == 1 for w in workers))
