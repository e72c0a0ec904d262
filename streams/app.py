"""The Faust stream adapter: input topics -> engine -> session table, verdicts, dead letters.

Thin plumbing around :class:`streams.engine.Engine`; no detection logic lives here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import faust
import orjson
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError, TopicAlreadyExistsError
from faust.streams import _current_event  # see _as_current_event
from faust.transport.producer import ProducerBuffer
from faust.types import TP, EventT
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    generate_latest,
)

from schemas.config import DetectionConfigFile, load_config
from schemas.decode import EventRejected, decode_event
from streams.engine import Engine, Notice, SessionState
from streams.fast_delivery import install_fast_delivery
from streams.faust_fixes import (
    ignore_phantom_gaps,
    keep_queues_on_redundant_resume,
    operators_only_web,
)
from streams.processor import Limits, Outgoing, SessionFold, Source, dead_letter
from streams.progress import InputProgress
from streams.settings import Settings

log = logging.getLogger("loopfuse.worker")

SESSION_TABLE = "sessions"
#: Decoded states kept between batches (see Judge._load); ~2-5 KB each.
STATE_CACHE_SIZE = 20_000


class TopicMismatchError(RuntimeError):
    """An existing topic's partition count breaks co-partitioning."""


# -- topics ---------------------------------------------------------------------------


def changelog_topic(settings: Settings) -> str:
    """Faust's name for the session table's changelog topic."""
    return f"{settings.app_id}-{SESSION_TABLE}-changelog"


async def ensure_topics(settings: Settings, *, timeout: float = 30.0) -> None:
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
        **settings.kafka_client_kwargs(),  # type: ignore[arg-type]
    )
    await asyncio.wait_for(admin.start(), timeout)
    try:
        strict = [*settings.input_topics, changelog_topic(settings)]
        wanted = [*strict, *settings.output_topics]
        existing = set(await admin.list_topics())
        missing = [name for name in wanted if name not in existing]
        if missing:
            new = [
                NewTopic(
                    name,
                    settings.partitions,
                    settings.replication_factor,
                    topic_configs=(
                        {"cleanup.policy": "compact"} if name == changelog_topic(settings) else {}
                    ),
                )
                for name in missing
            ]
            # another worker may win the race: the size check below still applies
            with contextlib.suppress(TopicAlreadyExistsError):
                await admin.create_topics(new)
        counts = await _partition_counts(admin, strict)
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
    finally:
        await admin.close()


async def _partition_counts(admin: AIOKafkaAdminClient, topics: Sequence[str]) -> dict[str, int]:
    # describe_topics can race topic creation on some brokers: retry briefly until
    # every topic reports partitions.
    for _ in range(50):
        described = await admin.describe_topics(list(topics))
        counts = {d["topic"]: len(d.get("partitions") or ()) for d in described}
        if all(counts.get(name) for name in topics):
            return counts
        await asyncio.sleep(0.1)
    raise TopicMismatchError(f"topics {list(topics)} did not become visible: {counts}")


# -- metrics --------------------------------------------------------------------------


