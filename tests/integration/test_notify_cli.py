"""``loopfuse notify`` as a process: the session broker in, a local webhook out.

Each test asserts what reached the webhook (``tests.support.webhook``) across what
an operator's notifier lives through: a SIGKILL and a restart, a SIGTERM, a record
the worker published twice, an outage of the webhook, one event it keeps refusing,
a flood of one loop.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import tempfile
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from tests.support.kafka import fixture_records, new_topic, produce
from tests.support.webhook import Webhook, critical_loop_events

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Notify:
    """One ``loopfuse notify`` process; its stderr lines collected as they come."""

    def __init__(self, bootstrap: str, topic: str, hook: Webhook, group: str, *flags: str) -> None:
        if "--dead-letter-file" not in flags:  # never the default, in the repository
            flags = (*flags, "--dead-letter-file", os.path.join(tempfile.mkdtemp(), "dead.jsonl"))
        self.args = [
            "--bootstrap",
            bootstrap,
            "--topic",
            topic,
            "--group",
            group,
            "--metrics-port",
            "0",
            "--backoff",
            "0.05",
            "--rate",
            "0",
            *flags,
        ]
        self.env = {**os.environ, "LOOPFUSE_NOTIFY_WEBHOOK_URL": hook.url}
        self.lines: list[str] = []
        self.process: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None

    async def start(self) -> Notify:
        """Start, and return once it has its partitions (from then on it reads)."""
        self.lines = []
        self.process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "loopfuse.streams.cli",
            "notify",
            *self.args,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            cwd=ROOT,
            env=self.env,
        )
        self._reader = asyncio.create_task(self._read())
        await until(
            lambda: any(line.startswith("notify: assigned") for line in self.lines),
            60,
            lambda: f"notify never got its partitions: {self.lines}",
        )
        return self

    async def _read(self) -> None:
        assert self.process is not None and self.process.stderr is not None
        async for line in self.process.stderr:
            self.lines.append(line.decode().rstrip("\n"))

    async def stop(self, signum: int = signal.SIGTERM, timeout: float = 30) -> int:
        assert self.process is not None
        if self.process.returncode is None:
            self.process.send_signal(signum)
        code = await asyncio.wait_for(self.process.wait(), timeout)
        if self._reader is not None:
            await asyncio.wait_for(self._reader, 5)
        return code

    async def ensure_stopped(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.kill()
            await self.process.wait()


async def until(done: Callable[[], bool], timeout: float, why: Callable[[], str] = str) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, why()
        await asyncio.sleep(0.05)


def _group() -> str:
    return f"test-notify-{uuid.uuid4().hex[:10]}"


async def test_notify_posts_critical_loop_events_from_the_topic(kafka_bootstrap: str) -> None:
    topic = await new_topic(kafka_bootstrap)
    events = fixture_records()
    critical = next(e for e in events if e["level"] == "critical")
    warning = next(e for e in events if e["level"] == "warning")
    port = _free_port()
    with Webhook(statuses=[500]) as hook:
        notify = Notify(kafka_bootstrap, topic, hook, _group())
        notify.args[notify.args.index("--metrics-port") + 1] = str(port)
        try:
            await notify.start()
            await produce(kafka_bootstrap, topic, [warning, b"\x00 not json", critical])
            metrics = b""
            for _ in range(300):  # until the webhook has it and the notifier has counted it
                metrics = urllib.request.urlopen(
                    f"http://127.0.0.1:{port}/metrics", timeout=5
                ).read()
                if hook.received and b"loopfuse_notify_sent_total 1.0" in metrics:
                    break
                await asyncio.sleep(0.1)
            assert notify.process is not None and notify.process.returncode is None
        finally:
            assert await notify.stop() == 0

    posted = [r["loop_event"] for r in hook.received]
    assert posted == [{k: v for k, v in critical.items() if k != "config"}]
    assert hook.attempts == 2  # the first answer was a 500
    assert b"loopfuse_notify_sent_total 1.0" in metrics
    assert b"loopfuse_notify_skipped_records_total 1.0" in metrics
    assert b"loopfuse_notify_retries_total 1.0" in metrics
    assert hook.url not in "\n".join(notify.lines)  # the URL is a secret


async def test_a_killed_and_restarted_notify_posts_every_event(kafka_bootstrap: str) -> None:
    topic, group = await new_topic(kafka_bootstrap), _group()
    before, while_down = critical_loop_events(60, "kill"), critical_loop_events(20, "down")
    with Webhook() as hook:
        notify = Notify(kafka_bootstrap, topic, hook, group, "--rate", "20", "--burst", "1")
        try:
            await notify.start()
            await produce(kafka_bootstrap, topic, before)
            await until(lambda: len(hook.received) >= 20, 30)
            assert await notify.stop(signal.SIGKILL) == -signal.SIGKILL  # mid-stream
            posted_before_kill = set(hook.event_ids())
            await produce(kafka_bootstrap, topic, while_down)
            await notify.start()
            wanted = {e["event_id"] for e in before + while_down}
            await until(
                lambda: set(hook.event_ids()) >= wanted,
                60,
                lambda: f"missing {sorted(wanted - set(hook.event_ids()))[:10]}",
            )
            await asyncio.sleep(1)
        finally:
            await notify.ensure_stopped()

    posts = Counter(hook.event_ids())
    assert set(posts) == wanted
    twice = {event_id for event_id, n in posts.items() if n > 1}
    assert twice <= posted_before_kill and max(posts.values()) <= 2
    assert len(twice) <= 10, twice  # only those delivered since the last commit


async def test_sigterm_mid_stream_loses_nothing_and_repeats_nothing(kafka_bootstrap: str) -> None:
    topic, group = await new_topic(kafka_bootstrap), _group()
    first, second = critical_loop_events(10, "a"), critical_loop_events(10, "b")
    outage = [False]
    with Webhook(answer=lambda post: 500 if outage[0] else 200) as hook:
        notify = Notify(kafka_bootstrap, topic, hook, group, "--drain-seconds", "1")
        try:
            await notify.start()
            await produce(kafka_bootstrap, topic, first)
            await until(lambda: len(hook.received) == 10, 30)
            outage[0] = True
            await produce(kafka_bootstrap, topic, second)
            await until(lambda: hook.attempts >= 20, 30)  # every one of them tried
            assert await notify.stop(signal.SIGTERM) == 0
            assert notify.lines[-1] == (
                "notify: stopped with 10 loop-event record(s) not delivered; left uncommitted, "
                "they are read again at the next start"
            )
            outage[0] = False
            await notify.start()
            await until(lambda: len(hook.received) >= 20, 30)
            await asyncio.sleep(1)
        finally:
            await notify.ensure_stopped()

    assert sorted(hook.event_ids()) == sorted(e["event_id"] for e in first + second)


async def test_a_loop_event_published_twice_is_posted_once(kafka_bootstrap: str) -> None:
    topic = await new_topic(kafka_bootstrap)
    one, two, three = critical_loop_events(3, "twice")
    with Webhook() as hook:
        notify = Notify(kafka_bootstrap, topic, hook, _group())
        try:
            await notify.start()
            await produce(kafka_bootstrap, topic, [one, two])
            await until(lambda: len(hook.received) == 2, 30)
            await produce(kafka_bootstrap, topic, [one, three, two])  # a worker's redelivery
            await until(lambda: len(hook.received) >= 3, 30)
            await asyncio.sleep(1)
        finally:
            await notify.stop()

    assert sorted(hook.event_ids()) == sorted(e["event_id"] for e in (one, two, three))


async def test_an_outage_of_the_webhook_delivers_all_and_one_refused_event_blocks_none(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    topic = await new_topic(kafka_bootstrap)
    events = critical_loop_events(20, "outage")
    poison, rest = events[0], events[1:]
    state = {"outage": True, "poison": True}

    def answer(post: dict[str, Any]) -> int:
        refused = state["poison"] and post["loop_event"]["event_id"] == poison["event_id"]
        if state["outage"] or refused:
            return 500
        return 200

    with Webhook(answer=answer) as hook:
        notify = Notify(
            kafka_bootstrap,
            topic,
            hook,
            _group(),
            "--dead-letter-file",
            str(tmp_path / "dead.jsonl"),
        )
        try:
            await notify.start()
            await produce(kafka_bootstrap, topic, [poison])
            await until(lambda: hook.attempts >= 3, 30)  # the outage: it retries
            await produce(kafka_bootstrap, topic, rest)
            await asyncio.sleep(2)
            assert hook.received == []
            state["outage"] = False  # back, but still refusing the poison event
            back = time.monotonic()
            await until(lambda: len(hook.received) == 19, 30)
            others = time.monotonic() - back
            state["poison"] = False
            await until(lambda: len(hook.received) == 20, 60)
        finally:
            await notify.stop()

    assert sorted(hook.event_ids()) == sorted(e["event_id"] for e in events)
    assert others < 3, others  # not behind the poison event's backoff
    assert hook.event_ids()[-1] == poison["event_id"]
    assert (tmp_path / "dead.jsonl").read_bytes() == b""  # nothing given up


async def test_a_flood_of_one_loop_is_coalesced_without_args(kafka_bootstrap: str) -> None:
    topic = await new_topic(kafka_bootstrap)
    flood = critical_loop_events(
        50,
        "flood",
        session_key="sim:flood",
        warning_key="run-0:unknown-tool:deploy",
        args={"command": "deploy", "api_key": "sk-live-SECRET"},
    )

    def events_posted() -> int:
        return sum(post.get("coalesced", {}).get("events", 1) for post in hook.received)

    with Webhook() as hook:
        notify = Notify(kafka_bootstrap, topic, hook, _group(), "--coalesce-seconds", "2")
        try:
            await notify.start()
            await produce(kafka_bootstrap, topic, flood)
            await until(lambda: events_posted() == 50, 30)
            await asyncio.sleep(2.5)  # another window: nothing more
        finally:
            await notify.stop()

    assert 1 <= len(hook.received) <= 2, [post["text"] for post in hook.received]
    assert events_posted() == 50
    assert hook.received[-1]["loop_event"]["event_id"] == flood[-1]["event_id"]
    assert not any(b"SECRET" in body or b'"args"' in body for body in hook.bodies)


async def test_a_refused_event_goes_to_the_dead_letter_file_once(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    topic, group = await new_topic(kafka_bootstrap), _group()
    refused, fine = critical_loop_events(2, "refused")
    dead = tmp_path / "dead.jsonl"

    def answer(post: dict[str, Any]) -> int:
        return 400 if post["loop_event"]["event_id"] == refused["event_id"] else 200

    with Webhook(answer=answer) as hook:
        notify = Notify(kafka_bootstrap, topic, hook, group, "--dead-letter-file", str(dead))
        try:
            await notify.start()
            await produce(kafka_bootstrap, topic, [refused, fine])
            await until(lambda: len(hook.received) == 1 and dead.stat().st_size > 0, 30)
            await asyncio.sleep(0.5)  # the commit
            assert await notify.stop(signal.SIGKILL) == -signal.SIGKILL
            await notify.start()  # resumes after both: neither is tried again
            await asyncio.sleep(1)
        finally:
            await notify.stop()

    (letter,) = [orjson.loads(line) for line in dead.read_bytes().splitlines()]
    assert (letter["reason"], letter["attempts"], letter["topic"]) == ("http_400", 1, topic)
    assert letter["loop_event"]["event_id"] == refused["event_id"]
    assert hook.event_ids() == [fine["event_id"]] and hook.attempts == 2
