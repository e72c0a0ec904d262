"""The gateway client: the Python reference for integrating an agent gateway with loopfuse.

A gateway publishes what its agents do (tool calls, results, compactions, run ends)
and, before it runs a tool, asks for the verdict:

    async with GatewayClient("127.0.0.1:9092") as client:
        session = client.session("agent:main:42", run_id="run-7", agent_id="main")
        verdict = await session.check("exec", {"command": "make test"})
        if verdict.action == "block":
            return blocked_tool_result(verdict)        # OpenClaw's blocked tool-result shape
        outcome = run_the_tool(...)
        await session.result("exec", {"command": "make test"}, call_id=verdict.call_id,
                             result=outcome)

One producer and one verdict consumer serve any number of concurrent sessions.
``seq`` and ``event_id`` are assigned here, per session key, in publish order, in
this client's *incarnation* (a random id per client): a gateway that restarts gets a
new incarnation, so loopfuse continues its sessions in a new seq space instead of
taking the new events for redeliveries (docs/wire-format.md: restart-safe gateways). A verdict is
accepted only for the pending call it answers: same session, call id, seq,
incarnation and args hash; anything else on the verdicts topic is counted and
dropped. The verdict reader survives bad records, callback errors and consumer
errors (logged, counted, restarted); ``client.stats`` has the counters.

Reply routing (docs/wire-format.md: Reply routing): every event names ``reply_to``, one
partition of the reply topic (``Topics.replies``, per tenant if the operator says so)
keyed by this client's incarnation, and the client reads that partition only, from
its end, with no consumer group. The partition is the incarnation's hash modulo the
topic's partition count (or ``reply_partition``); another gateway that lands on the
same one costs a key comparison per record of its, never a parse. ``Topics(replies=None)``
is the v1 way: every partition of the verdicts topic, every record parsed.

Verdict signatures (docs/wire-format.md: Verdict signatures): with ``verdict_key`` (the
worker's ``LOOPFUSE_VERDICT_KEY``), a verdict record of ours whose ``loopfuse-sig``
header is missing or does not verify is dropped before it is parsed, and counted
(``stats.unsigned_verdicts``, ``stats.bad_signatures``): its call waits on, and the
fail policy decides if no genuine verdict comes. Without a key, headers are ignored.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson
import xxhash
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka import errors as kafka_errors
from pydantic import ValidationError

from loopfuse.schemas.events import Verdict
from loopfuse.schemas.verdict_signature import VerdictKey, VerdictVerifier, parse_verdict_keys
from loopfuse.streams.broker_access import (
    CLIENT_NAMES,
    BrokerAccessError,
    SettingNames,
    diagnose,
)
from loopfuse.streams.engine.fingerprint import args_hash, result_token
from loopfuse.streams.engine.step import verdict_id
from loopfuse.streams.settings import Settings

log = logging.getLogger("loopfuse.gateway")

FailPolicy = Literal["open", "closed"]
AbortCallback = Callable[[Verdict], Awaitable[None] | None]

TIMEOUT_MESSAGE = "loopfuse did not answer in time; the call is {what} by the fail-{policy} policy."
#: Session keys whose seq counters a client keeps; a key evicted and seen again
#: continues in a fresh seq space (a sub-incarnation), which loopfuse handles like a
#: restart, so eviction never turns detection off.
MAX_TRACKED_SESSIONS = 100_000
#: How often, at most, the client logs verdicts it dropped for their signature (counted).
SIGNATURE_LOG_INTERVAL_SECONDS = 10.0


@dataclass(slots=True)
class ClientStats:
    """What the client could not do as asked; a rising number is worth an alert."""

    verdicts: int = 0  # verdicts matched to a pending call
    timeouts: int = 0  # calls decided by the fail policy (no verdict in time)
    dropped_verdicts: int = 0  # verdicts for no pending call of ours, or not matching it
    sticky_blocks: int = 0  # calls answered from the sticky-block cache (still reported)
    undecodable_records: int = 0  # records on the verdicts topic that are not verdicts
    callback_errors: int = 0  # on_abort callbacks that raised
    reader_errors: int = 0  # consumer errors survived by the verdict reader
    reader_restarts: int = 0  # times the verdict reader task was started again
    records_read: int = 0  # records the verdict reader took from Kafka
    bytes_read: int = 0  # their keys and values, in bytes (what the brokers served this client)
    foreign_records: int = 0  # of those, other gateways' (reply key not ours): not parsed
    # With a verdict key: our records dropped unparsed for their signature
    unsigned_verdicts: int = 0  # no loopfuse-sig header (a worker without the key, a forgery)
    bad_signatures: int = 0  # a header that does not verify (wrong or unknown key, altered)


@dataclass(slots=True)
class _SeqSpace:
    """The counters of one session key in one incarnation."""

    incarnation: str
    seq: itertools.count[int] = field(default_factory=itertools.count)
    calls: itertools.count[int] = field(default_factory=itertools.count)


@dataclass(slots=True)
class _Pending:
    """A published call waiting for its verdict."""

    future: asyncio.Future[Verdict]
    seq: int
    incarnation: str
    args_hash: str


def _default(name: str) -> str:
    value = Settings.model_fields[name].default
    assert isinstance(value, str)
    return value


@dataclass(frozen=True, slots=True)
class Topics:
    """Topic names; the defaults are the worker's defaults."""

    tool_calls: str = field(default_factory=lambda: _default("topic_tool_calls"))
    tool_results: str = field(default_factory=lambda: _default("topic_tool_results"))
    compactions: str = field(default_factory=lambda: _default("topic_compactions"))
    verdicts: str = field(default_factory=lambda: _default("topic_verdicts"))
    # The reply topic this gateway reads (one of the worker's LOOPFUSE_REPLY_TOPICS);
    # None: no reply routing, the whole verdicts topic is read (v1).
    replies: str | None = field(default_factory=lambda: _default("reply_topics").split(",")[0])

    @classmethod
    def from_settings(cls, settings: Settings, replies: str | None = None) -> Topics:
        """The worker's topic names; ``replies`` defaults to its first reply topic."""
        names = settings.reply_topic_names
        return cls(
            settings.topic_tool_calls,
            settings.topic_tool_results,
            settings.topic_compactions,
            settings.topic_verdicts,
            replies if replies is not None else (names[0] if names else None),
        )


