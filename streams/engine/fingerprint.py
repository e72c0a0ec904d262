"""Fingerprints: call signatures and result outcomes (spec sections 2 and 3).

Tokens that leave the process (``args_hash`` in verdicts, what a gateway may send
instead of raw payloads) are 128-bit xxh3 hex digests. Inside session state every
token is hashed to a 64-bit int (``hash64``); a gateway's precomputed hash strings
go through the same hash, so raw and pre-hashed payloads compare equal.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from xxhash import xxh3_64_intdigest, xxh3_128_hexdigest

from loopfuse.streams.engine.canonical import canonical_json
from loopfuse.streams.engine.native import NATIVE
from loopfuse.streams.engine.volatile import mask_value

ERROR_PREFIX = "error:"
#: An unknown-tool name taken from error text is cut to this many characters (an
#: ``unknown_tool`` field is bounded at decode like every identifier).
MAX_TOOL_NAME_CHARS = 512

_UNKNOWN_TOOL = re.compile(r"unknown tool[:\s]+[\"']?([a-z0-9_.-]+)[\"']?", re.IGNORECASE)
_TOOL_NOT_FOUND = re.compile(
    r"tool\s+[\"']?([a-z0-9_.-]+)[\"']?\s+(?:not found|is not available)", re.IGNORECASE
)

KNOWN_POLL_TOOLS = frozenset({"command_status"})
_PROCESS_POLL_ACTIONS = frozenset({"poll", "log"})
SEND_LIKE_MESSAGE_ACTIONS = frozenset(
    {
        "send",
        "broadcast",
        "reply",
        "thread-reply",
        "sendWithEffect",
        "sendAttachment",
        "upload-file",
        "sticker",
        "poll",
    }
)
VOLATILE_SEND_KEYS = frozenset(
    {
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
    }
)


#: An event's tokens as the native judge computed them from its wire bytes
#: (loopfuse.streams.engine.wire), for ``Engine.step``: (the args token or None, the
#: result token or None, whether that result token is known; None with True means
#: "nothing is recorded"). The result token assumes no configured send tools, so the
#: step takes it only for a tool that is not one.
Fingerprints = tuple[str | None, str | None, bool]

#: The native judge's xxh3-128 of a value's canonical JSON (None for what it leaves to
#: Python), when built.
_native_digest: Callable[[Any], str | None] | None = (
    None if NATIVE is None else NATIVE.canonical_digest
)


def digest(data: bytes) -> str:
    """The 128-bit token of some canonical bytes."""
    return xxh3_128_hexdigest(data)


def canonical_digest(value: Any) -> str:
    """xxh3-128 of a JSON value's canonical JSON (natively where the native judge can)."""
    if _native_digest is not None and (native := _native_digest(value)) is not None:
        return native
    return xxh3_128_hexdigest(canonical_json(value))


def args_hash(args: Any) -> str:
    """Fingerprint of a call's arguments: xxh3-128 of their canonical JSON."""
    return canonical_digest(args)


def hash64(token: str) -> int:
    """A token or id (ours or a gateway's opaque hash string) as a 64-bit int for state."""
    return xxh3_64_intdigest(token.encode("utf-8", "surrogatepass"))


def hash32(text: str) -> int:
    """The low 32 bits of ``hash64``: enough to tell a session's few pending call ids
    or remembered verdicts apart, in half the state bytes."""
    return xxh3_64_intdigest(text.encode("utf-8", "surrogatepass")) & 0xFFFFFFFF


def signature(tool_name: str, args_token: str) -> int:
    """Call signature inside state: tool name + args fingerprint."""
    return xxh3_64_intdigest(f"{tool_name}\x00{args_token}".encode("utf-8", "surrogatepass"))


def result_fingerprint(token: str) -> int:
    """A result token as a non-zero 64-bit int whose low bit says "error".

    The low bit makes the spec's "an error never equals a success" hold exactly,
    not just with overwhelming probability.
    """
    is_error = token.startswith(ERROR_PREFIX)
    value = hash64(token)
    if is_error:
        return value | 1
    value &= ~1
    return value or 2


def action_of(args: Any, hinted: str | None) -> str | None:
    """args.action when it is a string (or the gateway's hint for hashed args)."""
    if isinstance(args, dict):
        action = args.get("action")
        return action if isinstance(action, str) else None
    return hinted


def is_known_poll(tool_name: str, action: str | None) -> bool:
    return tool_name in KNOWN_POLL_TOOLS or (
        tool_name == "process" and action in _PROCESS_POLL_ACTIONS
    )


def unknown_tool_name(error_text: str) -> str | None:
    raw = error_text.strip()
    if not raw:
        return None
    match = _UNKNOWN_TOOL.search(raw) or _TOOL_NOT_FOUND.search(raw)
    if match is None:
        return None
    # Bounded like every identifier: the name is kept in state and quoted in messages.
    name = match.group(1).strip()[:MAX_TOOL_NAME_CHARS]
    return name.lower() if name else None