class Metrics:
    """Prometheus counters of one worker; labels never carry session or run ids."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.events = Counter("loopfuse_events", "Input events judged", ["type"], registry=r)
        self.verdicts = Counter(
            "loopfuse_verdicts", "Verdicts published", ["action", "detector"], registry=r
        )
        self.loop_events = Counter(
            "loopfuse_loop_events", "Loop events published", ["detector"], registry=r
        )
        self.dead_letters = Counter(
            "loopfuse_dead_letters", "Inputs dead-lettered", ["reason"], registry=r
        )
        self.expired = Counter(
            "loopfuse_sessions_expired", "Idle sessions deleted from the table", registry=r
        )
        self.batches = Counter("loopfuse_batches", "Batches processed", registry=r)
        self.consumer_lag = Gauge(
            "loopfuse_consumer_lag",
            "Records of an input partition not judged yet (end offset as of the last fetch "
            "minus the next offset to judge)",
            ["topic", "partition"],
            registry=r,
        )
        self.shed = Counter(
            "loopfuse_state_shed",
            "Times a session's state was over its byte cap and its oldest evidence shed",
            registry=r,
        )
        self.input_behind = Gauge(
            "loopfuse_input_behind_seconds",
            "Wall clock minus the event time every input topic of the partition is judged "
            "up to, as of the last idle scan (-1: not known yet)",
            ["partition"],
            registry=r,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)


# -- the per-batch work ---------------------------------------------------------------


class _PartitionOnly:
    """Stands in for a Faust event where only the partition matters (timer deletes)."""

    __slots__ = ("__weakref__", "message")

    def __init__(self, topic: str, partition: int) -> None:
        self.message = _Message(topic, partition)


@dataclass(frozen=True, slots=True)
class _Message:
    topic: str
    partition: int


def _as_current_event(event: Any) -> None:
    """Make ``event`` Faust's current event in this task.

    A plain Table picks the store and the changelog partition of a write from the
    *current event* (a context variable Faust sets while iterating a stream), but
    ``take_events`` fills its buffer from a background task, so the agent task that
    consumes the batch has no current event of its own. We set it explicitly, to
    the event of the session being written (all of a session's messages share one
    partition number), which is exactly what Faust would have done per message.
    """
    _current_event.set(weakref.ref(event))


class Judge:
    """Turns one batch of input messages into table writes and messages to publish."""

    def __init__(self, app: faust.App, settings: Settings, engine: Engine, metrics: Metrics):
        self.app = app
        self.settings = settings
        self.engine = engine
        self.metrics = metrics
        table = app.conf.Table(
            app,
            name=SESSION_TABLE,
            default=None,
            partitions=settings.partitions,
            beacon=app.tables.beacon,
            on_changelog_event=self._on_changelog_event,
        )
        # Keys and values are raw bytes (the engine's codec). Faust derives a table's
        # serializers from key_type/value_type and falls back to JSON, so set them
        # before the table is registered, which creates its changelog topic.
        table.key_serializer = table.value_serializer = "raw"
        self.table: faust.Table = app.tables.add(table)
        # session key -> partition, for idle expiry (the memory store does not know
        # which partition a key belongs to; the timer must only delete keys of
        # partitions this worker actively owns).
        self.key_partition: dict[bytes, int] = {}
        # session key -> (the bytes we last wrote, the state they encode)
        self.decoded: dict[bytes, tuple[bytes, SessionState]] = {}
        self.progress = InputProgress(settings.input_topics)
        self.limits = Limits(
            max_state_bytes=settings.max_session_state_bytes,
            max_output_bytes=settings.producer_max_request_size,
            dead_letter_original_bytes=settings.dead_letter_original_bytes,
            max_identifier_bytes=settings.max_identifier_bytes,
        )
        # Sessions whose restarted gateway's first events wait for the input to move
        # on (Engine.release): key -> partition. Re-checked every batch and by a timer,
        # since the gateway sends nothing more until it has its verdict.
        self.waiting: dict[bytes, int] = {}
        self.topic_of = {
            "verdict": settings.topic_verdicts,
            "loop_event": settings.topic_loop_events,
            "dead_letter": settings.topic_dead_letters,
        }

    async def _on_changelog_event(self, event: EventT) -> None:
        key = event.message.key
        if key is None:
            return
        if event.message.value is None:
            self.key_partition.pop(key, None)
        else:
            self.key_partition[key] = event.message.partition

    # The batch is processed synchronously (no await between reading a session's
    # state and writing it back), so the expiry timer can never interleave with it.
    def judge(self, batch: Sequence[EventT]) -> list[tuple[str, bytes | None, bytes]]:
        """One batch in, the messages to publish out; table writes done.

        Poison isolation (streams.processor): whatever fails for one event - its
        bytes, its key, the engine, an output or the state over its size - becomes
        that event's dead letter and changes nothing else. Nothing here raises
        because of input, so a batch is never acknowledged unjudged.
        """
        settings, limits = self.settings, self.limits
        metrics = self.metrics
        now_ms = int(time.time() * 1000)
        out: list[tuple[str, bytes | None, bytes]] = []
        sessions: dict[bytes, list[tuple[Any, Source, EventT]]] = {}
        progress = self.progress
        for fevent in batch:
            message = fevent.message
            source = Source(
                message.topic, message.partition, message.offset, key=message.key,
                value=message.value,
            )
            try:
                decoded = decode_event(
                    message.value,
                    max_bytes=settings.max_event_bytes,
                    max_identifier_bytes=limits.max_identifier_bytes,
                )
            except EventRejected as exc:
                progress.judged(message.topic, message.partition, message.offset, None)
                self._emit(dead_letter(source, exc.code, exc.reason, limits), out)
                continue
            except Exception as exc:  # a decoder bug must not take the partition down
                log.exception("decoding failed")
                progress.judged(message.topic, message.partition, message.offset, None)
                reason = f"undecodable: {exc!r}"
                self._emit(dead_letter(source, "invalid_event", reason, limits), out)
                continue
            # A gateway clock running ahead counts as now: one far-future ts must not
            # move the partition's watermark and event clock for every session on it.
            progress.judged(
                message.topic, message.partition, message.offset, min(decoded.ts, now_ms)
            )
            key = decoded.key.encode("utf-8", "surrogatepass")
            if message.key != key:
                # A message on the wrong partition would split the session's state
                # across partitions (and workers): refuse it rather than guess.
                reason = (
                    f"message key {_show_key(message.key)} is not the event's session key "
                    f"{decoded.key[:80]!r}: events must be keyed by session_key (else run_id)"
                )
                self._emit(dead_letter(source, "invalid_event", reason, limits), out)
                continue
            metrics.events.labels(decoded.type).inc()
            sessions.setdefault(key, []).append((decoded, source, fevent))

        watermarks: dict[int, int | None] = {}
        for key, items in sessions.items():
            _as_current_event(items[-1][2])
            partition = items[-1][1].partition or 0
            watermark = self._watermark(partition, watermarks)
            if len(items) > 1 and all(decoded.seq is not None for decoded, _, _ in items):
                # The engine would park and drain them into seq order anyway; in
                # order they cost no parking.
                items.sort(key=lambda item: item[0].seq)
            fold = self._fold(key)
            for decoded, source, _ in items:
                fold.apply(decoded, source, now_ms, watermark)
            self._settle(key, fold, partition, out)
        self._release_waiting(now_ms, watermarks, out, skip=sessions)
        metrics.batches.inc()
        return out

    def release_waiting(self) -> list[tuple[str, bytes | None, bytes]]:
        """Apply what waits in sessions whose input has moved on (the timer's work)."""
        out: list[tuple[str, bytes | None, bytes]] = []
        if self.waiting:
            self._release_waiting(int(time.time() * 1000), {}, out, skip={})
            _current_event.set(None)
        return out

    def _release_waiting(
        self,
        now_ms: int,
        watermarks: dict[int, int | None],
        out: list[tuple[str, bytes | None, bytes]],
        skip: dict[bytes, Any],
    ) -> None:
        for key, partition in list(self.waiting.items()):
            if key in skip:
                continue
            source = Source(self.settings.topic_tool_calls, partition, key=key)
            _as_current_event(_PartitionOnly(self.settings.topic_tool_calls, partition))
            fold = self._fold(key)
            fold.release(now_ms, self._watermark(partition, watermarks), source)
            self._settle(key, fold, partition, out)  # writes only if the state changed

    def _watermark(self, partition: int, known: dict[int, int | None]) -> int | None:
        if partition not in known:
            # After the whole batch is counted: a missing event later in this batch
            # is not late (and the seq sort applies it first anyway).
            known[partition] = self.progress.watermark(
                partition, self._highwater, self._committed, self._answered_at
            )
        return known[partition]

    def _fold(self, key: bytes) -> SessionFold:
        raw = self.table.get(key)
        state = self._load(key, raw)
        # An unreadable state was logged and starts afresh: nothing to go back to.
        return SessionFold(self.engine, key, self.limits, raw if state else None, state)

    def _settle(
        self,
        key: bytes,
        fold: SessionFold,
        partition: int,
        out: list[tuple[str, bytes | None, bytes]],
    ) -> None:
        """Write the session's state back and queue the messages of what it includes."""
        before = fold.base
        data, messages = fold.checkpoint()
        if fold.shed:
            self.metrics.shed.inc(fold.shed)
        for message in messages:
            self._emit(message, out)
        for notice in fold.notices:
            self._log_notice(notice)
        state = fold.state
        if data is None or state is None:
            return
        if data != before:
            self.table[key] = data  # Faust persists (changelog) only on assignment
            self.key_partition[key] = partition
        self._remember(key, data, state)
        if state.pending:
            self.waiting[key] = partition
        else:
            self.waiting.pop(key, None)

    def _highwater(self, topic: str, partition: int) -> int | None:
        """End offset of an input partition as of the consumer's last fetch (None: unknown)."""
        try:
            return self.app.consumer.highwater(TP(topic, partition))  # type: ignore[no-any-return]
        except Exception:  # not assigned (any more), or no consumer yet
            return None

    def _answered_at(self, topic: str, partition: int) -> int | None:
        """Wall time (ms) of the consumer's last fetch answer for an input partition."""
        consumer = getattr(getattr(self.app.consumer, "_thread", None), "_consumer", None)
        if consumer is None:
            return None
        try:
            stamp = consumer.last_poll_timestamp(TP(topic, partition))
        except Exception:  # not assigned (any more)
            return None
        return int(stamp) if stamp else None

    def _committed(self, topic: str, partition: int) -> int | None:
        """Where judging of an input partition started: the group's committed offset."""
        # Faust keeps the offsets it sought to on assignment (and has committed
        # since) here; it stores 0 as None, which means the same to us.
        committed = getattr(self.app.consumer, "_committed_offset", None)
        return None if committed is None else committed.get(TP(topic, partition))

    def _load(self, key: bytes, raw: bytes | None) -> SessionState | None:
        """The session's state: reuse the decoded one when the table still holds our bytes.

        With ~100-event batches over many sessions most sessions appear once per
        batch, so decoding every time cost as much as the engine itself. The check
        against the stored bytes keeps this safe across recovery, deletes and
        rebalances: any other writer changes the bytes and we decode again.
        """
        cached = self.decoded.pop(key, None)
        if not raw:
            return None
        if cached is not None and (cached[0] is raw or cached[0] == raw):
            return cached[1]
        try:
            return SessionState.from_bytes(raw)
        except Exception:
            log.exception("unreadable state of session %r: starting it afresh", key[:80])
            return None

    def _remember(self, key: bytes, raw: bytes, state: SessionState) -> None:
        decoded = self.decoded
        decoded[key] = (raw, state)  # popped in _load: re-inserting keeps LRU order
        if len(decoded) > STATE_CACHE_SIZE:
            del decoded[next(iter(decoded))]

    def _emit(self, message: Outgoing, out: list[tuple[str, bytes | None, bytes]]) -> None:
        metrics = self.metrics
        if message.kind == "verdict":
            metrics.verdicts.labels(message.detail, message.detector or "none").inc()
        elif message.kind == "loop_event":
            metrics.loop_events.labels(message.detail).inc()
        else:
            metrics.dead_letters.labels(message.detail).inc()
            log.warning("dead letter %s: %s", message.detail, message.value[:300].decode(
                "utf-8", "replace"))
        out.append((self.topic_of[message.kind], message.key, message.value))

    @staticmethod
    def _log_notice(notice: Notice) -> None:
        log.log(
            logging.getLevelName(notice.level.upper()),
            "%s (session %r, run %r)",
            notice.message,
            notice.session_key[:80],
            (notice.run_id or "")[:80],
        )

    def measure_lag(self, owned: Iterable[TP]) -> None:
        """Set ``loopfuse_consumer_lag`` for the input partitions this worker owns."""
        gauge = self.metrics.consumer_lag
        gauge.clear()
        for tp in owned:
            lag = self.progress.lag(tp.topic, tp.partition, self._highwater, self._committed)
            if lag is not None:
                gauge.labels(tp.topic, str(tp.partition)).set(lag)

    # -- idle expiry ------------------------------------------------------------------

    def expire_idle(self, owned_partitions: Iterable[int], now_ms: int) -> int:
        """Delete sessions idle for longer than the TTL in ``owned_partitions``.

        ``del table[key]`` writes a tombstone to the changelog partition of the
        current event, so each delete runs with a stand-in event of the key's own
        partition; keys of partitions we do not actively own (standbys, or ones
        being revoked) are left to their owner.
        """
        # A session looks idle by the wall clock whenever the worker is behind (a
        # stall, a backlog after a restart, one input topic read late): its next
        # events may be on the broker, unread. Deleting it would make them wait for
        # seq 0 forever. So a session must also be idle in event time: its newest
        # event older than the TTL by the partition's event clock, the time every
        # input topic of the partition is judged up to (see InputProgress.event_clock).
        ttl_ms = int(self.settings.session_ttl_seconds * 1000)
        wall_cutoff = now_ms - ttl_ms
        event_cutoffs: dict[int, int] = {}
        for partition in owned_partitions:
            clock = self.progress.event_clock(
                partition, self._highwater, self._committed, self._answered_at
            )
            behind = self.metrics.input_behind.labels(str(partition))
            if clock is None:
                behind.set(-1)
                continue
            behind.set(max(0, now_ms - clock) / 1000)
            event_cutoffs[partition] = clock - ttl_ms
        table, expired = self.table, 0
        data = table.data
        for key, partition in list(self.key_partition.items()):
            event_cutoff = event_cutoffs.get(partition)
            if event_cutoff is None:
                continue  # not ours, or how far its input is judged is not known yet
            raw = data.get(key)
            if raw is None:
                self.key_partition.pop(key, None)
                continue
            touched_ms, last_event_ms = SessionState.idle_stamps(raw)
            if touched_ms >= wall_cutoff or last_event_ms >= event_cutoff:
                continue
            stand_in = _PartitionOnly(self.settings.topic_tool_calls, partition)
            _as_current_event(stand_in)
            del table[key]
            del self.key_partition[key]
            self.decoded.pop(key, None)
            self.waiting.pop(key, None)
            expired += 1
        _current_event.set(None)
        if expired:
            self.metrics.expired.inc(expired)
            log.info("expired %d idle sessions", expired)
        return expired

    def index_store(self, owned_partitions: Iterable[int]) -> None:
        """After recovery with RocksDB, index keys that came from local disk."""
        dbs = getattr(self.table.data, "_dbs", None)  # faust.stores.rocksdb.Store
        if not dbs:
            return
        for partition in owned_partitions:
            db = dbs.get(partition)
            if db is not None:
                for key in db.keys():  # noqa: SIM118 - rocksdict Rdict
                    self.key_partition.setdefault(bytes(key), partition)


def _show_key(key: bytes | None) -> str:
    if key is None:
        return "null"
    return repr(key[:80].decode("utf-8", "replace"))


# -- the app --------------------------------------------------------------------------


def _credentials(settings: Settings) -> Any:
    if settings.sasl_mechanism is not None:
        password = settings.sasl_password.get_secret_value() if settings.sasl_password else ""
        ssl_context = settings.kafka_client_kwargs().get("ssl_context")
        return faust.SASLCredentials(
            username=settings.sasl_username or "",
            password=password,
            mechanism=settings.sasl_mechanism,
            ssl_context=ssl_context,  # type: ignore[arg-type]
        )
    if settings.security_protocol == "SSL":
        return faust.SSLCredentials(settings.kafka_client_kwargs()["ssl_context"])  # type: ignore[arg-type]
    return None


def create_app(settings: Settings, config: DetectionConfigFile | None = None) -> faust.App:
    """Build the worker's Faust app (topics, session table, agent, timers, web views)."""
    if config is None and settings.config_file is not None:
        config = load_config(settings.config_file)
    brokers = [f"kafka://{hostport}" for hostport in settings.bootstrap_servers.split(",")]
    app = faust.App(
        settings.app_id,
        broker=brokers,
        broker_credentials=_credentials(settings),
        store=settings.store,
        datadir=str(settings.data_dir),
        autodiscover=False,
        topic_allow_declare=True,
        topic_disable_leader=True,
        topic_partitions=settings.partitions,
        topic_replication_factor=settings.replication_factor,
        table_standby_replicas=settings.standby_replicas,
        broker_session_timeout=settings.broker_session_timeout,
        broker_heartbeat_interval=settings.broker_heartbeat_interval,
        broker_commit_interval=settings.commit_interval,
        producer_linger=settings.producer_linger_ms / 1000.0,
        producer_max_batch_size=settings.producer_max_batch_size,
        producer_compression_type=(
            None if settings.producer_compression == "none" else settings.producer_compression
        ),
        producer_acks=-1,
        web_bind=settings.web_host,
        web_host=settings.web_host,
        web_port=settings.web_port,
        web_in_thread=False,
        # Only what operators need (/metrics, /ready, /livez): Faust's table view
        # would serve session state, its router view the cluster layout.
        web=operators_only_web(),
        web_tables_enabled=False,
        web_router_enabled=False,
        web_stats_enabled=False,
        web_graph_enabled=False,
        web_metrics_enabled=False,
        producer_max_request_size=settings.producer_max_request_size,
        key_serializer="raw",
        value_serializer="raw",
    )
    _track_buffer_hand_off()
    if settings.embedded_broker:
        from streams.kafka_compat import install_end_offset_workaround

        install_end_offset_workaround(app)

    engine = Engine(
        config,
        max_parked=settings.max_parked_events,
        max_parked_bytes=settings.max_parked_bytes,
        gap_timeout_ms=int(settings.sequence_gap_timeout_seconds * 1000),
    )
    metrics = Metrics()
    judge = Judge(app, settings, engine, metrics)
    inputs = app.topic(
        *settings.input_topics,
        key_serializer="raw",
        value_serializer="raw",
        partitions=settings.partitions,
    )
    producer_send = None
    health: dict[str, Any] = {"broker_ok": False, "broker_checked": 0.0, "topics_missing": []}

    async def publish(messages: list[tuple[str, bytes | None, bytes]]) -> None:
        """Hand messages to the producer; a broker problem is retried, never skipped.

        Outputs were checked against the producer's request size, so what fails
        here is the broker (or the network), not the input: giving up would let the
        batch be acknowledged without its verdicts.
        """
        nonlocal producer_send
        if producer_send is None:
            producer_send = app.producer.send
        for topic, key, value in messages:
            delay = 0.1
            while True:
                try:
                    await producer_send(topic, key, value, None, None, None)
                    break
                except (KafkaError, OSError) as exc:
                    log.warning("cannot hand a message to the producer (%r); retrying", exc)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 5.0)

    @app.agent(inputs, name="judge")
    async def judge_events(stream: faust.Stream) -> None:
        async for batch in stream.take_events(settings.batch_max, within=settings.batch_within):
            try:
                messages = judge.judge(batch)
            except Exception:
                # Input cannot get here (each event is isolated); a bug can. Faust
                # would restart the agent and acknowledge this batch unjudged, so stop
                # the process instead: nothing of the batch is committed, and the
                # restarted worker judges it again (at-least-once holds).
                log.critical(
                    "judging a batch failed outside any one event's isolation: "
                    "exiting (code 70) so that it is judged again after a restart",
                    exc_info=True,
                )
                os._exit(70)
            await publish(messages)
            # At-least-once. take_events acks this batch's offsets only after this
            # body returns, and Faust commits only acked offsets; its commit path
            # (Consumer._commit_offsets) awaits producer.flush() - every message
            # handed to aiokafka is acknowledged by the broker - before it commits.
            # The verdicts and dead letters above are in aiokafka's accumulator
            # already (awaited send). Table writes take a detour through Faust's
            # ProducerBuffer, whose flush gives up after 100 ms without progress, so
            # we drain that buffer into aiokafka here, before the ack. A crash can
            # then only redeliver inputs whose effects are durable or get
            # redelivered with them, and the engine dedupes those (re-emitting the
            # same verdict ids for redelivered tool calls). Waiting for the broker's
            # acknowledgement here instead would cost a round trip per batch and
            # stall the take buffer meanwhile (4x lower throughput measured).
            await _drain_table_writes(app)

    @app.timer(0.25, name="release_waiting_sessions")
    async def release_waiting_sessions() -> None:
        # A restarted gateway's first call waits until the input moved on, and the
        # gateway sends nothing else until it has the verdict: no batch would come.
        if judge.waiting and not (app.rebalancing or app.in_recovery):
            await publish(judge.release_waiting())

    @app.timer(settings.idle_scan_interval_seconds, name="expire_idle_sessions")
    async def expire_idle_sessions() -> None:
        if app.rebalancing or app.in_recovery or not app.tables.recovery.completed.is_set():
            return
        judge.expire_idle(_owned_partitions(app, settings), int(time.time() * 1000))

    @app.on_partitions_assigned.connect
    async def _on_assigned(sender: Any, assigned: Any, **_: Any) -> None:
        _tune_fetch_wait(app, settings.fetch_max_wait_ms)
        install_fast_delivery(app)
        # Before the fetcher starts (recovery starts it after this signal): without
        # these a restart with a backlog skipped input and committed it unjudged.
        keep_queues_on_redundant_resume(app)
        ignore_phantom_gaps(app, frozenset(settings.input_topics))
        # Judging restarts from the committed offsets; what we knew of any
        # partition's progress may be stale (another worker may have moved it on).
        judge.progress.forget(range(settings.partitions))
        judge.metrics.input_behind.clear()  # the next idle scan sets the owned ones
        # Each batch writes every session it touched once and drains Faust's producer
        # buffer before it is acknowledged (see judge_events), so the buffer holds at
        # most one batch of table writes. Faust's threshold of 100 would make the
        # consumer stop and flush (and log "producer buffer full") in every batch.
        app.producer.buffer.max_messages = max(100, 2 * settings.batch_max)

    async def _index_after_recovery() -> None:
        judge.index_store(_owned_partitions(app, settings))

    judge.table.on_recover(_index_after_recovery)

    @app.timer(2.0, name="probe_broker")
    async def probe_broker() -> None:
        cluster = await _broker_metadata(app)
        health["broker_ok"] = cluster is not None
        health["broker_checked"] = time.monotonic()
        if cluster is not None:
            health["topics_missing"] = await _restore_lost_topics(app, settings, cluster)

    @app.page("/metrics")
    async def metrics_page(web: Any, request: Any) -> Any:
        judge.measure_lag(_owned_input_partitions(app, settings))
        return web.bytes(metrics.render(), content_type=CONTENT_TYPE_LATEST.split(";")[0])

    @app.page("/livez")
    async def livez_page(web: Any, request: Any) -> Any:
        # The event loop answers: the process is alive (readiness is /ready).
        return web.bytes(b'{"live":true}', content_type="application/json")

    @app.page("/ready")
    async def ready_page(web: Any, request: Any) -> Any:
        reasons = []
        if not health["broker_ok"] or time.monotonic() - health["broker_checked"] > 10:
            reasons.append("broker unreachable")
        if health["topics_missing"]:
            reasons.append("topics missing: " + ", ".join(health["topics_missing"]))
        if app.rebalancing:
            reasons.append("rebalancing")
        if app.in_recovery or not app.tables.recovery.completed.is_set():
            reasons.append("recovering tables")
        body = {"ready": not reasons, "reasons": reasons}
        return web.bytes(
            orjson.dumps(body), content_type="application/json", status=200 if not reasons else 503
        )

    app.loopfuse_judge = judge  # type: ignore[attr-defined]
    app.loopfuse_metrics = metrics  # type: ignore[attr-defined]
    return app


