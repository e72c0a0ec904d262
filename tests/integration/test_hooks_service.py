"""``loopfuse hooks serve`` against a real worker: each agent's hook JSON, POSTed as
the agent posts it, gets the agent's own answer for loopfuse's verdict.

The worker runs tests/fixtures/worker.json5 (warning 3, critical 5): a loop of
identical shell calls with identical outcomes runs calls 1-3 plainly, warns 4-5 and
blocks from 6 on, in each agent's protocol. (Inside the agents' own loops:
tests/e2e/agents.)
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest

from loopfuse.streams.gateway.hooks.protocols import block_answer
from loopfuse.streams.local.worker_process import WorkerProcess
from tests.support.harness import new_topics, unique, worker_settings
from tests.support.hooks_service import HooksServer

pytestmark = pytest.mark.timeout(300)

COMMAND = {"command": "make test"}


@pytest.fixture(scope="module")
def worker(
    kafka_bootstrap: str, kafka_broker_kind: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[WorkerProcess, dict[str, str]]]:
    """A worker with a reply topic of its own, and its settings (the service's too)."""
    tmp = tmp_path_factory.mktemp("hooks")
    settings = worker_settings(
        kafka_bootstrap,
        kafka_broker_kind,
        new_topics(),
        unique("hooks-test"),
        tmp / "data",
        reply_topics=unique("hooks-replies"),
        reply_partitions=4,
    )
    process = WorkerProcess(settings, log_path=tmp / "worker.log").start()
    try:
        process.wait_ready(90)
        yield process, settings
    finally:
        process.stop()


@pytest.fixture(scope="module")
def settings(worker: tuple[WorkerProcess, dict[str, str]]) -> dict[str, str]:
    return worker[1]


@pytest.fixture
def service(settings: dict[str, str]) -> Iterator[HooksServer]:
    server = HooksServer(settings, ["--port", "0", "--verdict-timeout", "30"]).start()
    try:
        yield server
    finally:
        assert server.stop() == 0


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def post(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> dict[str, Any]:
    async with http.post(url, json=body) as response:
        assert response.status == 200, await response.text()
        answer: dict[str, Any] = await response.json()
        return answer


def decision(answer: dict[str, Any]) -> str:
    """What the agent does with a pre-tool answer: run, run warned, deny, stop."""
    if answer.get("continue") is False:
        return "abort"
    output = answer.get("hookSpecificOutput", {})
    if output.get("permissionDecision") == "deny" or answer.get("decision") == "deny":
        return "block"
    return "warn" if output.get("additionalContext") else "allow"


async def claude_call(
    http: aiohttp.ClientSession, url: str, session_id: str, n: int, agent: str = "claude"
) -> str:
    """One Claude Code (or Codex) Bash call, and its result when it ran."""
    call = {
        "session_id": session_id,
        "transcript_path": f"/tmp/{session_id}.jsonl",
        "cwd": "/work",
        "tool_name": "Bash",
        "tool_input": COMMAND,
        "tool_use_id": f"toolu_{n}_{uuid.uuid4().hex[:6]}",
    }
    if agent == "codex":
        call["turn_id"] = "turn-1"
    answer = await post(http, f"{url}/{agent}", {**call, "hook_event_name": "PreToolUse"})
    action = decision(answer)
    if action in ("allow", "warn"):
        # as each sends it (captured): Claude reports a non-zero exit as a failure,
        # Codex hands over the output alone
        after: dict[str, Any] = {
            **call,
            "hook_event_name": "PostToolUseFailure",
            "error": "Exit code 1\nFAIL: 3 tests",
            "is_interrupt": False,
            "duration_ms": 30 + n,
        }
        if agent == "codex":
            after = {**call, "hook_event_name": "PostToolUse", "tool_response": "FAIL: 3 tests\n"}
        assert await post(http, f"{url}/{agent}", after) == {}
    return action


async def gemini_call(http: aiohttp.ClientSession, url: str, session_id: str, n: int) -> str:
    """One Gemini CLI shell call; its warning comes with AfterTool, appended to the result."""
    call = {
        "session_id": session_id,
        "transcript_path": f"/tmp/{session_id}.json",
        "cwd": "/work",
        "timestamp": "2026-12-04T18:00:00.000Z",
        "tool_name": "run_shell_command",
        "tool_input": COMMAND,
    }
    answer = await post(http, f"{url}/gemini", {**call, "hook_event_name": "BeforeTool"})
    action = decision(answer)
    if action != "allow":
        return action
    output = (  # Gemini's shell result (captured): the process group differs on every call
        "<untrusted_context>\nOutput: FAIL: 3 tests\nExit Code: 1\n"
        f"Process Group PGID: {4100 + n}\n</untrusted_context>"
    )
    response = {"llmContent": output, "returnDisplay": "FAIL: 3 tests"}
    after = await post(
        http, f"{url}/gemini", {**call, "hook_event_name": "AfterTool", "tool_response": response}
    )
    return decision(after)


LOOP = ["allow"] * 3 + ["warn"] * 2 + ["block"] * 3


@pytest.mark.parametrize("agent", ["claude", "codex", "gemini"])
async def test_a_loop_is_warned_then_blocked_in_each_agents_protocol(
    agent: str, service: HooksServer, http: aiohttp.ClientSession
) -> None:
    session_id = str(uuid.uuid4())
    actions = []
    for n in range(1, 9):
        if agent == "gemini":
            actions.append(await gemini_call(http, service.url, session_id, n))
        else:
            actions.append(await claude_call(http, service.url, session_id, n, agent))
    assert actions == LOOP
    async with http.get(f"{service.url}/healthz") as response:
        health = await response.json()
    assert health["stats"]["calls"] == 8 and health["stats"]["unjudged"] == 0
    assert health["verdict_wait_ms"]["count"] == 8
    assert 0 < health["verdict_wait_ms"]["p50"] <= health["verdict_wait_ms"]["p99"]


async def test_the_block_and_warning_carry_loopfuses_message(
    service: HooksServer, http: aiohttp.ClientSession
) -> None:
    session_id = str(uuid.uuid4())
    for n in range(1, 6):
        await claude_call(http, service.url, session_id, n)
    call = {
        "hook_event_name": "PreToolUse",
        "session_id": session_id,
        "tool_name": "Bash",
        "tool_input": COMMAND,
        "tool_use_id": "toolu_6",
    }
    answer = await post(http, f"{service.url}/claude", call)
    output = answer["hookSpecificOutput"]
    assert output["hookEventName"] == "PreToolUse" and output["permissionDecision"] == "deny"
    assert output["permissionDecisionReason"].startswith("CRITICAL: Called Bash with identical")


@pytest.mark.parametrize("agent", ["claude", "codex"])
async def test_a_loop_after_a_compaction_ends_the_run_where_the_agent_can(
    agent: str, service: HooksServer, http: aiohttp.ClientSession
) -> None:
    """The post-compaction guard (window 3) aborts the run: Claude is told to stop
    (continue false together with the deny); Codex cannot stop from a hook, so this and
    every later call of the run is denied with the abort's message."""
    session_id = str(uuid.uuid4())
    compaction = {"hook_event_name": "PostCompact", "session_id": session_id, "trigger": "auto"}
    assert await post(http, f"{service.url}/{agent}", compaction) == {}
    assert [await claude_call(http, service.url, session_id, n, agent) for n in (1, 2, 3)] == [
        "allow"
    ] * 3
    await asyncio.sleep(1.0)  # the abort comes for the third result; the model's turn is slower
    call = {
        "hook_event_name": "PreToolUse",
        "session_id": session_id,
        "tool_name": "Bash",
        "tool_input": COMMAND,
    }
    fourth = await post(http, f"{service.url}/{agent}", {**call, "tool_use_id": "toolu_4"})
    fifth = await post(http, f"{service.url}/{agent}", {**call, "tool_use_id": "toolu_5"})
    reason = fourth["hookSpecificOutput"]["permissionDecisionReason"]
    assert fourth["hookSpecificOutput"]["permissionDecision"] == "deny"
    assert "after auto-compaction" in reason and reason.startswith("CRITICAL: ")
    if agent == "claude":
        assert fourth["continue"] is False and fourth["stopReason"] == reason
    else:
        assert "continue" not in fourth and fifth == fourth


async def test_codex_interrupt_ends_the_aborted_codex_process_and_no_other(
    settings: dict[str, str], http: aiohttp.ClientSession
) -> None:
    """Opt-in: the process the hook names ($PPID of its shell) gets SIGINT after the
    abort's deny, if its command line says codex; any other process is left alone."""
    codex = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "codex"])
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    server = HooksServer(settings, ["--port", "0", "--codex-interrupt"]).start()
    try:
        for pid in (other.pid, codex.pid):
            session_id = str(uuid.uuid4())
            compaction = {"hook_event_name": "PostCompact", "session_id": session_id}
            await post(http, f"{server.url}/codex", compaction)
            for n in (1, 2, 3):
                await claude_call(http, server.url, session_id, n, "codex")
            await asyncio.sleep(1.0)
            call = {
                "hook_event_name": "PreToolUse",
                "session_id": session_id,
                "tool_name": "Bash",
                "tool_input": COMMAND,
                "tool_use_id": "toolu_4",
            }
            headers = {"X-Loopfuse-Agent-Pid": str(pid)}
            async with http.post(f"{server.url}/codex", json=call, headers=headers) as response:
                answer = await response.json()
            assert answer["hookSpecificOutput"]["permissionDecision"] == "deny"
        assert codex.wait(10) == -signal.SIGINT
        assert other.poll() is None
    finally:
        assert server.stop() == 0
        for process in (codex, other):
            if process.poll() is None:
                process.kill()
                process.wait()


