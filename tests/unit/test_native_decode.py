"""The native judge's decoder (native/, stage 2 of issue 27) against the Python decoder.

``event_fingerprints`` says "sure" (gives the event's tokens) only of bytes the Python
decoder accepts through its msgspec pass, and leaves everything else to it: so the
route replay and the worker take (loopfuse.streams.engine.wire) gives every event the
Python decoder gives, and every rejection with its code and reason. These tests hold it
to that on the engine corpus, the benchmark's workload, the malformed and awkward inputs,
the hostile strings in every field and hypothesis's bytes; and they hold its tokens to
the Python engine's. They drive the built module directly, whatever
LOOPFUSE_PURE_ENGINE says, and skip only where it is not built.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Any

import msgspec
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from msgspec import UNSET
from xxhash import xxh3_128_hexdigest

from bench.engine import build_workload
from loopfuse.schemas.decode import DEFAULT_MAX_EVENT_BYTES, EventRejected, decode_event
from loopfuse.schemas.events import (
    IDENTIFIER_FIELDS,
    MAX_EVENT_TS,
    MAX_WIRE_INT,
    Compaction,
    InputEvent,
    ToolCall,
    ToolResult,
)
from loopfuse.streams.engine.canonical import pure_canonical_json
from loopfuse.streams.engine.fingerprint import ERROR_PREFIX, action_of, normalised_result
from tests.fixtures.hostile_strings import HOSTILE
from tests.support.generated_sessions import generated_lines
from tests.unit.test_decode import _base, _fields

ROOT = Path(__file__).resolve().parents[2]
_DECODER = msgspec.json.Decoder(InputEvent)
_LIMITS = {"max_bytes": DEFAULT_MAX_EVENT_BYTES, "max_depth": 64, "max_identifier_bytes": 512}


def _pure_tokens(event: InputEvent) -> tuple[str | None, str | None, bool]:
    """The tokens the Python engine computes (with no send tools), canonical JSON by the
    Python reference."""
    args = getattr(event, "args", UNSET)
    args_token = None if args is UNSET else xxh3_128_hexdigest(pure_canonical_json(args))
    if type(event) is not ToolResult or event.result_hash is not None:
        return args_token, None, False
    error = event.error_text
    if error is not None:
        return args_token, ERROR_PREFIX + xxh3_128_hexdigest(error.encode()), True
    action = action_of(event.args, event.args_action)
    outcome = normalised_result(event.tool_name, action, event.result, frozenset())
    return (
        args_token,
        (None if outcome is None else xxh3_128_hexdigest(pure_canonical_json(outcome))),
        True,
    )


def _json(value: Any) -> bytes:
    """As a gateway writes it: orjson, or, for a lone surrogate, an escape (json.dumps)."""
    try:
        return orjson.dumps(value)
    except TypeError:
        return json.dumps(value).encode()


def _fields_of(event: InputEvent) -> tuple[Any, ...]:
    # repr: 1 == 1.0 == True, and a float must stay a float
    fields = {name: getattr(event, name) for name in event.__struct_fields__}
    return type(event), repr(fields), msgspec.json.encode(event)


def decided_natively(native: ModuleType, raw: bytes, **limits: int) -> bool:
    """Whether the native judge answered; where it did, the Python decoder accepts the
    bytes, the event the route builds is its event field for field, and the tokens are
    the Python engine's. (Where it did not, the route is the Python decoder's.)"""
    limits = {**_LIMITS, **limits}
    tokens = native.event_fingerprints(raw, *limits.values())
    if tokens is None:
        return False
    python = {name: value for name, value in limits.items() if name != "max_bytes"}
    try:
        expected = decode_event(raw, max_bytes=limits["max_bytes"], **python)
    except EventRejected as exc:
        raise AssertionError(
            f"native accepted what the decoder rejects: {exc.code} {exc.reason} {raw[:200]!r}"
        ) from None
    event = _DECODER.decode(raw)
    assert _fields_of(event) == _fields_of(expected), raw[:200]
    args_token, result_token, known = tokens
    want_args, want_result, want_known = _pure_tokens(expected)
    # a token left to the engine (None) is fine: it computes it (an int beyond 2**53)
    assert args_token in (None, want_args), raw[:200]
    assert want_args is not None or args_token is None
    if known:
        assert want_known and result_token == want_result, raw[:200]
    fields = native.event_fields(raw, *limits.values())
    assert fields is not None, raw[:200]  # the same accept rules, the same answer
    assert fields == _wire_fields(expected), raw[:200]
    return True


def _wire_fields(event: InputEvent) -> dict[str, Any]:
    """What the native reader's ``event_fields`` must give of the event (raw values as
    their canonical JSON; None where the native writer leaves a value to Python)."""
    fields: dict[str, Any] = {
        name: getattr(event, name)
        for name in ("event_id", "session_key", "run_id", "agent_id", "incarnation", "seq", "ts")
    }
    reply = event.reply_to
    fields["type"] = event.type
    fields["reply_to"] = None if reply is None else (reply.topic, reply.partition, reply.requester)
    fields["key"] = event.key
    if isinstance(event, ToolCall | ToolResult):
        fields.update(
            call_id=event.call_id,
            tool_name=event.tool_name,
            args_hash=event.args_hash,
            args_action=event.args_action,
            args=_canonical_or_none(getattr(event, "args", UNSET)),
        )
    if isinstance(event, ToolResult):
        usage = event.usage
        fields.update(
            result=_canonical_or_none(event.result),
            result_hash=event.result_hash,
            error_text=event.error_text,
            unknown_tool=event.unknown_tool,
            usage=None
            if usage is None
            else (usage.input_tokens, usage.output_tokens, usage.total_tokens, usage.cost),
        )
    if isinstance(event, Compaction):
        fields["reason"] = event.reason
    return fields


def _canonical_or_none(value: Any) -> bytes | None:
    if value is UNSET:
        return None
    try:
        text = pure_canonical_json(value)
    except (TypeError, ValueError):
        return None
    # the native writer leaves integers beyond 2**53 - 1 to Python
    return None if _has_big_int(value) else text


def _has_big_int(value: Any) -> bool:
    if type(value) is int:
        return abs(value) > MAX_WIRE_INT
    if isinstance(value, dict):
        return any(map(_has_big_int, value.values()))
    if isinstance(value, list):
        return any(map(_has_big_int, value))
    return False


def test_the_benchmark_workload_is_all_decided_natively(native: ModuleType) -> None:
    lines = build_workload(40, 30, 3)
    assert all(decided_natively(native, raw) for raw in lines)
    # and its tokens are all native (none left to the engine)
    for raw in lines:
        args_token, _, known = native.event_fingerprints(raw, *_LIMITS.values())
        assert args_token is not None or b'"args"' not in raw
        assert known or b'"tool_result"' not in raw


def test_generated_sessions_with_hostile_strings(native: ModuleType) -> None:
    """Random sessions (tests/support/generated_sessions.py): what the native reader
    answers, the Python decoder accepts, with the same event and tokens; and it
    answers for nearly all of what that decoder accepts (only the lone surrogates and
    over-long identifiers are the Python decoder's to reject)."""
    lines = generated_lines(11)
    answered = sum(decided_natively(native, raw) for raw in lines)
    accepted = 0
    for raw in lines:
        try:
            decode_event(raw)
        except EventRejected:
            continue
        accepted += 1
    assert accepted > 4_000 and answered == accepted, (answered, accepted, len(lines))


def test_the_examples_and_fixtures(native: ModuleType) -> None:
    paths = sorted((ROOT / "examples").rglob("*.jsonl")) + sorted(
        (ROOT / "tests" / "fixtures").glob("*.jsonl")
    )
    lines = [line for path in paths for line in path.read_bytes().splitlines()]
    answered = sum(decided_natively(native, raw) for raw in lines)
    accepted = 0
    for raw in lines:
        try:
            event = decode_event(raw)
        except EventRejected:
            continue
        # RFC 3339 text for ts is the models' to convert (the msgspec pass leaves it too)
        accepted += type(orjson.loads(raw)["ts"]) is int and event.ts >= 0
    assert answered == accepted > 50  # every event the msgspec pass accepts, and only those


_AWKWARD = [
    b"",
    b" ",
    b"null",
    b'"x"',
    b"[]",
    b"{}",
    b'{"type":"run_ended","event_id":"a","run_id":"r","ts":5',
    b'{"type":"run_ended","event_id":"a","run_id":"r","ts":5}}',
    b'{"type":"run_ended","event_id":"a","run_id":"r","ts":05}',
    b'{"type":"run_ended","event_id":"a","run_id":"r","ts":-0}',
    b'{"type":"run_ended","event_id":"a","run_id":"r","ts":5.0}',
    b'{"type":"run_ended","event_id":"a","run_id":"r","ts":5e0}',
    b'{"type":"run_ended","event_id":"a","run_id":"r","ts":Infinity}',
    b'{"type":"run_ended","event_id":"a","run_id":"r","ts":"5"}',
    b'{"type":"run_ended","event_id":"a","run_id":"r","ts":%d}' % (MAX_EVENT_TS + 1),
    b'{"type":"run_ended","event_id":"a","run_id":"r","ts":%d}' % MAX_EVENT_TS,
    b'{"type":"run_ended","event_id":"a","run_id":"r","ts":5,"seq":%d}' % (MAX_WIRE_INT + 1),
    b'{"type":"run_ended","event_id":"a","run_id":"r","ts":5,"seq":true}',
    b'{"type":"run_ended","event_id":"a","run_id":"","session_key":"","ts":5}',
    b'{"type":"run_ended","event_id":"","run_id":"r","ts":5}',
    b'{"type":"run_ended","event_id":"a","run_id":"r","ts":5,"incarnation":""}',
    b'{"type":"run_ended","event_id":"a","run_id":"r","ts":5,"incarnation":null}',
    b'{"type":"run_ended","event_id":"a","run_id":"r","ts":5,"reason":"x"}',
    b'{"type":"compaction","event_id":"a","run_id":"r","ts":5,"reason":7}',
    b'{"type":"run_ended","event_id":"a","run_id":"r","ts":5,"reply_to":null}',
    b'{"type":"run_ended","event_id":"a","run_id":"r","ts":5,'
    b'"reply_to":{"topic":"t.x-1_","partition":3,"requester":"g"}}',
    b'{"type":"run_ended","event_id":"a","run_id":"r","ts":5,'
    b'"reply_to":{"topic":"t\\n","partition":3,"requester":"g"}}',
    b'{"type":"run_ended","event_id":"a","run_id":"r","ts":5,'
    b'"reply_to":{"topic":"t","partition":2147483648,"requester":"g"}}',
    b'{"type":"run_ended","event_id":"a","run_id":"r","ts":5,'
    b'"reply_to":{"topic":"t","partition":1,"requester":""}}',
    b'{"type":"run_ended","event_id":"a","run_id":"r","ts":5,'
    b'"reply_to":{"topic":"t","partition":1,"requester":"g","x":1}}',
    b'{"type":"run_ended","event_id":"a","run_id":"r","ts":5,'
    b'"reply_to":{"topic":"t","partition":1}}',
    b'{"type":"run_ended","event_id":"a","run_id":"r","ts":5,'
    b'"reply_to":{"topic":"' + b"t" * 250 + b'","partition":1,"requester":"g"}}',
    b'{"type":"run_ended","event_id":"a","run_id":"r","ts":5,'
    b'"reply_to":{"topic":"t","partition":1,"requester":"' + "é".encode() * 255 + b'"}}',
    b'{"type":"run_ended","event_id":"a","run_id":"r","ts":5,'
    b'"reply_to":{"topic":"t","partition":1,"requester":"' + "é".encode() * 256 + b'"}}',
    b'{"type":"tool_call","event_id":"a","session_key":"s","call_id":"c","tool_name":"t",'
    b'"ts":5,"args":{"n":18446744073709551615,"m":-9223372036854775808}}',
    b'{"type":"tool_call","event_id":"a","session_key":"s","call_id":"c","tool_name":"t",'
    b'"ts":5,"args":{"n":9223372036854775807,"f":1e308,"g":-0.0,"h":5e-324}}',
    b'{"type":"tool_call","event_id":"a","session_key":"s","call_id":"c","tool_name":"t",'
    b'"ts":5,"args":{"n":9007199254740993}}',
    b'{"type":"tool_call","event_id":"a","session_key":"s","call_id":"c","tool_name":"t",'
    b'"ts":5,"args":{"n":1e400}}',
    b'{"type":"tool_call","event_id":"a","session_key":"s","call_id":"c","tool_name":"t",'
    b'"ts":5,"args":{"n":NaN}}',
    b'{"type":"tool_call","event_id":"a","session_key":"s","call_id":"c","tool_name":"t",'
    b'"ts":5,"args":{"n":-Infinity}}',
    b'{"type":"tool_call","event_id":"a","session_key":"s","call_id":"c","tool_name":"t",'
    b'"ts":5,"args":{"n":1.},"x":0}',
    b'{"type":"tool_call","event_id":"a","session_key":"s","call_id":"c","tool_name":"t",'
    b'"ts":5,"args":{"\\ud83d\\ude00":"\\u00e9\\/\\b\\f\\n\\r\\t\\"\\\\"}}',
    b'{"type":"tool_call","event_id":"a","session_key":"s","call_id":"c","tool_name":"t",'
    b'"ts":5,"args":"\\ud83d"}',
    b'{"type":"tool_call","event_id":"a","session_key":"s","call_id":"c","tool_name":"t",'
    b'"ts":5,"args":"\\ude00\\ud83d"}',
    b'{"type":"tool_call","event_id":"a","session_key":"s","call_id":"c","tool_name":"t",'
    b'"ts":5,"args":"\\u12"}',
    b'{"type":"tool_call","event_id":"a","session_key":"s","call_id":"c","tool_name":"t",'
    b'"ts":5,"args":"\xed\xa0\x80"}',
    b'{"type":"tool_call","event_id":"a","session_key":"s","call_id":"c","tool_name":"t",'
    b'"ts":5,"args":"\xc3"}',
    b'{"type":"tool_call","event_id":"a","session_key":"s","call_id":"c","tool_name":"t",'
    b'"ts":5,"args":{"\xe2\x80\xa8":"\xf0\x9f\x98\x80\xef\xbf\xbf"}}',
    b'{"type":"tool_call","event_id":"a","session_key":"s","call_id":"c","tool_name":"t",'
    b'"ts":5,"args":null}',
    b'{"type":"tool_call","event_id":"a","session_key":"s","call_id":"c","tool_name":"t",'
    b'"ts":5,"args_hash":"h","args":null}',
    b'{"type":"tool_call","event_id":"a","session_key":"s","call_id":"c","tool_name":"t",'
    b'"ts":5,"args_hash":null}',
    b'{"type":"tool_call","event_id":"a","session_key":"s","call_id":"c","tool_name":"t",'
    b'"ts":5,"args_hash":"h","args_action":"poll"}',
    b'{"type":"tool_call","event_id":"a","session_key":"s","call_id":"","tool_name":"t",'
    b'"ts":5,"args":[]}',
    b'{"type":"tool_call","event_id":"a","session_key":"s","call_id":null,"tool_name":"t",'
    b'"ts":5,"args":[]}',
    b' \t\r\n{ "type" : "tool_call" , "event_id" : "a" , "session_key" : "s" , "call_id" :'
    b' "c" , "tool_name" : "t" , "ts" : 5 , "args" : [ 1 , { } , [ ] ] } \n\r\t ',
    b'{"type":"tool_result","event_id":"a","session_key":"s","call_id":"c","tool_name":"t",'
    b'"ts":5,"error":{"message":"","name":"E"}}',
    b'{"type":"tool_result","event_id":"a","session_key":"s","call_id":"c","tool_name":"t",'
    b'"ts":5,"error":{"message":"","name":null}}',
    b'{"type":"tool_result","event_id":"a","session_key":"s","call_id":"c","tool_name":"t",'
    b'"ts":5,"error":{"name":"E"}}',
    b'{"type":"tool_result","event_id":"a","session_key":"s","call_id":"c","tool_name":"t",'
    b'"ts":5,"error":"x","result":null}',
    b'{"type":"tool_result","event_id":"a","session_key":"s","call_id":"c","tool_name":"t",'
    b'"ts":5,"error":null,"result":null,"usage":{"cost":3,"input_tokens":null}}',
    b'{"type":"tool_result","event_id":"a","session_key":"s","call_id":"c","tool_name":"t",'
    b'"ts":5,"result_hash":"r","usage":{"cost":1.5e-3,"total_tokens":7}}',
    b'{"type":"tool_result","event_id":"a","session_key":"s","call_id":"c","tool_name":"t",'
    b'"ts":5,"result_hash":"r","usage":{"cost":-1}}',
    b'{"type":"tool_result","event_id":"a","session_key":"s","call_id":"c","tool_name":"t",'
    b'"ts":5,"result_hash":"r","usage":{}}',
    b'{"type":"tool_result","event_id":"a","session_key":"s","call_id":"c","tool_name":"t",'
    b'"ts":5,"result_hash":"r","unknown_tool":"ghost"}',
    b'{"type":"tool_result","event_id":"a","session_key":"s","call_id":"c","tool_name":"t",'
    b'"ts":5,"result":1,"args":1,"args_hash":"h"}',
    b'{"type":"tool_result","event_id":"a","session_key":"s","call_id":"c","tool_name":"t",'
    b'"ts":5,"result":1,"result":2}',
    b'{"type":"tool_call","event_id":"a","session_key":"s","call_id":"c","tool_name":"t",'
    b'"ts":5,"args":{' + b",".join(b'"k%d":%d' % (i, i) for i in range(40)) + b',"k3":0}}',
    b'{"type":"tool_call","event_id":"a","session_key":"s","call_id":"c","tool_name":"t",'
    b'"ts":5,"args":' + b"[" * 100_000 + b"]" * 100_000 + b"}",
]


@pytest.mark.parametrize("raw", _AWKWARD)
def test_awkward_bytes(native: ModuleType, raw: bytes) -> None:
    decided_natively(native, raw)


def test_what_it_answers_of_the_awkward_bytes(native: ModuleType) -> None:
    """Not only never wrong: the plain valid ones among them are decided natively."""
    answered = [raw for raw in _AWKWARD if native.event_fingerprints(raw, *_LIMITS.values())]
    assert len(answered) >= 15, answered


@pytest.mark.parametrize("max_depth", [3, 4, 5, 6, 64])
@pytest.mark.parametrize("levels", range(8))
def test_nesting_near_the_bound(native: ModuleType, max_depth: int, levels: int) -> None:
    for leaf in (b"0", b"[]", b"{}", b'"{["', b'{"k":0}'):
        args = b"[" * levels + leaf + b"]" * levels
        for field in (b"args", b"result"):
            kind = b"tool_call" if field == b"args" else b"tool_result"
            raw = (
                b'{"type":"' + kind + b'","event_id":"a","session_key":"s","call_id":"c",'
                b'"tool_name":"t","ts":5,"' + field + b'":' + args + b"}"
            )
            decided_natively(native, raw, max_depth=max_depth)


@pytest.mark.parametrize("name", IDENTIFIER_FIELDS)
def test_identifiers_at_the_bound_and_hostile(native: ModuleType, name: str) -> None:
    base: dict[str, Any] = {
        "type": "tool_result",
        "event_id": "e",
        "session_key": "s",
        "call_id": "c",
        "tool_name": "t",
        "ts": 5,
        "result_hash": "r",
    }
    for value in ["x" * 16, "x" * 17, "é" * 8, "é" * 9, "😀" * 4, "€" * 6, *HOSTILE.values()]:
        raw = _json({**base, name: value})
        decided_natively(native, raw, max_identifier_bytes=16)
        decided_natively(native, raw)


def test_hostile_strings_in_payloads(native: ModuleType) -> None:
    for payload in HOSTILE.values():
        for tool in ("exec", "process", "message", "read"):
            raw = _json(
                {
                    "type": "tool_result",
                    "event_id": payload or "e",
                    "session_key": payload or "s",
                    "call_id": payload,
                    "tool_name": tool,
                    "ts": 5,
                    "args": {"action": "poll", payload: [payload]},
                    "result": {
                        "content": [{"type": "text", "text": payload}],
                        "details": {"status": "completed", "aggregated": payload},
                    },
                }
            )
            # answered, unless a lone surrogate is in it (the Python decoder's to judge)
            surrogate = any("\ud800" <= char <= "\udfff" for char in payload)
            assert decided_natively(native, raw) != surrogate


# -- results shaped like the outcomes fingerprint.py cuts -------------------------------

_spaces = st.sampled_from(
    [
        "",
        " ",
        "\n",
        "\t",
        "\x0b",
        "\x1c",
        "\x1f",
        "\x85",
        "\xa0",
        "\u1680",
        "\u2000",
        "\u200a",
        "\u200b",
        "\u2028",
        "\u3000",
        "\ufeff",
    ]
)
_text = st.builds(lambda a, b, c: a + b + c, _spaces, st.text(max_size=8), _spaces)
_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**60), 2**60),
    _text,
    st.floats(allow_nan=False, allow_infinity=False),
)
_details = st.fixed_dictionaries(
    {},
    optional={
        "status": st.sampled_from(
            [
                "running",
                "completed",
                "failed",
                "approval-pending",
                "approval-unavailable",
                "blocked",
                "other",
                1,
            ]
        ),
        "deniedReason": st.sampled_from(["tool-loop", "x"]),
        "tail": _scalar,
        "aggregated": _scalar,
        "exitCode": _scalar,
        "timedOut": _scalar,
        "reason": _scalar,
        "host": _scalar,
        "command": _scalar,
        "warningText": _scalar,
        "exitSignal": _scalar,
        "totalLines": _scalar,
        "messageId": _scalar,
        "ts": _scalar,
        "id": _scalar,
        "text": _scalar,
        "direction": _scalar,
        "conversation": st.just({}),
        "nested": st.lists(
            st.fixed_dictionaries(
                {"id": _text, "text": _text, "senderId": _text, "sentAt": _scalar}
            )
        ),
    },
)
_result = st.one_of(
    _scalar,
    st.lists(_scalar, max_size=3),
    st.fixed_dictionaries(
        {},
        optional={
            "content": st.one_of(
                _scalar,
                st.lists(
                    st.one_of(
                        _scalar,
                        st.fixed_dictionaries({}, optional={"type": _scalar, "text": _text}),
                    ),
                    max_size=4,
                ),
            ),
            "details": st.one_of(_scalar, _details),
        },
    ),
)


