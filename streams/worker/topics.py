"""loopfuse's topics (created with the right partition counts, re-created if lost) and
the worker's readiness, which depends on them."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable, Sequence
from typing import Any

import faust
import orjson
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError, TopicAlreadyExistsError, TopicAuthorizationFailedError

from loopfuse.streams.settings import Settings
from loopfuse.streams.worker.faust_compat.consumer import refresh_consumer_metadata
from loopfuse.streams.worker.faust_compat.producer import broker_metadata, unreachable_leaders
from loopfuse.streams.worker.faust_compat.recovery import recovery_progress

log = logging.getLogger("loopfuse.worker")

SESSION_TABLE = "sessions"


class TopicMismatchError(RuntimeError):
    """An existing topic's partition count breaks co-partitioning."""


class TopicAccessDenied(RuntimeError):
    """The broker's ACLs refuse the worker's principal one of its topics."""


_TOPIC_AUTHORIZATION_FAILED = TopicAuthorizationFailedError.errno


def _denied(settings: Settings, topics: Sequence[str], operation: str) -> TopicAccessDenied:
    user = settings.sasl_username
    who = f"user {user!r}" if user else "the worker's principal"
    listed = ", ".join(repr(t) for t in sorted(topics))
    return TopicAccessDenied(
        f"the broker's ACLs do not let {who} {operation} topic {listed}: grant the worker's "
        f"role (infra/kafka/kafka-acls.sh worker User:{user or 'NAME'}; README: Running in "
        "production)"
    )


def changelog_topic(settings: Settings) -> str:
    """Faust's name for the session table's changelog topic."""
    return settings.changelog_name  # f"{app_id}-{SESSION_TABLE}-changelog"


def wanted_topics(settings: Settings, fleet_breaker: bool) -> list[str]:
    """Every topic the worker uses (the fleet breaker's only when it is configured)."""
    wanted = [
        *settings.input_topics,
        changelog_topic(settings),
        *settings.verdict_topics,
        *settings.output_topics[1:],
        *settings.reply_topic_names,
    ]
    return wanted + list(settings.fleet_topics) if fleet_breaker else wanted


def reply_partitions(settings: Settings, cluster: Any) -> dict[str, int]:
    """Each reply topic's partition count as the cluster metadata has it (a topic the
    broker does not have is left out: its replies go to the verdicts topic)."""
    counts = {}
    for name in settings.reply_topic_names:
        partitions = cluster.partitions_for_topic(name)
        if partitions:
            counts[name] = len(partitions)
    return counts


def update_replies(replies: dict[str, int], counts: dict[str, int]) -> None:
    """Make the live mapping the processor reads say ``counts`` (between its calls)."""
    for name in [name for name in replies if name not in counts]:
        del replies[name]
    replies.update(counts)


def _compacted(settings: Settings, name: str) -> bool:
    return name in (changelog_topic(settings), settings.topic_tool_breakers)


#: A reply topic's retention: a verdict is read within seconds of being published.
REPLY_RETENTION_MS = 3_600_000


def topic_configs(settings: Settings, name: str) -> dict[str, str]:
    """The configs a created topic gets: compaction for the changelogs, a short retention
    for the reply topics, and the ``min.insync.replicas`` of a replicated cluster (a
    single node keeps the broker's)."""
    configs = {"cleanup.policy": "compact"} if _compacted(settings, name) else {}
    if name in settings.reply_topic_names:
        configs["retention.ms"] = str(REPLY_RETENTION_MS)
    if settings.min_insync_replicas > 1:
        configs["min.insync.replicas"] = str(settings.min_insync_replicas)
    return configs


