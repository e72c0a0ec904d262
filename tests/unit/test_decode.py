"""The decoder's plain path builds exactly the event the models validate, or leaves it to them."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from schemas.decode import (
    EventRejected,
    _depth,
    check_identifiers,
    decode_event,
    plain_event,
)
from schemas.events import (
    IDENTIFIER_FIELDS,
    MAX_WIRE_INT,
    InputEvent,
    ToolCall,
    ToolResult,
    input_event_adapter,
)

_values = st.one_of(
    st.none(),
    st.just(""),
    st.sampled_from(["x", "r1", "s1", "Unknown tool: ghost"]),
    st.booleans(),
    st.integers(-2, 3),
    st.sampled_from([MAX_WIRE_INT, MAX_WIRE_INT + 1]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.just("2026-01-01T00:00:00Z"),
    st.just({"message": "boom"}),
    st.just({"input_tokens": 3, "cost": 0.5}),
    st.just({"k": [1, 2]}),
    st.just([]),
)
_fields = st.dictionaries(
    st.sampled_from(
        [*IDENTIFIER_FIELDS, "seq", "ts", "args", "result", "error", "reason", "usage", "extra"]
    ),
    _values,
    max_size=3,
)
# Mostly valid-looking calls and results, then the drawn fields on top.
_base = st.sampled_from(
    [
        {
            "type": "tool_call",
            "event_id": "e",
            "session_key": "s",
            "call_id": "c",
            "tool_name": "read",
            "args": {"p": 1},
            "ts": 5,
        },
        {
            "type": "tool_result",
            "event_id": "e",
            "run_id": "r",
            "call_id": "c",
            "tool_name": "read",
            "result": {"ok": True},
            "ts": 5,
            "seq": 2,
        },
        {
            "type": "tool_result",
            "event_id": "e",
            "session_key": "s",
            "call_id": "c",
            "tool_name": "read",
            "error": "Unknown tool: x",
            "ts": 5,
        },
        {"type": "compaction", "event_id": "e", "session_key": "s", "ts": 5},
    ]
)


def _same(a: Any, b: Any) -> bool:
    return (
        type(a) is type(b)
        and a.__dict__ == b.__dict__
        and list(a.__dict__) == list(b.__dict__)
        and a.model_fields_set == b.model_fields_set
    )


@settings(max_examples=2000, deadline=None)
@given(_base, _fields)
def test_the_plain_path_builds_what_the_models_validate(
    base: dict[str, Any], extra: dict[str, Any]
) -> None:
    data = {**base, **extra}
    plain = plain_event(data)
    try:
        validated = input_event_adapter.validate_python(data)
    except ValidationError:
        assert plain is None  # only the models reject, with their reasons
        return
    assert plain is None or _same(plain, validated)
    if plain is not None:  # and it serialises (state at rest, audit) the same way
        assert plain.model_dump_json(exclude_unset=True) == validated.model_dump_json(
            exclude_unset=True
        )


def test_a_plain_tool_call_takes_the_plain_path() -> None:
    data = {
        "type": "tool_call",
        "event_id": "e",
        "session_key": "s",
        "call_id": "c",
        "tool_name": "read",
        "args": None,
        "ts": 5,
    }
    event = plain_event(data)
    assert isinstance(event, ToolCall) and event.has_args and event.key == "s"
    with pytest.raises(Exception, match="frozen"):
        event.tool_name = "other"  # type: ignore[misc]


def test_rejections_keep_the_models_wording() -> None:
    raw = (
        b'{"type":"tool_call","event_id":"e","session_key":"s","call_id":"c",'
        b'"tool_name":"read","ts":5}'
    )
    with pytest.raises(Exception, match="exactly one of args or args_hash"):
        decode_event(raw)


def test_the_plain_path_knows_every_field_of_the_models() -> None:
    """A new field may need a check in plain_event (a type, a nested model): this fails
    until someone has looked."""
    known = {*IDENTIFIER_FIELDS, "type", "seq", "ts", "args", "result", "error", "usage"}
    assert set(ToolCall.model_fields) | set(ToolResult.model_fields) == known


# -- the identifier bound on the plain path: the verdict of the models' path ----------


def _reference_decode(raw: bytes, *, max_depth: int, max_identifier_bytes: int) -> InputEvent:
    """decode_event for JSON text as it was when every event went through the models:
    shape, nesting and type, then validate_python, then check_identifiers."""
    data = orjson.loads(raw)
    if not isinstance(data, dict):
        raise EventRejected(
            "not_an_object", f"an event is a JSON object, got {type(data).__name__}"
        )
    # Both as decode has always had them: _depth counts a scalar leaf as a level, so
    # [[[0]]] in an event is 5 deep by it, while its 4 brackets pass.
    if raw.count(b"{") + raw.count(b"[") > max_depth and _depth(data, max_depth) > max_depth:
        raise EventRejected("too_deep", f"JSON nested deeper than {max_depth}")
    kind = data.get("type")
    if not isinstance(kind, str) or kind not in {
        "tool_call", "tool_result", "compaction", "run_ended"
    }:
        raise EventRejected("unknown_type", f"unknown event type {str(kind)[:40]!r}")
    try:
        event: InputEvent = input_event_adapter.validate_python(data)
    except ValidationError as exc:
        raise EventRejected("invalid_event", f"model: {exc.error_count()}") from None
    check_identifiers(event, max_identifier_bytes)
    return event


def _verdict(decode: Any, raw: bytes, **limits: int) -> tuple[Any, ...]:
    """An event as its type, values, field order and set fields; a rejection as its
    code and reason (the models' wording is compared by the hypothesis test above, so
    here only its code)."""
    try:
        event = decode(raw, **limits)
    except EventRejected as exc:
        reason = exc.reason if exc.code != "invalid_event" or " bytes, " in exc.reason else ""
        return ("rejected", exc.code, reason)
    return (
        "event",
        type(event),
        event.__dict__,
        list(event.__dict__),
        event.model_fields_set,
    )


_LIMIT = 16  # small, so that short drawn strings fall on both sides of it
# ASCII, and characters of 2, 3 and 4 UTF-8 bytes: the character count that passes
# the quick bound (limit // 4) may be over the limit in bytes, or not.
_identifier_text = st.text(alphabet=st.sampled_from("xé€😀"), max_size=_LIMIT + 2)
_nested = st.recursive(
    st.integers(0, 3) | st.text(alphabet="{[", max_size=3),
    lambda inner: st.lists(inner, max_size=2) | st.dictionaries(st.just("k"), inner),
    max_leaves=8,
)


@settings(max_examples=3000, deadline=None)
@given(
    _base,
    st.dictionaries(st.sampled_from(IDENTIFIER_FIELDS), _identifier_text, max_size=4),
    _fields,
    st.one_of(st.none(), _nested),
    st.sampled_from([4, 5, 6, 64]),
    st.sampled_from([_LIMIT, _LIMIT + 1, 512]),
    st.one_of(
        st.none(), st.sampled_from(["run_ended", "tool", "", 1, ["tool_call"], {"t": 1}])
    ),
)
def test_decode_gives_the_verdict_of_the_models_path(
    base: dict[str, Any],
    identifiers: dict[str, str],
    extra: dict[str, Any],
    args: Any,
    max_depth: int,
    max_identifier_bytes: int,
    kind: Any,
) -> None:
    data = {**base, **identifiers, **extra}
    if kind is not None:  # an unknown (or unhashable) type beside everything else
        data["type"] = kind
    if args is not None and "args" in data:
        data["args"] = args
    raw = orjson.dumps(data)
    limits = {"max_depth": max_depth, "max_identifier_bytes": max_identifier_bytes}
    assert _verdict(decode_event, raw, **limits) == _verdict(_reference_decode, raw, **limits)


@pytest.mark.parametrize("levels", range(7))
@pytest.mark.parametrize("leaf", ["0", "[]", "{}", '"{["', '{"k":0}'])
@pytest.mark.parametrize("max_depth", [3, 4, 5])
def test_nesting_near_the_bound_gets_the_verdict_of_the_models_path(
    levels: int, leaf: str, max_depth: int
) -> None:
    args = "[" * levels + leaf + "]" * levels
    raw = (
        b'{"type":"tool_call","event_id":"e","session_key":"s","call_id":"c",'
        b'"tool_name":"read","ts":5,"args":' + args.encode() + b"}"
    )
    limits = {"max_depth": max_depth, "max_identifier_bytes": 512}
    assert _verdict(decode_event, raw, **limits) == _verdict(_reference_decode, raw, **limits)


def _plain_with(name: str, value: str) -> dict[str, Any]:
    """A plain event that carries ``value`` as its identifier ``name``."""
    data: dict[str, Any] = {
        "type": "tool_result",
        "event_id": "e",
        "session_key": "s",
        "call_id": "c",
        "tool_name": "read",
        "result": "ok",
        "ts": 5,
    }
    if name == "result_hash":
        del data["result"]
    if name == "args_hash":
        data["type"] = "tool_call"
        del data["result"]
    data[name] = value
    return data


@pytest.mark.parametrize("name", IDENTIFIER_FIELDS)
@pytest.mark.parametrize(
    ("value", "size"),
    [
        ("x" * 512, None),
        ("x" * 513, 513),
        ("x" * 300_000, 300_000),
        ("é" * 256, None),  # 256 characters (over limit // 4), 512 bytes
        ("é" * 257, 514),
        ("€" * 170, None),  # 510 bytes
        ("€" * 171, 513),
        ("😀" * 128, None),  # 128 characters: not over limit // 4
        ("😀" * 129, 516),
        ("x" + "😀" * 128, 513),
        ("é" * 200 + "€" * 38, 514),
    ],
)
def test_an_identifier_over_the_bound_is_rejected_as_the_models_path_does(
    name: str, value: str, size: int | None
) -> None:
    data = _plain_with(name, value)
    assert plain_event({**data, name: "ok"}) is not None  # the plain path's case
    raw = orjson.dumps(data)
    reference = _verdict(_reference_decode, raw, max_depth=64, max_identifier_bytes=512)
    assert _verdict(decode_event, raw) == reference
    if size is None:
        assert reference[0] == "event"
    else:
        assert reference == (
            "rejected", "invalid_event", f"{name} is {size} bytes, the limit is 512"
        )


def test_a_lone_surrogate_counts_as_the_built_event_would() -> None:
    """orjson never decodes one (it rejects "\\ud800"), but plain_event takes any dict
    (the models would not: pydantic rejects a lone surrogate as a string)."""
    data = _plain_with("tool_name", "\ud800" * 171)  # 513 bytes with surrogatepass
    event = plain_event(data, 1024)
    assert event is not None
    with pytest.raises(EventRejected) as by_event:
        check_identifiers(event, 512)
    with pytest.raises(EventRejected) as by_plain:
        plain_event(data, 512)
    assert (by_plain.value.code, by_plain.value.reason) == (
        by_event.value.code, by_event.value.reason
    ) == ("invalid_event", "tool_name is 513 bytes, the limit is 512")


def test_the_models_rejection_comes_before_the_identifier_bound() -> None:
    data = {**_plain_with("tool_name", "x" * 600), "result_hash": "h"}  # two outcomes
    with pytest.raises(EventRejected, match="exactly one of result, result_hash or error"):
        decode_event(orjson.dumps(data))


def test_the_first_identifier_over_the_bound_is_the_one_named() -> None:
    data = {**_plain_with("tool_name", "x" * 600), "session_key": "é" * 300}
    assert plain_event({**data, "tool_name": "read", "session_key": "s"}) is not None
    with pytest.raises(EventRejected, match=r"^session_key is 600 bytes, the limit is 512$"):
        decode_event(orjson.dumps(data))


def test_plain_tool_calls_and_results_take_the_plain_path() -> None:
    """The plain path decides for the usual events (not only that it is never wrong)."""
    for name in IDENTIFIER_FIELDS:
        assert plain_event(_plain_with(name, "ok")) is not None, name
    call = {**_plain_with("args_hash", "h"), "args_hash": None, "args": [1]}
    assert plain_event(call) is not None
    assert plain_event({**_plain_with("error", "boom"), "result": None}) is None
    assert plain_event({k: v for k, v in _plain_with("error", "x").items() if k != "result"})
