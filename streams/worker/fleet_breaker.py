"""The fleet-wide tool breaker (docs/configuration.md: Rules): one tool looping in
many sessions at once is broken fleet-wide until the window clears.

Three parts, wired by :func:`install_fleet_breaker` only when ``loopfuse.rules.
fleetBreaker`` is configured (else nothing here runs and no topic is touched):

1. the session processor publishes a *strike* (``loopfuse.schemas.events.ToolStrike``: tool,
   session hash, detector, event time) to ``loopfuse.tool-strikes``, keyed by tool, for
   each loop event that qualifies (``loopfuse.streams.engine.fleet.strikes``);
2. the ``fleet_breaker`` agent (Faust's ordinary stream path: strikes are rare) counts
   distinct sessions per tool in a sliding window of event time
   (:class:`FleetWindows`); at K it publishes the breaker's state to the compacted
   ``loopfuse.tool-breakers`` topic and one ``fleet_tool_breaker`` loop event;
3. every worker reads ``loopfuse.tool-breakers`` whole (:class:`BreakerBoard`,
   :func:`follow_board`) and the processor overlays the broken tools on its verdicts
   (``loopfuse.streams.engine.fleet.overlay``); expiry is by the calls' event time.

Why a plain aiokafka reader and not a Faust GlobalTable: a GlobalTable is recovered
by Faust's table recovery, which this worker patches for its one session table
(``faust_compat.recovery``), it holds the worker's readiness while it recovers, and
GlobalTables over several workers are a known weak spot of faust-streaming (its
issue #283, open: not every instance sees every key). The board is a few bounded records:
a consumer without a group that reads every partition from offset 0 is all it needs.

Why the window progress lives in memory on the owner of the tool's strike partition
and not in a changelog table: it is rebuilt from at most one window of strikes, a
loss (a rebalance, a crash) only delays a trip, and what must not be lost or doubled
(that a tool tripped, until when) is on the compacted topic every worker reads.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

import faust
from aiokafka import AIOKafkaConsumer, TopicPartition
from faust.types import StreamT
from pydantic import ValidationError

from loopfuse.schemas.events import FleetBreak, LoopEvent, ToolBreakerState, ToolStrike
from loopfuse.streams.end_offsets import fetch_end_offsets
from loopfuse.streams.engine import Engine
from loopfuse.streams.engine.fingerprint import digest
from loopfuse.streams.engine.fleet import ToolBreaker, breaker_message
from loopfuse.streams.engine.rule_config import FleetBreaker
from loopfuse.streams.settings import Settings
from loopfuse.streams.worker.faust_compat.producer import send_retrying

log = logging.getLogger("loopfuse.fleet_breaker")

#: Tools whose windows the breaker agent keeps (least recently struck go first), and
#: broken tools a board holds (soonest to clear go first): tool names come from the wire.
MAX_TOOLS = 10_000
#: A tripped breaker's state is published again when its end moves by this share of
#: the window (more sessions keep striking): bounded writes, each seen by every worker.
EXTEND_STEP = 10
#: How long the breaker agent waits for the board to be read before counting strikes.
BOARD_WAIT_SECONDS = 30.0

Message = tuple[str, bytes | None, bytes, int | None]  # as the processor's


# -- the window (pure) --------------------------------------------------------------


@dataclass(slots=True)
class _ToolWindow:
    newest: int = 0  # the latest strike's event time
    struck: dict[str, int] = field(default_factory=dict)  # session hash -> its latest strike
    since: int = 0  # the current trip's first event time
    until: int = 0  # the breaker holds for event times before this (0: never tripped)


@dataclass(frozen=True, slots=True)
class Trip:
    """A breaker to publish: ``new`` when it just tripped (its loop event goes too)."""

    breaker: ToolBreaker
    new: bool


class FleetWindows:
    """Distinct sessions that struck each tool within a sliding window of event time.

    A tool trips when ``sessions`` distinct sessions struck it within ``window_ms``;
    it holds until the window clears: the event time at which, with no more strikes,
    fewer than ``sessions`` would be left in it (the oldest of the newest K strikes
    plus the window). More strikes push that end on. Per tool at most K sessions are
    kept (the newest strikes), so memory is bounded by K times :data:`MAX_TOOLS`.
    A redelivered strike changes nothing (a session counts once; its time only grows).
    """

    def __init__(self, sessions: int, window_ms: int, *, max_tools: int = MAX_TOOLS) -> None:
        self.sessions = sessions
        self.window_ms = window_ms
        self.max_tools = max_tools
        self._tools: dict[str, _ToolWindow] = {}  # insertion order: least recently struck first

    def strike(
        self, tool: str, session: str, ts: int, published: ToolBreaker | None = None
    ) -> Trip | None:
        """Count one strike; the breaker to publish, if any.

        ``published`` is what the board says of the tool (another worker owned it
        before a rebalance): a trip already published is not published again.
        """
        window = self._tools.pop(tool, None) or _ToolWindow()
        self._tools[tool] = window
        if len(self._tools) > self.max_tools:
            del self._tools[next(iter(self._tools))]
        if published is not None and published.until_ts > window.until:
            window.since, window.until = published.since_ts, published.until_ts
        window.newest = max(window.newest, ts)
        struck = window.struck
        struck[session] = max(struck.pop(session, ts), ts)
        horizon = window.newest - self.window_ms
        for old in [s for s, at in struck.items() if at <= horizon]:
            del struck[old]
        while len(struck) > self.sessions:
            del struck[min(struck, key=struck.__getitem__)]
        if len(struck) < self.sessions:
            return None
        until = min(struck.values()) + self.window_ms
        if window.until <= ts:  # not broken at this strike's time: it trips now
            window.since, window.until = ts, until
            return Trip(self._breaker(tool, window), new=True)
        if until >= window.until + max(1, self.window_ms // EXTEND_STEP):
            window.until = until
            return Trip(self._breaker(tool, window), new=False)
        return None

    def _breaker(self, tool: str, window: _ToolWindow) -> ToolBreaker:
        return ToolBreaker(
            tool, len(window.struck), self.window_ms // 1000, window.since, window.until
        )


# -- the board every worker reads (pure) --------------------------------------------


class BreakerBoard:
    """The tools broken fleet-wide as read from the breakers topic: ``broken`` is what the
    processor overlays. Bounded: at most :data:`MAX_TOOLS`, those clearing soonest go."""

    def __init__(self, *, max_tools: int = MAX_TOOLS) -> None:
        self.broken: dict[str, ToolBreaker] = {}
        self.max_tools = max_tools
        self.caught_up = asyncio.Event()  # the topic read to its end once (start-up)

    def apply(self, key: bytes | None, value: bytes | None) -> None:
        """One record of the breakers topic: a breaker's state, or a tombstone."""
        if key is None:
            return
        if value is None:
            self.broken.pop(key.decode("utf-8", "replace"), None)
            return
        try:
            state = ToolBreakerState.model_validate_json(value)
        except ValidationError:
            log.warning("ignoring an invalid record of the breakers topic")
            return
        self.note(
            ToolBreaker(
                state.tool_name,
                state.sessions,
                state.window_seconds,
                state.since_ts,
                state.until_ts,
            )
        )

    def note(self, breaker: ToolBreaker) -> None:
        self.broken[breaker.tool_name] = breaker
        if len(self.broken) > self.max_tools:
            soonest = min(self.broken.values(), key=lambda b: b.until_ts)
            del self.broken[soonest.tool_name]


