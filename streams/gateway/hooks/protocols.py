"""The coding agents' hook protocols: what each agent sends, and what it reads back.

Pure: a hook's JSON body in, a :data:`HookEvent` out (:func:`parse`); a decision in,
the agent's own hook output out (the ``*_answer`` functions). No I/O, no Kafka.

Claude Code (2.1.x), Codex CLI (0.169) and Gemini CLI (0.61) each run a hook before
and after every tool call and hand it one JSON object: ``hook_event_name``,
``session_id``, ``tool_name``, ``tool_input``, and where the agent has them
``tool_use_id`` (Claude, Codex), ``tool_response`` (after the tool) and ``turn_id``
(Codex). Gemini names its events ``BeforeTool`` / ``AfterTool`` and gives no call id.

What each answer does in the agent (docs/gateway-integration.md: Coding agents):

* allow: ``{}``;
* warn: ``hookSpecificOutput.additionalContext`` before the tool (Claude, Codex); Gemini
  reads it only after the tool (``AfterTool``), appended to the result;
* block: ``permissionDecision: "deny"`` with the message (Claude, Codex); Gemini's
  ``{"decision": "deny", "reason": ...}``;
* abort: Claude's deny together with ``continue: false`` (alone, the tool still runs);
  Gemini's ``{"continue": false, "stopReason": ...}``; Codex cannot end a run from a
  hook's output (``continue: false`` makes it discard the reply and run the tool), so
  its abort is the deny.

Codex rejects an output with a field its schema does not name (and then runs the
tool), so every answer here uses only the documented fields.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any, Literal

import orjson

Agent = Literal["claude", "codex", "gemini"]
AGENTS: tuple[Agent, ...] = ("claude", "codex", "gemini")
FailPolicy = Literal["open", "closed"]

#: An agent's id (session, call, host) longer than this many UTF-8 bytes is replaced by
#: its SHA-256 (stable, so a session keeps one key); the worker bounds identifiers at 512.
MAX_ID_BYTES = 200
#: Error text kept from a failed tool (it decides "same outcome" and names unknown tools).
MAX_ERROR_CHARS = 4_096

# The events each agent sends, by what loopfuse makes of them. Anything else (session
# start, prompts, notifications, Gemini's PreCompress, which fires every turn) is
# answered ``{}`` and not published.
_CALL_EVENTS = {"claude": "PreToolUse", "codex": "PreToolUse", "gemini": "BeforeTool"}
_RESULT_EVENTS = {"claude": "PostToolUse", "codex": "PostToolUse", "gemini": "AfterTool"}
_FAILURE_EVENTS = {"claude": "PostToolUseFailure"}
_COMPACTION_EVENTS = {"claude": "PostCompact", "codex": "PostCompact"}
_END_EVENTS: dict[str, frozenset[str]] = {
    "claude": frozenset({"Stop", "SessionEnd"}),
    "codex": frozenset({"Stop", "SessionEnd"}),
    "gemini": frozenset({"SessionEnd"}),
}

#: Lines of a result that differ on every call while the outcome is the same: Gemini's
#: shell tool reports its process group (and background pids). Dropped before the
#: outcome is hashed, so a loop's outcomes repeat as the model reads them. (Claude's
#: hooks get the command's output and exit code; Codex's the output alone.)
_VOLATILE_LINES: dict[str, re.Pattern[str]] = {
    "claude": re.compile(r"(?!)"),
    "codex": re.compile(r"(?!)"),
    "gemini": re.compile(r"^(?:Process Group PGID: \d+|Background PIDs: [\d, ]+)\s*$", re.M),
}
_CLAUDE_UNKNOWN_TOOL = re.compile(r"No such tool available:\s*([A-Za-z0-9_.:-]+)")


class HookInputError(ValueError):
    """A hook body that cannot be judged; ``before_tool``: it may be a pre-tool call."""

    def __init__(self, reason: str, *, before_tool: bool = True) -> None:
        super().__init__(reason)
        self.reason = reason
        self.before_tool = before_tool


@dataclass(frozen=True, slots=True)
class ToolUse:
    """The agent is about to run a tool: it waits for the answer."""

    session_id: str
    tool_name: str
    tool_input: Any
    call_id: str | None  # None: the agent gives none (Gemini)


@dataclass(frozen=True, slots=True)
class ToolOutcome:
    """A tool ran (or failed): the outcome as the model reads it."""

    session_id: str
    tool_name: str
    tool_input: Any
    call_id: str | None
    result: dict[str, Any] | None  # OpenClaw's result shape: {content: [{type, text}], details}
    error: str | None
    unknown_tool: str | None


@dataclass(frozen=True, slots=True)
class Compacted:
    session_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class Ended:
    session_id: str


@dataclass(frozen=True, slots=True)
class Ignored:
    event: str


HookEvent = ToolUse | ToolOutcome | Compacted | Ended | Ignored


def bounded_id(value: str) -> str:
    """An agent's id as loopfuse keeps it: itself, or ``lf-sha256:<hex>`` when long."""
    raw = value.encode("utf-8", "surrogatepass")
    if len(raw) <= MAX_ID_BYTES:
        return value
    return "lf-sha256:" + hashlib.sha256(raw).hexdigest()


