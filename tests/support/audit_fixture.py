"""Generate the events behind tests/fixtures/audit_replay.jsonl: the demo's traffic.

Runs the demo's fleet simulator (every session kind) against the in-process loopback
gateway and keeps the events it publishes, plus a smaller "canary" fleet whose
agents are replayed in shadow mode. Event times are stretched so the few seconds of
simulation span minutes (the report's timeline has something to draw); order and
verdicts are unchanged. The fixture is their ``loopfuse replay`` output (verdicts and
loop events mixed, as ``loopfuse audit`` gets it)::

    python -m tests.support.audit_fixture /tmp/events.jsonl /tmp/canary.jsonl
    loopfuse replay --config tests/fixtures/audit_demo.json /tmp/events.jsonl > /tmp/a
    loopfuse replay --config tests/fixtures/audit_shadow.json /tmp/canary.jsonl > /tmp/b
    cat /tmp/a /tmp/b > tests/fixtures/audit_replay.jsonl
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import orjson

from loopfuse.schemas.config import parse_config
from loopfuse.streams.local.simulator import DEMO_CONFIG, run_fleet
from tests.support.loopback_gateway import LoopbackClient

STRETCH = 40  # event-time speed-up: 6 s of simulation -> 4 min of timeline


async def _fleet(seed: int, sessions: int, seconds: float) -> list[dict[str, Any]]:
    client = LoopbackClient()
    await run_fleet(
        client,
        sessions=sessions,
        duration=seconds,
        seed=seed,
        config=parse_config(DEMO_CONFIG),
        pace=0.12,
    )
    return client.published


def _stretch(events: list[dict[str, Any]], start: int) -> list[dict[str, Any]]:
    first = min(e["ts"] for e in events)
    for event in events:
        event["ts"] = start + (event["ts"] - first) * STRETCH
    return events


def _write(path: Path, events: list[dict[str, Any]]) -> None:
    path.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in events))


def main(enforced_path: str, canary_path: str) -> None:
    start = 1_796_032_800_000  # 2026-11-30T10:00:00Z
    enforced = _stretch(asyncio.run(_fleet(seed=7, sessions=12, seconds=6.0)), start)
    canary = _stretch(asyncio.run(_fleet(seed=8, sessions=6, seconds=3.0)), start + 60_000)
    for event in canary:
        event["agent_id"] = str(event["agent_id"]).replace("agent-", "canary-")
    _write(Path(enforced_path), enforced)
    _write(Path(canary_path), canary)
    with open(canary_path, "ab") as stream:  # the replay output then holds a dead letter too
        stream.write(b'{"type": "tool_call", "event_id": "broken"}\n')


if __name__ == "__main__":
    main(*sys.argv[1:3])
