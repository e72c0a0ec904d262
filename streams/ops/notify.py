"""``loopfuse notify``: critical loop events POSTed to a webhook (Slack-compatible JSON).

A consumer of its own rather than a sink inside the worker: judging must never wait
on somebody's HTTP endpoint, a webhook outage must not touch the workers' batches,
offsets or restarts, and one notifier serves any number of workers. It follows the
loop-events topic from the end (no consumer group: loop events published while it
is down are not notified; ``loopfuse audit`` reads them later).

Each critical loop event (``level: critical``: blocks, aborts, circuit breakers) is
POSTed as ``{"text": ..., "loop_event": {...}}``; ``text`` is what Slack and
Slack-compatible webhooks (Mattermost, Rocket.Chat, Teams workflows) show. Failed
attempts are retried with exponential backoff, a bounded number of times; a
notification given up on counts in ``loopfuse_notify_failures_total{reason}``. A
record that is not a loop event is skipped and counted, never a crash. Reading and
sending are decoupled by a bounded queue, so a slow webhook never stalls reading.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

log = logging.getLogger("loopfuse.notify")

MAX_BACKOFF_SECONDS = 30.0
QUEUE_SIZE = 1000


class NotifyMetrics:
    """The notifier's Prometheus counters (its own registry, its own port)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.sent = Counter("loopfuse_notify_sent", "Notifications delivered", registry=r)
        self.failures = Counter(
            "loopfuse_notify_failures",
            "Notifications given up on after all retries (or dropped: queue full)",
            ["reason"],
            registry=r,
        )
        self.retries = Counter(
            "loopfuse_notify_retries", "Delivery attempts after a failed one", registry=r
        )
        self.skipped = Counter(
            "loopfuse_notify_skipped_records",
            "Records on the topic that are not loop events",
            registry=r,
        )
        self.queued = Gauge(
            "loopfuse_notify_queue", "Critical loop events waiting to be sent", registry=r
        )

    def value(self, name: str, **labels: str) -> float:
        found = self.registry.get_sample_value(name, labels)
        return 0.0 if found is None else float(found)


def slack_text(event: dict[str, Any]) -> str:
    """One line a human reads in a chat channel."""
    where = ", ".join(
        f"{label} {event[key]}"
        for label, key in (
            ("agent", "agent_id"),
            ("session", "session_key"),
            ("run", "run_id"),
            ("tool", "tool_name"),
        )
        if event.get(key)
    )
    shadow = " (shadow mode: allowed)" if event.get("enforced") is False else ""
    return (
        f":rotating_light: loopfuse {str(event.get('action', '?')).upper()}{shadow}: "
        f"{event.get('detector')} (count {event.get('count')}) - {where}\n"
        f"{event.get('message') or ''}"
    ).rstrip()


def critical_loop_event(value: bytes | None) -> tuple[dict[str, Any] | None, bool]:
    """(the event if it is a critical loop event, whether the record was a loop event)."""
    try:
        document = orjson.loads(value or b"")
    except orjson.JSONDecodeError:
        return None, False
    if not isinstance(document, dict) or document.get("type") != "loop_event":
        return None, False
    if not isinstance(document.get("detector"), str) or not document.get("session_key"):
        return None, False
    return (document if document.get("level") == "critical" else None), True


@dataclass
class Delivery:
    """How hard to try: ``retries`` more attempts after the first, delays doubling."""

    retries: int = 5
    backoff: float = 0.5
    timeout: float = 10.0

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        wait: float = self.backoff * 2.0**attempt
        if retry_after is not None:
            wait = max(wait, retry_after)
        return min(wait, MAX_BACKOFF_SECONDS)


