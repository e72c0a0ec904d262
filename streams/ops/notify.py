"""``loopfuse notify``: critical loop events POSTed to a webhook (Slack-compatible JSON).

A consumer of its own rather than a sink inside the worker: judging must never wait
on somebody's HTTP endpoint, a webhook outage must not touch the workers' batches,
offsets or restarts, and one notifier serves any number of workers.

What it guarantees, and how:

* **At least once.** It reads with a consumer group of its own and commits a
  record's offset only once the record is dealt with: its post was delivered, or
  given up and written to the dead-letter file. A crash, SIGKILL or SIGTERM loses
  nothing: what was not dealt with is read again at the next start (SIGTERM first
  drains for a while). Records published while it is down are read when it is back.
* **Once per loop event.** Loop-event ids are deterministic, so a record the
  worker published twice (at-least-once after a worker crash) is posted once; the
  ids are remembered in a bounded, ordered map. Across a notify restart, what was
  delivered but not yet committed (the last fraction of a second) is posted again.
* **Coalesced.** The first critical loop event of a session's loop (its
  ``warning_key``, else its detector) is posted at once; repeats within the window
  after a post wait for the window to end and go out as one post with their count
  (an agent retrying a blocked call 50 times gives two posts, not 51).
* **Rate-limited** per webhook (a token bucket; a 429's ``Retry-After`` pauses
  every post), with several posts in flight: an event being retried waits on its
  own timer and holds no sender, so it never blocks the others.
* **Bounded.** At most ``max_pending`` records are held; beyond that reading
  pauses (the consumer stays in its group), so an outage makes records wait
  uncommitted on the broker, never dropped.
* **Inert, bounded text.** Every string of a loop event comes from an agent: each
  string a post carries (in ``text`` and in ``loop_event``, object keys too) is shown
  as escaped plain text (:func:`loopfuse.streams.ops.plain.shown`) with the
  characters chats read as markup in an inert form (:data:`CHAT_MARKUP`), so no value
  can mention, ping, link or load an image in Slack, Mattermost or Rocket.Chat; each
  is cut at :data:`ID_CHARS` (a message at :data:`MESSAGE_CHARS`) and a post never
  passes :data:`MAX_POST_BYTES`. The ``loop_event`` posted is an allow-list of
  fields: never the config, never the call's ``args`` unless ``include_args``
  (``--include-args``).

The webhook URL is a secret (Slack's carries its token): it is taken from the
environment or a file, never the command line, and never printed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import heapq
import itertools
import logging
import os
import signal
import sys
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import orjson
from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server
from pydantic import SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from loopfuse.streams.broker_access import explain
from loopfuse.streams.ops.plain import Markup, shown, shown_all
from loopfuse.streams.ops.topic_reader import TopicRecord

log = logging.getLogger("loopfuse.notify")

MAX_BACKOFF_SECONDS = 30.0
#: A Retry-After beyond this is taken as this (a misconfigured endpoint must not
#: silence notifications for a day).
MAX_RETRY_AFTER_SECONDS = 300.0
#: Characters of one string a post carries (an identifier, a key, a value of ``args``),
#: and of the message, after escaping.
ID_CHARS = 200
MESSAGE_CHARS = 1_000
#: Bytes of one post at most. What ``text`` and ``coalesced`` can hold stays far below
#: it (``text`` measured 8,864 bytes with every string cut, 4 bytes a character);
#: ``loop_event``'s values, largest first, are left out (:data:`LEFT_OUT`) until the
#: post fits.
MAX_POST_BYTES = 32_768
LEFT_OUT = "(left out: the post would pass its size cap)"
#: What chats read as markup in a post's text, each shown inert. ``<`` ``&`` ``>``:
#: Slack's ``<!channel>``, ``<@U123>``, ``<url|label>`` and Markdown's autolinks
#: ``<https://…>`` (as entities, which Slack and Markdown show as typed); ``[``:
#: Markdown links and images, ``[label](url)``, ``![alt](src)``, ``[label][ref]``;
#: ``@``: mentions in Mattermost and Rocket.Chat (``@channel``, ``@all``, ``@user``) and
#: e-mail autolinks; a backslash: Markdown reads ``\\`` as one, so an escape shown
#: would no longer be told from the agent's own text.
CHAT_MARKUP: Markup = {
    "&": "&amp;",
    "<": "&lt;",
    ">": "&gt;",
    "[": "\\x5b",
    "@": "\\x40",
    "\\": "\\x5c",
}

#: The loop-event fields a post carries (schemas.events.LoopEvent minus ``config``,
#: which is noise in a chat, and ``args``, which may hold secrets: see include_args).
POSTED_FIELDS = frozenset(
    (
        "type",
        "event_id",
        "session_key",
        "run_id",
        "agent_id",
        "call_id",
        "seq",
        "incarnation",
        "tool_name",
        "paired_tool_name",
        "action",
        "level",
        "detector",
        "count",
        "message",
        "args_hash",
        "warning_key",
        "enforced",
        "fleet",
        "event_ts",
        "decided_ts",
    )
)


class NotifySettings(BaseSettings):
    """``LOOPFUSE_NOTIFY_*``: where the webhook URL comes from (the variable, or a file)
    and where give-ups go.

    The URL is not a flag: a command line is visible to every user of the machine
    (``ps``). (Not in the worker's settings: notify is a process of its own.)
    """

    model_config = SettingsConfigDict(env_prefix="LOOPFUSE_NOTIFY_", frozen=True, extra="ignore")

    webhook_url: SecretStr | None = None
    webhook_file: Path | None = None
    dead_letter_file: Path = Path("loopfuse-notify-dead-letters.jsonl")


class WebhookMissing(ValueError):
    """No usable webhook URL; the message never includes the URL."""


def webhook_url(settings: NotifySettings, file: Path | None = None) -> str:
    """The URL from ``file`` (a flag), else the settings' file, else their URL."""
    path = file or settings.webhook_file
    if path is not None:
        try:
            url = path.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
            raise WebhookMissing(f"cannot read the webhook file {path}: {reason}") from None
        source = f"the webhook file {path}"
    elif settings.webhook_url is not None:
        url = settings.webhook_url.get_secret_value().strip()
        source = "LOOPFUSE_NOTIFY_WEBHOOK_URL"
    else:
        raise WebhookMissing(
            "no webhook: set LOOPFUSE_NOTIFY_WEBHOOK_URL or give --webhook-file FILE"
        )
    if not url.startswith(("http://", "https://")) or any(c.isspace() for c in url):
        raise WebhookMissing(f"{source} does not hold one http:// or https:// URL")
    return url


class NotifyMetrics:
    """The notifier's Prometheus counters (its own registry, its own port)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.sent = Counter("loopfuse_notify_sent", "Posts delivered", registry=r)
        self.failures = Counter(
            "loopfuse_notify_failures",
            "Posts given up on (their records are in the dead-letter file)",
            ["reason"],
            registry=r,
        )
        self.retries = Counter(
            "loopfuse_notify_retries", "Delivery attempts after a failed one", registry=r
        )
        self.rate_limited = Counter(
            "loopfuse_notify_rate_limited", "HTTP 429 answers (every post waits)", registry=r
        )
        self.skipped = Counter(
            "loopfuse_notify_skipped_records",
            "Records on the topic that are not loop events",
            registry=r,
        )
        self.duplicates = Counter(
            "loopfuse_notify_duplicates",
            "Loop-event records not posted: their event id was already posted",
            registry=r,
        )
        self.coalesced = Counter(
            "loopfuse_notify_coalesced",
            "Loop events posted as part of another's post (repeats within the window)",
            registry=r,
        )
        self.dead_letters = Counter(
            "loopfuse_notify_dead_letters",
            "Loop events written to the dead-letter file (their post was given up)",
            registry=r,
        )
        self.queued = Gauge(
            "loopfuse_notify_queue",
            "Critical loop-event records read and not yet delivered or given up",
            registry=r,
        )

    def value(self, name: str, **labels: str) -> float:
        found = self.registry.get_sample_value(name, labels)
        return 0.0 if found is None else float(found)


# -- what is posted ------------------------------------------------------------------------


def inert(value: object, limit: int = ID_CHARS) -> str:
    """``value`` as inert text in a chat message: plain (``ops/plain``), the characters
    of :data:`CHAT_MARKUP` in their inert form, at most ``limit`` characters."""
    return shown(value, limit, CHAT_MARKUP)


def slack_text(event: Mapping[str, Any], repeats: int = 1, span_ms: int = 0) -> str:
    """What a human reads in the channel: one line, the repeats, the message."""
    where = ", ".join(
        f"{label} {inert(event[key])}"
        for label, key in (
            ("agent", "agent_id"),
            ("session", "session_key"),
            ("run", "run_id"),
            ("tool", "tool_name"),
        )
        if event.get(key)
    )
    shadow = " (shadow mode: allowed)" if event.get("enforced") is False else ""
    lines = [
        f":rotating_light: loopfuse {inert(str(event.get('action', '?')).upper())}"
        f"{shadow}: {inert(event.get('detector'))} "
        f"(count {inert(event.get('count'))}) - {where}"
    ]
    if repeats > 1:
        lines.append(
            f"{repeats} loop events like this in {span_ms / 1000:.1f} s (this is the last)"
        )
    if event.get("message"):
        lines.append(inert(event["message"], MESSAGE_CHARS))
    return "\n".join(lines)


def posted_event(event: Mapping[str, Any], include_args: bool = False) -> dict[str, Any]:
    """The loop event as posted: the allow-listed fields (``args`` only if asked), every
    string in them inert and cut (:func:`inert`; the message at MESSAGE_CHARS)."""
    # In the event's own order: the post reads like the record on the topic.
    return {
        name: shown_all(value, MESSAGE_CHARS if name == "message" else ID_CHARS, CHAT_MARKUP)
        for name, value in event.items()
        if name in POSTED_FIELDS or (include_args and name == "args")
    }


def post_body(document: dict[str, Any]) -> bytes:
    """``document`` (``text``, ``loop_event``, ...) as JSON of at most MAX_POST_BYTES:
    the largest values of its ``loop_event`` are left out until it fits."""
    body = orjson.dumps(document)
    if len(body) <= MAX_POST_BYTES:
        return body
    event = dict(document["loop_event"])
    note = orjson.dumps(LEFT_OUT)
    sizes = sorted(
        ((len(orjson.dumps(value)), name) for name, value in event.items()), reverse=True
    )
    for size, name in sizes:
        if size <= len(note):
            break
        event[name] = LEFT_OUT
        body = orjson.dumps({**document, "loop_event": event})
        if len(body) <= MAX_POST_BYTES:
            break
    return body


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


def coalescing_key(event: Mapping[str, Any]) -> tuple[str, str]:
    """Which loop events are repeats of one another: one session's one loop."""
    warning_key = event.get("warning_key")
    loop = warning_key if isinstance(warning_key, str) and warning_key else event["detector"]
    return str(event["session_key"]), str(loop)


# -- how hard to try -----------------------------------------------------------------------


@dataclass(frozen=True)
class Delivery:
    """How hard to try, and how many at once.

    A failed post (connection error, timeout, 408, 5xx) is retried after ``backoff``
    seconds, doubling up to 30 s, until ``retries`` more attempts were made (None: no
    limit) or ``give_up_after`` seconds passed since the first. A 429 waits for its
    Retry-After and counts only against the time. Any other 4xx is given up at once.
    """

    retries: int | None = None
    backoff: float = 0.5
    timeout: float = 10.0
    give_up_after: float = 3_600.0
    concurrency: int = 4

    def delay(self, attempt: int) -> float:
        return float(min(self.backoff * 2.0**attempt, MAX_BACKOFF_SECONDS))


@dataclass(frozen=True)
class Shaping:
    """What reaches the channel, and how fast: coalescing, rate limit, deduplication."""

    coalesce_seconds: float = 60.0
    rate: float = 1.0  # posts per second (Slack allows about one per webhook); 0: no limit
    burst: int = 5
    remembered_ids: int = 100_000  # ~10 MB
    max_pending: int = 10_000  # records held before reading pauses
    include_args: bool = False


class TokenBucket:
    """Posts per second with bursts, and a pause for everyone after a 429."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float]) -> None:
        self.rate = rate
        self.burst = max(1, burst)
        self.clock = clock
        self.tokens = float(self.burst)
        self.stamp = clock()
        self.held_until = 0.0

    def wait(self) -> float:
        """Seconds until a post may go (0: now, and the token is taken)."""
        now = self.clock()
        if now < self.held_until:
            return self.held_until - now
        if self.rate <= 0:
            return 0.0
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        return (1 - self.tokens) / self.rate

    async def take(self) -> None:
        while (seconds := self.wait()) > 0:
            await asyncio.sleep(seconds)

    def hold(self, seconds: float) -> None:
        self.held_until = max(self.held_until, self.clock() + seconds)


def retry_after(header: str | None) -> float | None:
    """A Retry-After header's seconds (delta-seconds or an HTTP date), capped."""
    if not header:
        return None
    header = header.strip()
    try:
        seconds = float(header)
    except ValueError:
        try:
            seconds = parsedate_to_datetime(header).timestamp() - time.time()
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
    if seconds != seconds:  # NaN
        return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_SECONDS)


