"""The worker's wiring: Faust app, topics, session table, the agent, timers, web pages.

No logic of its own: batches go to :class:`loopfuse.streams.worker.processor.SessionProcessor`; what
Faust and aiokafka do not offer (or do wrong) is in :mod:`loopfuse.streams.worker.faust_compat`.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import faust
from faust.types import StreamT
from prometheus_client import CONTENT_TYPE_LATEST

from loopfuse.schemas.config import DetectionConfigFile, load_config
from loopfuse.schemas.verdict_signature import VerdictSigner
from loopfuse.streams.engine import Engine
from loopfuse.streams.engine.native import NATIVE
from loopfuse.streams.settings import Settings
from loopfuse.streams.worker import faust_compat as compat
from loopfuse.streams.worker.faust_compat.assignment import prepare_consumer
from loopfuse.streams.worker.faust_compat.consumer import FaustInputOffsets, owned_inputs
from loopfuse.streams.worker.faust_compat.delivery import FetchBatches
from loopfuse.streams.worker.faust_compat.embedded_recovery import install_end_offset_workaround
from loopfuse.streams.worker.faust_compat.producer import (
    Publisher,
    VerdictSigning,
    idempotent_producer,
)
from loopfuse.streams.worker.faust_compat.recovery import ChangelogRestore
from loopfuse.streams.worker.faust_compat.tables import FaustSessionStore, session_table
from loopfuse.streams.worker.faust_compat.typed import (
    every,
    faust_credentials,
    on_assigned,
    recovery_completed,
)
from loopfuse.streams.worker.faust_compat.web import operators_only_web
from loopfuse.streams.worker.fleet_breaker import install_fleet_breaker
from loopfuse.streams.worker.metrics import Metrics
from loopfuse.streams.worker.outgoing import Limits
from loopfuse.streams.worker.processor import OutputTopics, SessionProcessor
from loopfuse.streams.worker.topics import SESSION_TABLE, Readiness

log = logging.getLogger("loopfuse.worker")


def judged_by(processor: SessionProcessor) -> str:
    """Which engine judges the sessions, for the start-up log: an operator who installed
    the native judge sees it taken (or why not)."""
    if processor.native is not None:
        return f"sessions are judged by the native judge ({getattr(NATIVE, '__name__', '?')})"
    if NATIVE is not None:
        return (
            "sessions are judged by the Python engine: the native judge does not take "
            f"this engine ({type(processor.engine).__name__})"
        )
    return (
        "sessions are judged by the Python engine: no native judge here (pip install "
        "./native from the same checkout; docs/operations.md: The native judge)"
    )


def create_app(settings: Settings, config: DetectionConfigFile | None = None) -> faust.App:
    """Build the worker's Faust app (topics, session table, agent, timers, web pages)."""
    compat.check_versions()
    if config is None and settings.config_file is not None:
        config = load_config(settings.config_file)
    app = faust.App(
        settings.app_id,
        broker=[f"kafka://{h}" for h in settings.bootstrap_servers.split(",")],
        broker_credentials=faust_credentials(settings),
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
        producer_compression_type=None
        if settings.producer_compression == "none"
        else settings.producer_compression,
        producer_acks=-1,
        producer_max_request_size=settings.producer_max_request_size,
        # Only what operators need (/metrics, /ready, /livez), on loopback by default.
        web=operators_only_web(),
        web_bind=settings.web_host,
        web_host=settings.web_host,
        web_port=settings.web_port,
        web_in_thread=False,
        key_serializer="raw",
        value_serializer="raw",
    )
    if settings.embedded_broker:
        install_end_offset_workaround(app)
    else:
        idempotent_producer(app)

    async def on_changelog(event: Any) -> None:  # recovery and standbys
        processor.on_changelog(event.message.key, event.message.value, event.message.partition)

    table = session_table(app, SESSION_TABLE, settings.partitions, on_changelog)
    engine = Engine(
        config,
        max_parked=settings.max_parked_events,
        max_parked_bytes=settings.max_parked_bytes,
        gap_timeout_ms=int(settings.sequence_gap_timeout_seconds * 1000),
    )
    board = install_fleet_breaker(app, settings, engine)  # None: no fleetBreaker configured
    store = FaustSessionStore(table, settings.topic_tool_calls)
    replies: dict[str, int] = {}  # reply topic -> partitions, kept current by the probe
    default, *tenants = settings.served_tenants
    processor = SessionProcessor(
        engine,
        default.inputs,
        OutputTopics(
            settings.topic_verdicts,
            settings.topic_loop_events,
            settings.topic_dead_letters,
            settings.topic_tool_strikes if board is not None else None,
            replies=replies,
        ),
        store,
        FaustInputOffsets(app),
        limits=Limits(
            settings.max_session_state_bytes,
            settings.producer_max_request_size,
            settings.dead_letter_original_bytes,
            settings.max_identifier_bytes,
        ),
        max_event_bytes=settings.max_event_bytes,
        session_ttl_ms=int(settings.session_ttl_seconds * 1000),
        metrics=Metrics(),
        breakers=board.broken if board is not None else None,
        tenants=tenants,
    )
    inputs = app.topic(
        *settings.input_topics,
        key_serializer="raw",
        value_serializer="raw",
        partitions=settings.partitions,
    )
    readiness = Readiness(app, settings, fleet_breaker=board is not None, replies=replies)

    keys = settings.verdict_keys()  # LOOPFUSE_VERDICT_KEY: sign with the first
    signing = (
        None
        if not keys
        else VerdictSigning(
            VerdictSigner(keys[0]), (*settings.verdict_topics, *settings.reply_topic_names)
        )
    )

    def owned() -> list[tuple[str, int]]:
        return owned_inputs(app, settings.input_topics)

    fetches = FetchBatches(
        app,
        frozenset(settings.input_topics),
        settings.batch_max,
        restore=ChangelogRestore(app, table, processor.on_changelog),
        aligned=[tenant.inputs for tenant in settings.served_tenants],
    )
    # right after each processor call; checkpoints the table writes, then acks
    publish = Publisher(
        app, table, store, fetches.ack, signing, interval=settings.checkpoint_interval
    )

    @app.agent(inputs, name="judge")
    async def judge_events(stream: StreamT[Any]) -> None:
        # Said here, where the worker's logging is set up (create_app's would be lost).
        log.info("%s", judged_by(processor))
        if keys:  # the id only: the secret is never logged
            log.info(
                "verdicts are signed with key %r (%d key(s) configured)", keys[0].key_id, len(keys)
            )
        # Whole fetches, not the stream's events one by one (faust_compat.delivery).
        while True:
            # A checkpoint waits for the broker's acks of the outputs sent since the
            # last one: every ``checkpoint_interval``, never between a paced call and
            # the next one (which then waited a round trip before it was judged). A
            # revocation or a stop wakes the wait (take returns nothing), and they
            # wait for every batch taken to be acknowledged.
            batch = await fetches.take(publish.due_in())  # aiokafka ConsumerRecords
            if not batch:
                await publish.checkpoint()
                continue
            try:
                messages = processor.process(batch)
            except Exception:
                # Input cannot get here (each event is isolated); a bug can. Stop rather
                # than go on past the batch: nothing of it is acknowledged, so nothing
                # is committed and a restarted worker judges it again.
                log.critical("a batch failed outside event isolation: exit 70", exc_info=True)
                os._exit(70)
            # At-least-once: acked at a checkpoint, after the batch's outputs are on
            # the broker and its writes with the producer; Faust commits acked offsets
            # only after producer.flush().
            await publish.send(messages, batch)
            if publish.due:
                await publish.checkpoint()

    @every(app, 0.25, name="release_waiting_sessions")
    async def release_waiting_sessions() -> None:
        # A restarted gateway's first call waits for the input to move on, and the
        # gateway sends nothing else until it has the verdict: no batch would come.
        if processor.waiting and not (app.rebalancing or app.in_recovery):
            await publish(processor.release_waiting())

    @every(app, settings.idle_scan_interval_seconds, name="expire_idle_sessions")
    async def expire_idle_sessions() -> None:
        if not (app.rebalancing or app.in_recovery or not recovery_completed(app)):
            processor.expire_idle({partition for _, partition in owned()})
            await publish([])  # the tombstones

    async def _on_assigned() -> None:
        prepare_consumer(app, fetches, fetch_max_wait_ms=settings.fetch_wait_ms)
        processor.assigned(range(settings.partitions))
        if settings.reply_topic_names and not replies:
            # before the first batch: a call's reply is not sent elsewhere for want of
            # the probe's first answer
            await readiness.refresh_replies()

    on_assigned(app, _on_assigned)

    async def _recovered() -> None:
        processor.recovered({partition for _, partition in owned()})

    table.on_recover(_recovered)

    @app.page("/metrics")
    async def metrics_page(web: Any, request: Any) -> Any:
        processor.measure_lag(owned())
        body = processor.metrics.render()
        return web.bytes(body, content_type=CONTENT_TYPE_LATEST.split(";")[0])

    readiness.add_pages()  # /ready and /livez

    app.loopfuse_processor = processor  # type: ignore[attr-defined]
    return app