def reply_partition_of(requester: str, partitions: int) -> int:
    """The reply partition a gateway reads when none is configured: its id's hash.

    Spread evenly, so with P partitions and G gateways a gateway shares its partition
    with (G - 1) / P others on average (docs/benchmarks.md: Verdict fan-out).
    """
    return xxhash.xxh64_intdigest(requester.encode()) % partitions


def blocked_tool_result(verdict: Verdict) -> dict[str, Any]:
    """What the gateway returns to the agent instead of running a blocked tool (spec 6).

    loopfuse recognises this shape when it comes back as the tool's result and
    records nothing for it, so the block stays in force.
    """
    message = verdict.message or "blocked by loopfuse"
    return {
        "content": [{"type": "text", "text": message}],
        "details": {"status": "blocked", "deniedReason": "tool-loop", "reason": message},
    }


class GatewaySession:
    """One agent session as the gateway sees it: assigns ``seq`` and event ids."""

    def __init__(
        self, client: GatewayClient, session_key: str, run_id: str | None, agent_id: str | None
    ) -> None:
        self.client = client
        self.session_key = session_key
        self.run_id = run_id
        self.agent_id = agent_id
        # Called with every event this session publishes, in seq order (audit logs,
        # the fleet simulator's expected-verdict engine).
        self.observer: Callable[[dict[str, Any]], None] | None = None

    async def _publish(self, topic: str, event: dict[str, Any]) -> None:
        if self.observer is not None:
            self.observer(event)
        await self.client._publish(topic, self.session_key, event)

    def _envelope(self, kind: str) -> dict[str, Any]:
        # One seq space per session key in this client, shared by every session
        # object for the key: two objects for one key must not both count from 0.
        space = self.client._seq_space(self.session_key)
        seq = next(space.seq)
        return {
            "type": kind,
            "event_id": f"{space.incarnation}:{seq}",
            "session_key": self.session_key,
            "run_id": self.run_id,
            "agent_id": self.agent_id,
            "incarnation": space.incarnation,
            "seq": seq,
            "ts": int(time.time() * 1000),
            **self.client._reply_to,
        }

    def new_call_id(self) -> str:
        space = self.client._seq_space(self.session_key)
        return f"call-{next(space.calls)}-{space.incarnation[:8]}"

    async def check(
        self, tool_name: str, args: Any, *, call_id: str | None = None, timeout: float | None = None
    ) -> Verdict:
        """Publish a tool call and wait for its verdict (see ``GatewayClient.check``)."""
        return await self.client.check(self, tool_name, args, call_id=call_id, timeout=timeout)

    async def result(
        self,
        tool_name: str,
        args: Any,
        *,
        call_id: str,
        result: Any = None,
        error: str | None = None,
        unknown_tool: str | None = None,
        usage: dict[str, Any] | None = None,
    ) -> None:
        """Publish a tool's outcome: ``result`` (OpenClaw's shape) or ``error`` text.

        ``usage``: what the session spent since its last report (``input_tokens``,
        ``output_tokens``, ``total_tokens``, ``cost``), for the run caps (docs/configuration.md: Rules).
        """
        event = self._envelope("tool_result")
        event.update(call_id=call_id, tool_name=tool_name)
        if usage is not None:
            event["usage"] = usage
        self.client._put_args(event, tool_name, args)
        if error is not None:
            event["error"] = error
        elif self.client.hash_locally:
            event["result_hash"] = result_token(
                tool_name,
                args,
                result=result,
                send_tools=self.client.send_tools,
            )
            if event["result_hash"] is None:  # nothing to record: say so without payload
                del event["result_hash"]
                event["result"] = None
        else:
            event["result"] = result
        if unknown_tool is not None:
            event["unknown_tool"] = unknown_tool
        await self._publish(self.client.topics.tool_results, event)

    async def compaction(self, reason: str = "context_overflow") -> None:
        event = self._envelope("compaction")
        event["reason"] = reason
        await self._publish(self.client.topics.compactions, event)

    async def run_ended(self) -> None:
        event = self._envelope("run_ended")
        await self._publish(self.client.topics.compactions, event)
        self.client._forget_run(self.session_key, self.run_id)

    def new_run(self, run_id: str) -> None:
        """The session moves on to another run (e.g. the next heartbeat cycle)."""
        self.run_id = run_id