# -- the breaker agent's work -------------------------------------------------------


class FleetBreakerJudge:
    """Strikes in, the breaker's state and loop event out (the agent's logic)."""

    def __init__(
        self, rule: FleetBreaker, enforce: bool, board: BreakerBoard, topics: tuple[str, str]
    ) -> None:
        self.rule = rule
        self.enforce = enforce
        self.board = board
        self.breakers_topic, self.loop_events_topic = topics
        self.windows = FleetWindows(rule.sessions, rule.window_seconds * 1000)

    def on_strike(self, value: bytes | None, now_ms: int) -> list[Message]:
        try:
            strike = ToolStrike.model_validate_json(value or b"")
        except ValidationError:
            log.warning("ignoring an invalid strike")
            return []
        tool = strike.tool_name
        trip = self.windows.strike(tool, strike.session, strike.ts, self.board.broken.get(tool))
        if trip is None:
            return []
        breaker = trip.breaker
        self.board.note(breaker)  # at once: the board's reader sees it a little later
        key = tool.encode("utf-8", "surrogatepass")
        state = ToolBreakerState(
            tool_name=tool,
            sessions=breaker.sessions,
            window_seconds=breaker.window_seconds,
            since_ts=breaker.since_ts,
            until_ts=breaker.until_ts,
        )
        state_json = state.model_dump_json().encode()
        messages: list[Message] = [(self.breakers_topic, key, state_json, None)]
        if trip.new:
            log.warning(
                "fleet breaker tripped for tool %r: %d sessions within %d s",
                tool[:80],
                breaker.sessions,
                breaker.window_seconds,
            )
            messages.append((self.loop_events_topic, key, self.loop_event(breaker, now_ms), None))
        return messages

    def loop_event(self, breaker: ToolBreaker, now_ms: int) -> bytes:
        rule = self.rule
        tool = breaker.tool_name
        event = LoopEvent(
            event_id=digest(
                f"fleet\x1f{tool}\x1f{breaker.since_ts}".encode("utf-8", "surrogatepass")
            ),
            session_key="fleet",
            run_id=None,
            agent_id=None,
            call_id=None,
            seq=None,
            tool_name=tool,
            action=rule.action,
            level="critical" if rule.action == "block" else "warning",
            detector="fleet_tool_breaker",
            count=breaker.sessions,
            message=breaker_message(rule.action, tool, breaker.sessions, breaker.window_seconds),
            args_hash=None,
            warning_key=f"fleet:{tool}",
            config={
                "enforce": self.enforce,
                "fleetBreaker": {
                    "sessions": rule.sessions,
                    "windowSeconds": rule.window_seconds,
                    "action": rule.action,
                    "enforced": rule.enforced,
                },
            },
            enforced=rule.enforced,
            fleet=FleetBreak(
                sessions=breaker.sessions,
                window_seconds=breaker.window_seconds,
                since_ts=breaker.since_ts,
                until_ts=breaker.until_ts,
            ),
            event_ts=breaker.since_ts,
            decided_ts=now_ms,
        )
        return event.model_dump_json().encode()


