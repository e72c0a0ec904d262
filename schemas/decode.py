"""Bytes to a validated input event, or a classified rejection (for the dead-letter topic).

Two passes, one decision. Nearly every event is decoded and validated by msgspec in
one pass in C straight into its event type (loopfuse.schemas.events), then checked for what
that pass cannot see (the exactly-one-of rules, the history scope, identifier sizes
in UTF-8 bytes, nesting). Whatever the pass refuses or is not sure of - a value the
models would convert, like RFC 3339 text for ``ts``, an unknown field, a rejection
to word - is decoded again as it always was: parsed by orjson, validated by the
pydantic models of loopfuse.schemas.event_schema, which word every rejection. So the first
pass never decides a rejection, and where it accepts an event it builds the very
event the models would have: tests/unit/test_decode.py holds the two to that.
"""

from __future__ import annotations

from typing import Any

import msgspec
import orjson
from msgspec import UNSET
from pydantic import ValidationError

from loopfuse.schemas.event_schema import validate_event
from loopfuse.schemas.events import (
    DEFAULT_MAX_IDENTIFIER_BYTES,
    IDENTIFIERS_OF,
    ErrorDetail,
    InputEvent,
    ToolCall,
    ToolResult,
    Usage,
)

DEFAULT_MAX_EVENT_BYTES = 1_048_576
DEFAULT_MAX_DEPTH = 64
_KNOWN_TYPES = frozenset({"tool_call", "tool_result", "compaction", "run_ended"})