class _Retryable(Exception):
    def __init__(self, reason: str, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after


class _Permanent(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Notifier:
    """Reads records, queues the critical loop events, POSTs them with retries."""

    def __init__(
        self, webhook: str, delivery: Delivery | None = None, metrics: NotifyMetrics | None = None
    ) -> None:
        self.webhook = webhook
        self.delivery = delivery or Delivery()
        self.metrics = metrics or NotifyMetrics()
        self.queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(QUEUE_SIZE)

    def offer(self, value: bytes | None) -> None:
        """Take one record from the topic; never raises, never waits."""
        try:
            event, is_loop_event = critical_loop_event(value)
        except Exception:  # pragma: no cover - defensive: a record must never stop us
            event, is_loop_event = None, False
        if not is_loop_event:
            self.metrics.skipped.inc()
            return
        if event is None:
            return
        try:
            self.queue.put_nowait(event)
        except asyncio.QueueFull:
            self.metrics.failures.labels(reason="queue_full").inc()
            log.warning("notify: queue full, dropped a notification for %s", event["session_key"])
        self.metrics.queued.set(self.queue.qsize())

    async def send(self, http: aiohttp.ClientSession, event: dict[str, Any]) -> bool:
        """POST one notification; True when delivered. Never raises."""
        body = orjson.dumps({"text": slack_text(event), "loop_event": event})
        reason = "unknown"
        for attempt in range(self.delivery.retries + 1):
            if attempt:
                self.metrics.retries.inc()
            try:
                await self._post(http, body)
                self.metrics.sent.inc()
                return True
            except _Retryable as exc:
                reason = exc.reason
                if attempt < self.delivery.retries:
                    await asyncio.sleep(self.delivery.delay(attempt, exc.retry_after))
            except _Permanent as exc:
                reason = exc.reason
                break
        self.metrics.failures.labels(reason=reason).inc()
        log.warning("notify: gave up on a notification for %s (%s)", event["session_key"], reason)
        return False

    async def _post(self, http: aiohttp.ClientSession, body: bytes) -> None:
        timeout = aiohttp.ClientTimeout(total=self.delivery.timeout)
        try:
            async with http.post(
                self.webhook,
                data=body,
                headers={"Content-Type": "application/json"},
                timeout=timeout,
            ) as answer:
                await answer.read()
                if answer.status < 300:
                    return
                if answer.status == 429 or answer.status >= 500:
                    retry_after = answer.headers.get("Retry-After", "")
                    raise _Retryable(
                        f"http_{answer.status}",
                        float(retry_after) if retry_after.isdigit() else None,
                    )
                raise _Permanent(f"http_{answer.status}")
        except TimeoutError:
            raise _Retryable("timeout") from None
        except aiohttp.ClientError:
            raise _Retryable("connection") from None

    async def run(self, records: AsyncIterator[bytes]) -> None:
        """Read ``records`` and deliver until the stream ends (then drain the queue)."""
        async with aiohttp.ClientSession() as http:
            sender = asyncio.create_task(self._send_loop(http))
            try:
                async for value in records:
                    self.offer(value)
                await self.queue.join()
            finally:
                sender.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sender

    async def _send_loop(self, http: aiohttp.ClientSession) -> None:
        while True:
            event = await self.queue.get()
            try:
                await self.send(http, event)
            finally:
                self.queue.task_done()
                self.metrics.queued.set(self.queue.qsize())


def run_notify(args: argparse.Namespace) -> int:
    from loopfuse.streams.ops.topic_reader import TopicMissing, follow, reader_settings

    if not args.webhook.startswith(("http://", "https://")):
        print("loopfuse notify: --webhook must be an http:// or https:// URL", file=sys.stderr)
        return 2
    if args.retries < 0 or args.backoff < 0 or args.timeout <= 0:
        print("loopfuse notify: --retries/--backoff must be >= 0, --timeout > 0", file=sys.stderr)
        return 2
    settings = reader_settings(args.bootstrap)
    topic = args.topic or settings.topic_loop_events
    notifier = Notifier(args.webhook, Delivery(args.retries, args.backoff, args.timeout))
    if args.metrics_port:
        # Loopback only, like the worker's default: metrics are not for the world.
        start_http_server(args.metrics_port, addr="127.0.0.1", registry=notifier.metrics.registry)

    def ready(partitions: int) -> None:
        print(
            f"notify: following {topic} ({partitions} partitions) from the end; "
            f"critical loop events go to the webhook"
            + (f"; metrics on 127.0.0.1:{args.metrics_port}" if args.metrics_port else ""),
            file=sys.stderr,
            flush=True,
        )

    records = follow(
        settings.bootstrap_servers,
        topic,
        kafka_options=settings.kafka_client_kwargs(),
        on_ready=ready,
    )
    try:
        asyncio.run(notifier.run(records))
    except TopicMissing as exc:
        print(f"loopfuse notify: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0
    except Exception as exc:  # the broker went away for good, ...: one line, exit 1
        print(f"loopfuse notify: {exc}", file=sys.stderr)
        return 1
    return 0