# -- I/O: the board's reader and the agent ------------------------------------------


async def follow_board(settings: Settings, board: BreakerBoard) -> None:
    """Read the breakers topic from offset 0 into ``board``, forever (no consumer group:
    every worker reads every partition; nothing is committed)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings.bootstrap_servers,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=max(settings.fetch_wait_ms, 50),
        **settings.kafka_client_kwargs(),
    )
    await consumer.start()
    try:
        # Without a group, a subscription is assigned every partition of the topic once
        # metadata names it. (Asking for the topic list, then for its partitions from the
        # consumer's own metadata, worked on the embedded broker only: on Apache Kafka
        # that metadata holds no topic the consumer has not asked for.)
        consumer.subscribe([settings.topic_tool_breakers])
        while not consumer.assignment():
            await asyncio.sleep(0.2)
        tps = sorted(consumer.assignment())
        for tp in tps:
            consumer.seek(tp, 0)
        # The embedded broker's ListOffsets is wrong (faust_compat.embedded_recovery): there,
        # the high watermarks of a Fetch answer.
        ends: dict[TopicPartition, int] = (
            await fetch_end_offsets(consumer, tps)
            if settings.embedded_broker
            else await consumer.end_offsets(tps)
        )
        while True:
            batches = await consumer.getmany(timeout_ms=500)
            for records in batches.values():
                for record in records:
                    board.apply(record.key, record.value)
            if not board.caught_up.is_set():
                positions = {tp: await consumer.position(tp) for tp in tps}
                if all(positions[tp] >= ends.get(tp, 0) for tp in tps):
                    log.info("breakers topic read: %d tools broken", len(board.broken))
                    board.caught_up.set()
    finally:
        await consumer.stop()


def install_fleet_breaker(
    app: faust.App, settings: Settings, engine: Engine
) -> BreakerBoard | None:
    """The breaker agent (strikes in) and the board's reader on ``app``, when ``engine``'s
    config has a fleet breaker; the board the processor overlays (None: no breaker)."""
    rule = engine.rules.resolver.fleet_breaker
    if rule is None:
        return None
    board = BreakerBoard()
    strikes = app.topic(
        settings.topic_tool_strikes,
        key_serializer="raw",
        value_serializer="raw",
        partitions=settings.partitions,
    )
    judge = FleetBreakerJudge(
        rule,
        engine.resolver.enforce,
        board,
        (settings.topic_tool_breakers, settings.topic_loop_events),
    )

    @app.agent(strikes, name="fleet_breaker")
    async def fleet_breaker(stream: StreamT[bytes]) -> None:
        # What tripped before (another owner) is known first; but strikes share the
        # consumer with the input topics, and a full stream buffer would stall judging,
        # so not forever: a trip published twice is the lesser harm.
        try:
            await asyncio.wait_for(board.caught_up.wait(), BOARD_WAIT_SECONDS)
        except TimeoutError:
            log.warning("the breakers topic is not read to its end: counting strikes anyway")
        async for event in stream.events():
            # Sent before the next event is taken: Faust acks (and later commits) an
            # event once the agent asks for the next, so a strike is at least once.
            await send_retrying(app, judge.on_strike(event.value, int(time.time() * 1000)))

    @app.task  # type: ignore[untyped-decorator]
    async def follow_breakers() -> None:
        while True:  # a reader that failed starts again from offset 0 (records are states)
            try:
                await follow_board(settings, board)
            except Exception:
                log.warning("reading the breakers topic failed; reading it again", exc_info=True)
                await asyncio.sleep(1.0)

    app.loopfuse_breaker = judge  # type: ignore[attr-defined]
    return board