async def _drain_table_writes(app: faust.App) -> None:
    """Hand every table write of this batch to aiokafka before the batch is acked.

    Faust's ProducerBuffer counts only messages still queued: the one its
    background task has taken off the queue is invisible until aiokafka has it, so
    ``buffer.size == 0`` alone let a batch be acked (and its offsets committed, and
    the worker killed) while its last changelog record was still in that hand-off.
    ``_track_buffer_hand_off`` makes the hand-off visible.
    """
    buffer = app.producer.buffer
    while buffer.size or getattr(buffer, _IN_FLIGHT, 0):
        if buffer.size:
            await buffer.flush()
        else:
            await asyncio.sleep(0.001)


_IN_FLIGHT = "_loopfuse_in_flight"


def _track_buffer_hand_off() -> None:
    """Count, per ProducerBuffer, messages between its queue and aiokafka (idempotent).

    Patched on the class before any producer starts, because the buffer's
    background task binds ``_send_pending`` once when it starts.
    """
    original = ProducerBuffer._send_pending
    if getattr(original, "_loopfuse_tracked", False):
        return

    async def _send_pending(self: ProducerBuffer, fut: Any) -> None:
        setattr(self, _IN_FLIGHT, getattr(self, _IN_FLIGHT, 0) + 1)
        try:
            await original(self, fut)
        finally:
            setattr(self, _IN_FLIGHT, getattr(self, _IN_FLIGHT) - 1)

    _send_pending._loopfuse_tracked = True  # type: ignore[attr-defined]
    ProducerBuffer._send_pending = _send_pending  # type: ignore[method-assign]


