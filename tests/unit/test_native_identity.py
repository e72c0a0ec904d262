"""The native judge (native/, Rust) against the Python engine it stands in for: every byte.

Stage 1 of issue 27 makes canonical JSON and the 128-bit digests native (floats written
as ECMAScript writes them since stage 2; its decoder: tests/unit/test_native_decode.py). Each native
function answers the common case and returns None for what it leaves to Python; where it
answers, it must give the Python reference's bytes. The tests drive the built module
directly (whatever LOOPFUSE_PURE_ENGINE says), over the engine corpus (run whole, native
and pure, in subprocesses), the hostile strings, the malformed inputs and hypothesis's
JSON values; they skip, saying why, only where the module is not built.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from xxhash import xxh3_128_hexdigest

from loopfuse.streams.engine import native as choice
from loopfuse.streams.engine.canonical import pure_canonical_json
from tests.fixtures.hostile_strings import HOSTILE

ROOT = Path(__file__).resolve().parents[2]


def same_bytes(native: ModuleType, value: Any) -> bool:
    """Whether the native judge gave the reference's bytes; False where it passed."""
    got = native.canonical_json(value)
    digest = native.canonical_digest(value)
    assert (got is None) == (digest is None)
    if got is None:
        return False
    expected = pure_canonical_json(value)
    assert got == expected, (value, got, expected)
    assert digest == xxh3_128_hexdigest(expected)
    return True


def _plain(value: Any) -> bool:
    """What the native judge must answer itself: JSON without big ints, lone surrogates or
    non-finite floats (which the reference refuses)."""
    if isinstance(value, bool) or value is None:
        return True
    if isinstance(value, int):
        return abs(value) <= 2**53 - 1
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, str):
        return not any("\ud800" <= char <= "\udfff" for char in value)
    if isinstance(value, list):
        return all(map(_plain, value))
    if isinstance(value, dict):
        return all(_plain(key) and _plain(child) for key, child in value.items())
    return False


def payloads(lines: list[bytes]) -> list[Any]:
    found: list[Any] = []
    for raw in lines:
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError:
            continue
        found.append(data)
        if isinstance(data, dict):
            found.extend(data[name] for name in ("args", "result", "error") if name in data)
    return found


def test_hostile_strings_as_keys_values_and_payloads(native: ModuleType) -> None:
    for payload in HOSTILE.values():
        for value in (
            payload,
            {payload: payload},
            [payload, {"k": payload}],
            {"a": payload, payload: 1, "\ue000" + payload: None},
        ):
            assert same_bytes(native, value) == _plain(value)


def test_malformed_and_example_inputs(native: ModuleType) -> None:
    lines = (ROOT / "tests" / "fixtures" / "malformed.jsonl").read_bytes().splitlines()
    for path in sorted((ROOT / "examples").rglob("*.jsonl")):
        lines += path.read_bytes().splitlines()
    values = payloads(lines)
    assert len(values) > 50
    answered = sum(same_bytes(native, value) for value in values)
    assert answered == sum(map(_plain, values))


@settings(max_examples=2000, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False))
def test_hypothesis_floats(native: ModuleType, number: float) -> None:
    assert same_bytes(native, number)


def test_what_it_leaves_to_python(native: ModuleType) -> None:
    class Text(str):
        pass

    for value in (
        2**53,
        -(2**53),
        2**64,
        "\ud800",
        {"\udfff": 1},
        (1, 2),
        Text("x"),
        {1: "x"},
        [math.nan],
        {"a": {"b": [math.inf]}},
        [2**53, 0.5],
    ):
        assert native.canonical_json(value) is None
    deep: Any = "leaf"
    for _ in range(300):
        deep = [deep]
    assert native.canonical_json(deep) is None


@pytest.mark.parametrize(
    "number",
    [
        0.0,
        -0.0,
        1.0,
        -1.5,
        1e16,
        1e21,
        1e-7,
        1e-6,
        123456789012345680000.0,
        1.5e300,
        5e-324,
        1.7976931348623157e308,
        0.1,
        0.30000000000000004,
        2.0**53,
        -(2.0**60),
        1e20,
        4.35,
    ],
)
def test_floats_as_ecmascript_writes_them(native: ModuleType, number: float) -> None:
    assert same_bytes(native, number)
    assert same_bytes(native, {"n": [number, 1, "x"]})


def test_key_order_is_utf16_code_units(native: ModuleType) -> None:
    # U+E000 sorts before U+1F600 by code point, after it by UTF-16 code unit.
    value = {"\ue000": 1, "\U0001f600": 2, "a": 3, "A": 4, "": 5, "\x7f": 6, "\u00e9": 7}
    assert same_bytes(native, value)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**60), 2**60)
    | st.floats(allow_nan=False)
    | st.text(st.characters(codec=None)),
    lambda children: (
        st.lists(children, max_size=6)
        | st.dictionaries(st.text(st.characters(codec=None), max_size=6), children, max_size=6)
    ),
    max_leaves=30,
)


@settings(max_examples=400, deadline=None)
@given(json_values)
def test_hypothesis_json_values(native: ModuleType, value: Any) -> None:
    assert same_bytes(native, value) == _plain(value)


@pytest.mark.timeout(600)
def test_the_engine_corpus_gives_the_same_outputs_and_states(
    native: ModuleType, tmp_path: Path
) -> None:
    def corpus(pure: bool) -> list[bytes]:
        env = {**os.environ}
        env.pop(choice.PURE_ENV, None)
        if pure:
            env[choice.PURE_ENV] = "1"
        out = tmp_path / ("pure.txt" if pure else "native.txt")
        script = (
            "import sys; from loopfuse.streams.engine.native import NATIVE; "
            f"assert (NATIVE is None) == {pure}, NATIVE; "
            "from tests.support.engine_corpus import main; main()"
        )
        subprocess.run(
            [sys.executable, "-W", "error::RuntimeWarning", "-c", script, str(out)],
            env=env,
            cwd=ROOT,
            check=True,
            timeout=300,
        )
        return out.read_bytes().splitlines()

    pure, built = corpus(pure=True), corpus(pure=False)
    assert len(pure) > 1000
    assert built == pure