@settings(max_examples=1500, deadline=None)
@given(
    st.sampled_from(["exec", "process", "message", "sessions_send", "read"]),
    st.one_of(st.none(), st.sampled_from(["poll", "log", "send", "reply", "x"])),
    st.booleans(),
    _result,
)
def test_result_tokens(
    native: ModuleType, tool: str, action: str | None, in_args: bool, result: Any
) -> None:
    event: dict[str, Any] = {
        "type": "tool_result",
        "event_id": "e",
        "session_key": "s",
        "call_id": "c",
        "tool_name": tool,
        "ts": 5,
        "result": result,
    }
    if action is not None:
        if in_args:
            event["args"] = {"action": action}
        else:
            event["args_hash"], event["args_action"] = "h", action
    decided_natively(native, orjson.dumps(event))


# -- hypothesis's bytes: valid-looking events written the ways JSON can be written ------


def _escape(char: str, how: int) -> str:
    """One character of a JSON string: escaped where JSON must, else as drawn (0: as it
    is, 1: as \\uXXXX, a surrogate pair beyond the BMP)."""
    if char in '"\\' or char < " " or how == 1:
        return json.dumps(char)[1:-1]
    return char


@st.composite
def _wire(draw: st.DrawFn, value: Any, depth: int = 0) -> str:
    """JSON text of ``value``, with whitespace, escapes, number forms and the odd
    duplicate key drawn."""
    space = draw(st.sampled_from(["", "", " ", "\n\t"]))
    if isinstance(value, dict):
        items = [
            f"{draw(_wire(key, depth + 1))}:{space}{draw(_wire(child, depth + 1))}"
            for key, child in value.items()
        ]
        if items and draw(st.integers(0, 30)) == 0:
            items.append(items[0])  # a duplicate key
        return "{" + space + ("," + space).join(items) + space + "}"
    if isinstance(value, list):
        return "[" + ",".join([draw(_wire(child, depth + 1)) for child in value]) + "]"
    if isinstance(value, str):
        how = draw(st.integers(0, 3))
        return '"' + "".join(_escape(char, how) for char in value) + '"'
    if isinstance(value, float) and draw(st.booleans()):
        return draw(st.sampled_from([repr(value), f"{value:e}", f"{value:E}", f"{value:.17g}"]))
    return json.dumps(value)


