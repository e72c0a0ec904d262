"""The native state codec (native/src/state_codec.rs) against the pure one: the same format-5
bytes for a state, the same state from them, and corrupt bytes refused alike, with ValueError."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loopfuse.streams.engine import SessionState
from loopfuse.streams.engine import state_codec as codec
from tests.unit.conftest import engine_with
from tests.unit.test_properties import build, ops_strategy
from tests.unit.test_state_codec import STATES, V5, pure_codec


def _both(data: bytes) -> tuple[Any, Any]:
    """What each codec reads from ``data``: a state, or the ValueError's type."""
    results = []
    for pure in (False, True):
        try:
            if pure:
                with pure_codec():
                    results.append(codec.decode(data))
            else:
                results.append(codec.decode(data))
        except ValueError:
            results.append(ValueError)
    return results[0], results[1]


def test_both_codecs_write_the_same_bytes_and_read_the_same_states(native: ModuleType) -> None:
    for data, pure_bytes in zip(STATES, V5, strict=True):
        state = codec.decode(data)
        assert codec.encode(state, 5) == pure_bytes
        native_read, pure_read = _both(pure_bytes)
        assert native_read == pure_read == state


@settings(max_examples=150, deadline=None)
@given(ops_strategy, st.booleans(), st.data())
def test_engine_states_give_the_same_bytes_either_way(
    native: ModuleType, ops: Any, with_seq: bool, draw: Any
) -> None:
    events = draw.draw(st.permutations(build(ops, with_seq=with_seq)), label="order")
    engine = engine_with(historySize=4)
    state = SessionState()
    for event in events:
        state, _ = engine.step(state, event, event.ts)
        written = codec.encode(state, 5)
        with pure_codec():
            assert codec.encode(state, 5) == written
        assert _both(written) == (state, state)


def test_every_cut_is_refused_natively(native: ModuleType) -> None:
    for data in V5:
        for cut in range(len(data)):
            assert native.expand_state(data[:cut]) is None
            with pytest.raises(ValueError, match=r"corrupt|unknown"):
                codec.decode(data[:cut])


@settings(max_examples=2000, deadline=None)
@given(st.sampled_from(V5), st.data())
def test_corrupt_bytes_are_refused_or_read_alike(
    native: ModuleType, data: bytes, draw: Any
) -> None:
    """Bytes overwritten, inserted, deleted or copied from elsewhere: both codecs raise
    ValueError, or both read the same state (which can be written again)."""
    damaged = bytearray(data)
    for _ in range(draw.draw(st.integers(1, 3), label="damages")):
        at = draw.draw(st.integers(17, len(damaged)), label="at")
        kind = draw.draw(st.sampled_from(["overwrite", "insert", "delete", "splice"]))
        if kind == "overwrite" and at < len(damaged):
            damaged[at] = draw.draw(st.integers(0, 255), label="byte")
        elif kind == "insert":
            damaged[at:at] = draw.draw(st.binary(min_size=1, max_size=9), label="bytes")
        elif kind == "delete":
            del damaged[at : at + draw.draw(st.integers(1, 9), label="length")]
        else:
            start = draw.draw(st.integers(0, len(data) - 1), label="from")
            damaged[at:at] = data[start : start + draw.draw(st.integers(1, 24))]
    native_read, pure_read = _both(bytes(damaged))
    assert native_read == pure_read
    if native_read is not ValueError:
        assert codec.decode(codec.encode(native_read, 5)) == native_read


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_never_fail_the_native_codec(native: ModuleType, tail: bytes) -> None:
    """No panic (an exception of another type through PyO3): None, or bytes."""
    assert native.compact_state(0, 0, tail) is None or tail[:1] in (b"\x9d", b"\xdc")
    expanded = native.expand_state(b"\x05" + bytes(16) + tail)
    assert expanded is None or isinstance(expanded, bytes)
    assert _both(b"\x05" + bytes(16) + tail)[0] == _both(b"\x05" + bytes(16) + tail)[1]


def test_a_body_format_5_has_no_room_for_is_left_to_format_4(native: ModuleType) -> None:
    state = codec.decode(STATES[-1])
    state.history[0] = msgspec.structs.replace(state.history[0], call=-5)
    state.forget_derived()
    body = codec.encode(state, 4)[17:]
    assert native.compact_state(0, 0, body) is None
    assert native.compact_state(0, 0, body[:-1]) is None
    assert native.compact_state(0, 0, body + b"\x00") is None