async def test_two_agents_sessions_with_one_id_stay_apart(
    service: HooksServer, http: aiohttp.ClientSession
) -> None:
    shared = str(uuid.uuid4())
    claude = [await claude_call(http, service.url, shared, n) for n in range(1, 7)]
    codex = [await claude_call(http, service.url, shared, n, "codex") for n in range(1, 3)]
    gemini = [await gemini_call(http, service.url, shared, n) for n in range(1, 3)]
    assert claude == LOOP[:6]
    assert codex == ["allow", "allow"] and gemini == ["allow", "allow"]


async def test_a_restarted_service_keeps_the_sessions_history(
    settings: dict[str, str], http: aiohttp.ClientSession
) -> None:
    claude_session, gemini_session = str(uuid.uuid4()), str(uuid.uuid4())
    server = HooksServer(settings, ["--port", "0", "--verdict-timeout", "30"]).start()
    try:
        before = [await claude_call(http, server.url, claude_session, n) for n in range(1, 7)]
        gemini = [await gemini_call(http, server.url, gemini_session, n) for n in range(1, 5)]
    finally:
        assert server.stop() == 0
    server.start()  # a new process: a new incarnation, the same sessions
    try:
        after = await claude_call(http, server.url, claude_session, 7)
        gemini.append(await gemini_call(http, server.url, gemini_session, 5))
        gemini.append(await gemini_call(http, server.url, gemini_session, 6))
    finally:
        assert server.stop() == 0
    assert before == LOOP[:6] and after == "block"
    assert gemini == LOOP[:6]


