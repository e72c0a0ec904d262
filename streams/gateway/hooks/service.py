"""``loopfuse hooks serve``: the coding agents' hooks answered from one gateway client.

One long-lived process per machine (or CI runner) speaks each agent's hook protocol
on loopback (``POST /claude``, ``/codex``, ``/gemini``) and holds one
:class:`GatewayClient`: one incarnation, its reply partition, one seq space per
session key. A restarted service is a new incarnation, so loopfuse continues its
sessions with their history (docs/wire-format.md: restart-safe gateways).

Per hook event (the mapping in :mod:`.protocols`):

* before a tool: ``tool_call``, then the verdict within ``verdict_timeout`` (under the
  agent's own hook timeout); none in time: the agent's fail policy;
* after a tool: ``tool_result`` (a failure as ``error``), hashed here unless raw
  payloads are asked for, so no tool argument or output leaves the machine;
* after a compaction (Claude, Codex): ``compaction``; at the end of a turn or
  session: ``run_ended``.

The run id of a session is its agent's session id: a session is one run, each
``Stop`` ends it (freeing its warnings and post-compaction guard) and the next turn
continues it with the same history, so a loop across turns is still one loop, and a
restarted service (which remembers nothing) continues the same run.

Gemini gives no call id: a ``BeforeTool`` takes a call id here and its ``AfterTool``
is paired with the oldest open call of the same session, tool name and canonical
arguments (first in, first out). An ``AfterTool`` with no open call (the service
restarted between the two) is sent with an empty call id, which loopfuse pairs with
the session's latest open call of that tool and those arguments.

Logs name sessions, tools and verdicts, never a tool's arguments or output.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import logging
import os
import signal
import sys
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web
from aiokafka.errors import KafkaError

from loopfuse.schemas.events import Verdict
from loopfuse.streams.broker_access import ENV_NAMES, BrokerAccessError
from loopfuse.streams.engine.fingerprint import args_hash
from loopfuse.streams.gateway.client import (
    TIMEOUT_MESSAGE,
    GatewayClient,
    GatewaySession,
    Topics,
    blocked_tool_result,
)
from loopfuse.streams.gateway.hooks.protocols import (
    AGENTS,
    Agent,
    Compacted,
    FailPolicy,
    HookInputError,
    Ignored,
    ToolOutcome,
    ToolUse,
    abort_answer,
    block_answer,
    bounded_id,
    parse,
    session_key,
    stop_after_answer,
    unjudged_answer,
    warn_after_answer,
    warn_before_answer,
)
from loopfuse.streams.settings import Settings

log = logging.getLogger("loopfuse.hooks")

DEFAULT_PORT = 7311
#: Largest hook body read (a PostToolUse carries the tool's whole output).
DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
#: Sessions, open Gemini calls, blocked calls and aborted runs remembered (oldest first out).
MAX_REMEMBERED = 10_000
#: Open Gemini calls of one (session, tool, arguments).
MAX_OPEN_CALLS = 64
#: How long a blocked call waits for an abort beside its block (run endings send both).
ABORT_BESIDE_BLOCK_SECONDS = 0.25
#: Verdict waits kept for /healthz's percentiles (the newest).
WAITS_KEPT = 4096
#: How long after a Codex abort's deny the interrupt follows (the deny is read first).
INTERRUPT_DELAY_SECONDS = 0.1
#: The header a Codex hook command sends its agent's process id in ($PPID).
AGENT_PID_HEADER = "X-Loopfuse-Agent-Pid"


@dataclass(frozen=True, slots=True)
class HooksOptions:
    """How the service listens and decides (``loopfuse hooks serve``'s flags)."""

    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    token: str | None = None  # a bearer token every request must carry
    host_id: str | None = None  # in every session key: which machine's agent it is
    verdict_timeout: float = 5.0
    fail_policy: dict[Agent, FailPolicy] = field(default_factory=dict)  # default open
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    raw_payloads: bool = False  # send tool arguments and outputs, not their hashes
    codex_interrupt: bool = False  # SIGINT a Codex whose run loopfuse aborted

    def policy(self, agent: Agent) -> FailPolicy:
        return self.fail_policy.get(agent, "open")


@dataclass(slots=True)
class HooksStats:
    """What the service answered; ``GET /healthz`` shows them."""

    requests: int = 0
    calls: int = 0  # tool calls judged (a verdict, or the fail policy)
    warned: int = 0
    blocked: int = 0
    aborted: int = 0
    unjudged: int = 0  # calls decided by the fail policy: no verdict in time, Kafka failing
    bad_requests: int = 0  # bodies that are not a hook event (answered by the fail policy)
    unauthorised: int = 0
    results: int = 0
    unpaired_results: int = 0  # Gemini AfterTool with no open BeforeTool here
    interrupts: int = 0  # SIGINTs sent to a Codex process


@dataclass(slots=True)
class _OpenCall:
    call_id: str
    warning: str | None


class HooksService:
    """Answers hook requests; one per process, around one started gateway client."""

    def __init__(self, client: GatewayClient, options: HooksOptions) -> None:
        self.client = client
        self.options = options
        self.stats = HooksStats()
        self._watched: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._aborts: OrderedDict[str, Verdict] = OrderedDict()
        self._blocked_calls: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._open_calls: OrderedDict[tuple[str, str, str], deque[_OpenCall]] = OrderedDict()
        self._waits: deque[float] = deque(maxlen=WAITS_KEPT)  # verdict waits, ms

    # -- HTTP --------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.options.max_body_bytes)
        for agent in AGENTS:
            app.router.add_post(f"/{agent}", self._handler(agent))
        app.router.add_get("/healthz", self._healthz)
        app.router.add_route("*", "/{tail:.*}", self._not_found)
        return app

    def _handler(self, agent: Agent) -> Callable[[web.Request], Any]:
        async def handle(request: web.Request) -> web.Response:
            return await self._handle(agent, request)

        return handle

    async def _handle(self, agent: Agent, request: web.Request) -> web.Response:
        self.stats.requests += 1
        if not self._authorised(request):
            self.stats.unauthorised += 1
            return web.json_response(
                {"error": "loopfuse hooks: missing or wrong bearer token"}, status=401
            )
        body = await self._body(request)
        if body is None:
            self.stats.bad_requests += 1
            reason = (
                f"loopfuse: the hook body is larger than {self.options.max_body_bytes} bytes "
                f"and was not judged ({self._policy_words(agent)})"
            )
            return web.json_response(
                unjudged_answer(agent, self.options.policy(agent), reason, before_tool=True)
            )
        try:
            answer = await self.answer(agent, body, request.headers.get(AGENT_PID_HEADER))
        except Exception:  # never an error page: the agent gets its fail policy
            log.exception("answering a %s hook failed", agent)
            self.stats.unjudged += 1
            reason = f"loopfuse: the hook could not be judged ({self._policy_words(agent)})"
            answer = unjudged_answer(agent, self.options.policy(agent), reason, before_tool=True)
        return web.json_response(answer)

    def _authorised(self, request: web.Request) -> bool:
        token = self.options.token
        if token is None:
            return True
        given = request.headers.get("Authorization", "")
        return hmac.compare_digest(given.encode(), f"Bearer {token}".encode())

    async def _body(self, request: web.Request) -> bytes | None:
        """The request body, or None when it is larger than the bound (not read further)."""
        limit = self.options.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            return None
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.content.iter_chunked(65_536):
            size += len(chunk)
            if size > limit:
                return None
            chunks.append(chunk)
        return b"".join(chunks)

    async def _healthz(self, request: web.Request) -> web.Response:
        client = self.client
        return web.json_response(
            {
                "status": "ok",
                "incarnation": client.incarnation,
                "reply_partition": client.reply_partition,
                "fail_policy": {agent: self.options.policy(agent) for agent in AGENTS},
                "stats": asdict(self.stats),
                "verdict_wait_ms": _percentiles(self._waits),
                "client": {
                    "verdicts": client.stats.verdicts,
                    "timeouts": client.stats.timeouts,
                    "dropped_verdicts": client.stats.dropped_verdicts,
                },
            }
        )

    async def _not_found(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"error": "loopfuse hooks: POST /claude, /codex or /gemini; GET /healthz"},
            status=404,
        )

    # -- hook events -------------------------------------------------------------------

    async def answer(
        self, agent: Agent, body: bytes, agent_pid: str | None = None
    ) -> dict[str, Any]:
        """The agent's hook output for one hook body."""
        try:
            event = parse(agent, body)
        except HookInputError as exc:
            self.stats.bad_requests += 1
            reason = f"loopfuse: {exc.reason}; not judged ({self._policy_words(agent)})"
            policy = self.options.policy(agent)
            return unjudged_answer(agent, policy, reason, before_tool=exc.before_tool)
        if isinstance(event, Ignored):
            return {}
        key = session_key(agent, self.options.host_id, event.session_id)
        session = self.client.session(key, run_id=bounded_id(event.session_id), agent_id=agent)
        self._watch(session)
        if isinstance(event, ToolUse):
            return await self._before_tool(agent, session, event, agent_pid)
        try:  # nothing left to block: a failure is only reported
            if isinstance(event, ToolOutcome):
                return await self._after_tool(agent, session, event)
            if isinstance(event, Compacted):
                await session.compaction(event.reason)
                return {}
            await session.run_ended()
        except Exception as exc:
            log.warning("cannot publish a %s event of session %r (%r)", agent, key[:80], exc)
            return {"systemMessage": f"loopfuse could not record the {type(event).__name__}"}
        self._aborts.pop(key, None)
        self._watched.pop((key, session.run_id or ""), None)
        return {}

    async def _before_tool(
        self, agent: Agent, session: GatewaySession, event: ToolUse, agent_pid: str | None
    ) -> dict[str, Any]:
        key = session.session_key
        self.stats.calls += 1
        aborted = self._aborts.get(key)
        if aborted is not None:  # Codex goes on after an abort: every later call is denied
            self.stats.aborted += 1
            self._interrupt(agent, agent_pid)
            return abort_answer(agent, aborted.message or "aborted by loopfuse")
        call_id = event.call_id or session.new_call_id()
        policy = self.options.policy(agent)
        started = time.perf_counter()
        try:
            verdict = await asyncio.wait_for(
                self.client.check(
                    session,
                    event.tool_name,
                    event.tool_input,
                    call_id=call_id,
                    timeout=self.options.verdict_timeout,
                    fail_policy=policy,
                ),
                # the client decides at the timeout; this bounds a publish that hangs
                self.options.verdict_timeout + 1.0,
            )
        except Exception as exc:  # Kafka failing, a publish that hangs
            self.stats.unjudged += 1
            log.warning(
                "no verdict for %r call of session %r (%s): %s by the fail-%s policy",
                event.tool_name[:80],
                key[:80],
                type(exc).__name__,
                "allowed" if policy == "open" else "blocked",
                policy,
            )
            reason = f"loopfuse could not judge the call ({self._policy_words(agent)})"
            return unjudged_answer(agent, policy, reason, before_tool=True)
        self._waits.append((time.perf_counter() - started) * 1000)
        if verdict.message == TIMEOUT_MESSAGE.format(what="allowed", policy="open"):
            self.stats.unjudged += 1  # no verdict in time, the fail-open policy runs it
            self._open(agent, session, event, call_id, None)
            return {"systemMessage": verdict.message}
        if verdict.message == TIMEOUT_MESSAGE.format(what="blocked", policy="closed"):
            self.stats.unjudged += 1  # and the fail-closed policy blocks it (below)
        if verdict.action in ("block", "abort"):
            return await self._blocked(agent, session, event, call_id, verdict, agent_pid)
        message = verdict.message or ""
        if verdict.action == "warn":
            self.stats.warned += 1
            self._open(agent, session, event, call_id, message)
            return warn_before_answer(agent, message)
        self._open(agent, session, event, call_id, None)
        return {}

    async def _blocked(
        self,
        agent: Agent,
        session: GatewaySession,
        event: ToolUse,
        call_id: str,
        verdict: Verdict,
        agent_pid: str | None,
    ) -> dict[str, Any]:
        """A blocked call: loopfuse is sent the blocked-result shape, so it records
        nothing for the call and the block stays in force (a later result the agent
        sends for it is dropped); an abort beside the block ends the run."""
        key = session.session_key
        _remember(self._blocked_calls, (key, call_id), None)
        try:
            await session.result(
                event.tool_name,
                event.tool_input,
                call_id=call_id,
                result=blocked_tool_result(verdict),
            )
        except Exception as exc:  # the block stands; loopfuse misses the blocked shape
            log.warning("cannot publish the blocked result of session %r (%r)", key[:80], exc)
        abort = self._aborts.get(key)
        waited = 0.0
        while abort is None and waited < ABORT_BESIDE_BLOCK_SECONDS:
            await asyncio.sleep(0.025)
            waited += 0.025
            abort = self._aborts.get(key)
        if abort is not None:
            self.stats.aborted += 1
            self._interrupt(agent, agent_pid)
            return abort_answer(agent, abort.message or "aborted by loopfuse")
        self.stats.blocked += 1
        return block_answer(agent, verdict.message or "blocked by loopfuse")

    async def _after_tool(
        self, agent: Agent, session: GatewaySession, event: ToolOutcome
    ) -> dict[str, Any]:
        key = session.session_key
        warning: str | None = None
        if event.call_id is None:  # Gemini: the oldest open call of these arguments
            opened = self._close(agent, session, event)
            call_id = opened.call_id if opened is not None else ""
            warning = opened.warning if opened is not None else None
        else:
            call_id = event.call_id
        if (key, call_id) in self._blocked_calls:
            return {}  # the call was blocked: its blocked result is what loopfuse has
        self.stats.results += 1
        await session.result(
            event.tool_name,
            event.tool_input,
            call_id=call_id,
            result=event.result,
            error=event.error,
            unknown_tool=event.unknown_tool,
        )
        aborted = self._aborts.get(key)
        if aborted is not None:
            return stop_after_answer(agent, aborted.message or "aborted by loopfuse")
        if warning is not None:
            return warn_after_answer(agent, warning)
        return {}

    # -- bookkeeping -------------------------------------------------------------------

    def _open(
        self,
        agent: Agent,
        session: GatewaySession,
        event: ToolUse,
        call_id: str,
        warning: str | None,
    ) -> None:
        """Remember a Gemini call until its AfterTool (the others carry their call id)."""
        if agent != "gemini":
            return
        slot = (session.session_key, event.tool_name, args_hash(event.tool_input))
        calls = self._open_calls.get(slot)
        if calls is None:
            calls = deque(maxlen=MAX_OPEN_CALLS)
            _remember(self._open_calls, slot, calls)
        calls.append(_OpenCall(call_id, warning))

    def _close(self, agent: Agent, session: GatewaySession, event: ToolOutcome) -> _OpenCall | None:
        slot = (session.session_key, event.tool_name, args_hash(event.tool_input))
        calls = self._open_calls.get(slot)
        if not calls:
            self.stats.unpaired_results += 1
            return None
        opened = calls.popleft()
        if not calls:
            del self._open_calls[slot]
        return opened

    def _watch(self, session: GatewaySession) -> None:
        """Hear this run's aborts (they come for a call or a result, any time)."""
        run = (session.session_key, session.run_id or "")
        if run in self._watched:
            self._watched.move_to_end(run)
            return
        self._watched[run] = None
        if len(self._watched) > MAX_REMEMBERED:  # a run that never ended (Gemini's may not)
            (old_key, old_run), _ = self._watched.popitem(last=False)
            self.client.forget_run(old_key, old_run)
        key = session.session_key

        def aborted(verdict: Verdict) -> None:
            _remember(self._aborts, key, verdict)
            log.warning(
                "loopfuse aborted session %r (%s, count %d)",
                key[:80],
                verdict.detector,
                verdict.count,
            )

        self.client.on_abort(session.session_key, session.run_id, aborted)

    def _interrupt(self, agent: Agent, agent_pid: str | None) -> None:
        """With ``--codex-interrupt``: SIGINT the Codex process that asked (its hook
        command sends ``$PPID``), shortly after the deny, so Codex ends its run."""
        if agent != "codex" or not self.options.codex_interrupt or agent_pid is None:
            return
        pid = _codex_pid(agent_pid)
        if pid is None:
            log.warning(
                "not interrupting process %r: not a Codex process of this user", agent_pid[:20]
            )
            return

        def send() -> None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGINT)
                self.stats.interrupts += 1

        asyncio.get_running_loop().call_later(INTERRUPT_DELAY_SECONDS, send)

    def _policy_words(self, agent: Agent) -> str:
        policy = self.options.policy(agent)
        return f"{'runs' if policy == 'open' else 'blocked'} by the fail-{policy} policy"


