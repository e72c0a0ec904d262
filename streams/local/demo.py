"""``loopfuse demo``: the whole pipeline on one machine, with a live view.

Starts the embedded broker (Apache Kafka with ``--kafka``; none when ``--bootstrap``
names a Kafka), a worker in a child process, and the fleet simulator driving sessions
through the gateway client;
shows sessions, verdict counts and the latest loop events while it runs; then a
summary and one line ``demo: sessions=… mismatches=…``. Exits 0 only when every
verdict was the expected one. Everything it started is stopped, also on Ctrl-C.

The live view shows loop events as read from the topic, which anything can write to:
their strings go through ``ops/plain`` (never rich markup), and a record that is not a
JSON object is counted as skipped, not shown.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
import uuid
from collections import deque
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition
from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from loopfuse.schemas.config import parse_config
from loopfuse.streams.gateway.client import GatewayClient, Topics
from loopfuse.streams.local.broker import BrokerProcess, EmbeddedBroker
from loopfuse.streams.local.kafka_broker import ApacheKafka, kafka_version
from loopfuse.streams.local.simulator import DEMO_CONFIG, KINDS, FleetStats, run_fleet
from loopfuse.streams.local.worker_process import WorkerProcess
from loopfuse.streams.ops import plain
from loopfuse.streams.settings import Settings

REFRESH_SECONDS = 0.5
PLAIN_EVERY_SECONDS = 3.0


class LatestLoopEvents:
    """The latest loop events read, and how many records were read or skipped."""

    def __init__(self, keep: int = 6) -> None:
        self.latest: deque[dict[str, Any]] = deque(maxlen=keep)
        self.total = 0
        self.skipped = 0  # records that are not a JSON object (a list, a number, not JSON)

    def add(self, value: bytes | None) -> None:
        try:
            record = orjson.loads(value or b"null")
        except orjson.JSONDecodeError:
            record = None
        if not isinstance(record, dict):
            self.skipped += 1
            return
        self.latest.append(record)
        self.total += 1


class LoopEventFeed(LatestLoopEvents):
    """The latest loop events from the loop-events topic, for the live view."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__()
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False
        )
        self._topic = topic
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self._consumer.start()
        partitions = self._consumer.partitions_for_topic(self._topic) or set()
        if not partitions:
            await self._consumer._client.force_metadata_update()
            partitions = self._consumer.partitions_for_topic(self._topic) or set()
        tps = [TopicPartition(self._topic, p) for p in partitions]
        self._consumer.assign(tps)
        await self._consumer.seek_to_end(*tps)
        self._task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        while True:
            for records in (await self._consumer.getmany(timeout_ms=200)).values():
                for record in records:
                    self.add(record.value)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._consumer.stop()


