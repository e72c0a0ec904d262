"""The decoder's msgspec pass builds exactly the event the models' path builds, or leaves
the event to it: the same event, field for field, or the same rejection."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from msgspec import UNSET
from pydantic import ValidationError

from loopfuse.schemas import decode as decode_module
from loopfuse.schemas import event_schema
from loopfuse.schemas.decode import EventRejected, _depth, check_identifiers, decode_event
from loopfuse.schemas.event_schema import input_event_adapter, to_event
from loopfuse.schemas.events import (
    IDENTIFIER_FIELDS,
    MAX_WIRE_INT,
    Compaction,
    InputEvent,
    RunEnded,
    ToolCall,
    ToolResult,
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
    st.just({"message": "boom", "name": None, "extra": 1}),
    st.just({"message": 3}),
    st.just({"input_tokens": 3, "cost": 0.5}),
    st.just({"total_tokens": 3, "cost": 1}),
    st.just({"cost": -0.5}),
    st.just({"cost": True}),
    st.just({"output_tokens": MAX_WIRE_INT + 1}),
    st.just({}),
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
        {"type": "run_ended", "event_id": "e", "run_id": "r", "ts": 5},
    ]
)


def _reference_decode(raw: bytes, *, max_depth: int, max_identifier_bytes: int) -> InputEvent:
    """decode_event as it was when every event went through the models: bytes, shape,
    nesting and type, then the models, then check_identifiers."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            raise EventRejected("invalid_utf8", "") from None
        if "recursion" in str(exc) or "depth" in str(exc):
            raise EventRejected("too_deep", f"JSON nested deeper than {max_depth}") from None
        raise EventRejected("invalid_json", "") from None
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
        "tool_call",
        "tool_result",
        "compaction",
        "run_ended",
    }:
        raise EventRejected("unknown_type", f"unknown event type {str(kind)[:40]!r}")
    try:
        event = to_event(input_event_adapter.validate_python(data))
    except ValidationError as exc:
        raise EventRejected("invalid_event", f"model: {exc.error_count()}") from None
    check_identifiers(event, max_identifier_bytes)
    return event


def _verdict(decode: Any, raw: bytes, **limits: int) -> tuple[Any, ...]:
    """An event as its type and values (what the engine reads, and what it writes at
    rest); a rejection as its code and reason (the models' wording: see below)."""
    try:
        event = decode(raw, **limits)
    except EventRejected as exc:
        keep_reason = exc.code not in ("invalid_event", "invalid_json", "invalid_utf8") or (
            " bytes, " in exc.reason
        )
        return ("rejected", exc.code, exc.reason if keep_reason else "")
    fields = {name: getattr(event, name) for name in event.__struct_fields__}
    # repr: 1 == 1.0 == True, and a float where orjson reads one must stay a float
    return ("event", type(event), repr(fields), msgspec.json.encode(event))


@settings(max_examples=3000, deadline=None)
@given(_base, _fields)
def test_the_msgspec_pass_builds_what_the_models_validate(
    base: dict[str, Any], extra: dict[str, Any]
) -> None:
    data = {**base, **extra}
    raw = orjson.dumps(data)
    limits = {"max_depth": 64, "max_identifier_bytes": 512}
    assert _verdict(decode_event, raw, **limits) == _verdict(_reference_decode, raw, **limits)


def test_rejections_keep_the_models_wording() -> None:
    raw = (
        b'{"type":"tool_call","event_id":"e","session_key":"s","call_id":"c",'
        b'"tool_name":"read","ts":5}'
    )
    with pytest.raises(EventRejected, match="exactly one of args or args_hash"):
        decode_event(raw)
    with pytest.raises(EventRejected, match=r"^ts: ts must be epoch milliseconds in 0 \.\."):
        decode_event(raw.replace(b'"ts":5', b'"ts":-1,"args":{}'))