_odd_values = st.one_of(
    st.sampled_from(
        [
            MAX_WIRE_INT,
            MAX_WIRE_INT + 1,
            2**63,
            2**64,
            -(2**63) - 1,
            10**30,
            -0.0,
            1e16,
            1e21,
            1e-7,
            5e-324,
            1.7976931348623157e308,
            0.1,
            100.0,
        ]
    ),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(st.characters(codec="utf-8"), max_size=6),
    st.lists(st.integers(-3, 3), max_size=3),
    st.recursive(
        st.integers(0, 2) | st.text(max_size=2),
        lambda inner: (
            st.lists(inner, max_size=2) | st.dictionaries(st.text(max_size=2), inner, max_size=2)
        ),
        max_leaves=6,
    ),
)


@settings(max_examples=3000, deadline=None)
@given(
    _base,
    _fields,
    st.dictionaries(st.sampled_from(["args", "result", "seq", "ts"]), _odd_values, max_size=2),
    st.data(),
)
def test_hypothesis_events(
    native: ModuleType,
    base: dict[str, Any],
    fields: dict[str, Any],
    odd: dict[str, Any],
    data: st.DataObject,
) -> None:
    event = {**base, **fields, **odd}
    text = data.draw(_wire(event))
    raw = text.encode("utf-8", "surrogatepass")
    mangle = data.draw(st.integers(0, 12))
    if mangle == 0:  # a byte that is not UTF-8, somewhere
        at = data.draw(st.integers(0, len(raw)))
        raw = raw[:at] + data.draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80"])) + raw[at:]
    elif mangle == 1:  # a NaN-like or cut token
        raw = raw.replace(
            b'"ts":5',
            data.draw(
                st.sampled_from(
                    [b'"ts":NaN', b'"ts":Infinity', b'"ts":-5', b'"ts":5.', b'"ts":.5', b'"ts":+5']
                )
            ),
        )
    elif mangle == 2:  # a lone surrogate escape
        raw = raw.replace(b'"e"', data.draw(st.sampled_from([b'"\\ud800"', b'"a\\udfffb"'])))
    for max_depth in (3, 64):
        decided_natively(native, raw, max_depth=max_depth)
        decided_natively(native, raw, max_depth=max_depth, max_identifier_bytes=2)
