"""Spec section 2: RFC 8785 canonical JSON and the call signature built on it."""

from __future__ import annotations

from typing import Any

import pytest
import rfc8785
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from loopfuse.streams.engine.canonical import canonical_json
from loopfuse.streams.engine.fingerprint import args_hash
from tests.unit.conftest import actions, call, engine_with, verdicts

SAFE = 2**53 - 1


def as_javascript(value: Any) -> Any:
    """What JSON.parse would hold: integers beyond 2**53-1 become the nearest double."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return float(value) if abs(value) > SAFE else value
    if isinstance(value, list):
        return [as_javascript(v) for v in value]
    if isinstance(value, dict):
        return {k: as_javascript(v) for k, v in value.items()}
    return value


CORPUS: list[Any] = [
    None,
    True,
    False,
    0,
    -1,
    1,
    SAFE,
    -SAFE,
    "",
    "plain",
    1e21,
    1e-7,
    0.1,
    -0.0,
    0.0,
    5e-324,
    1.0,
    -2.0,
    1e20,
    123456789012.5,
    1e300,
    1.7976931348623157e308,
    2.5e-5,
    0.000001,
    1e-6,
    123e-20,
    4.35,
    0.30000000000000004,
    9007199254740993.0,
    "é",
    "日本語",
    "😀",
    "\u2028\u2029",
    "\x00\x01\x1f\x7f\x80",
    '"\\/\b\f\n\r\t',
    {"b": 1, "a": 2, "c": {"z": [], "y": {}}},
    {"\ue000": 1, "😀": 2, "a": 3, "\uffff": 4, "\u00e9": 5, "\U0001f600x": 6, "": 7},
    {"\U0010ffff": 1, "\ufb33": 2, "\ud7ff": 3},
    [1, "two", [3.0, [4.5, {"five": None}]], {"six": [True, False]}],
    {"numbers": [1e21, 1e-7, -0.0, 100.0, 3.14159], "nested": {"deep": {"deeper": ["x"]}}},
    {"\u0080": 1, "\u007f": 2, "\u00ff": 3, "\u0100": 4},
]


@pytest.mark.parametrize("value", CORPUS, ids=repr)
def test_matches_rfc8785(value: Any) -> None:
    assert canonical_json(value) == rfc8785.dumps(value)


def test_keys_sort_by_utf16_code_units_not_code_points() -> None:
    # U+1F600 is the surrogate pair D83D DE00, which sorts before U+E000 in UTF-16.
    assert canonical_json({"\ue000": 1, "😀": 2}) == '{"😀":2,"\ue000":1}'.encode()


@pytest.mark.parametrize("n", [2**53, 2**53 + 1, -(2**53) - 1, 2**63, 2**64 + 1, 10**30, -(10**25)])
def test_big_integers_are_numbers_as_javascript_sees_them(n: int) -> None:
    assert canonical_json(n) == rfc8785.dumps(float(n))
    assert canonical_json({"n": [n]}) == rfc8785.dumps({"n": [float(n)]})


def test_canonical_json_is_bytes_without_whitespace() -> None:
    out = canonical_json({"a": [1, 2], "b": {"c": "d e"}})
    assert out == b'{"a":[1,2],"b":{"c":"d e"}}'


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5)
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_property_matches_rfc8785(value: Any) -> None:
    assert canonical_json(value) == rfc8785.dumps(as_javascript(value))


# --- args_hash and call signatures ---------------------------------------------------------------


def test_args_hash_is_xxh3_128_of_canonical_json() -> None:
    args = {"path": "/tmp/x", "opts": {"b": 2, "a": [1, 1e21]}}
    assert args_hash(args) == xxhash.xxh3_128_hexdigest(rfc8785.dumps(args))
    assert len(args_hash(args)) == 32


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.text(max_size=6), json_values, min_size=2, max_size=6), st.randoms())
def test_same_args_in_any_key_order_same_args_hash(args: dict[str, Any], rnd: Any) -> None:
    items = list(args.items())
    rnd.shuffle(items)
    assert args_hash(dict(items)) == args_hash(args)


def test_different_args_different_hash() -> None:
    assert args_hash({"a": 1}) != args_hash({"a": 2})
    assert args_hash({"a": 1}) != args_hash({"a": "1"})
    assert args_hash([1, 2]) != args_hash([2, 1])


def test_same_args_in_any_key_order_count_as_repeats() -> None:
    engine = engine_with(warningThreshold=2, criticalThreshold=3)
    events = [
        call("read", {"path": "/x", "limit": 5, "o": {"a": 1, "b": 2}}),
        call("read", {"o": {"b": 2, "a": 1}, "limit": 5, "path": "/x"}),
        call("read", {"limit": 5.0, "o": {"a": 1, "b": 2}, "path": "/x"}),
    ]
    outputs = engine.replay(events)
    assert actions(outputs) == ["allow", "allow", "warn"]
    assert len({v.args_hash for v in verdicts(outputs)}) == 1


def test_args_are_not_filtered_before_hashing() -> None:
    engine = engine_with(warningThreshold=2, criticalThreshold=3)
    events = [call("read", {"path": "/x", "requestId": i}) for i in range(3)]
    assert actions(engine.replay(events)) == ["allow"] * 3


def test_different_tool_same_args_is_a_different_signature() -> None:
    engine = engine_with(warningThreshold=2, criticalThreshold=3, detectors={"pingPong": False})
    events = [call("read", {"p": 1}), call("stat", {"p": 1}), call("list", {"p": 1})]
    v = verdicts(engine.replay([*events, call("read", {"p": 1}), call("read", {"p": 1})]))
    assert [(x.action, x.count) for x in v] == [("allow", 0)] * 4 + [("warn", 2)]
