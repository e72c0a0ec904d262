"""Bytes to a validated input event, or a classified rejection (for the dead-letter topic)."""

from __future__ import annotations

from typing import Any

import orjson
from pydantic import ValidationError

from schemas.events import (
    DEFAULT_MAX_IDENTIFIER_BYTES,
    IDENTIFIER_FIELDS,
    InputEvent,
    input_event_adapter,
)

DEFAULT_MAX_EVENT_BYTES = 1_048_576
DEFAULT_MAX_DEPTH = 64
_KNOWN_TYPES = frozenset({"tool_call", "tool_result", "compaction", "run_ended"})


class EventRejected(ValueError):
    """An input that is not a valid event; ``code`` is the dead-letter error code."""

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


def _depth(value: Any, limit: int) -> int:
    """Nesting depth, computed iteratively so hostile input cannot blow the stack."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > deepest:
            deepest = depth
            if deepest > limit:
                return deepest
        if isinstance(node, dict):
            stack.extend((child, depth + 1) for child in node.values())
        elif isinstance(node, list):
            stack.extend((child, depth + 1) for child in node)
    return deepest


def _describe(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:3]:
        loc = ".".join(str(p) for p in err["loc"][1:]) or "event"
        msg = str(err["msg"]).removeprefix("Value error, ")
        parts.append(f"{loc}: {msg}")
    return "; ".join(parts)


def utf8_size(text: str) -> int:
    """Bytes of ``text`` in UTF-8 (lone surrogates count as the 3 bytes they take)."""
    return len(text.encode("utf-8", "surrogatepass"))


def check_identifiers(
    event: InputEvent, limit: int
) -> None:
    """Reject an event whose identifiers or tokens are longer than ``limit`` UTF-8 bytes.

    They end up in session state, verdicts, loop events and messages: unbounded, one
    event could make a session's state or an output larger than Kafka accepts.
    """
    quick = limit // 4  # a string this short cannot exceed the limit in UTF-8
    for name in IDENTIFIER_FIELDS:
        value = getattr(event, name, None)
        if value is not None and len(value) > quick and (size := utf8_size(value)) > limit:
            raise EventRejected(
                "invalid_event", f"{name} is {size} bytes, the limit is {limit}"
            )


def decode_event(
    raw: bytes | None,
    *,
    max_bytes: int = DEFAULT_MAX_EVENT_BYTES,
    max_depth: int = DEFAULT_MAX_DEPTH,
    max_identifier_bytes: int = DEFAULT_MAX_IDENTIFIER_BYTES,
) -> InputEvent:
    """Parse and validate one wire event; raise EventRejected with a code and a reason.

    Bounds (README, Wire format): the message size, JSON nesting, integers in
    0 .. 2**53-1 (the models), identifiers at most ``max_identifier_bytes``.
    """
    if not raw:
        raise EventRejected("empty_message", "empty message (no bytes)")
    if len(raw) > max_bytes:
        raise EventRejected("too_large", f"event is {len(raw)} bytes, the limit is {max_bytes}")
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as uexc:
            raise EventRejected(
                "invalid_utf8", f"not UTF-8: {uexc.reason} at byte {uexc.start}"
            ) from None
        if "recursion" in str(exc) or "depth" in str(exc):
            raise EventRejected("too_deep", f"JSON nested deeper than {max_depth}") from None
        raise EventRejected("invalid_json", f"not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise EventRejected(
            "not_an_object", f"an event is a JSON object, got {type(data).__name__}"
        )
    # Cheap bound first: nesting can never exceed the number of opening brackets.
    if raw.count(b"{") + raw.count(b"[") > max_depth and _depth(data, max_depth) > max_depth:
        raise EventRejected("too_deep", f"JSON nested deeper than {max_depth}")
    kind = data.get("type")
    if not isinstance(kind, str) or kind not in _KNOWN_TYPES:
        raise EventRejected("unknown_type", f"unknown event type {str(kind)[:40]!r}")
    try:
        event = input_event_adapter.validate_python(data)
    except ValidationError as exc:
        raise EventRejected("invalid_event", _describe(exc)) from None
    check_identifiers(event, max_identifier_bytes)
    return event
