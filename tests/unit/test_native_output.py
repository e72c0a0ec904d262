"""The native judge's output writer (native/src/output.rs) against ``to_json``: every byte.

The next stage of issue 27 judges in Rust and publishes what it writes, so a verdict or
a loop event written natively must be the bytes the Python engine publishes (orjson
over the model's fields). Checked on every verdict and loop event the Python engine
produces over the engine corpus (examples, fixtures, the benchmark workload in order and
disordered, generated sessions with hostile strings under seven configs), and on
hostile strings and every control character in every string field. Skips only where the
module is not built.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import msgspec
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loopfuse.schemas import LoopEvent, Verdict
from tests.fixtures.hostile_strings import HOSTILE
from tests.support.engine_corpus import corpus_steps

_STRING_FIELDS = (
    "session_key",
    "run_id",
    "agent_id",
    "call_id",
    "incarnation",
    "tool_name",
    "message",
    "args_hash",
    "paired_tool_name",
)
_TEXTS = [text for name, text in HOSTILE.items() if name != "lone_surrogate"] + [
    "".join(map(chr, range(0x20))) + '"\\/\x7f\u2028\u00e9\U0001f600',
    "",
]


def _outputs() -> list[Verdict | LoopEvent]:
    return [
        output
        for _, outputs in corpus_steps()
        for output in outputs
        if isinstance(output, Verdict | LoopEvent)
    ]


@pytest.fixture(scope="module")
def outputs() -> list[Verdict | LoopEvent]:
    return _outputs()


def _left_to_python(output: Verdict | LoopEvent) -> bool:
    return isinstance(output, LoopEvent) and (output.args is not None or output.fleet is not None)


def test_every_output_of_the_corpus(native: ModuleType, outputs: list[Any]) -> None:
    verdicts = loop_events = 0
    for output in outputs:
        written = native.output_json(output.__dict__)
        if _left_to_python(output):
            assert written is None
            continue
        assert written == output.to_json()
        verdicts += isinstance(output, Verdict)
        loop_events += isinstance(output, LoopEvent)
    # the corpus has both, with every detector and a config of each kind
    assert verdicts > 10_000 and loop_events > 1_000, (verdicts, loop_events)
    detectors = {output.detector for output in outputs}
    assert {
        "generic_repeat",
        "ping_pong",
        "known_poll_no_progress",
        "unknown_tool_repeat",
        "global_circuit_breaker",
        "compaction_loop_persisted",
        "sequence_gap",
        "cycle",
        "run_call_cap",
        "tool_loop_run_ended",
    } <= detectors


def test_hostile_strings_in_every_field(native: ModuleType, outputs: list[Any]) -> None:
    samples = [
        next(o for o in outputs if isinstance(o, Verdict)),
        next(o for o in outputs if isinstance(o, LoopEvent) and not _left_to_python(o)),
    ]
    checked = 0
    for sample in samples:
        for field in (*_STRING_FIELDS, "warning_key" if isinstance(sample, LoopEvent) else "level"):
            for text in _TEXTS:
                changed = sample.model_copy(update={field: text})
                assert native.output_json(changed.__dict__) == changed.to_json(), (field, text)
                checked += 1
    assert checked > 400


def test_what_it_leaves_to_python(native: ModuleType, outputs: list[Any]) -> None:
    """From a model's fields (this test's writer), raw args and the fleet breaker's
    record are orjson's: it says None for them, as for a config value of another type.
    (The fold writes args from the wire's value: test_payloads_as_orjson_writes_them.)"""
    event = next(o for o in outputs if isinstance(o, LoopEvent) and not _left_to_python(o))
    for update in (
        {"args": {"f": 1e-7}},
        {"args": [1]},
        {"config": {**event.config, "ratio": 0.5}},
    ):
        assert native.output_json(event.model_copy(update=update).__dict__) is None
    shadowed = [o for o in outputs if _left_to_python(o)]
    assert shadowed, "the corpus's payload config puts args in some loop events"


#: JSON values as a gateway sends them in args: every float, 64-bit integers, any text
#: (no lone surrogates: orjson refuses them, and the native reader leaves them to Python).
_ARGS = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5)
    ),
    max_leaves=25,
)


def _has_float(value: Any) -> bool:
    if isinstance(value, float):
        return True
    if isinstance(value, list):
        return any(map(_has_float, value))
    if isinstance(value, dict):
        return any(map(_has_float, value.values()))
    return False


@settings(max_examples=1500, deadline=None)
@given(_ARGS)
def test_payloads_as_orjson_writes_them(native: ModuleType, value: Any) -> None:
    """A loop event's args, written natively from the wire's value, are the bytes
    ``LoopEvent.to_json`` writes for the value the Python decoder reads; args with a
    float are left to orjson (its shortest digits are not always Rust's)."""
    wire = b'{"v":' + orjson.dumps(value) + b"}"
    got = native.payload_json(wire)
    assert (got is None) == _has_float(value)
    if got is not None:
        assert got == orjson.dumps(orjson.loads(wire)["v"])


@pytest.mark.parametrize(
    "text",
    [
        b"-0",
        b'"\\u00e9\\ud83d\\ude00\\u2028\\/"',
        b'{"b":1,"a":[{}]}',
        b"[1,-2,null,true]",
    ],
)
def test_payload_texts_as_the_decoder_reads_them(native: ModuleType, text: bytes) -> None:
    """Other spellings of a number or a string (the gateway's, not orjson's) come out
    as orjson writes what the decoder reads from them."""
    wire = b'{"v":' + text + b"}"
    assert native.payload_json(wire) == orjson.dumps(msgspec.json.decode(wire)["v"])


@pytest.mark.parametrize("text", [b"562949953421312.2", b"1e-7", b'{"a":[1.5]}'])
def test_payloads_with_a_float_are_left_to_orjson(native: ModuleType, text: bytes) -> None:
    assert native.payload_json(b'{"v":' + text + b"}") is None
