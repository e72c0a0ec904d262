"""``loopfuse notify``'s delivery, against a real HTTP server on 127.0.0.1 (no broker).

The server (``tests.support.webhook``) runs in a thread and records what it was
sent; some answer with errors first, to exercise the retries.
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from typing import Any

import orjson
import pytest
from prometheus_client import start_http_server

from loopfuse.streams.ops.notify import Delivery, Notifier
from tests.support.kafka import fixture_records
from tests.support.webhook import Webhook

CRITICAL = next(e for e in fixture_records() if e["level"] == "critical" and e["action"] == "block")
WARNING = next(e for e in fixture_records() if e["level"] == "warning")


@pytest.fixture
def webhook() -> Iterator[Webhook]:
    with Webhook() as hook:
        yield hook


async def _records(*values: bytes | dict[str, Any]) -> AsyncIterator[bytes]:
    for value in values:
        yield value if isinstance(value, bytes) else orjson.dumps(value)


def _notifier(url: str, retries: int = 3) -> Notifier:
    return Notifier(url, Delivery(retries=retries, backoff=0.05, timeout=2.0))


async def test_critical_loop_events_are_posted_slack_style(webhook: Webhook) -> None:
    notifier = _notifier(webhook.url)
    await notifier.run(_records(WARNING, CRITICAL))

    assert len(webhook.received) == 1  # the warning is not notified
    posted = webhook.received[0]
    assert posted["loop_event"] == CRITICAL
    text = posted["text"]
    assert "BLOCK" in text and CRITICAL["detector"] in text
    assert f"session {CRITICAL['session_key']}" in text and f"agent {CRITICAL['agent_id']}" in text
    assert CRITICAL["message"] in text
    assert notifier.metrics.value("loopfuse_notify_sent_total") == 1


async def test_a_webhook_failing_twice_then_answering_gets_the_event_once() -> None:
    with Webhook(statuses=[500, 503]) as hook:
        notifier = _notifier(hook.url)
        await notifier.run(_records(CRITICAL))

    assert hook.attempts == 3 and len(hook.received) == 1
    gaps = [b - a for a, b in zip(hook.times, hook.times[1:], strict=False)]
    assert gaps[0] >= 0.05 and gaps[1] >= 0.1  # backoff doubles
    assert notifier.metrics.value("loopfuse_notify_retries_total") == 2
    assert notifier.metrics.value("loopfuse_notify_failures_total", reason="http_503") == 0
    assert notifier.metrics.value("loopfuse_notify_sent_total") == 1


async def test_retries_are_bounded_and_the_failure_is_counted() -> None:
    with Webhook(statuses=[502] * 10) as hook:
        notifier = _notifier(hook.url, retries=2)
        started = time.monotonic()
        await notifier.run(_records(CRITICAL))
        elapsed = time.monotonic() - started

    assert hook.attempts == 3 and hook.received == []
    assert elapsed < 2
    assert notifier.metrics.value("loopfuse_notify_failures_total", reason="http_502") == 1


async def test_a_client_error_is_not_retried_and_unreachable_is() -> None:
    with Webhook(statuses=[404]) as hook:
        notifier = _notifier(hook.url)
        await notifier.run(_records(CRITICAL))
    assert hook.attempts == 1
    assert notifier.metrics.value("loopfuse_notify_failures_total", reason="http_404") == 1

    down = _notifier(hook.url, retries=1)  # the server is gone: connection refused
    await down.run(_records(CRITICAL))
    assert down.metrics.value("loopfuse_notify_failures_total", reason="connection") == 1
    assert down.metrics.value("loopfuse_notify_retries_total") == 1


async def test_bad_records_never_stop_it(webhook: Webhook) -> None:
    notifier = _notifier(webhook.url)
    bad: list[bytes | dict[str, Any]] = [
        b"",
        b"not json",
        b"[1, 2]",
        b"\xff\xfe",
        {"type": "verdict", "level": "critical"},
        {"type": "loop_event", "level": "critical"},  # no detector, no session
        {**CRITICAL, "count": "many", "message": None, "agent_id": None, "run_id": 7},
    ]
    await notifier.run(_records(*bad, CRITICAL))

    assert len(webhook.received) == 2  # the odd but usable one, and the good one
    assert webhook.received[0]["loop_event"]["count"] == "many"
    assert webhook.received[1]["loop_event"] == CRITICAL
    assert notifier.metrics.value("loopfuse_notify_skipped_records_total") == 6


def test_metrics_are_served_with_the_failure_counter() -> None:
    notifier = _notifier("http://127.0.0.1:9/unused")
    notifier.metrics.failures.labels(reason="timeout").inc()
    server, thread = start_http_server(0, addr="127.0.0.1", registry=notifier.metrics.registry)
    try:
        port = server.server_address[1]
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
    assert b'loopfuse_notify_failures_total{reason="timeout"} 1.0' in text