class GatewayClient:
    """Publishes a fleet's tool activity and hands back loopfuse's verdicts."""

    def __init__(
        self,
        bootstrap_servers: str,
        *,
        topics: Topics | None = None,
        timeout: float = 5.0,
        fail_policy: FailPolicy = "open",
        hash_locally: bool = False,
        send_tools: frozenset[str] = frozenset(),
        sticky_blocks: bool = True,
        client_id: str | None = None,
        linger_ms: int = 0,
        verdict_fetch_wait_ms: int = 500,
        reply_partition: int | None = None,
        idempotent: bool = True,
        verdict_key: str | Sequence[VerdictKey] | None = None,
        setting_names: SettingNames = CLIENT_NAMES,
        **kafka_options: Any,
    ) -> None:
        self.bootstrap_servers = bootstrap_servers
        # What a connection error names: these keyword arguments, or the variables a
        # host read them from (the Hermes plugin passes LOOPFUSE_*'s names).
        self._setting_names = setting_names
        # "id:base64[,...]" as LOOPFUSE_VERDICT_KEY, or Settings.verdict_keys(): any listed
        # key verifies (rotation); None or empty: signatures are not checked.
        keys = parse_verdict_keys(verdict_key) if isinstance(verdict_key, str) else verdict_key
        self._verifier = VerdictVerifier(keys) if keys else None
        self._signature_logged: float | None = None
        self._signature_unlogged = 0
        # The embedded broker has no idempotent producer: pass idempotent=False there.
        self._idempotent = idempotent
        # The verdict reader's fetch long-poll. Apache Kafka answers it at the first
        # verdict, so a long one costs no latency and spares the broker a poll every few
        # ms per gateway; the embedded broker waits it out whole: pass ~5 there.
        self._verdict_fetch_wait_ms = verdict_fetch_wait_ms
        self.topics = topics or Topics()
        self.timeout = timeout
        self.fail_policy: FailPolicy = fail_policy
        self.hash_locally = hash_locally
        self.send_tools = send_tools
        self.sticky_blocks = sticky_blocks
        self.client_id = client_id or f"gw-{uuid.uuid4().hex[:12]}"
        self._kafka_options = kafka_options
        self._linger_ms = linger_ms
        self._producer: AIOKafkaProducer | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._reader: asyncio.Task[None] | None = None
        self._stopping = False
        self._pending: dict[tuple[str, str], _Pending] = {}
        self._blocked: dict[tuple[str, str | None], dict[str, Verdict]] = {}
        self._abort_callbacks: dict[tuple[str, str | None], list[AbortCallback]] = {}
        self._background: set[asyncio.Task[Any]] = set()
        self._aborted: OrderedDict[str, None] = OrderedDict()  # a redelivered abort fires once
        # Calls answered from the sticky-block cache and reported: their verdicts are
        # expected and nobody waits for them (not "dropped").
        self._reported: OrderedDict[tuple[str, str], None] = OrderedDict()
        # This client's incarnation: every event it publishes is numbered in it.
        self.incarnation = uuid.uuid4().hex
        # Reply routing: the partition read (set by start()) and what each event names.
        self._reply_partition_asked = reply_partition
        self.reply_partition: int | None = None
        self._reply_key = self.incarnation.encode()
        self._reply_to: dict[str, Any] = {}
        self._spaces: OrderedDict[str, _SeqSpace] = OrderedDict()
        self._spaces_made = 0
        self.stats = ClientStats()

    @property
    def timeouts(self) -> int:
        """Calls decided by the fail policy (kept for older callers; see ``stats``)."""
        return self.stats.timeouts

    def _seq_space(self, session_key: str) -> _SeqSpace:
        space = self._spaces.get(session_key)
        if space is None:
            self._spaces_made += 1
            # The first space of a key is the plain incarnation; a key seen again
            # after eviction gets a fresh one (a counter cannot be resumed).
            incarnation = (
                self.incarnation
                if self._spaces_made <= MAX_TRACKED_SESSIONS
                else (f"{self.incarnation}.{self._spaces_made}")
            )
            space = self._spaces[session_key] = _SeqSpace(incarnation)
            if len(self._spaces) > MAX_TRACKED_SESSIONS:
                self._spaces.popitem(last=False)
        else:
            self._spaces.move_to_end(session_key)
        return space

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        try:
            await self._start()
        except BaseException:
            await self.stop()  # a failed start leaves no client connected
            raise

    async def _start(self) -> None:
        self._producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap_servers,
            client_id=self.client_id,
            linger_ms=self._linger_ms,
            # A call's event is acknowledged once min.insync.replicas hold it, and a
            # resend after a leader's crash is not written twice (idempotence).
            acks="all",
            enable_idempotence=self._idempotent,
            **self._kafka_options,
        )
        try:
            await self._producer.start()
        except (kafka_errors.KafkaConnectionError, OSError) as exc:
            # aiokafka says "Unable to bootstrap" for a refused password, an untrusted
            # certificate and a broker not up alike: find which, in one line.
            diagnosis = await diagnose(
                self.bootstrap_servers, self._kafka_options, self._setting_names
            )
            if diagnosis is not None and diagnosis.lasting:
                raise BrokerAccessError(f"loopfuse gateway client: {diagnosis.message}") from None
            raise exc from None
        # No consumer group: every gateway reads every verdict partition from "now".
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap_servers,
            client_id=f"{self.client_id}-verdicts",
            group_id=None,
            enable_auto_commit=False,
            fetch_max_wait_ms=self._verdict_fetch_wait_ms,
            **self._kafka_options,
        )
        await self._consumer.start()
        tps = await self._verdict_partitions()
        self._consumer.assign(tps)
        await self._consumer.seek_to_end(*tps)
        for tp in tps:  # resolve "end" now, so no verdict published after start is missed
            await self._consumer.position(tp)
        self._stopping = False
        self._start_reader()

    async def _verdict_partitions(self) -> list[TopicPartition]:
        """What the reader reads: this gateway's reply partition, or (v1) every verdict one."""
        replies = self.topics.replies
        if replies is None:
            partitions = await self._partitions_of(self.topics.verdicts)
            return [TopicPartition(self.topics.verdicts, p) for p in partitions]
        count = len(await self._partitions_of(replies, what="reply topic"))
        asked = self._reply_partition_asked
        if asked is not None and not 0 <= asked < count:
            raise ValueError(
                f"reply_partition {asked} is not a partition of {replies!r} (it has {count})"
            )
        partition = reply_partition_of(self.incarnation, count) if asked is None else asked
        self.reply_partition = partition
        self._reply_to = {
            "reply_to": {
                "topic": replies,
                "partition": partition,
                "requester": self.incarnation,
            }
        }
        return [TopicPartition(replies, partition)]

    def _start_reader(self) -> None:
        self._reader = asyncio.create_task(self._read_verdicts(), name="loopfuse-verdicts")
        self._reader.add_done_callback(self._reader_ended)

    def _reader_ended(self, task: asyncio.Task[None]) -> None:
        """The reader never ends on its own; if it does, say so and start it again."""
        if self._stopping or task.cancelled():
            return
        exc = task.exception()
        log.error("the loopfuse verdict reader stopped (%r); starting it again", exc)
        self.stats.reader_restarts += 1
        self._start_reader()

    async def _partitions_of(self, topic: str, what: str = "topic") -> set[int]:
        assert self._consumer is not None
        # Asked by name: metadata of all topics leaves out the ones the ACLs hide, while
        # a named one comes back refused (TOPIC_AUTHORIZATION_FAILED), which says why.
        user = self._kafka_options.get("sasl_plain_username")
        denied = BrokerAccessError(
            f"loopfuse gateway client: the broker's ACLs do not let "
            f"{f'user {user!r}' if user else 'this client'} read {what} {topic!r} (a gateway "
            "reads its tenant's reply topic: infra/kafka/kafka-acls.sh gateway USER TOPIC)"
        )
        try:
            await self._consumer._client.add_topic(topic)
            for _ in range(100):
                partitions = self._consumer.partitions_for_topic(topic)
                if partitions:
                    return set(partitions)
                await self._consumer._client.force_metadata_update()
                if topic in self._consumer._client.cluster.unauthorized_topics:
                    raise denied
                await asyncio.sleep(0.1)
        except kafka_errors.TopicAuthorizationFailedError:
            raise denied from None
        hint = "is the loopfuse worker running?"
        if what == "reply topic":
            hint = (
                "the worker creates the topics of LOOPFUSE_REPLY_TOPICS; name one of them, "
                "or Topics(replies=None) to read the whole verdicts topic"
            )
        raise RuntimeError(f"{what} {topic!r} does not exist ({hint})")

    async def stop(self) -> None:
        self._stopping = True
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        for task in list(self._background):
            task.cancel()
        if self._consumer is not None:
            await self._consumer.stop()
        if self._producer is not None:
            await self._producer.stop()
        for pending in self._pending.values():
            pending.future.cancel()
        self._pending.clear()

    async def __aenter__(self) -> GatewayClient:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- the gateway API ---------------------------------------------------------------

    def session(
        self, session_key: str, *, run_id: str | None = None, agent_id: str | None = None
    ) -> GatewaySession:
        return GatewaySession(self, session_key, run_id, agent_id)

    def forget_run(self, session_key: str, run_id: str | None) -> None:
        """Drop what the client keeps for a run (abort callbacks, sticky blocks) without
        publishing ``run_ended``: for a host that stops tracking a run that never ended."""
        self._forget_run(session_key, run_id)

    def on_abort(self, session_key: str, run_id: str | None, callback: AbortCallback) -> None:
        """Call ``callback(verdict)`` when loopfuse aborts this run (post-compaction guard,
        and the opt-in run endings and run caps: every ``abort`` verdict)."""
        self._abort_callbacks.setdefault((session_key, run_id), []).append(callback)

    async def check(
        self,
        session: GatewaySession,
        tool_name: str,
        args: Any,
        *,
        call_id: str | None = None,
        timeout: float | None = None,
        fail_policy: FailPolicy | None = None,
    ) -> Verdict:
        """Publish a tool call and wait for its verdict.

        A call this run already had blocked (same args hash) is answered from the
        local sticky-block cache without a round trip. When no verdict arrives within
        the timeout, the fail policy (``fail_policy``, else the client's) decides:
        ``open`` allows, ``closed`` blocks.
        """
        policy = fail_policy or self.fail_policy
        call_id = call_id or session.new_call_id()
        token = args_hash(args)
        run_key = (session.session_key, session.run_id)
        if self.sticky_blocks:
            blocked = self._blocked.get(run_key, {}).get(token)
            if blocked is not None:
                await self._report_sticky(session, call_id, tool_name, args, token)
                return blocked.model_copy(
                    update={
                        "call_id": call_id,
                        "verdict_id": verdict_id(
                            session.session_key,
                            session.run_id,
                            call_id,
                            "block",
                            self._seq_space(session.session_key).incarnation,
                        ),
                        "decided_ts": int(time.time() * 1000),
                    }
                )
        event = session._envelope("tool_call")
        event.update(call_id=call_id, tool_name=tool_name)
        self._put_args(event, tool_name, args, token)
        waiter: asyncio.Future[Verdict] = asyncio.get_running_loop().create_future()
        pending_key = (session.session_key, call_id)
        self._pending[pending_key] = _Pending(waiter, event["seq"], event["incarnation"], token)
        try:
            await session._publish(self.topics.tool_calls, event)
            verdict = await asyncio.wait_for(waiter, timeout or self.timeout)
        except TimeoutError:
            self.stats.timeouts += 1
            # Never silently: every call decided without loopfuse is logged and counted.
            log.warning(
                "no verdict for %s call %r of session %r within %.1f s: %s by the "
                "fail-%s policy (%d such calls so far)",
                tool_name[:80],
                call_id[:80],
                session.session_key[:80],
                timeout or self.timeout,
                "allowed" if policy == "open" else "blocked",
                policy,
                self.stats.timeouts,
            )
            return self._timeout_verdict(event, token, policy)
        finally:
            self._pending.pop(pending_key, None)
        # A fleet breaker's block holds only until its window clears (fleet-wide, in
        # event time): the call is asked again, not answered from the cache for the run.
        if (
            verdict.action == "block"
            and self.sticky_blocks
            and verdict.detector != "fleet_tool_breaker"
        ):
            self._blocked.setdefault(run_key, {})[token] = verdict
        return verdict

    # -- internals ---------------------------------------------------------------------

    async def _report_sticky(
        self, session: GatewaySession, call_id: str, tool_name: str, args: Any, token: str
    ) -> None:
        """Publish a call answered from the sticky-block cache, without waiting for it.

        The gateway does not wait, but loopfuse still records the attempt: a model
        retrying a blocked call is what an opt-in run ending counts (its abort reaches
        ``on_abort``), and auditors see every attempt. A publish failure leaves the
        local answer standing.
        """
        self.stats.sticky_blocks += 1
        event = session._envelope("tool_call")
        event.update(call_id=call_id, tool_name=tool_name)
        self._put_args(event, tool_name, args, token)
        self._reported[(session.session_key, call_id)] = None
        if len(self._reported) > 10_000:
            self._reported.popitem(last=False)
        try:
            await session._publish(self.topics.tool_calls, event)
        except Exception as exc:  # the block stands; loopfuse misses one attempt
            log.warning("cannot report a call answered by the sticky-block cache (%r)", exc)

    def _put_args(
        self, event: dict[str, Any], tool_name: str, args: Any, token: str | None = None
    ) -> None:
        if self.hash_locally:
            event["args_hash"] = token or args_hash(args)
            if isinstance(args, dict) and isinstance(args.get("action"), str):
                event["args_action"] = args["action"]
        else:
            event["args"] = args

    async def _publish(self, topic: str, key: str, event: dict[str, Any]) -> None:
        assert self._producer is not None, "GatewayClient.start() first"
        # send() (not send_and_wait) keeps per-partition order and lets calls batch;
        # the verdict itself is the acknowledgement the gateway waits for.
        await self._producer.send(topic, orjson.dumps(event), key=key.encode())

    def _timeout_verdict(self, event: dict[str, Any], token: str, policy: FailPolicy) -> Verdict:
        allow = policy == "open"
        action = "allow" if allow else "block"
        return Verdict(
            verdict_id=verdict_id(
                event["session_key"],
                event["run_id"],
                event["call_id"],
                action,
                event["incarnation"],
            ),
            session_key=event["session_key"],
            run_id=event["run_id"],
            agent_id=event["agent_id"],
            call_id=event["call_id"],
            seq=event["seq"],
            incarnation=event["incarnation"],
            tool_name=event["tool_name"],
            action=action,
            level="none" if allow else "critical",
            detector=None,
            count=0,
            message=TIMEOUT_MESSAGE.format(what="allowed" if allow else "blocked", policy=policy),
            args_hash=token,
            event_ts=event["ts"],
            decided_ts=int(time.time() * 1000),
        )

    def _forget_run(self, session_key: str, run_id: str | None) -> None:
        self._blocked.pop((session_key, run_id), None)
        self._abort_callbacks.pop((session_key, run_id), None)

    async def _read_verdicts(self) -> None:
        """Hand verdicts to the calls waiting for them, whatever else turns up.

        A consumer error is logged, counted and retried with backoff; a record that
        is not a verdict, or a callback that raises, costs only that record.
        """
        assert self._consumer is not None
        backoff = 0.1
        while True:
            try:
                batches = await self._consumer.getmany(timeout_ms=100)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.stats.reader_errors += 1
                log.warning("reading loopfuse verdicts failed (%r); retrying", exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            backoff = 0.1
            routed = self.topics.replies is not None
            mine = self._reply_key
            stats = self.stats
            verifier = self._verifier
            for records in batches.values():
                stats.records_read += len(records)
                for record in records:
                    stats.bytes_read += max(record.serialized_key_size, 0) + max(
                        record.serialized_value_size, 0
                    )
                    # Another gateway's reply on a shared partition: skipped by its key,
                    # unparsed (a verdict routed here is keyed by its requester).
                    if routed and record.key != mine:
                        stats.foreign_records += 1
                        continue
                    if verifier is not None and not self._signed(verifier, record):
                        continue
                    self._deliver(record.value)

    def _signed(self, verifier: VerdictVerifier, record: Any) -> bool:
        """Whether a record of ours carries a valid signature; if not, counted (and
        logged at most every 10 s): never parsed, never matched to a call."""
        check = verifier.check(record.key, record.value or b"", record.headers)
        if check == "ok":
            return True
        if check == "unsigned":
            self.stats.unsigned_verdicts += 1
        else:
            self.stats.bad_signatures += 1
        now = time.monotonic()
        last = self._signature_logged
        if last is not None and now - last < SIGNATURE_LOG_INTERVAL_SECONDS:
            self._signature_unlogged += 1
            return False
        self._signature_logged = now
        log.warning(
            "dropping a verdict record that is %s (%d unsigned, %d badly signed so far; %d "
            "more since the last such line): forged, or the worker's LOOPFUSE_VERDICT_KEY "
            "is not one of this gateway's keys",
            "unsigned" if check == "unsigned" else "not signed by a key of this gateway",
            self.stats.unsigned_verdicts,
            self.stats.bad_signatures,
            self._signature_unlogged,
        )
        self._signature_unlogged = 0
        return False

    def _deliver(self, raw: bytes | None) -> None:
        try:
            verdict = Verdict.model_validate_json(raw or b"")
        except ValidationError:
            self.stats.undecodable_records += 1
            log.warning("ignoring a record on the verdicts topic that is not a verdict")
            return
        if verdict.action == "abort":
            self._on_abort(verdict)
            return
        pending = self._pending.get((verdict.session_key, verdict.call_id or ""))
        if pending is None:
            if self._reported.pop((verdict.session_key, verdict.call_id or ""), 0) is None:
                return  # the verdict of a call the sticky-block cache answered
            if verdict.incarnation == self.incarnation or any(
                verdict.incarnation == space.incarnation for space in self._spaces.values()
            ):
                self.stats.dropped_verdicts += 1  # ours, but nobody waits (late, duplicate)
            return  # another gateway's session: not ours to count
        if pending.future.done():
            return  # a redelivered verdict for a call already answered
        if (
            verdict.seq != pending.seq
            or verdict.incarnation != pending.incarnation
            or verdict.args_hash != pending.args_hash
        ):
            # Same session and call id, but not this call: an older incarnation's
            # verdict, or a forged one. Accepting it could allow what was blocked.
            self.stats.dropped_verdicts += 1
            log.warning(
                "dropping a verdict for call %r of session %r that does not match it",
                (verdict.call_id or "")[:80],
                verdict.session_key[:80],
            )
            return
        self.stats.verdicts += 1
        pending.future.set_result(verdict)

    def _on_abort(self, verdict: Verdict) -> None:
        if verdict.verdict_id in self._aborted:
            return
        self._aborted[verdict.verdict_id] = None
        if len(self._aborted) > 10_000:
            self._aborted.popitem(last=False)
        run_key = (verdict.session_key, verdict.run_id)
        for callback in self._abort_callbacks.get(run_key, []):
            try:
                outcome = callback(verdict)
            except Exception:
                self.stats.callback_errors += 1
                log.exception("an on_abort callback raised")
                continue
            if asyncio.iscoroutine(outcome):
                task = asyncio.ensure_future(outcome)
                self._background.add(task)
                task.add_done_callback(self._callback_done)

    def _callback_done(self, task: asyncio.Task[Any]) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.stats.callback_errors += 1
            log.error("an on_abort callback raised", exc_info=task.exception())