_EVENT_DECODER = msgspec.json.Decoder(InputEvent)
_NO_USAGE = Usage()


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
    event could make a session's state or an output larger than Kafka accepts. The
    first identifier over the bound, in IDENTIFIER_FIELDS order, is the one named.
    """
    quick = limit // 4  # a string this short cannot exceed the limit in UTF-8
    for name in IDENTIFIERS_OF[type(event)]:
        value = getattr(event, name)
        if value is not None and len(value) > quick and (size := utf8_size(value)) > limit:
            raise EventRejected("invalid_event", f"{name} is {size} bytes, the limit is {limit}")


def decode_event(
    raw: bytes | None,
    *,
    max_bytes: int = DEFAULT_MAX_EVENT_BYTES,
    max_depth: int = DEFAULT_MAX_DEPTH,
    max_identifier_bytes: int = DEFAULT_MAX_IDENTIFIER_BYTES,
) -> InputEvent:
    """Parse and validate one wire event; raise EventRejected with a code and a reason.

    Bounds (docs/wire-format.md): the message size, JSON nesting, integers in
    0 .. 2**53-1 and ``ts`` up to year 9999 (the models), identifiers at most
    ``max_identifier_bytes``.
    """
    if not raw:
        raise EventRejected("empty_message", "empty message (no bytes)")
    if len(raw) > max_bytes:
        raise EventRejected("too_large", f"event is {len(raw)} bytes, the limit is {max_bytes}")
    try:
        event: InputEvent = _EVENT_DECODER.decode(raw)
    except (msgspec.MsgspecError, RecursionError):  # msgspec nests by recursion
        return _decode_by_the_models(raw, max_depth, max_identifier_bytes)
    if not _as_the_models_would(event):
        return _decode_by_the_models(raw, max_depth, max_identifier_bytes)
    # The models' path refuses an event as too deep when both its brackets and its
    # nesting (as _depth counts it) exceed the bound. The nesting is the payloads',
    # found in the few containers most events have; the brackets, a pass over every
    # byte, are only counted for an event that is that deep.
    deep = _nested_deeper(event, max_depth - 1)
    if deep is None:
        return _decode_by_the_models(raw, max_depth, max_identifier_bytes)
    if not deep and _may_hide_nesting(event) and raw.count(b"{") + raw.count(b"[") > max_depth:
        # A usage or error object drops the fields it does not know, with their nesting
        # (``{"usage": {"k": [[0]]}}``): where the brackets allow too deep a value, the
        # models' path judges it.
        return _decode_by_the_models(raw, max_depth, max_identifier_bytes)
    if deep and raw.count(b"{") + raw.count(b"[") > max_depth:
        raise EventRejected("too_deep", f"JSON nested deeper than {max_depth}")
    # An identifier takes at most as many UTF-8 bytes as its JSON text: in an event
    # no longer than the bound, none can be over it (most tool calls).
    if len(raw) > max_identifier_bytes:
        check_identifiers(event, max_identifier_bytes)
    return event


def _as_the_models_would(event: InputEvent) -> bool:
    """Whether the models would accept the event the msgspec pass built, with the
    same values: the rules across fields, and payload numbers as orjson reads them.

    msgspec reads an integer of any size exactly, orjson one beyond 64 bits as the
    nearest double (or refuses it, past the doubles' range); orjson.dumps refuses
    such an integer, so a payload it writes holds none (and nothing else differs).
    """
    if not event.session_key and not event.run_id:
        return False
    if isinstance(event, ToolCall):
        args = event.args
        if (args is not UNSET) == (event.args_hash is not None):
            return False
        return args is UNSET or _orjson_writes(args)
    if isinstance(event, ToolResult):
        args, result = event.args, event.result
        outcomes = (
            (result is not UNSET) + (event.result_hash is not None) + (event.error is not None)
        )
        if outcomes != 1 or (args is not UNSET and event.args_hash is not None):
            return False
        return (args is UNSET or _orjson_writes(args)) and (
            result is UNSET or _orjson_writes(result)
        )
    return True


def _orjson_writes(value: Any) -> bool:
    if value is None or type(value) is str:
        return True
    try:
        orjson.dumps(value)
    except orjson.JSONEncodeError:
        return False
    return True


def _nested_deeper(event: InputEvent, limit: int) -> bool | None:
    """Whether a field's value of the event is nested deeper than ``limit``, as
    :func:`_depth` counts it (a scalar is 1); None where the built event cannot tell
    (a usage object with no field set: ``{}`` and ``{"cost": null}`` build the same)."""
    if limit < 1:
        return True  # every field's value is 1 deep at least
    if type(event) is ToolResult:
        # An error object has its message, so it is 2 deep; a usage object is,
        # unless no field of it is set.
        if limit < 2 and (event.usage is not None or type(event.error) is ErrorDetail):
            return None if event.usage == _NO_USAGE else True
        if event.result is not UNSET and _deeper(event.result, limit):
            return True
    elif type(event) is not ToolCall:
        return False  # only scalars
    return event.args is not UNSET and _deeper(event.args, limit)


def _may_hide_nesting(event: InputEvent) -> bool:
    """Whether the event holds an object that ignores unknown fields (usage, an error)."""
    return type(event) is ToolResult and (
        event.usage is not None or type(event.error) is ErrorDetail
    )


def _deeper(value: Any, limit: int) -> bool:
    """``_depth(value) > limit``, for ``limit`` >= 1: a JSON value as decoded (dicts
    and lists, nothing else nests), descended no further than ``limit``."""
    kind = type(value)
    if kind is dict:
        children = value.values()
    elif kind is list:
        children = value
    else:
        return False  # a scalar is 1 deep
    if not children:
        return False  # an empty container is 1 deep
    if limit < 2:
        return True  # a container with children is 2 deep at least
    for child in children:
        kind = type(child)
        if (kind is dict or kind is list) and _deeper(child, limit - 1):
            return True
    return False


def _decode_by_the_models(raw: bytes, max_depth: int, max_identifier_bytes: int) -> InputEvent:
    """What the first pass leaves: orjson, then the pydantic models, which word the
    rejection (its code decided in this order: the bytes, the shape, the nesting,
    the type, the models, the identifiers)."""
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
    # (_depth counts a scalar leaf as a level too, so it can say one more than the
    # brackets: both tests decide, and tests/unit/test_decode.py holds them so.)
    if raw.count(b"{") + raw.count(b"[") > max_depth and _depth(data, max_depth) > max_depth:
        raise EventRejected("too_deep", f"JSON nested deeper than {max_depth}")
    kind = data.get("type")
    if not isinstance(kind, str) or kind not in _KNOWN_TYPES:
        raise EventRejected("unknown_type", f"unknown event type {str(kind)[:40]!r}")
    try:
        event = validate_event(data)
    except ValidationError as exc:
        raise EventRejected("invalid_event", _describe(exc)) from None
    check_identifiers(event, max_identifier_bytes)
    return event
