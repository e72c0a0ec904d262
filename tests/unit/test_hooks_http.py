"""The hooks service's HTTP face under hostile requests: every one gets a JSON answer
under the agent's fail policy (or 401 / 404 in JSON), the service keeps serving, and
nothing reaches Kafka for a body that is not a hook event. The gateway client is a
real one that is never started: a request that tried to publish would fail, and be
answered by the fail policy instead of the ``{}`` asserted for ignored events.
(The verdict paths run against a real worker: tests/integration/test_hooks_service.py.)"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from loopfuse.streams.gateway.client import GatewayClient
from loopfuse.streams.gateway.hooks.service import HooksOptions, HooksService

Start = Callable[..., Any]


@pytest.fixture
def services() -> list[HooksService]:
    return []


@pytest.fixture
async def start(services: list[HooksService]) -> AsyncIterator[Start]:
    clients: list[TestClient[Any, Any]] = []

    async def started(**options: Any) -> TestClient[Any, Any]:
        service = HooksService(GatewayClient("127.0.0.1:1"), HooksOptions(**options))
        services.append(service)
        client = TestClient(TestServer(service.app()))
        await client.start_server()
        clients.append(client)
        return client

    yield started
    for client in clients:
        await client.close()


async def answer(client: TestClient[Any, Any], path: str, data: bytes, **headers: str) -> Any:
    response = await client.post(path, data=data, headers=headers)
    assert response.status == 200, await response.text()
    assert response.content_type == "application/json"
    return await response.json()


OPEN = "runs by the fail-open policy"
CLOSED = "blocked by the fail-closed policy"


async def test_hostile_bodies_get_the_fail_open_answer_and_the_service_goes_on(
    start: Start,
) -> None:
    client = await start()
    bodies = [
        b"{not json",
        b"",
        b"null",
        b'"PreToolUse"',
        b"[" * 100_000,
        b'{"hook_event_name": "PreToolUse"}',
        b'{"hook_event_name": "PreToolUse", "session_id": "s"}',
        b'{"hook_event_name": "PreToolUse", "session_id": 7, "tool_name": "Bash"}',
    ]
    for agent, before in (
        ("claude", b"PreToolUse"),
        ("codex", b"PreToolUse"),
        ("gemini", b"BeforeTool"),
    ):
        for data in bodies:
            got = await answer(client, f"/{agent}", data.replace(b"PreToolUse", before))
            assert set(got) == {"systemMessage"} and got["systemMessage"].startswith("loopfuse: ")
            assert got["systemMessage"].endswith(f"not judged ({OPEN})")
    health = await (await client.get("/healthz")).json()
    assert health["status"] == "ok" and health["stats"]["bad_requests"] == 24


async def test_fail_closed_blocks_what_cannot_be_judged_in_the_agents_shape(start: Start) -> None:
    client = await start(fail_policy={"codex": "closed", "gemini": "closed"})
    codex = await answer(client, "/codex", b"{not json")
    assert codex == {
        "hookSpecificOutput": {
            "hookEventName": "PreToolUse",
            "permissionDecision": "deny",
            "permissionDecisionReason": f"loopfuse: the hook body is not JSON; not judged ({CLOSED})",
        }
    }
    gemini = await answer(client, "/gemini", b'{"hook_event_name": "BeforeTool"}')
    assert gemini == {
        "decision": "deny",
        "reason": f"loopfuse: the hook body has no session_id; not judged ({CLOSED})",
    }
    # after the tool nothing can be blocked; Claude stays open
    after = await answer(client, "/codex", b'{"hook_event_name": "PostToolUse", "session_id": "s"}')
    assert set(after) == {"systemMessage"}
    assert set(await answer(client, "/claude", b"{")) == {"systemMessage"}


async def test_a_body_over_the_bound_is_not_read(start: Start) -> None:
    client = await start(max_body_bytes=1_000, fail_policy={"claude": "closed"})
    huge = json.dumps(
        {
            "hook_event_name": "PreToolUse",
            "session_id": "s",
            "tool_name": "Write",
            "tool_input": {"content": "x" * 5_000},
        }
    ).encode()
    got = await answer(client, "/claude", huge)
    reason = got["hookSpecificOutput"]["permissionDecisionReason"]
    assert (
        reason == f"loopfuse: the hook body is larger than 1000 bytes and was not judged ({CLOSED})"
    )


async def test_events_loopfuse_does_not_use_are_answered_without_a_publish(start: Start) -> None:
    client = await start(fail_policy={"claude": "closed", "codex": "closed", "gemini": "closed"})
    for agent, event in [
        ("gemini", "PreCompress"),
        ("gemini", "SessionStart"),
        ("claude", "UserPromptSubmit"),
        ("claude", "Notification"),
        ("codex", "SessionStart"),
        ("codex", "\x1b[31mred"),
    ]:
        data = json.dumps({"hook_event_name": event, "session_id": "s"}).encode()
        assert await answer(client, f"/{agent}", data) == {}


async def test_a_token_is_required_when_configured_and_compared_whole(start: Start) -> None:
    client = await start(token="s3cret-token")
    data = b'{"hook_event_name": "SessionStart", "session_id": "s"}'
    for given in [
        None,
        "Bearer wrong",
        "Bearer s3cret-toke",
        "s3cret-token",
        "Bearer s3cret-token2",
    ]:
        headers = {"Authorization": given} if given is not None else {}
        response = await client.post("/claude", data=data, headers=headers)
        assert response.status == 401
        got = await response.json()
        assert got == {"error": "loopfuse hooks: missing or wrong bearer token"}
        assert "s3cret" not in json.dumps(got)
    assert await answer(client, "/claude", data, Authorization="Bearer s3cret-token") == {}


async def test_other_paths_and_methods_answer_json(start: Start) -> None:
    client = await start()
    for method, path in [("POST", "/openclaw"), ("GET", "/claude"), ("GET", "/"), ("PUT", "/x")]:
        response = await client.request(method, path)
        assert response.status in (404, 405)
        if response.status == 404:
            assert "POST /claude, /codex or /gemini" in (await response.json())["error"]


async def test_what_the_service_keeps_per_run_is_bounded(
    start: Start, services: list[HooksService], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Runs that never end (Gemini's SessionEnd is not waited for) are forgotten, oldest
    first, by the service and by its client (their abort callbacks)."""
    from loopfuse.streams.gateway.hooks import service as hooks_service

    monkeypatch.setattr(hooks_service, "MAX_REMEMBERED", 5)
    client = await start()
    for n in range(20):
        data = json.dumps({"hook_event_name": "PostCompact", "session_id": f"s{n}"}).encode()
        await answer(client, "/claude", data)  # not published (no Kafka here): fail policy
    [service] = services
    assert [key for key, _ in service._watched] == [f"claude:s{n}" for n in range(15, 20)]
    assert sorted(service.client._abort_callbacks) == [
        (f"claude:s{n}", f"s{n}") for n in range(15, 20)
    ]