def _owned_partitions(app: faust.App, settings: Settings) -> set[int]:
    return {tp.partition for tp in _owned_input_partitions(app, settings)}


def _owned_input_partitions(app: faust.App, settings: Settings) -> list[TP]:
    inputs = set(settings.input_topics)
    try:
        return [tp for tp in app.consumer.assignment() if tp.topic in inputs]
    except Exception:  # no consumer yet (starting up)
        return []


def _tune_fetch_wait(app: faust.App, max_wait_ms: int) -> None:
    """Bound the consumer's fetch long-poll (Faust hard-codes 1500 ms).

    Apache Kafka answers a fetch as soon as data arrives, but Tansu sleeps for the
    whole max wait when a partition has nothing new, so with Faust's value a
    verdict could wait 1.5 s. aiokafka reads ``Fetcher._fetch_max_wait_ms`` for
    every fetch request it builds, so setting it at any time takes effect.
    """
    consumer = getattr(getattr(app.consumer, "_thread", None), "_consumer", None)
    fetcher = getattr(consumer, "_fetcher", None)
    if fetcher is not None:
        fetcher._fetch_max_wait_ms = max_wait_ms


async def _broker_metadata(app: faust.App) -> Any:
    """The cluster's metadata (aiokafka ClusterMetadata), None when the broker does not answer."""
    try:
        client = app.producer._producer.client  # type: ignore[attr-defined]
        return await asyncio.wait_for(client.fetch_all_metadata(), 2.0)
    except (KafkaError, OSError, TimeoutError, AttributeError):
        return None


async def _restore_lost_topics(app: faust.App, settings: Settings, cluster: Any) -> list[str]:
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
    wanted = [*settings.input_topics, changelog_topic(settings), *settings.output_topics]
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
        await ensure_topics(settings, timeout=10.0)
    except TopicMismatchError as exc:
        log.critical("%s Stopping (exit code 2).", exc)
        app.loopfuse_exit = (2, str(exc))  # type: ignore[attr-defined]
        os.kill(os.getpid(), signal.SIGTERM)  # mode's worker stops the app in order
        return missing
    except Exception as exc:  # the broker went away again: the next probe retries
        log.warning("could not re-create topics: %r", exc)
        return missing
    return []