def test_the_events_have_the_fields_of_the_models() -> None:
    """One event, two libraries: the msgspec Struct the engine folds and the pydantic
    model that validates and exports the schema carry the same fields and defaults."""
    pairs = [
        (ToolCall, event_schema.ToolCall),
        (ToolResult, event_schema.ToolResult),
        (Compaction, event_schema.Compaction),
        (RunEnded, event_schema.RunEnded),
        (event_schema.events.ErrorDetail, event_schema.ErrorDetail),
        (event_schema.events.Usage, event_schema.Usage),
    ]
    for struct, model in pairs:
        fields = {f.name: f for f in msgspec.structs.fields(struct)}
        model_fields = {name: f for name, f in model.model_fields.items() if name != "type"}
        assert set(fields) == set(model_fields), struct
        for name, field in model_fields.items():
            if field.is_required():
                assert fields[name].required, (struct, name)
            else:
                unset_when_absent = name in ("args", "result")
                expected = UNSET if unset_when_absent else field.default
                assert fields[name].default == expected, (struct, name)


# -- numbers: what orjson reads, whichever pass decoded them ----------------------------


@pytest.mark.parametrize(
    "number",
    [
        "0",
        "-0",
        "-0.0",
        "1",
        "1.0",
        "1e2",
        "1E2",
        "2.5e-3",
        "1e-400",
        "5e-324",
        "9007199254740993",
        "18446744073709551615",
        "18446744073709551616",
        "-9223372036854775808",
        "-9223372036854775809",
        "123456789012345678901234567890",
        "1" + "0" * 308,
        "1" + "0" * 400,
        "1e400",
        "0.1",
        "0.30000000000000004",
        "2.2250738585072014e-308",
        "1.7976931348623157e308",
        "4.9406564584124654e-324",
    ],
)
@pytest.mark.parametrize("where", ["args", "result"])
def test_payload_numbers_are_read_as_orjson_reads_them(number: str, where: str) -> None:
    kind = "tool_call" if where == "args" else "tool_result"
    raw = (
        b'{"type":"' + kind.encode() + b'","event_id":"e","session_key":"s","call_id":"c",'
        b'"tool_name":"read","ts":5,"' + where.encode() + b'":{"n":[' + number.encode() + b"]}}"
    )
    limits = {"max_depth": 64, "max_identifier_bytes": 512}
    assert _verdict(decode_event, raw, **limits) == _verdict(_reference_decode, raw, **limits)


@settings(max_examples=2000, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False), st.sampled_from(["repr", "json"]))
def test_payload_floats_are_read_as_orjson_reads_them(value: float, form: str) -> None:
    text = repr(value) if form == "repr" else json.dumps(value)
    raw = (
        b'{"type":"tool_call","event_id":"e","session_key":"s","call_id":"c",'
        b'"tool_name":"read","ts":5,"args":{"x":' + text.encode() + b"}}"
    )
    event = decode_event(raw)
    assert isinstance(event, ToolCall)
    assert repr(event.args) == repr(orjson.loads(raw)["args"])


