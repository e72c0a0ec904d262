"""Each coding agent's hook JSON in, loopfuse's event out; a verdict in, the agent's own
hook output out (streams/gateway/hooks/protocols.py). The answers' shapes are the
agents' documented ones: Claude Code's and Codex's ``hookSpecificOutput`` (Codex
rejects any field its schema does not name), Gemini CLI's ``decision`` / ``continue``."""

from __future__ import annotations

import json
from typing import Any

import pytest

from loopfuse.streams.engine.fingerprint import result_token
from loopfuse.streams.gateway.hooks.protocols import (
    Compacted,
    Ended,
    HookInputError,
    Ignored,
    ToolOutcome,
    ToolUse,
    abort_answer,
    block_answer,
    parse,
    session_key,
    unjudged_answer,
    warn_after_answer,
    warn_before_answer,
)
from tests.fixtures.hostile_strings import HOSTILE


def body(**fields: Any) -> bytes:
    return json.dumps(fields).encode()


def test_claude_events_map_onto_loopfuses() -> None:
    call = parse(
        "claude",
        body(
            hook_event_name="PreToolUse",
            session_id="s1",
            tool_name="Bash",
            tool_input={"command": "ls"},
            tool_use_id="toolu_1",
        ),
    )
    assert call == ToolUse("s1", "Bash", {"command": "ls"}, "toolu_1")
    result = parse(
        "claude",
        body(
            hook_event_name="PostToolUse",
            session_id="s1",
            tool_name="Bash",
            tool_input={"command": "ls"},
            tool_use_id="toolu_1",
            tool_response={"stdout": "a\nb", "stderr": "", "interrupted": False, "isImage": False},
        ),
    )
    assert isinstance(result, ToolOutcome) and result.error is None
    assert result.result == {
        "content": [{"type": "text", "text": "a\nb"}],
        "details": {"interrupted": False},
    }
    assert parse(
        "claude", body(hook_event_name="PostCompact", session_id="s1", trigger="auto")
    ) == (Compacted("s1", "auto"))
    assert parse("claude", body(hook_event_name="Stop", session_id="s1")) == Ended("s1")
    assert parse("claude", body(hook_event_name="SessionEnd", session_id="s1")) == Ended("s1")


def test_a_claude_failure_is_an_error_and_names_an_unknown_tool() -> None:
    failed = parse(
        "claude",
        body(
            hook_event_name="PostToolUseFailure",
            session_id="s1",
            tool_name="Frobnicate",
            tool_input={},
            tool_use_id="toolu_2",
            error="<tool_use_error>Error: No such tool available: Frobnicate</tool_use_error>",
        ),
    )
    assert isinstance(failed, ToolOutcome) and failed.result is None
    assert failed.error is not None and "No such tool available" in failed.error
    assert failed.unknown_tool == "Frobnicate"


def test_codex_results_are_the_commands_output() -> None:
    """Codex 0.169 hands PostToolUse the command's output as a string (captured)."""
    event = parse(
        "codex",
        body(
            hook_event_name="PostToolUse",
            session_id="01a2423b-f2a9-7423-be90-09eb2d002930",
            turn_id="01a2423b-f2bc-75e0-abf1-255e58130d87",
            tool_name="Bash",
            tool_input={"command": "echo still broken; exit 3"},
            tool_response="still broken\n",
            tool_use_id="call_0_0",
            model="scripted",
            permission_mode="bypassPermissions",
        ),
    )
    assert isinstance(event, ToolOutcome) and event.call_id == "call_0_0"
    assert event.result == {"content": [{"type": "text", "text": "still broken"}], "details": {}}


def test_gemini_results_hash_alike_whatever_their_process_group() -> None:
    """Gemini's shell result names its process group, new on every call: hashed as it
    arrives, a loop's outcomes would never repeat and the critical block never come."""

    def outcome(pgid: int, output: str = "FAIL") -> Any:
        # Gemini 0.61's llmContent for a shell call (captured)
        text = (
            f"<untrusted_context>\nOutput: {output}\nExit Code: 3\n"
            f"Process Group PGID: {pgid}\n</untrusted_context>"
        )
        event = parse(
            "gemini",
            body(
                hook_event_name="AfterTool",
                session_id="s",
                tool_name="run_shell_command",
                tool_input={"command": "make"},
                tool_response={"llmContent": text, "returnDisplay": output},
            ),
        )
        assert isinstance(event, ToolOutcome) and event.call_id is None
        return result_token("run_shell_command", {"command": "make"}, result=event.result)

    assert outcome(4101) == outcome(4177)
    assert outcome(4101) != outcome(4101, output="PASS")


def test_a_gemini_error_response_is_an_error() -> None:
    event = parse(
        "gemini",
        body(
            hook_event_name="AfterTool",
            session_id="s",
            tool_name="read_file",
            tool_input={"path": "/nope"},
            tool_response={
                "llmContent": "",
                "returnDisplay": "",
                "error": {"message": "File not found: /nope", "type": "FILE_NOT_FOUND"},
            },
        ),
    )
    assert isinstance(event, ToolOutcome) and event.error == "File not found: /nope"


