"""Spec section 3: what counts as "the same outcome" (result normalisation)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from loopfuse.streams.engine.fingerprint import result_token
from tests.unit.conftest import (
    LOOP_BLOCK_RESULT,
    call,
    engine_with,
    last_verdict,
    pair,
    repeat_pairs,
)

TOKEN = re.compile(r"[0-9a-f]{32}")


def res(text: str | None = None, **details: Any) -> dict[str, Any]:
    content = [] if text is None else [{"type": "text", "text": text}]
    return {"content": content, "details": details}


def same(tool: str, args: Any, a: Any, b: Any, **kw: Any) -> bool:
    ta, tb = result_token(tool, args, result=a, **kw), result_token(tool, args, result=b, **kw)
    assert ta is not None and tb is not None
    return ta == tb


def blocks_after(tool: str, args: Any, outcomes: list[dict[str, Any]], **loop: Any) -> bool:
    """Feed call/result pairs with these outcomes, then one more call: is it blocked?"""
    engine = engine_with(warningThreshold=1, criticalThreshold=len(outcomes), **loop)
    events = [e for outcome in outcomes for e in pair(tool, args, **outcome)]
    return last_verdict(engine.replay([*events, call(tool, args)])).action == "block"


# --- tokens, errors, non-objects -----------------------------------------------------------------


def test_token_shape() -> None:
    assert TOKEN.fullmatch(result_token("read", {}, result=res("x")) or "")
    error = result_token("read", {}, error="boom") or ""
    assert error.startswith("error:") and TOKEN.fullmatch(error.removeprefix("error:"))


def test_error_never_equals_a_success_with_the_same_text() -> None:
    for success in ["boom", res("boom"), {"error": "boom"}]:
        assert result_token("read", {}, error="boom") != result_token("read", {}, result=success)
    assert not blocks_after("read", {}, [{"error": "boom"}, {"result": "boom"}, {"error": "boom"}])
    assert blocks_after("read", {}, [{"error": "boom"}] * 3)


def test_error_object_message_counts_like_the_error_text() -> None:
    assert blocks_after(
        "read",
        {},
        [
            {"error": "boom"},
            {"error": {"message": "boom"}},
            {"error": {"message": "boom", "name": "Error"}},
        ],
    )


def test_null_result_records_nothing() -> None:
    assert result_token("read", {}, result=None) is None
    assert not blocks_after("read", {}, [{"result": None}] * 3)


@pytest.mark.parametrize(
    ("a", "b", "equal"),
    [
        ("text", "text", True),
        ("text", "other", False),
        ([1, 2], [1, 2], True),
        ([1, 2], [2, 1], False),
        (0, 0.0, True),  # canonical JSON of both is "0"
        ("1", 1, False),
        (True, 1, False),
        ("x", ["x"], False),
    ],
)
def test_non_object_results_hash_their_canonical_json(a: Any, b: Any, equal: bool) -> None:
    assert same("read", {}, a, b) is equal


def test_result_hash_is_an_opaque_token() -> None:
    assert blocks_after("read", {}, [{"result_hash": "abc"}] * 3)
    assert not blocks_after(
        "read", {}, [{"result_hash": "abc"}, {"result_hash": "abd"}, {"result_hash": "abc"}]
    )


# --- the loop detector's own block ---------------------------------------------------------------


def test_own_block_records_nothing() -> None:
    assert result_token("read", {}, result=LOOP_BLOCK_RESULT) is None
    assert result_token("exec", {}, result=LOOP_BLOCK_RESULT) is None
    assert not blocks_after("read", {}, [{"result": LOOP_BLOCK_RESULT}] * 3)


def test_other_blocked_results_are_hashed() -> None:
    veto = res("no", status="blocked", deniedReason="approval")
    assert result_token("read", {}, result=veto) is not None
    assert blocks_after("read", {}, [{"result": veto}] * 3)


# --- default branch: {details, text} -------------------------------------------------------------


def test_text_is_the_joined_trimmed_string_entries() -> None:
    parts = {
        "content": [
            {"type": "text", "text": "  a"},
            {"type": "image", "data": "..."},
            {"type": "text"},
            {"text": "skip"},
            {"type": "text", "text": "b \n"},
        ],
        "details": {},
    }
    assert same("read", {}, parts, res("a\nb"))
    assert not same("read", {}, parts, res("a b"))


def test_default_branch_uses_details_and_text_only() -> None:
    base = res("hello", size=3)
    assert same("read", {}, base, {**base, "extra": "ignored", "isError": False})
    assert not same("read", {}, base, res("hello", size=4))
    assert not same("read", {}, base, res("bye", size=3))


def test_non_object_details_count_as_empty() -> None:
    assert same("read", {}, {"content": [], "details": "x"}, {"content": []})
    assert same("read", {}, {"content": [], "details": [1]}, {"content": [], "details": {}})


# --- exec ----------------------------------------------------------------------------------------


def test_exec_running_ignores_text_and_volatile_fields() -> None:
    a = res(
        "started pid 1",
        status="running",
        tail="building",
        pid=1,
        sessionId="a",
        cwd="/a",
        startedAt=1,
    )
    b = res(
        "started pid 2",
        status="running",
        tail="building",
        pid=2,
        sessionId="b",
        cwd="/b",
        startedAt=2,
    )
    assert same("exec", {"command": "make"}, a, b)
    assert not same("exec", {}, a, res(status="running", tail="linking"))
    assert same("exec", {}, res(status="running"), res(status="running", tail=""))


def test_exec_completed_ignores_duration_pid_and_session() -> None:
    a = res(
        "x",
        status="completed",
        exitCode=0,
        aggregated="ok\n",
        durationMs=10,
        pid=1,
        sessionId="a",
        cwd="/a",
    )
    b = res(
        "y",
        status="completed",
        exitCode=0,
        aggregated="ok",
        durationMs=99,
        pid=2,
        sessionId="b",
        cwd="/b",
    )
    assert same("exec", {}, a, b)
    assert not same("exec", {}, a, {**a, "details": {**a["details"], "exitCode": 1}})
    assert not same("exec", {}, a, {**a, "details": {**a["details"], "status": "failed"}})
    assert not same("exec", {}, a, {**a, "details": {**a["details"], "aggregated": "ko"}})


@pytest.mark.parametrize(
    ("a", "b", "equal"),
    [
        ({"exitCode": "0"}, {}, True),  # exitCode: number or null
        ({"exitCode": True}, {}, True),  # a boolean is not a number
        ({"exitCode": 0}, {}, False),
        ({"exitCode": 1.5}, {"exitCode": 1.5}, True),
        ({"timedOut": 1}, {"timedOut": False}, True),  # true only if exactly true
        ({"timedOut": "true"}, {}, True),
        ({"timedOut": True}, {}, False),
    ],
)
def test_exec_completed_field_types(a: dict[str, Any], b: dict[str, Any], equal: bool) -> None:
    base = {"status": "completed", "aggregated": "out"}
    assert same("exec", {}, res(**base, **a), res(**base, **b)) is equal


def test_exec_output_falls_back_to_text_when_aggregated_is_empty() -> None:
    assert same(
        "exec", {}, res("hi", status="failed", aggregated="   "), res(" hi ", status="failed")
    )
    assert same(
        "exec",
        {},
        res("hi", status="failed", aggregated=""),
        res("zzz", status="failed", aggregated="hi"),
    )
    assert not same("exec", {}, res("hi", status="failed"), res("ho", status="failed"))


def test_exec_approval_statuses() -> None:
    a = res(
        "wait",
        status="approval-pending",
        reason="policy",
        host="gw",
        command="rm -rf",
        warningText="danger",
        approvalId="1",
        expiresAt=5,
    )
    b = res(
        "other",
        status="approval-pending",
        reason="policy",
        host="gw",
        command="rm -rf",
        warningText="danger",
        approvalId="2",
        expiresAt=6,
    )
    assert same("exec", {}, a, b)
    assert not same("exec", {}, a, {**a, "details": {**a["details"], "reason": "other"}})
    assert not same(
        "exec", {}, a, {**a, "details": {**a["details"], "status": "approval-unavailable"}}
    )
    assert same(
        "exec",
        {},
        res(status="approval-unavailable", command="", warningText=""),
        res(status="approval-unavailable"),
    )


def test_exec_other_status_falls_through_to_details_and_text() -> None:
    a = res("x", status="queued", pid=1)
    assert not same("exec", {}, a, res("x", status="queued", pid=2))
    assert not same("exec", {}, res("a"), res("b"))  # no status at all


def test_exec_completed_results_differing_only_in_volatile_fields_are_no_progress() -> None:
    outcomes = [
        {
            "result": res(
                f"took {i}s",
                status="completed",
                exitCode=1,
                aggregated="fail",
                durationMs=i * 100,
                pid=1000 + i,
                sessionId=f"s{i}",
            )
        }
        for i in range(3)
    ]
    assert blocks_after("exec", {"command": "make test"}, outcomes)


# --- process poll / log --------------------------------------------------------------------------


def test_process_poll_keeps_only_its_fields() -> None:
    args = {"action": "poll", "sessionId": "p1"}
    a = res("tail", status="running", aggregated="...", pid=1, durationMs=5, updatedAt=1)
    b = res("tail", status="running", aggregated="...", pid=2, durationMs=9, updatedAt=2)
    assert same("process", args, a, b)
    assert not same("process", args, a, res("tail2", status="running", aggregated="..."))
    assert not same("process", args, a, res("tail", status="exited", aggregated="..."))
    assert same(
        "process", args, res("t", status="running", exitCode=None), res("t", status="running")
    )  # missing -> null


def test_process_log_keeps_only_its_fields() -> None:
    args = {"action": "log", "sessionId": "p1"}
    a = res("l", status="running", totalLines=3, totalChars=30, truncated=False, offset=0)
    assert same(
        "process",
        args,
        a,
        res("l", status="running", totalLines=3, totalChars=30, truncated=False, offset=99, pid=5),
    )
    assert not same(
        "process", args, a, res("l", status="running", totalLines=4, totalChars=30, truncated=False)
    )


def test_process_poll_by_args_action_hint_when_args_are_hashed() -> None:
    a = res("t", status="running", pid=1)
    b = res("t", status="running", pid=2)
    assert result_token("process", None, result=a, args_action="poll") == result_token(
        "process", None, result=b, args_action="poll"
    )


def test_process_other_actions_are_hashed_in_full() -> None:
    args = {"action": "list"}
    assert not same("process", args, res("t", pid=1), res("t", pid=2))


# --- outbound sends ------------------------------------------------------------------------------

SEND_A = res(
    "sent message m-1 at 10",
    ok=True,
    messageId="m-1",
    ts=10,
    channel="telegram",
    conversationId="chat-9",
    delivery={
        "platformMessageIds": ["p1"],
        "receipt": {"a": 1},
        "sentAt": 10,
        "route": {"id": "r-7"},
    },
    results=[{"message_id": "x1", "createdAt": 1, "status": "ok"}],
)
SEND_B = res(
    "sent message m-2 at 20",
    ok=True,
    messageId="m-2",
    ts=20,
    channel="telegram",
    conversationId="chat-9",
    delivery={
        "platformMessageIds": ["p2"],
        "receipt": {"b": 2},
        "sentAt": 20,
        "route": {"id": "r-7"},
    },
    results=[{"message_id": "x2", "createdAt": 2, "status": "ok"}],
)


@pytest.mark.parametrize(
    ("tool", "args"),
    [
        ("sessions_send", {"sessionKey": "k", "message": "hi"}),
        *[
            ("message", {"action": a, "to": "u"})
            for a in [
                "send",
                "broadcast",
                "reply",
                "thread-reply",
                "sendWithEffect",
                "sendAttachment",
                "upload-file",
                "sticker",
                "poll",
            ]
        ],
    ],
)
def test_outbound_sends_strip_volatile_ids_at_any_depth(tool: str, args: Any) -> None:
    assert same(tool, args, SEND_A, SEND_B)


@pytest.mark.parametrize(
    "key",
    [
        "messageId",
        "message_id",
        "messageIds",
        "platformMessageId",
        "platformMessageIds",
        "fileId",
        "file_id",
        "fileKey",
        "pollId",
        "poll_id",
        "receipt",
        "runId",
        "idempotencyKey",
        "ts",
        "timestamp",
        "sentAt",
        "deliveredAt",
        "createdAt",
    ],
)
def test_each_volatile_key_is_stripped(key: str) -> None:
    args = {"action": "send"}
    assert same("message", args, res(nested={key: {"v": 1}}), res(nested={key: [2]}))
    assert same("message", args, res(nested={key: 1}), res(nested={}))


def test_route_and_conversation_ids_are_kept() -> None:
    args = {"action": "send"}
    assert not same("message", args, res(conversationId="c1"), res(conversationId="c2"))
    assert not same("message", args, res(route={"id": "r1"}), res(route={"id": "r2"}))
    assert not same("sessions_send", {}, res(ok=True, sessionKey="a"), res(ok=True, sessionKey="b"))


def test_bare_id_is_stripped_only_on_a_message_object() -> None:
    args = {"action": "send"}
    for marker in [
        {"direction": "outbound"},
        {"senderId": "u1"},
        {"accountId": "acc"},
        {"conversation": {"id": "c1"}},
    ]:
        a = res(message={"id": "m1", "text": "hi", **marker})
        b = res(message={"id": "m2", "text": "hi", **marker})
        assert same("message", args, a, b), marker
    not_messages = [
        {"id": "m1", "direction": "out"},  # no text
        {"id": "m1", "text": "hi"},  # no marker
        {"id": "m1", "text": "hi", "direction": 1},  # marker not a string
        {"id": "m1", "text": "hi", "conversation": "c1"},
    ]  # not an object
    for obj in not_messages:
        changed = {**obj, "id": "m2"}
        assert not same("message", args, res(message=obj), res(message=changed)), obj


def test_conversation_id_inside_a_message_object_is_kept() -> None:
    args = {"action": "send"}
    a = res(message={"id": "m1", "text": "hi", "conversation": {"id": "c1"}})
    b = res(message={"id": "m2", "text": "hi", "conversation": {"id": "c2"}})
    assert not same("message", args, a, b)


def test_send_text_is_left_out() -> None:
    assert same("message", {"action": "send"}, res("sent at 1", ok=True), res("sent at 2", ok=True))


def test_other_message_actions_are_hashed_in_full() -> None:
    args = {"action": "read"}
    assert not same("message", args, res(messageId="m1"), res(messageId="m2"))
    assert not same("message", {}, res(messageId="m1"), res(messageId="m2"))


def test_configured_provider_send_tools() -> None:
    sends = frozenset({"telegram_send"})
    assert same("telegram_send", {}, SEND_A, SEND_B, send_tools=sends)
    assert not same("telegram_send", {}, SEND_A, SEND_B)


def test_provider_send_tools_from_the_config_file() -> None:
    from loopfuse.schemas import parse_config
    from loopfuse.streams.engine import Engine

    doc = {
        "tools": {
            "loopDetection": {"enabled": True, "warningThreshold": 1, "criticalThreshold": 2}
        },
        "loopfuse": {"providerSendTools": ["telegram_send"]},
    }
    events = [
        *pair("telegram_send", {"to": 1}, result=SEND_A),
        *pair("telegram_send", {"to": 1}, result=SEND_B),
        call("telegram_send", {"to": 1}),
    ]
    assert last_verdict(Engine(parse_config(doc)).replay(events)).action == "block"


def test_repeated_sends_with_fresh_ids_escalate_to_a_block() -> None:
    outcomes = [{"result": SEND_A}, {"result": SEND_B}, {"result": SEND_A}]
    assert blocks_after("message", {"action": "send", "to": "u"}, outcomes)


# --- unknown-tool name extraction ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "name"),
    [
        ("Unknown tool: web_search", "web_search"),
        ("unknown tool 'Browser.Open'", "browser.open"),
        ('UNKNOWN TOOL:   "my-tool"', "my-tool"),
        ("Tool foo_bar not found", "foo_bar"),
        ("tool 'X.Y' is not available", "x.y"),
        ('Error: tool "Zed" not found in registry', "zed"),
    ],
)
def test_unknown_tool_name_extraction(error: str, name: str) -> None:
    engine = engine_with(unknownToolThreshold=2)
    events = [e for i in range(2) for e in pair("call_tool", {"i": i}, error=error)]
    v = last_verdict(engine.replay([*events, call("call_tool", {"i": 9})]))
    assert (v.detector, v.message) == (
        "unknown_tool_repeat",
        f"CRITICAL: attempted unavailable tool {name} 2 times. "
        "Stop retrying that missing tool and answer without it.",
    )


@pytest.mark.parametrize("error", ["permission denied", "the tool crashed", "unknown error"])
def test_errors_without_a_tool_name_are_not_unknown_tools(error: str) -> None:
    engine = engine_with(unknownToolThreshold=2)
    events = [e for i in range(3) for e in pair("call_tool", {"i": i}, error=error)]
    assert last_verdict(engine.replay([*events, call("call_tool", {"i": 9})])).action == "allow"


def test_explicit_unknown_tool_field() -> None:
    engine = engine_with(unknownToolThreshold=2)
    events = [
        e
        for i in range(2)
        for e in pair("call_tool", {"i": i}, error="failed", unknown_tool="ghost")
    ]
    v = last_verdict(engine.replay([*events, call("call_tool", {"i": 9})]))
    assert (v.detector, v.count) == ("unknown_tool_repeat", 2)
    assert "unavailable tool ghost 2 times" in (v.message or "")


def test_identical_results_at_default_branch_block_through_the_engine() -> None:
    engine = engine_with(warningThreshold=1, criticalThreshold=3)
    same_outcome = res("same", size=1)
    events = [*repeat_pairs("read", {"p": 1}, 3, result=same_outcome), call("read", {"p": 1})]
    assert last_verdict(engine.replay(events)).action == "block"