# -- the bookkeeping -----------------------------------------------------------------------


class PartitionProgress:
    """Which offsets of one partition are dealt with: what may be committed.

    Records are read in offset order but finish in any order (a retried post takes
    longer), so the committable offset is the lowest one not yet dealt with.
    """

    def __init__(self) -> None:
        self.order: deque[int] = deque()
        self.waiting: set[int] = set()
        self.next_offset: int | None = None
        self.committed: int | None = None

    def read(self, offset: int, done: bool) -> None:
        self.next_offset = offset + 1
        if not done:
            self.order.append(offset)
            self.waiting.add(offset)

    def done(self, offset: int) -> None:
        self.waiting.discard(offset)

    def committable(self) -> int | None:
        """The next offset to read after a restart, when it moved since the last commit."""
        while self.order and self.order[0] not in self.waiting:
            self.order.popleft()
        offset = self.order[0] if self.order else self.next_offset
        if offset is None or offset == self.committed:
            return None
        return offset


@dataclass(eq=False)
class Notification:
    """One post to make: the loop events it stands for and the records they came in.

    Open (accepting repeats) until a sender takes it; then sealed, and retried as is.
    """

    key: tuple[str, str]
    events: list[tuple[dict[str, Any], TopicRecord]] = field(default_factory=list)
    # every record whose offset waits for this post: the events' and their duplicates'
    tickets: list[tuple[PartitionProgress, int]] = field(default_factory=list)
    sealed: bool = False
    attempts: int = 0
    first_attempt: float | None = None

    def body(self, include_args: bool) -> bytes:
        first, last = self.events[0][0], self.events[-1][0]
        document: dict[str, Any] = {"loop_event": posted_event(last, include_args)}
        span = 0
        if len(self.events) > 1:
            first_ts, last_ts = first.get("event_ts"), last.get("event_ts")
            if isinstance(first_ts, int) and isinstance(last_ts, int):
                span = max(0, last_ts - first_ts)
            document["coalesced"] = {
                "events": len(self.events),
                "first_event_id": shown_all(first.get("event_id"), ID_CHARS, CHAT_MARKUP),
                "first_event_ts": shown_all(first_ts, ID_CHARS, CHAT_MARKUP),
            }
        document = {"text": slack_text(last, len(self.events), span), **document}
        return post_body(document)


