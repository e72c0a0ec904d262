"""A session state's bytes read natively (``NativeState.read``, native/src/state_bytes.rs):
the same native state as the Python reader's route (``from_python(state_codec.decode)``),
or None, leaving the bytes to that route, never a state the Python reader would refuse.

Every state the Python engine holds along the engine corpus (each session's after every
event it took, in format 4 and format 5), then those bytes cut short and with a byte
changed, and forms the native reader must leave alone (a repeated map key, which
msgspec reads as its last value; a waiting event). Skips only where the module is not
built.
"""

from __future__ import annotations

import random
from types import ModuleType
from typing import Any

import msgspec
import pytest

from loopfuse.streams.engine import SessionState, state_codec
from loopfuse.streams.engine.native_step import NativeEngine
from tests.support.engine_corpus import corpus_steps


def _corpus_states() -> list[bytes]:
    """Each session's state after each event, both formats, without repeats."""
    found: dict[bytes, None] = {}
    for state, _ in corpus_steps():
        for version in (4, 5):
            found[state_codec.encode(state, version)] = None
    return list(found)


@pytest.fixture(scope="module")
def state_bytes() -> list[bytes]:
    return _corpus_states()


def _python_route(data: bytes) -> Any:
    """The Python reader's state, or the exception it raises."""
    try:
        return NativeEngine.from_python(state_codec.decode(data))
    except Exception as exc:  # what it raises is what is compared
        return exc


def _same_as_python(native: ModuleType, data: bytes) -> bool:
    """Whether the native reader read ``data`` (else it left it to Python); asserts that
    what it read is the Python route's state, field for field and as bytes."""
    got = native.NativeState.read(data)
    if got is None:
        return False
    want = _python_route(data)
    assert not isinstance(want, Exception), (data.hex(), want)
    assert got.export() == want.export(), data.hex()
    assert got.v4_body() == want.v4_body()
    return True


def test_every_corpus_state(native: ModuleType, state_bytes: list[bytes]) -> None:
    read = sum(_same_as_python(native, data) for data in state_bytes)
    waiting = sum(
        bool(state_codec.decode(data).parked or state_codec.decode(data).pending)
        for data in state_bytes
    )
    # all but the states with an event waiting (parked on a gap, pending a restart)
    assert len(state_bytes) > 20_000
    assert read == len(state_bytes) - waiting, (read, len(state_bytes), waiting)
    rules = sum(
        bool(NativeEngine.to_python(native.NativeState.read(data)).rules)
        for data in state_bytes[::50]
        if native.NativeState.read(data) is not None
    )
    assert rules > 0, "the corpus's rule configs leave rule tallies in some states"


def test_cut_and_changed_bytes(native: ModuleType, state_bytes: list[bytes]) -> None:
    """Damaged bytes: read natively only where the Python reader reads the same state;
    where it refuses them (ValueError), so does the native reader."""
    rng = random.Random(27)
    refused = 0
    for data in rng.sample(state_bytes, 400):
        damaged = [data[: rng.randrange(len(data))], data + b"\x00"]
        for _ in range(6):
            at = rng.randrange(len(data))
            damaged.append(data[:at] + bytes([rng.randrange(256)]) + data[at + 1 :])
        for bad in damaged:
            if not _same_as_python(native, bad):
                refused += isinstance(_python_route(bad), Exception)
    assert refused > 1_000  # most damage is refused, by both


def test_forms_left_to_python(native: ModuleType) -> None:
    empty = state_codec.encode(SessionState(), 4)
    head, body = empty[:17], list(msgspec.msgpack.decode(empty[17:]))

    def packed(*fields: bytes) -> bytes:  # version 4's body: an array of 13
        assert len(fields) == 13
        return head + b"\x9d" + b"".join(fields)

    fields = [msgspec.msgpack.encode(value) for value in body]
    assert native.NativeState.read(packed(*fields)) is not None
    # a guard's run key twice (msgspec keeps the last)
    guards = b"\x82\x01\x94\x03\x03\xc0\xc2\x01\x94\x02\x02\xc0\xc3"
    repeated = packed(*fields[:4], guards, *fields[5:])
    assert state_codec.decode(repeated).guards[1].window == 2
    assert native.NativeState.read(repeated) is None
    # an event waiting: the Python decoder checks its JSON
    event = b'{"type":"run_ended","event_id":"e","session_key":"s","ts":1}'
    parked = packed(*fields[:8], msgspec.msgpack.encode({3: event}), *fields[9:])
    assert state_codec.decode(parked).parked
    assert native.NativeState.read(parked) is None
    # a string where an int goes (the Python reader refuses it), an older format
    assert native.NativeState.read(packed(msgspec.msgpack.encode("1"), *fields[1:])) is None
    assert native.NativeState.read(b"\x03" + empty[1:]) is None
