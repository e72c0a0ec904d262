"""Sustained load: a steady event rate with sessions starting, ending and going idle.

The worker runs with a short session TTL, so its table must hold only recently
active sessions however many have come and gone, and its memory must level off.
Measured while events flow:

* the worker's RSS (``/proc/PID/status`` VmRSS);
* the table size: the worker exposes no sessions gauge (only
  ``loopfuse_sessions_expired_total``), so a background consumer tails the table's
  changelog compaction-aware (last value per key wins, a tombstone removes it).

CI: ~400 ev/s for ~40 s. ``LOOPFUSE_LONG=1``: 10 minutes (``LOOPFUSE_LOAD_SECONDS``
overrides the duration).
"""

from __future__ import annotations

import asyncio
import os
import random
import statistics
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from loopfuse.streams.local.worker_process import WorkerProcess
from tests.support.harness import (
    LONG,
    _session_events,
    consumed_to_end,
    http_get,
    new_topics,
    read_all,
    rss_kb,
    topic_of,
    unique,
    worker_committed,
    worker_settings,
)

DURATION = float(os.environ.get("LOOPFUSE_LOAD_SECONDS", 600 if LONG else 40))
RATE = float(os.environ.get("LOOPFUSE_LOAD_RATE", 400))
ACTIVE = 60  # sessions sending at any moment
TTL = 5.0
SCAN = 1.0
KINDS = ("healthy", "generic_repeat", "polling", "ping_pong", "unknown_tool", "compaction_loop")

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(DURATION + 180)]


class Fleet:
    """An endless stream of sessions: ACTIVE at a time; each sends 20-80 events, then
    ends its run (``run_ended``) or just goes quiet; a new one takes its place."""

    def __init__(self, seed: int, prefix: str) -> None:
        self.rng = random.Random(seed)
        self.prefix = prefix
        self.started = 0
        self.active: list[list[dict[str, Any]]] = [self._new() for _ in range(ACTIVE)]
        self.last_seen: dict[str, float] = {}
        self.n = 0
        self.tool_calls = 0
        # (session, seq) of every tool_call, and each session's (seq, type) in order
        self.calls: set[tuple[str, int]] = set()
        self.sent: dict[str, list[tuple[int, str]]] = {}

    def _new(self) -> list[dict[str, Any]]:
        kind = KINDS[self.started % len(KINDS)]
        key = f"{self.prefix}{self.started}-{kind}"
        self.started += 1
        events = _session_events(self.rng, key, kind, self.rng.randint(20, 80), None)
        if self.rng.random() < 0.5:
            last = events[-1]
            events.append(
                {
                    "type": "run_ended",
                    "session_key": key,
                    "run_id": last["run_id"],
                    "seq": len(events),
                    "event_id": f"{key}#end",
                }
            )
        events.reverse()  # pop() from the end
        return events

    def next(self) -> dict[str, Any]:
        i = self.rng.randrange(len(self.active))
        event = self.active[i].pop()
        if not self.active[i]:
            self.active[i] = self._new()
        # Gateways stamp events with their wall clock: idle expiry compares event
        # time with the worker's clock (an old synthetic ts would look idle at once).
        event["ts"] = int(time.time() * 1000)
        self.n += 1
        self.tool_calls += event["type"] == "tool_call"
        if event["type"] == "tool_call":
            self.calls.add((event["session_key"], event["seq"]))
        self.sent.setdefault(event["session_key"], []).append((event["seq"], event["type"]))
        self.last_seen[event["session_key"]] = time.monotonic()
        return event


class ChangelogTail:
    """Live keys of the session table, from its changelog, updated in the background."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.consumer = AIOKafkaConsumer(
            topic,
            bootstrap_servers=bootstrap,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            fetch_max_wait_ms=50,
        )
        self.live: set[bytes] = set()
        self.records = 0
        self.tombstones = 0
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.consumer.start()
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.consumer.stop()

    async def _run(self) -> None:
        while True:
            batches = await self.consumer.getmany(timeout_ms=200)
            for records in batches.values():
                for r in records:
                    self.records += 1
                    if r.key is None:
                        continue
                    if r.value is None:
                        self.tombstones += 1
                        self.live.discard(r.key)
                    else:
                        self.live.add(r.key)


class VerdictCounter:
    def __init__(self, bootstrap: str, topic: str) -> None:
        self.consumer = AIOKafkaConsumer(
            topic,
            bootstrap_servers=bootstrap,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            fetch_max_wait_ms=50,
        )
        self.verdicts = 0
        self.aborts = 0
        self.judged: set[tuple[str, int]] = set()  # (session, seq) of non-abort verdicts
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.consumer.start()
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.consumer.stop()

    async def _run(self) -> None:
        while True:
            batches = await self.consumer.getmany(timeout_ms=200)
            for records in batches.values():
                for r in records:
                    self.verdicts += 1
                    if b'"action":"abort"' in r.value:
                        self.aborts += 1
                    else:
                        v = orjson.loads(r.value)
                        self.judged.add((v["session_key"], v["seq"]))


def input_behind(web_port: int) -> float:
    """The worst partition's ``loopfuse_input_behind_seconds`` (-1 when none is known)."""
    metrics = http_get(web_port, "/metrics")[1]
    values = [
        float(line.split()[-1])
        for line in metrics.splitlines()
        if line.startswith("loopfuse_input_behind_seconds{")
    ]
    return max(values, default=-1.0)


