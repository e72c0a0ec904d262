"""loopfuse in front of Hermes Agent's tool dispatcher, through Hermes' plugin hooks.

Hermes calls hooks synchronously, from whichever thread runs the tool (the agent loop
runs a turn's parallel tool calls on worker threads), while ``GatewayClient`` is
asyncio. So one client lives on an event loop of its own, on a daemon thread, and
each hook hands it a coroutine and waits at most the plugin's timeout.

How Hermes' ids map to loopfuse's: a Hermes ``session_id`` is a loopfuse session
(the key of its state), a ``task_id`` is a run (one ``run_conversation`` call: one
turn in the CLI; in the messaging gateway the task id is the session id, so every
turn is the same run id, ended and begun again). When compaction rotates the
session id mid-run, the new id is folded into the old key (see ``pre_api_request``).

The hooks never raise: Hermes logs a hook's exception and runs the tool, which
would make every plugin failure fail open whatever the fail policy says.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import threading
import uuid
import weakref
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from loopfuse.integrations.hermes import host
from loopfuse.integrations.hermes.settings import HermesConfig
from loopfuse.schemas import Verdict
from loopfuse.streams.broker_access import ENV_NAMES, BrokerAccessError
from loopfuse.streams.gateway.client import TIMEOUT_MESSAGE, GatewayClient, GatewaySession, Topics
from loopfuse.streams.gateway.client import blocked_tool_result as loopfuse_blocked_result

log = logging.getLogger("loopfuse.hermes")

T = TypeVar("T")
HookReply = dict[str, str] | None
CallKey = tuple[str, str]

#: How long a blocked call waits for the abort that may come beside its block (run
#: endings publish both for one call, and the abort may be read a fetch later): with it
#: in hand before the tool batch ends, Hermes ends the run after this batch rather than
#: after one more model turn. Only blocked calls wait; they run no tool anyway.
ABORT_GRACE_SECONDS = 0.25

#: The key a Hermes tool result gets when loopfuse warns about its call.
WARNING_FIELD = "loopfuse_warning"


class EventLoopThread:
    """An asyncio event loop on a daemon thread, for synchronous callers."""

    def __init__(self, name: str = "loopfuse-gateway") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def stop(self, timeout: float = 5.0) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout)


@dataclass(slots=True)
class _Call:
    """A checked call, until its outcome is published."""

    session: GatewaySession
    run_id: str
    call_id: str
    args: Any
    verdict: Verdict
    vetoed: bool


def with_warning(result: str, message: str) -> str:
    """The tool result the model sees, with loopfuse's warning in it.

    Hermes results are JSON objects as text, mostly: the warning becomes one more
    field, so the result stays valid JSON for whatever reads it after the model (unless
    another step appends text after it: Hermes 0.19's own guardrail warning does).
    Anything else gets the warning appended as a paragraph.
    """
    try:
        parsed = json.loads(result)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        return json.dumps({**parsed, WARNING_FIELD: message}, ensure_ascii=False)
    return f"{result}\n\n[loopfuse] {message}"


class HermesPlugin:
    """The hooks Hermes calls, and the one ``GatewayClient`` they share."""

    def __init__(self, config: HermesConfig, *, agent_id: str | None = None) -> None:
        self.config = config
        self.settings = config.plugin
        self.agent_id = self.settings.agent_id or agent_id
        self._lock = threading.Lock()
        self._loop: EventLoopThread | None = None
        self._client: GatewayClient | None = None
        self._starting: concurrent.futures.Future[GatewayClient] | None = None
        self._access_error: str | None = None  # the last one logged (said once)
        self._sessions: dict[str, GatewaySession] = {}
        self._open_runs: dict[str, set[str]] = {}  # session key -> runs not yet ended
        self._calls: dict[CallKey, _Call] = {}
        self._warnings: dict[CallKey, tuple[str, str, str]] = {}  # -> (key, run, message)
        self._aborted: dict[tuple[str, str], str] = {}  # (session key, run) -> message
        self._abort_seen = threading.Condition(self._lock)
        self._roots: dict[str, str] = {}  # Hermes session id -> loopfuse session key
        self._task_sessions: dict[str, str] = {}  # task id -> last Hermes session id seen
        # session key -> digests of the history at the last model request (compaction)
        self._histories: dict[str, list[int]] = {}
        self._agents: dict[tuple[str, str], weakref.ref[Any]] = {}  # (key, run) -> AIAgent
        # Called (on the client's thread) with every event published, in seq order.
        self.observer: Callable[[dict[str, Any]], None] | None = None

    # -- Hermes hooks -------------------------------------------------------------------

    def pre_tool_call(
        self,
        tool_name: str = "",
        args: Any = None,
        task_id: str = "",
        session_id: str = "",
        tool_call_id: str = "",
        **_: Any,
    ) -> HookReply:
        """Publish the call, wait for its verdict; a ``block`` directive vetoes the tool."""
        try:
            return self._pre_tool_call(tool_name, args, task_id, session_id, tool_call_id)
        except Exception:
            log.exception("loopfuse: checking %s failed", tool_name)
            return self._unanswered()

    def post_tool_call(
        self,
        tool_name: str = "",
        args: Any = None,
        result: Any = None,
        task_id: str = "",
        session_id: str = "",
        tool_call_id: str = "",
        status: str | None = None,
        error_message: str | None = None,
        **_: Any,
    ) -> None:
        """Publish the outcome of a call loopfuse checked (without waiting for Kafka)."""
        try:
            call = self._pop_call(session_id, tool_call_id, tool_name)
            if call is None:
                return
            outcome: dict[str, Any]
            if call.vetoed:
                # loopfuse's own blocked shape: it records nothing for it, so the block
                # stays in force (Hermes' {"error": ...} would count as an outcome).
                outcome = {"result": loopfuse_blocked_result(call.verdict)}
            elif status in ("error", "blocked"):
                outcome = {"error": error_message or str(result)}
            else:
                outcome = {"result": result}
            self._fire(
                self._in_run(
                    call.session,
                    call.run_id,
                    call.session.result(tool_name, call.args, call_id=call.call_id, **outcome),
                )
            )
        except Exception:
            log.exception("loopfuse: publishing the result of %s failed", tool_name)

    def transform_tool_result(
        self,
        tool_name: str = "",
        result: Any = None,
        session_id: str = "",
        tool_call_id: str = "",
        **_: Any,
    ) -> str | None:
        """Put a ``warn`` verdict's message into the result the model reads."""
        with self._lock:
            warning = self._warnings.pop(self._call_key(session_id, tool_call_id, tool_name), None)
        if warning is None or not isinstance(result, str):
            return None
        return with_warning(result, warning[2])

    def pre_api_request(
        self,
        task_id: str = "",
        session_id: str = "",
        conversation_history: Any = None,
        **_: Any,
    ) -> None:
        """Compaction, seen from the next model request (Hermes has no compaction hook);
        and the run's agent, which an abort ends (:mod:`.host`).

        Traces of a compaction that reach plugins: the session id of a run changes (a
        split: Hermes continues in a child session), or the history is no longer an
        extension of the one the last request carried (in place: Hermes 0.19 keeps the
        session id and replaces earlier turns with a ``[CONTEXT COMPACTION — REFERENCE
        ONLY]`` message, so the history may even grow). Either way the session's
        post-compaction guard is armed.
        """
        try:
            self._note_agent(task_id, session_id)
            self._detect_compaction(task_id, session_id, conversation_history)
        except Exception:
            log.exception("loopfuse: compaction detection failed")

    def on_session_end(self, session_id: str = "", task_id: str = "", **_: Any) -> None:
        """The end of a ``run_conversation`` call: the run is over (``run_ended``)."""
        try:
            key = self._key(session_id, task_id)
            session = self._sessions.get(key)
            run = task_id or (session.run_id if session is not None else None)
            if run:
                self._end_run(key, run)
            with self._lock:
                self._task_sessions.pop(task_id, None)
        except Exception:
            log.exception("loopfuse: ending the run of %s failed", session_id)

    def on_session_finalize(self, session_id: str = "", **_: Any) -> None:
        """The session is closed (reset, shutdown): end any run still open."""
        try:
            key = self._key(session_id, "")
            for run in sorted(self._open_runs.get(key, set())):
                self._end_run(key, run)
        except Exception:
            log.exception("loopfuse: finalizing %s failed", session_id)

    on_session_reset = on_session_finalize

    # -- lifecycle ----------------------------------------------------------------------

    def close(self, timeout: float = 5.0) -> None:
        """Flush what was published and stop the client and its thread."""
        with self._lock:
            loop, client, self._client, self._loop = self._loop, self._client, None, None
            self._starting = None
        if loop is None:
            return
        if client is not None:
            try:
                loop.submit(client.stop()).result(timeout)
            except Exception:
                log.warning("loopfuse: the gateway client did not stop cleanly", exc_info=True)
        loop.stop(timeout)

    # -- internals ----------------------------------------------------------------------

    def _pre_tool_call(
        self, tool_name: str, args: Any, task_id: str, session_id: str, tool_call_id: str
    ) -> HookReply:
        key, run = self._key(session_id, task_id), task_id or session_id or "hermes"
        client = self._ensure_client()
        if client is None:
            with self._lock:
                abort_message = self._aborted.get((key, run))
            if abort_message is not None and not self.settings.shadow:
                return {"action": "block", "message": abort_message}
            return self._unanswered()
        assert self._loop is not None
        args = args if isinstance(args, dict) else {}
        future = self._loop.submit(self._check(client, key, run, tool_name, args, tool_call_id))
        try:
            session, verdict = future.result(self.settings.gateway_timeout + 1.0)
        except (TimeoutError, concurrent.futures.TimeoutError):
            future.cancel()
            return self._unanswered()
        with self._lock:
            if verdict.action == "block" and not self.settings.shadow:
                self._abort_seen.wait_for(lambda: (key, run) in self._aborted, ABORT_GRACE_SECONDS)
            abort_message = self._aborted.get((key, run))
        if abort_message is not None and verdict.action != "abort":
            # The run was aborted: every later call of it is published (loopfuse
            # records the attempt) and blocked, whatever its own verdict.
            verdict = verdict.model_copy(update={"action": "block", "message": abort_message})
        vetoed = verdict.action in ("block", "abort") and not self.settings.shadow
        with self._lock:
            self._calls[self._call_key(session_id, tool_call_id, tool_name)] = _Call(
                session, run, verdict.call_id or "", args, verdict, vetoed
            )
            if verdict.action == "warn" and verdict.message and not self.settings.shadow:
                self._warnings[self._call_key(session_id, tool_call_id, tool_name)] = (
                    key,
                    run,
                    verdict.message,
                )
        if verdict.action != "allow":
            log.info(
                "loopfuse: %s %s (%s, count %s)%s",
                verdict.action,
                tool_name,
                verdict.detector,
                verdict.count,
                " [shadow]" if self.settings.shadow else "",
            )
        if vetoed:
            return {"action": "block", "message": verdict.message or "blocked by loopfuse"}
        return None

    async def _check(
        self, client: GatewayClient, key: str, run: str, tool: str, args: Any, call_id: str
    ) -> tuple[GatewaySession, Verdict]:
        session = self._session(client, key, run)
        return session, await session.check(tool, args, call_id=call_id or None)

    def _session(self, client: GatewayClient, key: str, run: str) -> GatewaySession:
        """The key's one session object (it numbers the key's events), moved to ``run``.

        Runs only on the client's loop, so switching runs cannot interleave with a
        publication of another run.
        """
        session = self._sessions.get(key)
        if session is None:
            session = client.session(key, run_id=run, agent_id=self.agent_id)
            session.observer = self._observe
            self._sessions[key] = session
        elif session.run_id != run:
            session.new_run(run)
        with self._lock:
            runs = self._open_runs.setdefault(key, set())
            new_run = run not in runs
            runs.add(run)
        if new_run:
            client.on_abort(key, run, self._on_abort)
        return session

    async def _in_run(
        self, session: GatewaySession, run: str, publication: Coroutine[Any, Any, None]
    ) -> None:
        if session.run_id != run:
            session.new_run(run)
        await publication

    def _on_abort(self, verdict: Verdict) -> None:
        message = verdict.message or "loopfuse aborted this run"
        log.warning(
            "loopfuse: run %s of %s aborted: %s", verdict.run_id, verdict.session_key, message
        )
        run_key = (verdict.session_key, verdict.run_id or "")
        with self._lock:
            self._aborted[run_key] = message
            self._abort_seen.notify_all()
            agent_ref = self._agents.get(run_key)
        agent = agent_ref() if agent_ref is not None else None
        if agent is not None and not self.settings.shadow:
            # the run ends after the tool batch in hand, as Hermes' own hard stop does
            host.halt(
                agent, tool=verdict.tool_name or "a tool", count=verdict.count, message=message
            )

    def _end_run(self, key: str, run: str) -> None:
        with self._lock:
            runs = self._open_runs.get(key, set())
            if run not in runs:
                return
            runs.discard(run)
            self._aborted.pop((key, run), None)
            self._agents.pop((key, run), None)
            # Calls Hermes never reported back (interrupted, or a warning on a tool the
            # agent loop runs itself, where transform_tool_result does not fire).
            for call_key in [
                k for k, c in self._calls.items() if (c.session.session_key, c.run_id) == (key, run)
            ]:
                del self._calls[call_key]
            for call_key in [k for k, w in self._warnings.items() if w[:2] == (key, run)]:
                del self._warnings[call_key]
        session = self._sessions[key]

        async def end() -> None:
            if session.run_id != run:
                session.new_run(run)
            await session.run_ended()

        self._fire(end())

    def _note_agent(self, task_id: str, session_id: str) -> None:
        """Remember the run's Hermes agent (weakly), so an abort can end the run."""
        agent = host.running_agent()
        if agent is None:
            return
        key, run = self._key(session_id, task_id), task_id or session_id or "hermes"
        with self._lock:
            self._agents[(key, run)] = weakref.ref(agent)
            aborted = self._aborted.get((key, run))
        if aborted is not None and not self.settings.shadow:
            # aborted before this request (the abort came after the last batch)
            host.halt(agent, tool="a tool", count=0, message=aborted)

    def _detect_compaction(self, task_id: str, session_id: str, history: Any) -> None:
        with self._lock:
            previous_id = self._task_sessions.get(task_id) if task_id else None
            rotated = bool(previous_id and session_id and previous_id != session_id)
            if previous_id and rotated:
                self._roots[session_id] = self._roots.get(previous_id, previous_id)
            if task_id and session_id:
                self._task_sessions[task_id] = session_id
            key = self._key(session_id, task_id)
            digests = _history_digests(history)
            last = self._histories.get(key)
            if digests is not None:
                self._histories.pop(key, None)  # re-inserted last: the dict keeps recency
                self._histories[key] = digests
                while len(self._histories) > MAX_TRACKED_SESSIONS:
                    del self._histories[next(iter(self._histories))]
            # In place: not an extension of the last history (shorter, or an earlier
            # message replaced), or a compaction marker that was not there before.
            shrunk = (
                digests is not None
                and last is not None
                and (
                    len(digests) < len(last)
                    or digests[: len(last)] != last
                    or _markers(history) > _markers_count(last, history)
                )
            )
            session = self._sessions.get(key)
        client = self._client
        if not (rotated or shrunk) or client is None:
            return  # no compaction, or no call checked in this process yet
        run = task_id or (session.run_id if session is not None else None) or session_id or "hermes"
        log.info("loopfuse: compaction in %s (%s)", key, "split" if rotated else "in place")

        async def compacted() -> None:
            await self._session(client, key, run).compaction("context_overflow")

        self._fire(compacted())

    def _ensure_client(self) -> GatewayClient | None:
        """The started client, starting it on first use; None if not up within the timeout."""
        with self._lock:
            if self._client is not None:
                return self._client
            if self._starting is None:
                if self._loop is None:
                    self._loop = EventLoopThread()
                self._starting = self._loop.submit(self._start())
            starting = self._starting
        try:
            return starting.result(self.settings.gateway_timeout)
        except (TimeoutError, concurrent.futures.TimeoutError):
            return None  # still starting: this call gets the fail policy
        except BrokerAccessError as exc:
            # A refused password or an untrusted certificate: one line naming the
            # variable, said once (every call retries the start; none will succeed
            # until the host's settings change).
            if str(exc) != self._access_error:
                self._access_error = str(exc)
                log.error("%s; calls get the fail policy until it is fixed", exc)
            with self._lock:
                if self._starting is starting:
                    self._starting = None
            return None
        except Exception as exc:
            log.warning("loopfuse: cannot reach Kafka (%s); will retry", exc)
            with self._lock:
                if self._starting is starting:
                    self._starting = None
            return None

    async def _start(self) -> GatewayClient:
        kafka = self.config.kafka
        security: dict[str, Any] = kafka.kafka_client_kwargs()
        client = GatewayClient(
            kafka.bootstrap_servers,
            topics=Topics.from_settings(kafka),
            timeout=self.settings.gateway_timeout,
            fail_policy=self.settings.fail_policy,
            hash_locally=self.settings.hash_locally,
            client_id=f"hermes-{uuid.uuid4().hex[:12]}",
            # LOOPFUSE_FETCH_MAX_WAIT_MS, else the broker kind's default (settings)
            verdict_fetch_wait_ms=kafka.fetch_wait_ms,
            idempotent=not kafka.embedded_broker,  # the embedded broker has no idempotence
            setting_names=ENV_NAMES,  # a host sets LOOPFUSE_*: errors name those
            verdict_key=kafka.verdict_keys(),  # LOOPFUSE_VERDICT_KEY (empty: not checked)
            **security,
        )
        try:
            await client.start()
        except BaseException:
            await client.stop()
            raise
        with self._lock:
            self._client = client
        return client

    def _fire(self, coro: Coroutine[Any, Any, None]) -> None:
        """Publish without waiting: the producer batches and orders by partition."""
        loop = self._loop
        if loop is None:
            coro.close()
            return
        loop.submit(coro).add_done_callback(_log_failure)

    def _unanswered(self) -> HookReply:
        """No verdict (Kafka unreachable, plugin fault): the fail policy decides."""
        if self.settings.fail_policy == "open" or self.settings.shadow:
            return None
        return {
            "action": "block",
            "message": TIMEOUT_MESSAGE.format(what="blocked", policy="closed"),
        }

    def _pop_call(self, session_id: str, tool_call_id: str, tool_name: str) -> _Call | None:
        with self._lock:
            return self._calls.pop(self._call_key(session_id, tool_call_id, tool_name), None)

    def _key(self, session_id: str, task_id: str) -> str:
        if session_id:
            return self._roots.get(session_id, session_id)
        return task_id or "hermes"

    @staticmethod
    def _call_key(session_id: str, tool_call_id: str, tool_name: str) -> CallKey:
        # Without a tool call id (a direct dispatch), calls of a session are sequential.
        return (session_id, tool_call_id or f"tool:{tool_name}")

    def _observe(self, event: dict[str, Any]) -> None:
        if self.observer is not None:
            self.observer(event)


#: Sessions whose last history the plugin remembers (the least recently seen go first).
MAX_TRACKED_SESSIONS = 10_000


def _history_digests(history: Any) -> list[int] | None:
    """One digest per message: its role, text and tool call id (what compaction
    changes; Hermes' own stamps on a message, such as ``api_content``, are left out)."""
    if not isinstance(history, list):
        return None
    return [
        hash((m.get("role"), _text(m.get("content")), m.get("tool_call_id")))
        if isinstance(m, dict)
        else hash(repr(m))
        for m in history
    ]


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # multimodal parts
        return "".join(
            str(part.get("text", "")) if isinstance(part, dict) else str(part) for part in content
        )
    return "" if content is None else str(content)


def _markers(history: Any) -> int:
    if not isinstance(history, list):
        return 0
    return sum(
        1
        for m in history
        if isinstance(m, dict) and host.COMPACTION_MARKER in _text(m.get("content"))
    )


def _markers_count(last: list[int], history: Any) -> int:
    """How many compaction markers the history's first ``len(last)`` messages held
    (the same messages as last time when it is an extension)."""
    return _markers(history[: len(last)]) if isinstance(history, list) else 0


def _log_failure(future: concurrent.futures.Future[None]) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.warning("loopfuse: a publication failed: %s", future.exception())