def _remember(table: OrderedDict[Any, Any], key: Any, value: Any) -> None:
    table[key] = value
    table.move_to_end(key)
    while len(table) > MAX_REMEMBERED:
        table.popitem(last=False)


def _percentiles(waits: deque[float]) -> dict[str, float | int]:
    """p50 and p99 of the newest verdict waits (a call's wait for its verdict, as the
    service sees it: publish to verdict, or to the fail policy)."""
    ordered = sorted(waits)
    if not ordered:
        return {"count": 0}

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)

    return {"count": len(ordered), "p50": at(0.5), "p99": at(0.99)}


def _codex_pid(value: str) -> int | None:
    """A process id that is a Codex process of this user (Linux: /proc), else None."""
    if not value.strip().isdigit():
        return None
    pid = int(value)
    if pid <= 1 or pid == os.getpid():
        return None
    try:
        if os.stat(f"/proc/{pid}").st_uid != os.getuid():
            return None
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return pid if b"codex" in cmdline else None


# -- the process -----------------------------------------------------------------------


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def gateway_client(settings: Settings, options: HooksOptions) -> GatewayClient:
    """The service's client, from the worker's LOOPFUSE_* Kafka settings."""
    security: dict[str, Any] = settings.kafka_client_kwargs()
    return GatewayClient(
        settings.bootstrap_servers,
        topics=Topics.from_settings(settings),
        timeout=options.verdict_timeout,
        hash_locally=not options.raw_payloads,
        client_id=f"hooks-{uuid.uuid4().hex[:12]}",
        verdict_fetch_wait_ms=settings.fetch_wait_ms,
        idempotent=not settings.embedded_broker,
        setting_names=ENV_NAMES,
        verdict_key=settings.verdict_keys(),
        **security,
    )