async def test_sustained_load_keeps_memory_and_table_bounded(
    kafka_bootstrap: str, kafka_broker_kind: str, tmp_path: Path
) -> None:
    topics = new_topics()
    app_id = unique("loopfuse-load")
    settings = worker_settings(
        kafka_bootstrap,
        kafka_broker_kind,
        topics,
        app_id,
        tmp_path / "data",
        session_ttl_seconds=TTL,
        idle_scan_interval_seconds=SCAN,
    )
    fleet = Fleet(seed=4, prefix=unique("load") + "-")
    worker = WorkerProcess(settings, log_path=tmp_path / "worker.log").start()
    tail = ChangelogTail(kafka_bootstrap, f"{app_id}-sessions-changelog")
    counter = VerdictCounter(kafka_bootstrap, topics["verdicts"])
    # (t, rss kB, live keys, sessions started, input behind s)
    samples: list[tuple[float, int, int, int, float]] = []
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, linger_ms=5)
    try:
        await asyncio.to_thread(worker.wait_ready, 120)
        assert worker.pid is not None
        await producer.start()
        await tail.start()
        await counter.start()
        t0 = time.monotonic()
        every = 2.0 if DURATION <= 120 else 10.0
        next_sample = t0
        while (now := time.monotonic()) - t0 < DURATION:
            due = int((now - t0) * RATE)
            while fleet.n < due:
                e = fleet.next()
                await producer.send(
                    topic_of(topics, e), orjson.dumps(e), key=e["session_key"].encode()
                )
            await producer.flush()
            if now >= next_sample:
                assert worker.running, worker.tail()
                behind = await asyncio.to_thread(input_behind, worker.web_port)
                samples.append(
                    (now - t0, rss_kb(worker.pid), len(tail.live), fleet.started, behind)
                )
                next_sample += every
            await asyncio.sleep(0.05)
        produce_s = time.monotonic() - t0
        recent = sum(1 for t in fleet.last_seen.values() if time.monotonic() - t < TTL + 2 * SCAN)
        # Let the worker catch up, then measure the table at the end of the load.
        deadline = time.monotonic() + 60
        while counter.verdicts - counter.aborts < fleet.tool_calls and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        caught_up_s = time.monotonic() - t0 - produce_s
        # Every table write of the load is on the changelog (a commit follows them),
        # and the tail has read it all.
        await worker_committed(kafka_bootstrap, settings, 60)
        await consumed_to_end(tail.consumer)
        live_at_end = len(tail.live)
        # Everything idle now: within TTL + a few scans every session is expired.
        deadline = time.monotonic() + TTL + 15
        while tail.live and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
        live_after_idle = len(tail.live)
        metrics = http_get(worker.web_port, "/metrics")[1]
        rss_end = rss_kb(worker.pid)
        unjudged = sorted(fleet.calls - counter.judged)
        on_broker: set[tuple[str, int]] = set()
        if unjudged:  # published but missed by the counter, or never published?
            for _, _, _, value in await read_all(
                kafka_bootstrap, topics["verdicts"], int(settings.get("partitions", "4"))
            ):
                v = orjson.loads(value or b"{}")
                on_broker.add((v.get("session_key"), v.get("seq")))
    finally:
        await producer.stop()
        await tail.stop()
        await counter.stop()
        worker.stop()

    expired = sum(
        float(line.split()[-1])
        for line in metrics.splitlines()
        if line.startswith("loopfuse_sessions_expired_total")
    )
    rss = [s[1] for s in samples]
    half = len(rss) // 2
    mid = statistics.median(rss[max(1, half - 2) : half + 1])
    growth_kb = max(rss[half:]) - mid
    print(
        f"load: {fleet.n} events ({fleet.n / produce_s:.0f} ev/s) over {produce_s:.0f} s, "
        f"{fleet.started} sessions started, {fleet.tool_calls} tool_calls, "
        f"{counter.verdicts} verdicts; caught up {caught_up_s:.1f} s after the last event"
    )
    print(
        f"load: table live keys at end {live_at_end} (sessions active in the last "
        f"TTL+2 scans: {recent}; {ACTIVE} sending at a time); after {TTL:.0f} s idle "
        f"{live_after_idle}; expired {expired:.0f}; changelog records {tail.records}, "
        f"tombstones {tail.tombstones}"
    )
    print("load: t_s rss_MB live_keys sessions_started input_behind_s")
    for t, r, live, started, behind in samples:
        print(f"load: {t:6.0f} {r / 1024:7.1f} {live:6d} {started:7d} {behind:6.2f}")
    print(
        f"load: RSS first {rss[0] / 1024:.1f} MB, mid {mid / 1024:.1f} MB, max "
        f"{max(rss) / 1024:.1f} MB, end {rss_end / 1024:.1f} MB; second-half growth "
        f"{growth_kb / 1024:.1f} MB"
    )

    assert not unjudged, (
        f"{len(unjudged)} tool_calls without a verdict seen "
        f"({len(set(unjudged) & on_broker)} of them are on the verdicts topic), e.g. "
    ) + "; ".join(f"{key} seq {seq} (sent: {fleet.sent[key][:80]})" for key, seq in unjudged[:3])
    assert fleet.started > 4 * ACTIVE, "the load did not turn sessions over"
    max_live = max(s[2] for s in samples)
    assert max_live <= 3 * ACTIVE + RATE * (TTL + 2 * SCAN) / 20, (
        f"table grew to {max_live} keys with ~{ACTIVE} active sessions"
    )
    assert live_at_end <= recent + ACTIVE, (live_at_end, recent)
    assert live_after_idle == 0, f"{live_after_idle} sessions never expired"
    assert expired >= fleet.started - ACTIVE, (expired, fleet.started)
    assert growth_kb <= max(30 * 1024, 0.15 * mid), (
        f"RSS grew {growth_kb / 1024:.1f} MB in the second half: {[r // 1024 for r in rss]}"
    )