@pytest.mark.parametrize(
    "raw",
    [
        # the last of a repeated key counts, as orjson reads it
        b'{"type":"tool_call","event_id":"a","event_id":"b","session_key":"s","call_id":"c",'
        b'"tool_name":"t","ts":5,"args":1}',
        b'{"type":"tool_call","event_id":"a","session_key":"s","call_id":"c","tool_name":"t",'
        b'"ts":5,"args":{"k":1},"args":[2]}',
        b'{"type":"tool_call","event_id":"a","session_key":"s","call_id":"c","tool_name":"t",'
        b'"ts":"x","ts":5,"args":1}',
        b'{"type":"tool_call","event_id":"a","session_key":"s","call_id":"c","tool_name":"t",'
        b'"ts":5,"ts":"x","args":1}',
        b'{"type":"tool_result","event_id":"a","session_key":"s","call_id":"c",'
        b'"tool_name":"t","ts":5,"result":1,"type":"tool_call","args":1}',
        b'{"event_id":"a","session_key":"s","call_id":"c","tool_name":"t","ts":5,'
        b'"args":{"k":{"k":1,"k":2}},"type":"tool_call"}',
        # escapes, in keys too
        b'{"type":"tool_call","\\u0065vent_id":"\\u00e9\\ud83d\\ude00","session_key":"s",'
        b'"call_id":"c","tool_name":"t","ts":5,"args":"\\u0000"}',
        b'{"type":"tool_call","event_id":"a","session_key":"s","call_id":"c","tool_name":"t",'
        b'"ts":5,"args":"\\ud800"}',
        b'{"type":"tool_call","event_id":"\\udfff","session_key":"s","call_id":"c",'
        b'"tool_name":"t","ts":5,"args":1}',
        # bytes orjson refuses
        b'\xef\xbb\xbf{"type":"run_ended","event_id":"a","run_id":"r","ts":5}',
        b'{"type":"run_ended","event_id":"a","run_id":"r","ts":5} x',
        b'{"type":"run_ended","event_id":"a","run_id":"r","ts":5}\n',
        b'{"type":"run_ended","event_id":"a\x01","run_id":"r","ts":5}',
        b'{"type":"run_ended","event_id":"\xff","run_id":"r","ts":5}',
        b'{"type":"run_ended","event_id":"a","run_id":"r","ts":5,}',
        b'{"type":"run_ended","event_id":"a","run_id":"r","ts":NaN}',
        b'[{"type":"run_ended","event_id":"a","run_id":"r","ts":5}]',
        # deeper than msgspec's recursion and orjson's limit
        b'{"type":"tool_call","event_id":"a","session_key":"s","call_id":"c","tool_name":"t",'
        b'"ts":5,"args":' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        # a usage or error object the models check (or ignore the fields of)
        b'{"type":"tool_result","event_id":"a","session_key":"s","call_id":"c",'
        b'"tool_name":"t","ts":5,"error":{"message":"m","x":1},"usage":{"cost":1}}',
        b'{"type":"tool_result","event_id":"a","session_key":"s","call_id":"c",'
        b'"tool_name":"t","ts":5,"result":null,"usage":{"input_tokens":1.0}}',
        b'{"type":"tool_result","event_id":"a","session_key":"s","call_id":"c",'
        b'"tool_name":"t","ts":5,"result":null,"usage":{"cost":-0.0,"total_tokens":0}}',
        # nesting in the fields a usage or error object ignores
        b'{"type":"tool_result","event_id":"a","session_key":"s","call_id":"c",'
        b'"tool_name":"t","ts":5,"result":null,"usage":{"k":' + b"[" * 70 + b"]" * 70 + b"}}",
        b'{"type":"tool_result","event_id":"a","session_key":"s","call_id":"c",'
        b'"tool_name":"t","ts":5,"error":{"message":"m","k":' + b"[" * 70 + b"]" * 70 + b"}}",
    ],
)
def test_awkward_bytes_get_the_verdict_of_the_models_path(raw: bytes) -> None:
    limits = {"max_depth": 64, "max_identifier_bytes": 512}
    assert _verdict(decode_event, raw, **limits) == _verdict(_reference_decode, raw, **limits)


def test_json_the_models_path_refuses_is_refused_with_its_reason() -> None:
    raw = b'{"type":"run_ended","event_id":"a","run_id":"r","ts":5,"n":1e400}'
    with pytest.raises(EventRejected) as rejected:
        decode_event(raw)
    assert rejected.value.code == "invalid_json"
    assert rejected.value.reason.startswith("not JSON: number is infinity")
    with pytest.raises(EventRejected, match=r"^not UTF-8: invalid start byte at byte 0$"):
        decode_event(b"\xff" + raw)


# -- the identifier bound and nesting: the verdict of the models' path -----------------


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
    st.one_of(st.none(), _nested),
    st.sampled_from([2, 3, 4, 5, 6, 64]),
    st.sampled_from([_LIMIT, _LIMIT + 1, 512]),
    st.one_of(st.none(), st.sampled_from(["run_ended", "tool", "", 1, ["tool_call"], {"t": 1}])),
)
def test_decode_gives_the_verdict_of_the_models_path(
    base: dict[str, Any],
    identifiers: dict[str, str],
    extra: dict[str, Any],
    args: Any,
    result: Any,
    max_depth: int,
    max_identifier_bytes: int,
    kind: Any,
) -> None:
    data = {**base, **identifiers, **extra}
    if kind is not None:  # an unknown (or unhashable) type beside everything else
        data["type"] = kind
    if args is not None and "args" in data:
        data["args"] = args
    if result is not None and "result" in data:
        data["result"] = result
    raw = orjson.dumps(data)
    limits = {"max_depth": max_depth, "max_identifier_bytes": max_identifier_bytes}
    assert _verdict(decode_event, raw, **limits) == _verdict(_reference_decode, raw, **limits)