async def test_the_health_page_and_hostile_bodies_get_json_answers(
    service: HooksServer, http: aiohttp.ClientSession
) -> None:
    async with http.get(f"{service.url}/healthz") as response:
        assert response.status == 200
        health = await response.json()
    assert health["status"] == "ok" and health["fail_policy"]["claude"] == "open"
    async with http.post(f"{service.url}/claude", data=b"{not json") as response:
        assert response.status == 200
        answer = await response.json()
    assert answer == {
        "systemMessage": "loopfuse: the hook body is not JSON; not judged (runs by the "
        "fail-open policy)"
    }


async def test_with_the_worker_stopped_each_agent_gets_its_fail_policy(
    worker: tuple[WorkerProcess, dict[str, str]], http: aiohttp.ClientSession
) -> None:
    process, settings = worker
    args = ["--port", "0", "--verdict-timeout", "1", "--fail-closed", "codex"]
    server = HooksServer(settings, args).start()
    assert process.pid is not None
    os.kill(process.pid, signal.SIGSTOP)
    try:
        call = {
            "hook_event_name": "PreToolUse",
            "session_id": str(uuid.uuid4()),
            "tool_name": "Bash",
            "tool_input": COMMAND,
            "tool_use_id": "toolu_1",
        }
        claude = await post(http, f"{server.url}/claude", call)
        codex = await post(http, f"{server.url}/codex", call)
    finally:
        os.kill(process.pid, signal.SIGCONT)
        assert server.stop() == 0
    assert claude == {
        "systemMessage": "loopfuse did not answer in time; the call is allowed by the fail-open policy."
    }
    assert codex == block_answer(
        "codex", "loopfuse did not answer in time; the call is blocked by the fail-closed policy."
    )