async def serve(settings: Settings, options: HooksOptions, stop: asyncio.Event) -> None:
    """Serve until ``stop`` is set; prints the serving line once the client is up."""
    client = gateway_client(settings, options)
    await client.start()
    runner: web.AppRunner | None = None
    try:
        service = HooksService(client, options)
        runner = web.AppRunner(service.app(), access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, options.host, options.port)
        await site.start()
        port = options.port
        if runner.addresses:
            port = int(runner.addresses[0][1])
        shown = f"[{options.host}]" if ":" in options.host else options.host
        print(f"loopfuse hooks: serving on http://{shown}:{port}", flush=True)
        await stop.wait()
    finally:
        if runner is not None:
            await runner.cleanup()
        await client.stop()


def run_serve(settings: Settings, options: HooksOptions) -> int:
    """``loopfuse hooks serve``: runs until SIGINT or SIGTERM."""

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        await serve(settings, options, stop)

    try:
        asyncio.run(main())
    except BrokerAccessError as exc:  # one line naming the setting to fix
        print(f"loopfuse hooks: {exc}", file=sys.stderr)
        return 2
    except KafkaError as exc:
        print(
            f"loopfuse hooks: cannot reach Kafka at {settings.bootstrap_servers} "
            f"(LOOPFUSE_BOOTSTRAP_SERVERS): {exc}",
            file=sys.stderr,
        )
        return 1
    except OSError as exc:  # the port is taken, or the address is not this machine's
        print(
            f"loopfuse hooks: cannot listen on {options.host}:{options.port} "
            f"({exc.strerror or exc})",
            file=sys.stderr,
        )
        return 2
    return 0