async def ensure_topics(
    settings: Settings, *, timeout: float = 30.0, fleet_breaker: bool = False
) -> None:
    """Create missing topics with ``settings.partitions``; fail on a mismatching one.

    Idempotent. Faust itself only declares internal topics and silently accepts
    an existing topic of any size, but a session's events, its table updates and
    its verdicts must all land on the same partition number, so every input topic
    and the changelog must have exactly ``settings.partitions``. Output topics are
    created with the same count for symmetry but any count works for them.
    """
    admin = AIOKafkaAdminClient(
        bootstrap_servers=settings.bootstrap_servers,
        client_id=f"{settings.app_id}-topic-check",
        request_timeout_ms=int(timeout * 1000),
        **settings.kafka_client_kwargs(),
    )
    deadline = time.monotonic() + timeout
    await asyncio.wait_for(admin.start(), timeout)
    try:
        delay = 0.2
        while True:
            try:
                return await _ensure_topics(admin, settings, fleet_breaker)
            except KafkaError as exc:
                # The admin client sends each request to a random node of the metadata;
                # on a cluster with a node down (not fenced yet) that may be the dead
                # one. Retriable errors are retried on another; the steps are idempotent.
                if not exc.retriable or time.monotonic() + delay > deadline:
                    raise
                log.info("topic check: %r; retrying", exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
    finally:
        await admin.close()


async def _ensure_topics(
    admin: AIOKafkaAdminClient, settings: Settings, fleet_breaker: bool
) -> None:
    """:func:`ensure_topics`' steps, each idempotent (retried whole)."""
    strict = [*settings.input_topics, changelog_topic(settings)]
    wanted = wanted_topics(settings, fleet_breaker)
    replies = set(settings.reply_topic_names)
    existing = set(await admin.list_topics())
    missing = [name for name in wanted if name not in existing]
    if missing:
        new = [
            NewTopic(
                name,
                settings.reply_partitions if name in replies else settings.partitions,
                settings.replication_factor,
                topic_configs=topic_configs(settings, name),
            )
            for name in missing
        ]
        # another worker may win the race: the size check below still applies
        with contextlib.suppress(TopicAlreadyExistsError):
            response = await admin.create_topics(new)
            refused = [
                error[0]
                for error in getattr(response, "topic_errors", ())
                if error[1] == _TOPIC_AUTHORIZATION_FAILED
            ]
            if refused:  # list_topics shows only what the principal may describe
                raise _denied(settings, refused, "describe or create")
    counts = await _partition_counts(admin, strict, settings)
    wrong = {name: n for name, n in counts.items() if n != settings.partitions}
    if wrong:
        detail = "; ".join(
            f"topic {name!r} has {n} partitions, expected {settings.partitions}"
            for name, n in wrong.items()
        )
        raise TopicMismatchError(
            f"{detail} (LOOPFUSE_PARTITIONS={settings.partitions}). Input topics and the "
            "changelog must have equal partition counts so a session's events and state "
            "stay on one partition: recreate the topic or change LOOPFUSE_PARTITIONS."
        )


async def _partition_counts(
    admin: AIOKafkaAdminClient, topics: Sequence[str], settings: Settings
) -> dict[str, int]:
    # describe_topics can race topic creation on some brokers: retry briefly until
    # every topic reports partitions.
    for _ in range(50):
        described = await admin.describe_topics(list(topics))
        refused = [
            d["topic"] for d in described if d.get("error_code") == _TOPIC_AUTHORIZATION_FAILED
        ]
        if refused:
            raise _denied(settings, refused, "describe")
        counts = {d["topic"]: len(d.get("partitions") or ()) for d in described}
        if all(counts.get(name) for name in topics):
            return counts
        await asyncio.sleep(0.1)
    raise TopicMismatchError(f"topics {list(topics)} did not become visible: {counts}")


async def restore_lost_topics(
    settings: Settings,
    cluster: Any,
    on_fatal: Callable[[int, str], None],
    fleet_breaker: bool = False,
) -> list[str]:
    """Re-create loopfuse's topics if the broker no longer has them; the ones still missing.

    A broker that comes back without them has lost everything (the in-memory test
    broker after a restart, or a wiped cluster): the session table's changelog and
    the group's offsets with them. Judging goes on with what the worker holds in
    memory, but nothing of it is persisted until the changelog exists again, and a
    gateway's next event would let the broker auto-create an input topic with its
    default partition count, splitting sessions across partitions. So they are
    re-created at once with the configured size. An input topic that came back with
    another size cannot be repaired here: the worker stops (exit code 2), as at
    start-up.
    """
    wanted = wanted_topics(settings, fleet_breaker)
    present = cluster.topics()
    missing = [name for name in wanted if name not in present]
    if not missing:
        return []
    log.error(
        "the broker has lost topics %s (a restarted in-memory broker, or a wiped cluster): "
        "re-creating them; what the changelog held is gone",
        ", ".join(missing),
    )
    try:
        await ensure_topics(settings, timeout=10.0, fleet_breaker=fleet_breaker)
    except TopicMismatchError as exc:
        log.critical("%s Stopping (exit code 2).", exc)
        on_fatal(2, str(exc))
        return missing
    except Exception as exc:  # the broker went away again: the next probe retries
        log.warning("could not re-create topics: %r", exc)
        return missing
    return []


class RecoveryStall:
    """Table recovery that stopped moving: a worker that would never become ready.

    Readiness alone cannot get such a worker restarted (it is alive, just not ready),
    so after ``limit`` seconds without progress while the broker answers, ``/livez``
    fails and the orchestrator restarts it. A recovery that moves at all, or a broker
    that is down (a restart would not help), never counts as stalled.
    """

    def __init__(self, limit: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = limit
        self.clock = clock
        self._mark: tuple[int, float] | None = None  # (progress, since when)
        self.stalled_for: float | None = None  # seconds, once past the limit

    def observe(self, progress: int | None, broker_ok: bool) -> None:
        """Called every probe with :func:`recovery_progress` (None: not recovering)."""
        now = self.clock()
        if progress is None or not broker_ok or self._mark is None or progress != self._mark[0]:
            self._mark = None if progress is None else (progress, now)
            self.stalled_for = None
            return
        waited = now - self._mark[1]
        if waited >= self.limit:
            if self.stalled_for is None:
                log.error(
                    "table recovery made no progress for %.0f s with the broker reachable: "
                    "/livez fails so that the worker is restarted",
                    waited,
                )
            self.stalled_for = waited


class Readiness:
    """What ``/ready`` answers: the broker probe (every 2 s), lost topics, partitions
    whose leader is out of reach (a cluster that lost nodes), Faust's state."""

    def __init__(
        self,
        app: faust.App,
        settings: Settings,
        fleet_breaker: bool = False,
        replies: dict[str, int] | None = None,
    ) -> None:
        self.app = app
        self.settings = settings
        self.fleet_breaker = fleet_breaker
        # The reply topics' partition counts the processor routes by, kept current here
        # (an operator may add partitions, or a tenant's topic, while the worker runs).
        self.replies = replies if replies is not None else {}
        self.broker_ok = False
        self.checked = 0.0
        self.topics_missing: list[str] = []
        self.leaders_down: list[str] = []
        self.stall = RecoveryStall(settings.recovery_stall_seconds)

    async def probe(self) -> None:
        cluster = await broker_metadata(self.app)
        self.broker_ok, self.checked = cluster is not None, time.monotonic()
        self.stall.observe(recovery_progress(self.app), self.broker_ok)
        if cluster is not None:
            present = cluster.topics()
            lost = any(
                name not in present for name in wanted_topics(self.settings, self.fleet_breaker)
            )
            self.topics_missing = await restore_lost_topics(
                self.settings, cluster, self._stop_for_good, self.fleet_breaker
            )
            if lost and not self.topics_missing:
                # a group that joined while they were gone holds none of their partitions
                refresh_consumer_metadata(self.app)
            present_wanted = [
                name for name in wanted_topics(self.settings, self.fleet_breaker) if name in present
            ]
            self.leaders_down = await unreachable_leaders(self.app, cluster, present_wanted)
            update_replies(self.replies, reply_partitions(self.settings, cluster))
        else:
            self.leaders_down = []

    async def refresh_replies(self) -> None:
        """Read the reply topics' partition counts now (before the first batch)."""
        cluster = await broker_metadata(self.app)
        if cluster is not None:
            update_replies(self.replies, reply_partitions(self.settings, cluster))

    def _stop_for_good(self, code: int, reason: str) -> None:
        self.app.loopfuse_exit = (code, reason)  # type: ignore[attr-defined]
        os.kill(os.getpid(), signal.SIGTERM)  # mode's worker stops the app in order

    def add_pages(self) -> None:
        """The broker probe (every 2 s), ``/ready`` (200 or 503 with the reasons) and
        ``/livez`` (200 while the event loop answers)."""
        app = self.app

        @app.timer(2.0, name="probe_broker")  # type: ignore[untyped-decorator]
        async def probe_broker() -> None:
            await self.probe()

        @app.page("/ready")
        async def ready_page(web: Any, request: Any) -> Any:
            reasons = self.reasons()
            body = orjson.dumps({"ready": not reasons, "reasons": reasons})
            return web.bytes(body, content_type="application/json", status=503 if reasons else 200)

        @app.page("/livez")
        async def livez_page(web: Any, request: Any) -> Any:
            stalled = self.stall.stalled_for
            if stalled is None:
                return web.bytes(b'{"live":true}', content_type="application/json")
            body = orjson.dumps(
                {"live": False, "reason": f"table recovery stalled for {stalled:.0f} s"}
            )
            return web.bytes(body, content_type="application/json", status=503)

    def reasons(self) -> list[str]:
        """Why the worker is not ready; empty when it is."""
        app = self.app
        reasons = []
        if not self.broker_ok or time.monotonic() - self.checked > 10:
            reasons.append("broker unreachable")
        if self.topics_missing:
            reasons.append("topics missing: " + ", ".join(self.topics_missing))
        if self.leaders_down and self.broker_ok:
            # a cluster that lost nodes (two of three: no quorum to elect new leaders)
            shown = ", ".join(self.leaders_down[:6])
            more = len(self.leaders_down) - 6
            reasons.append(
                "partition leaders unreachable: "
                + shown
                + (f" and {more} more" if more > 0 else "")
            )
        if app.rebalancing:
            reasons.append("rebalancing")
        if app.in_recovery or not app.tables.recovery.completed.is_set():  # type: ignore[attr-defined]
            reasons.append("recovering tables")
        return reasons