def session_key(agent: Agent, host_id: str | None, session_id: str) -> str:
    """``<agent>:<host id>:<session id>``, or ``<agent>:<session id>`` without a host id:
    one agent kind's session never shares state with another's of the same id."""
    sid = bounded_id(session_id)
    return f"{agent}:{host_id}:{sid}" if host_id else f"{agent}:{sid}"


def parse(agent: Agent, body: bytes) -> HookEvent:
    """The event a hook body describes; :class:`HookInputError` with a reason if none."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        data = _lenient_json(body)
    if not isinstance(data, dict):
        raise HookInputError("the hook body is not a JSON object")
    event = data.get("hook_event_name")
    if not isinstance(event, str) or not event:
        raise HookInputError("the hook body has no hook_event_name")
    before_tool = event == _CALL_EVENTS[agent]
    after_tool = event in (_RESULT_EVENTS[agent], _FAILURE_EVENTS.get(agent))
    compaction = event == _COMPACTION_EVENTS.get(agent)
    ending = event in _END_EVENTS[agent]
    if not (before_tool or after_tool or compaction or ending):
        return Ignored(event[:80])
    session_id = data.get("session_id")
    if not isinstance(session_id, str) or not session_id.strip():
        raise HookInputError("the hook body has no session_id", before_tool=before_tool)
    if compaction:
        trigger = data.get("trigger")
        return Compacted(session_id, trigger[:80] if isinstance(trigger, str) else "compaction")
    if ending:
        return Ended(session_id)
    tool_name = data.get("tool_name")
    if not isinstance(tool_name, str) or not tool_name.strip():
        raise HookInputError("the hook body has no tool_name", before_tool=before_tool)
    tool_name = bounded_id(tool_name)
    tool_input = data.get("tool_input")
    call_id = data.get("tool_use_id") if agent != "gemini" else None
    call_id = bounded_id(call_id) if isinstance(call_id, str) and call_id else None
    if before_tool:
        return ToolUse(session_id, tool_name, tool_input, call_id)
    if event == _FAILURE_EVENTS.get(agent):
        error = data.get("error")
        text = error if isinstance(error, str) else _text_of(error) or "the tool failed"
        return _failed(agent, session_id, tool_name, tool_input, call_id, text)
    response = data.get("tool_response")
    error_text = _error_of(agent, response)
    if error_text is not None:
        return _failed(agent, session_id, tool_name, tool_input, call_id, error_text)
    result = outcome(agent, response)
    return ToolOutcome(session_id, tool_name, tool_input, call_id, result, None, None)


def _lenient_json(body: bytes) -> Any:
    """JSON that orjson refuses but an agent may send: Node's ``JSON.stringify`` writes a
    lone surrogate as ``\\ud800``. Read it, with each lone surrogate made ``?`` (so the
    event can be sent on, and the same input keeps one identity)."""
    try:
        return _without_surrogates(json.loads(body))
    except (ValueError, RecursionError):
        raise HookInputError("the hook body is not JSON") from None


def _without_surrogates(value: Any) -> Any:
    if isinstance(value, str):
        return value.encode("utf-8", "replace").decode("utf-8")
    if isinstance(value, list):
        return [_without_surrogates(item) for item in value]
    if isinstance(value, dict):
        return {_without_surrogates(k): _without_surrogates(v) for k, v in value.items()}
    return value


def _failed(
    agent: Agent,
    session_id: str,
    tool_name: str,
    tool_input: Any,
    call_id: str | None,
    text: str,
) -> ToolOutcome:
    text = _VOLATILE_LINES[agent].sub("", text).strip()[:MAX_ERROR_CHARS] or "the tool failed"
    unknown = _CLAUDE_UNKNOWN_TOOL.search(text) if agent == "claude" else None
    return ToolOutcome(
        session_id,
        tool_name,
        tool_input,
        call_id,
        None,
        text,
        unknown.group(1)[:MAX_ID_BYTES] if unknown else None,
    )


def _error_of(agent: Agent, response: Any) -> str | None:
    """The error text of an error-shaped tool response, else None."""
    if not isinstance(response, dict):
        return None
    error = response.get("error")
    if error is None or error is False or error == "":
        return None
    if agent == "gemini" and isinstance(error, dict):
        message = error.get("message")
        return message if isinstance(message, str) and message else _text_of(error)
    return error if isinstance(error, str) else _text_of(error)


def outcome(agent: Agent, response: Any) -> dict[str, Any] | None:
    """A tool response in OpenClaw's result shape, holding what the model reads.

    The engine hashes ``{details, text}`` of that shape; here ``text`` is the text the
    agent hands its hook (Claude's stdout and stderr, Gemini's ``llmContent``, Codex's
    output), with each agent's per-call noise dropped (``_VOLATILE_LINES``), and
    ``details`` the fields beside it that decide the outcome (an exit code, an
    interruption). None: there was no response at all.
    """
    if response is None:
        return None
    details: dict[str, Any] = {}
    if isinstance(response, dict):
        if agent == "gemini" and "llmContent" in response:
            text = _text_of(response.get("llmContent"))
        elif "stdout" in response or "stderr" in response:  # Claude's (and Codex's) shell
            stdout, stderr = _text_of(response.get("stdout")), _text_of(response.get("stderr"))
            text = stdout + ("\n" + stderr if stderr else "")
            for name in ("interrupted", "exit_code", "exitCode", "returnCodeInterpretation"):
                if name in response:
                    details[name] = response[name]
        elif "output" in response:  # Codex's exec output
            text = _text_of(response.get("output"))
            for name in ("exit_code", "exitCode"):
                if name in response:
                    details[name] = response[name]
        else:
            text = _text_of(response)
    else:
        text = _text_of(response)
    text = _VOLATILE_LINES[agent].sub("", text).strip()
    return {"content": [{"type": "text", "text": text}], "details": details}


def _text_of(value: Any) -> str:
    """A value as the model reads it: a string as is, text parts joined, else JSON."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = [
            _text_of(part.get("text")) if _is_text_part(part) else _text_of(part) for part in value
        ]
        return "\n".join(part for part in parts if part)
    if isinstance(value, dict) and _is_text_part(value):
        return _text_of(value.get("text"))
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS, default=str).decode()


