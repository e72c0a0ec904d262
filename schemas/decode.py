"""Bytes to a validated input event, or a classified rejection (for the dead-letter topic).

Every event is parsed by orjson. The two events of every tool call - a ``tool_call``
and its ``tool_result`` with plain fields - are then checked by :func:`plain_event`
and built without pydantic's validation, which would cost twice the parse; whatever
it is not sure of goes through the models (schemas.events), which decide and
word the rejections. tests/unit/test_decode.py holds the two paths to the same
events.
"""

from __future__ import annotations

from typing import Any

import orjson
from pydantic import ValidationError

from schemas.events import (
    DEFAULT_MAX_IDENTIFIER_BYTES,
    IDENTIFIER_FIELDS,
    MAX_WIRE_INT,
    InputEvent,
    ToolCall,
    ToolResult,
    input_event_adapter,
    unvalidated,
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


def check_identifiers(event: InputEvent, limit: int) -> None:
    """Reject an event whose identifiers or tokens are longer than ``limit`` UTF-8 bytes.

    They end up in session state, verdicts, loop events and messages: unbounded, one
    event could make a session's state or an output larger than Kafka accepts.
    """
    # not getattr: a field another event type lacks costs a raise
    _check_identifier_sizes(event.__dict__, limit)


def _check_identifier_sizes(fields: dict[str, Any], limit: int) -> None:
    """The first identifier of ``fields`` (in IDENTIFIER_FIELDS order) over ``limit``
    UTF-8 bytes rejects the event; ``fields`` are an event's, or the wire object of a
    plain event (whose identifiers are the event's)."""
    quick = limit // 4  # a string this short cannot exceed the limit in UTF-8
    for name in IDENTIFIER_FIELDS:
        value = fields.get(name)
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
    # (_depth counts a scalar leaf as a level too, so it can say one more than the
    # brackets: both tests decide, and tests/unit/test_decode.py holds them so.)
    if raw.count(b"{") + raw.count(b"[") > max_depth and _depth(data, max_depth) > max_depth:
        raise EventRejected("too_deep", f"JSON nested deeper than {max_depth}")
    # A plain event is a tool_call or tool_result, so the type test below would pass
    # it: the usual event is spared it.
    event: InputEvent | None = plain_event(data, max_identifier_bytes)
    if event is not None:
        return event  # its identifiers are checked already
    kind = data.get("type")
    if not isinstance(kind, str) or kind not in _KNOWN_TYPES:
        raise EventRejected("unknown_type", f"unknown event type {str(kind)[:40]!r}")
    try:
        event = input_event_adapter.validate_python(data)
    except ValidationError as exc:
        raise EventRejected("invalid_event", _describe(exc)) from None
    check_identifiers(event, max_identifier_bytes)
    return event


# -- tool calls and results with plain fields, without pydantic's validation ---------

_CALL_FIELDS = frozenset(ToolCall.model_fields)
_RESULT_FIELDS = frozenset(ToolResult.model_fields)
_CALL_DEFAULTS = {name: field.default for name, field in ToolCall.model_fields.items()}
_RESULT_DEFAULTS = {name: field.default for name, field in ToolResult.model_fields.items()}


def plain_event(
    data: dict[str, Any], max_identifier_bytes: int = DEFAULT_MAX_IDENTIFIER_BYTES
) -> ToolCall | ToolResult | None:
    """The ``tool_call`` or ``tool_result`` that validating ``data`` would give, built
    directly; None when ``data`` is anything but the plain case, which the models
    then validate (and word the rejection of).

    The plain case: only the model's own fields; every identifier a string or absent
    (null where the model allows it); ``seq`` absent, null or an int and ``ts`` an
    int, both in 0 .. 2**53-1; ``error`` a string; the event's exactly-one-of rules
    and its history scope hold. Those are the models' rules for these values, so the
    event is equal to the model's, field for field and in its set fields.

    A plain event with an identifier over ``max_identifier_bytes`` is rejected here,
    as :func:`check_identifiers` would reject the built event: this function has
    every identifier in hand already, and the bound is only looked at once the event
    is otherwise valid (a model's rejection of the same event would come first).
    """
    kind = data.get("type")
    fields: frozenset[str]
    defaults: dict[str, Any]
    cls: type[ToolCall | ToolResult]
    if kind == "tool_call":
        fields, defaults, cls = _CALL_FIELDS, _CALL_DEFAULTS, ToolCall
    elif kind == "tool_result":
        fields, defaults, cls = _RESULT_FIELDS, _RESULT_DEFAULTS, ToolResult
    else:
        return None
    if not fields.issuperset(data):
        return None  # unknown fields: the model drops them, and says nothing of them
    # One lookup per field, each value kept: this runs for nearly every event.
    event_id = data.get("event_id")
    session_key = data.get("session_key")
    run_id = data.get("run_id")
    agent_id = data.get("agent_id")
    incarnation = data.get("incarnation")
    call_id = data.get("call_id")
    tool_name = data.get("tool_name")
    args_hash = data.get("args_hash")
    args_action = data.get("args_action")
    if (
        type(event_id) is not str
        or type(call_id) is not str
        or type(tool_name) is not str
        or not event_id
        or not tool_name
    ):
        return None
    # Strings first: the usual value decides each test at its first comparison.
    if (
        (type(session_key) is not str and session_key is not None)
        or (type(run_id) is not str and run_id is not None)
        or (type(agent_id) is not str and agent_id is not None)
        or (type(args_hash) is not str and args_hash is not None)
        or (type(args_action) is not str and args_action is not None)
        or (incarnation is not None and (type(incarnation) is not str or not incarnation))
    ):
        return None
    seq, ts = data.get("seq"), data.get("ts")
    if seq is not None and (type(seq) is not int or not 0 <= seq <= MAX_WIRE_INT):
        return None
    if type(ts) is not int or not 0 <= ts <= MAX_WIRE_INT:
        return None  # RFC 3339 text and 10.0 are the model's to convert
    if not session_key and not run_id:
        return None
    sent_args = "args" in data
    quick = max_identifier_bytes // 4  # a string this short cannot exceed the limit
    if cls is ToolCall:
        if sent_args == (args_hash is not None):
            return None
        long_result_ids = False
    else:
        result_hash, unknown_tool = data.get("result_hash"), data.get("unknown_tool")
        if (type(result_hash) is not str and result_hash is not None) or (
            type(unknown_tool) is not str and unknown_tool is not None
        ):
            return None
        error = data.get("error")
        if error is not None and type(error) is not str:
            return None  # an ErrorDetail object
        if data.get("usage") is not None:
            return None  # a Usage object
        outcomes = ("result" in data) + (result_hash is not None) + (error is not None)
        if outcomes != 1 or (sent_args and args_hash is not None):
            return None
        long_result_ids = (result_hash is not None and len(result_hash) > quick) or (
            unknown_tool is not None and len(unknown_tool) > quick
        )
    if (
        long_result_ids
        or len(event_id) > quick
        or len(call_id) > quick
        or len(tool_name) > quick
        or (session_key is not None and len(session_key) > quick)
        or (run_id is not None and len(run_id) > quick)
        or (agent_id is not None and len(agent_id) > quick)
        or (incarnation is not None and len(incarnation) > quick)
        or (args_hash is not None and len(args_hash) > quick)
        or (args_action is not None and len(args_action) > quick)
    ):
        _check_identifier_sizes(data, max_identifier_bytes)
    return unvalidated(cls, {**defaults, **data}, data)