def _string_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _number_or_none(value: Any) -> int | float | None:
    if isinstance(value, bool):
        return None
    return value if isinstance(value, int | float) else None


def _content_text(result: dict[str, Any]) -> str:
    content = result.get("content")
    if not isinstance(content, list):
        return ""
    texts = [
        entry["text"]
        for entry in content
        if isinstance(entry, dict)
        and isinstance(entry.get("type"), str)
        and isinstance(entry.get("text"), str)
    ]
    return "\n".join(texts).strip()


def _exec_outcome(details: dict[str, Any], text: str) -> dict[str, Any] | None:
    status = details.get("status")
    if not isinstance(status, str):
        return None
    if status == "running":
        return {"status": status, "tail": _string_or_none(details.get("tail")) or ""}
    if status in ("completed", "failed"):
        aggregated = details.get("aggregated")
        output = aggregated.strip() if isinstance(aggregated, str) else ""
        return {
            "status": status,
            "exitCode": _number_or_none(details.get("exitCode")),
            "timedOut": details.get("timedOut") is True,
            "output": output or text,
        }
    if status in ("approval-pending", "approval-unavailable"):
        return {
            "status": status,
            "reason": _string_or_none(details.get("reason")),
            "host": _string_or_none(details.get("host")),
            "command": _string_or_none(details.get("command")) or "",
            "warningText": _string_or_none(details.get("warningText")) or "",
        }
    return None


def _process_outcome(action: str, details: dict[str, Any], text: str) -> dict[str, Any]:
    fields: tuple[str, ...]
    if action == "poll":
        fields = ("status", "exitCode", "exitSignal", "aggregated")
    else:
        fields = ("status", "totalLines", "totalChars", "truncated", "exitCode", "exitSignal")
    outcome: dict[str, Any] = {"action": action}
    for name in fields:
        outcome[name] = details.get(name)
    outcome["text"] = text
    return outcome


def _is_message_object(value: dict[str, Any]) -> bool:
    return (
        isinstance(value.get("id"), str)
        and isinstance(value.get("text"), str)
        and (
            isinstance(value.get("direction"), str)
            or isinstance(value.get("senderId"), str)
            or isinstance(value.get("accountId"), str)
            or isinstance(value.get("conversation"), dict)
        )
    )


def strip_volatile_send_ids(value: Any) -> Any:
    """Drop per-send ids and timestamps at any depth; route and conversation ids stay."""
    if isinstance(value, list):
        return [strip_volatile_send_ids(child) for child in value]
    if not isinstance(value, dict):
        return value
    drop_id = _is_message_object(value)
    return {
        key: strip_volatile_send_ids(child)
        for key, child in value.items()
        if key not in VOLATILE_SEND_KEYS and not (drop_id and key == "id")
    }


def is_outbound_send(tool_name: str, action: str | None, send_tools: frozenset[str]) -> bool:
    if tool_name == "sessions_send" or tool_name in send_tools:
        return True
    return tool_name == "message" and action in SEND_LIKE_MESSAGE_ACTIONS


def normalised_result(
    tool_name: str, action: str | None, result: Any, send_tools: frozenset[str]
) -> Any:
    """The part of a successful result that decides "same outcome" (spec 3, branches 2-7).

    Returns ``None`` when nothing must be recorded: no result at all, or the loop
    detector's own block (so a block stays in force instead of looking like progress).
    """
    if not isinstance(result, dict):
        return None if result is None else result
    raw_details = result.get("details")
    details: dict[str, Any] = raw_details if isinstance(raw_details, dict) else {}
    if details.get("status") == "blocked" and details.get("deniedReason") == "tool-loop":
        return None
    text = _content_text(result)
    if tool_name == "exec":
        outcome = _exec_outcome(details, text)
        if outcome is not None:
            return outcome
    if tool_name == "process" and action in _PROCESS_POLL_ACTIONS:
        return _process_outcome(action, details, text)
    if is_outbound_send(tool_name, action, send_tools):
        return strip_volatile_send_ids(details)
    return {"details": details, "text": text}


def result_token(
    tool_name: str,
    args: Any = None,
    *,
    result: Any = None,
    error: str | None = None,
    args_action: str | None = None,
    send_tools: frozenset[str] = frozenset(),
    mask: Callable[[str], str] | None = None,
) -> str | None:
    """The 128-bit outcome token of a tool result, or None when nothing is recorded.

    Gateways that hash locally send this token as ``result_hash``. ``mask``: the
    volatileResults rule's, applied to the error and to every string of the outcome.
    """
    if error is not None:
        text = error if mask is None else mask(error)
        return ERROR_PREFIX + digest(text.encode("utf-8", "surrogatepass"))
    action = action_of(args, args_action)
    outcome = normalised_result(tool_name, action, result, send_tools)
    if outcome is None:
        return None
    if mask is not None:
        outcome = mask_value(outcome, mask)
    return canonical_digest(outcome)