def _is_text_part(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("text"), str)


# -- answers --------------------------------------------------------------------------


def warn_before_answer(agent: Agent, message: str) -> dict[str, Any]:
    """A warning the model reads before the tool runs (Gemini: none; see after)."""
    if agent == "gemini":
        return {}
    return {"hookSpecificOutput": {"hookEventName": "PreToolUse", "additionalContext": message}}


def warn_after_answer(agent: Agent, message: str) -> dict[str, Any]:
    """A warning appended to the tool's result (Gemini's only way to warn)."""
    event = "AfterTool" if agent == "gemini" else "PostToolUse"
    return {"hookSpecificOutput": {"hookEventName": event, "additionalContext": message}}


def block_answer(agent: Agent, message: str) -> dict[str, Any]:
    """The tool does not run; the model reads ``message`` as its error."""
    if agent == "gemini":
        return {"decision": "deny", "reason": message}
    return {
        "hookSpecificOutput": {
            "hookEventName": "PreToolUse",
            "permissionDecision": "deny",
            "permissionDecisionReason": message,
        }
    }


def abort_answer(agent: Agent, message: str) -> dict[str, Any]:
    """The run ends where the agent allows it (Codex: the call is denied)."""
    if agent == "gemini":
        return {"continue": False, "stopReason": message}
    answer = block_answer(agent, message)
    if agent == "claude":
        answer.update({"continue": False, "stopReason": message})
    return answer


def stop_after_answer(agent: Agent, message: str) -> dict[str, Any]:
    """After a tool, for a run loopfuse aborted: stop the agent loop (Codex: nothing)."""
    if agent == "codex":
        return {}
    return {"continue": False, "stopReason": message}


def unjudged_answer(
    agent: Agent, policy: FailPolicy, reason: str, *, before_tool: bool
) -> dict[str, Any]:
    """A call loopfuse could not judge: ``open`` runs it and tells the user why,
    ``closed`` blocks it with the reason (only a pre-tool call can be blocked)."""
    if policy == "closed" and before_tool:
        return block_answer(agent, reason)
    return {"systemMessage": reason}