@pytest.mark.parametrize("levels", range(7))
@pytest.mark.parametrize("leaf", ["0", "[]", "{}", '"{["', '{"k":0}'])
@pytest.mark.parametrize("max_depth", [2, 3, 4, 5])
@pytest.mark.parametrize(
    "extra",
    [
        b"",
        b',"usage":{}',
        b',"usage":{"cost":null}',
        b',"usage":{"cost":1.5}',
        b',"error":{"message":"m"}',
    ],
)
def test_nesting_near_the_bound_gets_the_verdict_of_the_models_path(
    levels: int, leaf: str, max_depth: int, extra: bytes
) -> None:
    payload = ("[" * levels + leaf + "]" * levels).encode()
    outcome = b'"result":' + payload if not extra.startswith(b',"error"') else extra[1:]
    raw = (
        b'{"type":"tool_result","event_id":"e","session_key":"s","call_id":"c",'
        b'"tool_name":"read","ts":5,"args":'
        + payload
        + b","
        + outcome
        + (extra if extra.startswith(b',"usage"') else b"")
        + b"}"
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
    raw = orjson.dumps(data)
    reference = _verdict(_reference_decode, raw, max_depth=64, max_identifier_bytes=512)
    assert _verdict(decode_event, raw) == reference
    if size is None:
        assert reference[0] == "event"
    else:
        assert reference == (
            "rejected",
            "invalid_event",
            f"{name} is {size} bytes, the limit is 512",
        )


def test_the_models_rejection_comes_before_the_identifier_bound() -> None:
    data = {**_plain_with("tool_name", "x" * 600), "result_hash": "h"}  # two outcomes
    with pytest.raises(EventRejected, match="exactly one of result, result_hash or error"):
        decode_event(orjson.dumps(data))


def test_the_first_identifier_over_the_bound_is_the_one_named() -> None:
    data = {**_plain_with("tool_name", "x" * 600), "session_key": "é" * 300}
    with pytest.raises(EventRejected, match=r"^session_key is 600 bytes, the limit is 512$"):
        decode_event(orjson.dumps(data))


def test_the_usual_events_take_the_msgspec_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """The msgspec pass decides for the usual events (not only that it is never wrong)."""

    def refuse(*_: Any) -> InputEvent:
        raise AssertionError("left to the models")

    monkeypatch.setattr(decode_module, "_decode_by_the_models", refuse)
    usual = [_plain_with(name, "ok") for name in IDENTIFIER_FIELDS] + [
        {**_plain_with("args_hash", "h"), "args_hash": None, "args": [1]},
        {
            **_plain_with("x", "x"),
            "result": {"content": [{"type": "text", "text": "é"}]},
            "args": {"command": "ls", "timeout": 1.5},
        },
        {k: v for k, v in _plain_with("error", "boom").items() if k != "result"},
        {k: v for k, v in _plain_with("error", "x").items() if k not in ("result", "x")}
        | {"error": {"message": "boom", "name": "E"}, "usage": {"input_tokens": 3}},
        {"type": "compaction", "event_id": "e", "session_key": "s", "ts": 5, "reason": "x"},
        {"type": "run_ended", "event_id": "e", "run_id": "r", "seq": 0, "ts": 5},
    ]
    for data in usual:
        data.pop("x", None)
        assert decode_event(orjson.dumps(data)).type == data["type"]
    with pytest.raises(AssertionError, match="left to the models"):
        decode_event(orjson.dumps({**usual[0], "ts": "2026-01-01T00:00:00Z"}))


def test_events_are_frozen_and_know_their_session() -> None:
    event = decode_event(orjson.dumps(_plain_with("args_hash", "h")))
    assert isinstance(event, ToolCall) and event.has_args and event.key == "s"
    with pytest.raises(AttributeError):
        event.tool_name = "other"  # type: ignore[misc]
    assert event.args is UNSET and event.type == "tool_call"
