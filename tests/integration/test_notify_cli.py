"""``loopfuse notify`` as a process: the session broker in, a local webhook out."""

from __future__ import annotations

import asyncio
import socket
import sys
import urllib.request
from pathlib import Path

from tests.support.kafka import fixture_records, new_topic, produce
from tests.support.webhook import Webhook

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_notify_posts_critical_loop_events_from_the_topic(kafka_bootstrap: str) -> None:
    topic = await new_topic(kafka_bootstrap)
    events = fixture_records()
    critical = next(e for e in events if e["level"] == "critical")
    warning = next(e for e in events if e["level"] == "warning")
    port = _free_port()
    with Webhook(statuses=[500]) as hook:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "loopfuse.streams.cli", "notify", "--bootstrap", kafka_bootstrap,
            "--topic", topic, "--webhook", hook.url, "--metrics-port", str(port),
            "--backoff", "0.05",
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE, cwd=ROOT,
        )
        try:
            assert process.stderr is not None
            line = await asyncio.wait_for(process.stderr.readline(), 60)
            assert b"from the end" in line, line
            await produce(kafka_bootstrap, topic, [warning, b"\x00 not json", critical])
            metrics = b""
            for _ in range(300):  # until the webhook has it and the notifier has counted it
                metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
                if hook.received and b"loopfuse_notify_sent_total 1.0" in metrics:
                    break
                await asyncio.sleep(0.1)
            assert process.returncode is None  # still running after a bad record
        finally:
            process.terminate()
            await asyncio.wait_for(process.wait(), 30)

    assert [r["loop_event"] for r in hook.received] == [critical]
    assert hook.attempts == 2  # the first answer was a 500
    assert b"loopfuse_notify_sent_total 1.0" in metrics
    assert b"loopfuse_notify_skipped_records_total 1.0" in metrics
    assert b"loopfuse_notify_retries_total 1.0" in metrics