@pytest.mark.parametrize(
    ("agent", "event"),
    [
        ("gemini", "PreCompress"),  # fires every turn: not a compaction
        ("gemini", "Stop"),  # not Gemini's
        ("claude", "SessionStart"),
        ("claude", "UserPromptSubmit"),
        ("codex", "PreCompact"),
        ("codex", "BeforeTool"),  # Gemini's name, sent to /codex
        ("claude", "x" * 10_000),
    ],
)
def test_other_events_are_ignored(agent: Any, event: str) -> None:
    answer = parse(agent, body(hook_event_name=event, session_id="s", tool_name="Bash"))
    assert answer == Ignored(event[:80])


@pytest.mark.parametrize(
    ("raw", "reason", "before_tool"),
    [
        (b"{not json", "the hook body is not JSON", True),
        (b"", "the hook body is not JSON", True),
        (b"\xff\xfe", "the hook body is not JSON", True),
        (b"[1, 2]", "the hook body is not a JSON object", True),
        (b'{"session_id": "s"}', "the hook body has no hook_event_name", True),
        (b'{"hook_event_name": 7}', "the hook body has no hook_event_name", True),
        (b'{"hook_event_name": "PreToolUse", "tool_name": "Bash"}', "no session_id", True),
        (b'{"hook_event_name": "PreToolUse", "session_id": " "}', "no session_id", True),
        (b'{"hook_event_name": "PreToolUse", "session_id": {}}', "no session_id", True),
        (b'{"hook_event_name": "PreToolUse", "session_id": "s"}', "no tool_name", True),
        (b'{"hook_event_name": "PostToolUse", "session_id": "s"}', "no tool_name", False),
        (b'{"hook_event_name": "Stop"}', "no session_id", False),
    ],
)
def test_hostile_bodies_get_a_reason(raw: bytes, reason: str, before_tool: bool) -> None:
    with pytest.raises(HookInputError) as caught:
        parse("claude", raw)
    assert reason in caught.value.reason
    assert caught.value.before_tool is before_tool


def test_odd_ids_are_kept_or_bounded_never_refused() -> None:
    for odd in [*HOSTILE.values(), "a" * 100_000, "é" * 150]:
        if not odd.strip():
            continue
        event = parse(
            "codex",
            body(
                hook_event_name="PreToolUse",
                session_id=odd,
                tool_name=odd,
                tool_input={"x": odd},
                tool_use_id=odd,
            ),
        )
        assert isinstance(event, ToolUse)
        key = session_key("codex", "laptop-7", event.session_id)
        assert key.startswith("codex:laptop-7:")
        assert len(key.encode("utf-8", "surrogatepass")) <= 300
        assert (
            event.call_id is not None and len(event.call_id.encode("utf-8", "surrogatepass")) <= 200
        )
    assert session_key("claude", None, "abc") == "claude:abc"
    assert session_key("codex", None, "abc") != session_key("claude", None, "abc")


def test_a_huge_tool_input_is_parsed_whole() -> None:
    big = {"content": "x" * 5_000_000}
    event = parse(
        "claude",
        body(hook_event_name="PreToolUse", session_id="s", tool_name="Write", tool_input=big),
    )
    assert isinstance(event, ToolUse) and event.tool_input == big


def test_answers_are_each_agents_documented_shapes() -> None:
    deny = {
        "hookSpecificOutput": {
            "hookEventName": "PreToolUse",
            "permissionDecision": "deny",
            "permissionDecisionReason": "CRITICAL: stop",
        }
    }
    assert block_answer("claude", "CRITICAL: stop") == deny
    assert block_answer("codex", "CRITICAL: stop") == deny
    assert block_answer("gemini", "CRITICAL: stop") == {
        "decision": "deny",
        "reason": "CRITICAL: stop",
    }
    # Claude: continue false only together with the deny stops the tool too
    assert abort_answer("claude", "CRITICAL: abort") == {
        **block_answer("claude", "CRITICAL: abort"),
        "continue": False,
        "stopReason": "CRITICAL: abort",
    }
    assert abort_answer("gemini", "CRITICAL: abort") == {
        "continue": False,
        "stopReason": "CRITICAL: abort",
    }
    # Codex cannot end a run from a hook's output (continue false runs the tool)
    assert abort_answer("codex", "CRITICAL: abort") == block_answer("codex", "CRITICAL: abort")
    warn = {"hookSpecificOutput": {"hookEventName": "PreToolUse", "additionalContext": "WARNING"}}
    assert warn_before_answer("claude", "WARNING") == warn
    assert warn_before_answer("codex", "WARNING") == warn
    assert warn_before_answer("gemini", "WARNING") == {}  # Gemini warns after the tool
    assert warn_after_answer("gemini", "WARNING") == {
        "hookSpecificOutput": {"hookEventName": "AfterTool", "additionalContext": "WARNING"}
    }


def test_an_unjudged_call_follows_the_agents_fail_policy() -> None:
    assert unjudged_answer("claude", "open", "why", before_tool=True) == {"systemMessage": "why"}
    assert unjudged_answer("gemini", "closed", "why", before_tool=True) == {
        "decision": "deny",
        "reason": "why",
    }
    assert unjudged_answer("codex", "closed", "why", before_tool=True) == block_answer(
        "codex", "why"
    )
    # after the tool there is nothing to block
    assert unjudged_answer("codex", "closed", "why", before_tool=False) == {"systemMessage": "why"}