def _percentile(values: list[float], fraction: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


def render(
    stats: FleetStats, feed: LatestLoopEvents, elapsed: float, duration: float, where: str
) -> Group:
    latencies = list(stats.latencies_ms)
    header = (
        f"[b]loopfuse demo[/b]  {elapsed:5.1f}/{duration:.0f} s   broker {where}   "
        f"sessions {stats.sessions}   tool calls {stats.tool_calls}   "
        f"verdict latency p50 {_percentile(latencies, 0.5):.1f} ms, p99 {_percentile(latencies, 0.99):.1f} ms   "
        f"mismatches [{'red' if stats.mismatches else 'green'}]{stats.mismatches}[/]"
    )
    table = Table(expand=True)
    for column in ("session kind", "allow", "warn", "block", "abort"):
        table.add_column(column, justify="left" if column == "session kind" else "right")
    for kind in KINDS:
        counts = stats.by_kind.get(kind)
        if counts is None:
            continue
        table.add_row(kind, *(str(counts[a]) for a in ("allow", "warn", "block", "abort")))
    a = stats.actions
    table.add_row("[b]all[/b]", *(f"[b]{a[x]}[/b]" for x in ("allow", "warn", "block", "abort")))
    events = Table(expand=True, show_header=True)
    events.add_column("detector", no_wrap=True)
    events.add_column("session", no_wrap=True)
    events.add_column("message")
    for event in reversed(feed.latest):
        events.add_row(
            plain.text(f"{event.get('detector')} ({event.get('action')})"),
            plain.text(event.get("session_key")),
            plain.text(event.get("message"), 160),
        )
    skipped = f", {feed.skipped} skipped: not a JSON object" if feed.skipped else ""
    return Group(
        header,
        table,
        Panel(events, title=Text(f"latest loop events ({feed.total}{skipped})")),
    )


def _plain_line(stats: FleetStats, elapsed: float) -> str:
    a = stats.actions
    return (
        f"demo: t={elapsed:.0f}s sessions={stats.sessions} tool_calls={stats.tool_calls} "
        f"allow={a['allow']} warn={a['warn']} block={a['block']} abort={a['abort']} "
        f"mismatches={stats.mismatches}"
    )


async def _demo(args: argparse.Namespace) -> int:
    tui = not args.no_tui and sys.stdout.isatty()
    console = Console()

    def say(text: str) -> None:
        # plain text either way: a line may carry a broker address or a path
        if tui:
            console.print(text, markup=False, highlight=False)
        else:
            print(text, flush=True)

    defaults = Settings.model_construct()  # the worker's default topic names
    topics = Topics.from_settings(defaults)
    workdir = Path(tempfile.mkdtemp(prefix="loopfuse-demo-"))
    config_path = workdir / "loop-detection.json"
    config_path.write_bytes(orjson.dumps(DEMO_CONFIG, option=orjson.OPT_INDENT_2))
    broker: BrokerProcess | None = None
    worker: WorkerProcess | None = None
    client: GatewayClient | None = None
    feed: LoopEventFeed | None = None
    try:
        if args.bootstrap:
            bootstrap, where = args.bootstrap, args.bootstrap
        elif getattr(args, "kafka", False):
            say(f"demo: starting Apache Kafka {kafka_version()} (one KRaft node)")
            broker = ApacheKafka(
                log_path=workdir / "kafka.log", say=lambda line: say(f"demo: {line}")
            )
            await broker.start_async()
            bootstrap, where = broker.bootstrap, f"Apache Kafka {broker.bootstrap}"
        else:
            say("demo: starting the embedded broker")
            broker = await EmbeddedBroker().start_async()
            bootstrap, where = broker.bootstrap, f"embedded {broker.bootstrap}"
        say(f"demo: starting a worker (log: {workdir / 'worker.log'})")
        worker = WorkerProcess(
            {
                "bootstrap_servers": bootstrap,
                "embedded_broker": str(isinstance(broker, EmbeddedBroker)).lower(),
                "config_file": str(config_path),
                "app_id": f"loopfuse-demo-{uuid.uuid4().hex[:8]}",
                "data_dir": str(workdir / "data"),
                "broker_session_timeout": "6",
                "broker_heartbeat_interval": "1",
            },
            log_path=workdir / "worker.log",
        ).start()
        await asyncio.to_thread(worker.wait_ready, 90.0)
        client = GatewayClient(
            bootstrap,
            topics=topics,
            timeout=30.0,
            fail_policy="open",
            verdict_fetch_wait_ms=5 if isinstance(broker, EmbeddedBroker) else 500,
            idempotent=not isinstance(broker, EmbeddedBroker),
        )
        await client.start()
        feed = LoopEventFeed(bootstrap, defaults.topic_loop_events)
        await feed.start()
        say(
            f"demo: {args.sessions} simulated sessions for {args.duration:.0f} s (seed {args.seed})"
        )

        stats = FleetStats()
        config = parse_config(DEMO_CONFIG)
        fleet = asyncio.create_task(
            run_fleet(
                client,
                sessions=args.sessions,
                duration=args.duration,
                seed=args.seed,
                config=config,
                stats=stats,
            )
        )
        started = time.monotonic()
        if tui:
            with Live(console=console, refresh_per_second=4, transient=False) as live:
                while not fleet.done():
                    live.update(
                        render(stats, feed, time.monotonic() - started, args.duration, where)
                    )
                    await asyncio.sleep(REFRESH_SECONDS)
                live.update(render(stats, feed, time.monotonic() - started, args.duration, where))
        else:
            while not fleet.done():
                await asyncio.wait({fleet}, timeout=PLAIN_EVERY_SECONDS)
                print(_plain_line(stats, time.monotonic() - started), flush=True)
        await fleet
        _summary(say, stats, feed)
        print(stats.summary_line(), flush=True)
        return 0 if stats.mismatches == 0 and stats.tool_calls > 0 else 1
    finally:
        if feed is not None:
            await feed.stop()
        if client is not None:
            await client.stop()
        if worker is not None:
            await asyncio.to_thread(worker.stop)
        if broker is not None:
            await asyncio.to_thread(broker.close)


def _summary(say: Any, stats: FleetStats, feed: LoopEventFeed) -> None:
    latencies = list(stats.latencies_ms)
    say(
        f"demo: summary: {stats.tool_calls} tool calls over {stats.sessions} sessions; "
        f"detectors fired: {dict(stats.detectors) or 'none'}; loop events seen: {feed.total}; "
        f"client time-outs: {stats.timeouts}; verdict latency p50 "
        f"{statistics.median(latencies) if latencies else 0:.1f} ms, "
        f"p99 {_percentile(latencies, 0.99):.1f} ms"
    )
    for example in stats.mismatch_examples:
        say(f"demo: mismatch: {example}")


def run_demo(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_demo(args))
    except KeyboardInterrupt:
        print("demo: interrupted; everything it started has been stopped", file=sys.stderr)
        return 130