class DeadLetterFile:
    """Loop events whose post was given up, one JSON line each as it was posted (its
    topic, partition and offset find the record itself), on disk before commit."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def check(self) -> None:
        """Fail at start-up, not at the first give-up, when the file cannot be written."""
        with self.path.open("ab"):
            pass

    def write(
        self, notification: Notification, reason: str, topic: str, include_args: bool
    ) -> None:
        given_up = int(time.time() * 1000)
        lines = b"".join(
            orjson.dumps(
                {
                    "reason": reason,
                    "attempts": notification.attempts,
                    "given_up_ts": given_up,
                    "topic": topic,
                    "partition": record.partition,
                    "offset": record.offset,
                    "loop_event": posted_event(event, include_args),
                }
            )
            + b"\n"
            for event, record in notification.events
        )
        with self.path.open("ab") as out:
            out.write(lines)
            out.flush()
            os.fsync(out.fileno())  # the offsets are committed next


class RecordSource(Protocol):
    """Where records come from (a :class:`~loopfuse.streams.ops.topic_reader.GroupReader`,
    or a list in tests): records in offset order per partition, commits of offsets."""

    async def records(self, timeout: float) -> Sequence[TopicRecord] | None:
        """The next records (possibly none); None: the input has ended."""
        ...

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    async def commit(self, offsets: Mapping[int, int]) -> bool: ...


class _Retryable(Exception):
    def __init__(self, reason: str, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after


class _Permanent(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# -- the notifier --------------------------------------------------------------------------


class Notifier:
    """Records in; posts out; offsets committed once their records are dealt with.

    ``run`` reads (pausing when ``max_pending`` records are held), offers each record,
    and commits every ``poll_seconds``; ``concurrency`` senders take the notifications
    that are due, oldest first, each after a token from the bucket.
    """

    def __init__(
        self,
        webhook: str,
        delivery: Delivery | None = None,
        shaping: Shaping | None = None,
        *,
        dead_letters: DeadLetterFile | None = None,
        topic: str = "",
        metrics: NotifyMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        poll_seconds: float = 0.2,
    ) -> None:
        self.webhook = webhook
        self.delivery = delivery or Delivery()
        self.shaping = shaping or Shaping()
        self.dead_letters = dead_letters
        self.topic = topic
        self.metrics = metrics or NotifyMetrics()
        self.clock = clock
        self.poll_seconds = poll_seconds
        self.bucket = TokenBucket(self.shaping.rate, self.shaping.burst, clock)
        self.partitions: dict[int, PartitionProgress] = {}
        # event id -> the notification it waits on, or None once delivered/given up
        self.seen: OrderedDict[str, Notification | None] = OrderedDict()
        self.open: dict[tuple[str, str], Notification] = {}
        # key -> end of the window opened by its last post (in post order: pruned from
        # the front)
        self.windows: OrderedDict[tuple[str, str], float] = OrderedDict()
        self.due: list[tuple[float, int, Notification]] = []
        self._order = itertools.count()
        self._changed = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self.pending = 0
        self._failure: BaseException | None = None

    # -- reading ---------------------------------------------------------------------

    def offer(self, record: TopicRecord) -> None:
        """Take one record from the topic; never raises, never waits."""
        progress = self.partitions.setdefault(record.partition, PartitionProgress())
        try:
            event, is_loop_event = critical_loop_event(record.value)
        except Exception:  # pragma: no cover - defensive: a record must never stop us
            event, is_loop_event = None, False
        if not is_loop_event:
            self.metrics.skipped.inc()
        if event is None:
            progress.read(record.offset, done=True)
            return
        progress.read(record.offset, done=False)
        ticket = (progress, record.offset)
        event_id = event.get("event_id")
        if isinstance(event_id, str) and event_id in self.seen:
            self.metrics.duplicates.inc()
            earlier = self.seen[event_id]
            if earlier is None:
                progress.done(record.offset)
            else:  # committed when the first copy's post is dealt with
                earlier.tickets.append(ticket)
                self._held(1)
            return
        key = coalescing_key(event)
        notification = self.open.get(key)
        if notification is None:
            notification = Notification(key)
            self.open[key] = notification
            # Due now, or when the window of this loop's last post ends.
            self._schedule(notification, max(self.clock(), self.windows.get(key, 0.0)))
        else:
            self.metrics.coalesced.inc()
        notification.events.append((event, record))
        notification.tickets.append(ticket)
        self._held(1)
        if isinstance(event_id, str):
            self.seen[event_id] = notification
            if len(self.seen) > self.shaping.remembered_ids:
                self.seen.popitem(last=False)

    def revoked(self, partitions: set[int]) -> dict[int, int]:
        """Partitions going to another group member: what to commit for them first.

        Their posts in flight still finish (the new owner may post them again: at
        least once); their progress is forgotten, a later assignment starts afresh.
        """
        offsets: dict[int, int] = {}
        for partition in partitions:
            progress = self.partitions.pop(partition, None)
            if progress is not None and (offset := progress.committable()) is not None:
                offsets[partition] = offset
        return offsets

    def _held(self, records: int) -> None:
        self.pending += records
        self.metrics.queued.set(self.pending)
        if self.pending:
            self._idle.clear()
        else:
            self._idle.set()

    # -- running ---------------------------------------------------------------------

    async def run(
        self,
        source: RecordSource,
        stop: asyncio.Event | None = None,
        *,
        drain_seconds: float = 10.0,
    ) -> None:
        """Read and deliver until ``stop`` is set (then drain for at most
        ``drain_seconds``) or the input ends (then drain until everything is dealt with);
        commit what was dealt with either way."""
        stop = stop or asyncio.Event()
        ended = False
        async with aiohttp.ClientSession() as http:
            senders = [
                asyncio.create_task(self._sender(http)) for _ in range(self.delivery.concurrency)
            ]
            try:
                while not stop.is_set():
                    self._check()
                    if self.pending >= self.shaping.max_pending:
                        source.pause()
                    else:
                        source.resume()
                    batch = await source.records(self.poll_seconds)
                    if batch is None:
                        ended = True
                        break
                    for record in batch:
                        self.offer(record)
                    await self._commit(source)
                    # A backlog is read without waiting: let the senders start on it.
                    await asyncio.sleep(0)
                # Stopping: what waits for its coalescing window or a retry goes now.
                now = self.clock()
                self.due = [(min(at, now), order, n) for at, order, n in self.due]
                heapq.heapify(self.due)
                self._changed.set()
                deadline = None if ended else now + drain_seconds
                while self.pending and (deadline is None or self.clock() < deadline):
                    self._check()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._idle.wait(), self.poll_seconds)
                    await self._commit(source)
                self._check()
                await self._commit(source)
            finally:
                for sender in senders:
                    sender.cancel()
                for sender in senders:
                    with contextlib.suppress(asyncio.CancelledError):
                        await sender

    def _check(self) -> None:
        if self._failure is not None:
            raise self._failure

    async def _commit(self, source: RecordSource) -> None:
        offsets = {
            partition: offset
            for partition, progress in self.partitions.items()
            if (offset := progress.committable()) is not None
        }
        if offsets and await source.commit(offsets):
            for partition, offset in offsets.items():
                if (progress := self.partitions.get(partition)) is not None:
                    progress.committed = offset

    # -- sending ---------------------------------------------------------------------

    async def _next_due(self) -> Notification:
        while True:
            now = self.clock()
            if self.due and self.due[0][0] <= now:
                return heapq.heappop(self.due)[2]
            wait = self.due[0][0] - now if self.due else None
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), wait)

    def _schedule(self, notification: Notification, at: float) -> None:
        heapq.heappush(self.due, (at, next(self._order), notification))
        self._changed.set()

    async def _sender(self, http: aiohttp.ClientSession) -> None:
        while True:
            notification = await self._next_due()
            if not notification.sealed:
                notification.sealed = True
                if self.open.get(notification.key) is notification:
                    del self.open[notification.key]
                self._open_window(notification.key)
            try:
                await self.bucket.take()
                await self._attempt(http, notification)
            except asyncio.CancelledError:
                raise
            except BaseException as exc:  # the dead-letter file: stop, commit nothing more
                self._failure = exc
                return

    def _open_window(self, key: tuple[str, str]) -> None:
        now = self.clock()
        windows = self.windows
        while windows and next(iter(windows.values())) <= now:
            windows.popitem(last=False)
        windows.pop(key, None)
        windows[key] = now + self.shaping.coalesce_seconds

    async def _attempt(self, http: aiohttp.ClientSession, notification: Notification) -> None:
        delivery, now = self.delivery, self.clock()
        if notification.first_attempt is None:
            notification.first_attempt = now
        elif notification.attempts:
            self.metrics.retries.inc()
        try:
            await self._post(http, notification.body(self.shaping.include_args))
        except _Retryable as exc:
            if exc.reason == "http_429":
                self.metrics.rate_limited.inc()
                wait = exc.retry_after if exc.retry_after is not None else delivery.delay(0)
                self.bucket.hold(wait)
                give_up = self.clock() + wait - notification.first_attempt > delivery.give_up_after
            else:
                wait = delivery.delay(notification.attempts)
                notification.attempts += 1
                give_up = (
                    delivery.retries is not None and notification.attempts > delivery.retries
                ) or self.clock() + wait - notification.first_attempt > delivery.give_up_after
            if give_up:
                self._given_up(notification, exc.reason)
            else:
                self._schedule(notification, self.clock() + wait)
            return
        except _Permanent as exc:
            notification.attempts += 1
            self._given_up(notification, exc.reason)
            return
        notification.attempts += 1
        self.metrics.sent.inc()
        self._finished(notification)

    def _given_up(self, notification: Notification, reason: str) -> None:
        event = notification.events[-1][0]
        if self.dead_letters is not None:
            self.dead_letters.write(notification, reason, self.topic, self.shaping.include_args)
            self.metrics.dead_letters.inc(len(notification.events))
        self.metrics.failures.labels(reason=reason).inc()
        log.warning(
            "notify: gave up on a post of %d loop event(s) of session %s after %d attempt(s) "
            "(%s)%s",
            len(notification.events),
            shown(event.get("session_key"), 80),
            notification.attempts,
            reason,
            f"; written to {self.dead_letters.path}" if self.dead_letters else "",
        )
        self._finished(notification)

    def _finished(self, notification: Notification) -> None:
        for event, _ in notification.events:
            event_id = event.get("event_id")
            if isinstance(event_id, str) and event_id in self.seen:
                self.seen[event_id] = None
        for progress, offset in notification.tickets:
            progress.done(offset)
        self._held(-len(notification.tickets))

    async def _post(self, http: aiohttp.ClientSession, body: bytes) -> None:
        timeout = aiohttp.ClientTimeout(total=self.delivery.timeout)
        try:
            async with http.post(
                self.webhook,
                data=body,
                headers={"Content-Type": "application/json"},
                timeout=timeout,
                allow_redirects=False,  # a redirect would send the event elsewhere
            ) as answer:
                await answer.read()
                status = answer.status
                if status < 300:
                    return
                if status == 429:
                    raise _Retryable("http_429", retry_after(answer.headers.get("Retry-After")))
                if status == 408 or status >= 500:
                    raise _Retryable(f"http_{status}")
                raise _Permanent(f"http_{status}")
        except TimeoutError:
            raise _Retryable("timeout") from None
        except aiohttp.ClientError:
            # Never the exception's text: aiohttp's include the URL (the secret).
            raise _Retryable("connection") from None
        except (_Retryable, _Permanent):
            raise
        except Exception:  # whatever else the HTTP stack throws: one event's bad luck
            raise _Retryable("error") from None


# -- the command ---------------------------------------------------------------------------


def _scrubbed(text: str, url: str) -> str:
    return text.replace(url, "<webhook>") if url else text


def run_notify(args: argparse.Namespace) -> int:
    from loopfuse.streams.ops.topic_reader import GroupReader, TopicMissing, reader_settings

    if args.webhook is not None:
        print(
            "loopfuse notify: --webhook is not taken: a URL on the command line is visible "
            "to every user (ps); set LOOPFUSE_NOTIFY_WEBHOOK_URL or give --webhook-file FILE",
            file=sys.stderr,
        )
        return 2
    notify_settings = NotifySettings()
    try:
        url = webhook_url(notify_settings, args.webhook_file)
    except WebhookMissing as exc:
        print(f"loopfuse notify: {exc}", file=sys.stderr)
        return 2
    if (
        (args.retries is not None and args.retries < 0)
        or args.backoff < 0
        or args.timeout <= 0
        or args.give_up_after <= 0
        or args.concurrency < 1
        or args.coalesce_seconds < 0
        or args.rate < 0
        or args.burst < 1
        or args.max_pending < 1
        or args.drain_seconds < 0
    ):
        print(
            "loopfuse notify: --retries/--backoff/--coalesce-seconds/--rate/--drain-seconds "
            "must be >= 0; --timeout/--give-up-after > 0; --concurrency/--burst/--max-pending "
            ">= 1",
            file=sys.stderr,
        )
        return 2
    dead_letters = DeadLetterFile(args.dead_letter_file or notify_settings.dead_letter_file)
    try:
        dead_letters.check()
    except OSError as exc:
        print(
            f"loopfuse notify: cannot write the dead-letter file {dead_letters.path}: "
            f"{exc.strerror}",
            file=sys.stderr,
        )
        return 2
    settings = reader_settings(args.bootstrap)
    topic = args.topic or settings.topic_loop_events
    notifier = Notifier(
        url,
        Delivery(args.retries, args.backoff, args.timeout, args.give_up_after, args.concurrency),
        Shaping(
            coalesce_seconds=args.coalesce_seconds,
            rate=args.rate,
            burst=args.burst,
            max_pending=args.max_pending,
            include_args=args.include_args,
        ),
        dead_letters=dead_letters,
        topic=topic,
    )
    if args.metrics_port:
        # Loopback only, like the worker's default: metrics are not for the world.
        start_http_server(args.metrics_port, addr="127.0.0.1", registry=notifier.metrics.registry)

    def assigned(partitions: list[int]) -> None:
        print(
            f"notify: assigned partitions {', '.join(map(str, partitions)) or 'none'} of {topic}",
            file=sys.stderr,
            flush=True,
        )

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        reader = GroupReader(
            settings.bootstrap_servers,
            topic,
            args.group,
            kafka_options=settings.kafka_client_kwargs(),
            revoked=notifier.revoked,
            assigned=assigned,
        )
        partitions = await reader.start()
        try:
            print(
                f"notify: reading {topic} ({partitions} partitions) as group {args.group}, "
                f"from its last commit (a new group: from the end); critical loop events go "
                f"to the webhook; give-ups to {dead_letters.path}"
                + (f"; metrics on 127.0.0.1:{args.metrics_port}" if args.metrics_port else ""),
                file=sys.stderr,
                flush=True,
            )
            await notifier.run(reader, stop, drain_seconds=args.drain_seconds)
        finally:
            await reader.stop()
        if notifier.pending:
            print(
                f"notify: stopped with {notifier.pending} loop-event record(s) not delivered; "
                "left uncommitted, they are read again at the next start",
                file=sys.stderr,
            )

    try:
        asyncio.run(main())
    except TopicMissing as exc:
        print(f"loopfuse notify: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0
    except Exception as exc:  # the broker went away for good, ...: one line, exit 1
        # a refused password, an untrusted certificate...: the variable to fix, exit 2
        diagnosis = explain(exc, settings.bootstrap_servers, settings.kafka_client_kwargs())
        if diagnosis is not None:
            print(f"loopfuse notify: {diagnosis.message}", file=sys.stderr)
            return 2 if diagnosis.lasting else 1
        print(f"loopfuse notify: {_scrubbed(str(exc), url)}", file=sys.stderr)
        return 1
    return 0
