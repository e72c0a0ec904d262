"""Session state bytes: every format version reads, damaged bytes fail only with ValueError."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, get_args

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loopfuse.schemas import parse_config, validate_event
from loopfuse.schemas.events import Action, Detector
from loopfuse.streams.engine import Engine, SessionState
from loopfuse.streams.engine import state_codec as codec
from loopfuse.streams.engine.native import NATIVE
from loopfuse.streams.engine.rule_state import RuleState
from tests.unit.conftest import call, compaction, comparable, engine_with, loop_config, result
from tests.unit.test_ordering import SMALL_V3
from tests.unit.test_properties import build, ops_strategy


def _states() -> list[bytes]:
    """States with something in every section: history, guards, warnings, decisions,
    parked and pending events, retired incarnations, skipped gaps, unknown tools."""
    engine = Engine(
        parse_config(loop_config(warningThreshold=2, criticalThreshold=3)), gap_timeout_ms=10
    )
    state: SessionState | None = None
    events: list[Any] = []
    for seq in range(0, 8, 2):
        events += [
            call("exec", {"command": "ls"}, call_id=f"c{seq}", seq=seq, ts=seq),
            result(
                "exec",
                {"command": "ls"},
                call_id=f"c{seq}",
                seq=seq + 1,
                ts=seq,
                error="Unknown tool: ghost",
            ),
        ]
    events += [
        compaction(seq=8, ts=9),  # arms a guard
        call("read", {"p": 1}, call_id="late", seq=12, ts=20),
    ]  # parked: a gap
    states = []
    for event in events:
        state, _ = engine.step(state, event, event.ts)
        states.append(codec.encode(state))
    # A restarted gateway's first call waits while the input is not read up to it.
    restart = validate_event(
        {
            "type": "tool_call",
            "event_id": "restart",
            "session_key": "s1",
            "run_id": "r1",
            "incarnation": "g2",
            "seq": 0,
            "ts": 30,
            "call_id": "x",
            "tool_name": "read",
            "args": {"p": 2},
        }
    )
    state, _ = engine.step(state, restart, 30, watermark_ms=0)
    states.append(codec.encode(state))
    # The opt-in rules' trailer (issue 14) after everything else.
    state.rules = RuleState()
    state.rules.tally(7).calls = 3
    state.rules.note_failure((7, 11), 13)
    state.rules.session_cost = 0.25
    states.append(codec.encode(state))
    return states


STATES = _states()


@contextmanager
def pure_codec() -> Iterator[None]:
    """The pure codec, where the native one is built too (format 5 read and written in
    Python, as on a machine without Rust)."""
    native, codec._NATIVE_CODEC = codec._NATIVE_CODEC, None
    try:
        yield
    finally:
        codec._NATIVE_CODEC = native


#: The sample in format 5, as both codecs write it (tests/unit/test_native_state_codec.py).
with pure_codec():
    V5 = [codec.encode(codec.decode(data), 5) for data in STATES]


def test_every_section_round_trips() -> None:
    for data in STATES:
        assert codec.encode(codec.decode(data)) == data
    last = codec.decode(STATES[-1])  # the sample reaches every section
    assert last.history and last.guards and last.decisions and last.parked and last.pending
    assert any(record.unknown for record in last.history) and last.rules is not None


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def test_states_written_in_format_3_read_as_today() -> None:
    """The sample above as format 3 wrote it (3eeaf21, before format 4): a changelog
    written then reads to the same states, and is written again in format 4: as
    today's writer writes it, but for the JSON of events waiting at rest, kept as
    read (the pydantic models wrote it then; msgspec writes the same fields now, in
    another order and without the nulls). Then in the written format (5 where the
    native codec is, else 4)."""
    written = [bytes.fromhex(line) for line in (FIXTURES / "state_v3.hex").read_text().split()]
    assert len(written) == len(STATES) and {data[0] for data in written} == {3}
    for old, new in zip(written, STATES, strict=True):
        state = codec.decode(old)
        assert state == codec.decode(new)
        again = codec.encode(state)
        assert again[0] == codec.WRITTEN_VERSION and codec.decode(again) == state
        if not state.parked and not state.pending:
            assert again == new


def test_states_written_in_format_4_read_as_today() -> None:
    """The sample as format 4 wrote it (before format 5): the same states, and format 4
    is still written byte for byte alike when asked for."""
    written = [bytes.fromhex(line) for line in (FIXTURES / "state_v4.hex").read_text().split()]
    assert len(written) == len(STATES) and {data[0] for data in written} == {4}
    for old, new in zip(written, STATES, strict=True):
        state = codec.decode(old)
        assert state == codec.decode(new)
        assert codec.encode(state, 4) == old


def test_the_native_codec_writes_format_5_and_the_pure_one_format_4() -> None:
    """Format 5's pure writer costs many times msgspec's of format 4 (the module's
    docstring has the figures): without the native codec, format 4 is written."""
    assert (4 if NATIVE is None else 5) == codec.WRITTEN_VERSION
    assert codec.encode(codec.decode(STATES[-1]))[0] == codec.WRITTEN_VERSION


def test_format_5_round_trips_in_pure_python() -> None:
    """Every section, written and read in Python: the same state, the same bytes
    again, and a fraction of format 4's bytes."""
    with pure_codec():
        for data, compact in zip(STATES, V5, strict=True):
            state = codec.decode(data)
            assert compact[0] == 5 and compact[1:17] == codec.encode(state, 4)[1:17]
            assert codec.decode(compact) == state
            assert codec.encode(codec.decode(compact), 5) == compact
            assert codec.idle_stamps(compact) == codec.idle_stamps(data)
        assert len(V5[-1]) < 0.85 * len(codec.encode(codec.decode(STATES[-1]), 4))


def test_a_value_format_5_has_no_room_for_is_written_in_format_4() -> None:
    """None the engine makes; a record's call hash below zero stands for them all."""
    state = codec.decode(STATES[-1])
    state.history[0] = msgspec.structs.replace(state.history[0], call=-5)
    state.forget_derived()
    with pure_codec():
        data = codec.encode(state, 5)
    assert data[0] == 4 and codec.decode(data) == state
    assert codec.encode(state, 5) == data  # the native codec too, where it is built


@pytest.mark.parametrize("version", [4, 5])
def test_fit_sheds_the_oldest_records_in_either_format(version: int) -> None:
    state = codec.decode(STATES[-1])
    whole = len(codec.encode(state, version))
    with pure_codec():
        data = codec.fit(codec.decode(STATES[-1]), whole - 1, version)
    assert data[0] == version and len(data) <= whole - 1
    shed = codec.decode(data)
    assert shed.history == state.history[len(state.history) - len(shed.history) :]
    assert codec.fit(codec.decode(STATES[-1]), whole - 1, version) == data


def test_fit_sheds_at_the_same_size_whichever_format_it_writes() -> None:
    """The cap holds version 4's bytes in both formats, so a pure engine (writing 4) and
    a native one (writing 5) shed the same records at the same events: their verdicts
    stay the same however large a history is configured."""
    whole = len(codec.encode(codec.decode(STATES[-1]), 4))
    for cap in (whole - 1, whole - 60):
        kept = []
        for version in (4, 5):
            shed = codec.decode(STATES[-1])
            data = codec.fit(shed, cap, version)
            assert data[0] == version and len(data) <= cap
            kept.append(shed)
        assert kept[0] == kept[1] and len(kept[0].history) < len(codec.decode(STATES[-1]).history)


def test_every_cut_of_a_format_5_state_is_refused() -> None:
    """Format 5 has no optional part: every prefix of a state is corrupt."""
    with pure_codec():
        for data in V5:
            for cut in range(len(data)):
                with pytest.raises(ValueError):
                    codec.decode(data[:cut])


def test_a_record_of_another_type_is_refused_as_read() -> None:
    """Format 4 is typed: bytes whose history holds a run that is not a key fail
    at decode, with ValueError, not later in the engine."""
    state = codec.decode(STATES[-1])
    state.history[0] = msgspec.structs.replace(state.history[0], run="r1")
    with pytest.raises(ValueError):
        codec.decode(codec.encode(state))


def _written_before() -> list[bytes]:
    """States as formats 1 to 3 wrote them: the sample above in format 3, and a small
    session in formats 3, 2 and 1 (tests/unit/test_ordering.py)."""
    v3 = [bytes.fromhex(line) for line in (FIXTURES / "state_v3.hex").read_text().split()]
    v2 = bytes((2,)) + SMALL_V3[1:-10]
    v1 = bytes((1,)) + v2[1:9] + v2[17:]
    return [*v3, SMALL_V3, v2, v1]


#: Bytes of every format version, with something in every section.
SAMPLES = [
    *STATES,
    *V5,
    *[bytes.fromhex(line) for line in (FIXTURES / "state_v4.hex").read_text().split()],
    *_written_before(),
]


def _decodes_or_raises_value_error(data: bytes) -> None:
    """Corrupt bytes raise ValueError and nothing else; bytes that do decode give a
    state that can be written again (nothing half-typed got in)."""
    try:
        state = codec.decode(data)
    except ValueError:
        pass
    else:
        assert isinstance(codec.encode(state), bytes)
    try:
        stamps = codec.idle_stamps(data)
    except ValueError:
        pass
    else:
        assert all(isinstance(stamp, int) for stamp in stamps)


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(SAMPLES), st.data())
def test_truncated_state_raises_value_error(data: bytes, draw: Any) -> None:
    cut = draw.draw(st.integers(0, len(data) - 1), label="cut")
    try:
        shorter = codec.decode(data[:cut])
    except ValueError:
        pass
    else:
        # Format 3's opt-in rules trailer is optional (added within the version, so a
        # state written before it still reads): cut exactly where it starts, a format-3
        # state is a valid one without the rules' tallies, and only there.
        whole = codec.decode(data)
        assert data[0] == 3 and whole.rules is not None and shorter.rules is None
        assert (shorter.history, shorter.pending, shorter.incarnation) == (
            whole.history,
            whole.pending,
            whole.incarnation,
        )
    _decodes_or_raises_value_error(data[:cut])


@settings(max_examples=1500, deadline=None)
@given(st.sampled_from(SAMPLES), st.data())
def test_corrupt_state_decodes_or_raises_value_error(data: bytes, draw: Any) -> None:
    """Bytes overwritten, inserted, deleted or copied from elsewhere, anywhere (the
    version byte too), in every format version."""
    damaged = bytearray(data)
    for _ in range(draw.draw(st.integers(1, 4), label="damages")):
        at = draw.draw(st.integers(0, len(damaged)), label="at")
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
    _decodes_or_raises_value_error(bytes(damaged))


@settings(max_examples=1000, deadline=None)
@given(st.sampled_from(V5), st.data())
def test_corrupt_format_5_decodes_or_raises_value_error_in_python(data: bytes, draw: Any) -> None:
    """The pure reader of format 5 (the test above runs the native one where it is built)."""
    damaged = bytearray(data)
    for _ in range(draw.draw(st.integers(1, 3), label="damages")):
        at = draw.draw(st.integers(0, len(damaged) - 1), label="at")
        if draw.draw(st.booleans(), label="overwrite"):
            damaged[at] = draw.draw(st.integers(0, 255), label="byte")
        else:
            del damaged[at : at + draw.draw(st.integers(1, 9), label="length")]
    with pure_codec():
        _decodes_or_raises_value_error(bytes(damaged))


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([1, 2, 3, 4, 5]), st.binary(max_size=200))
def test_arbitrary_bytes_decode_or_raise_value_error(version: int, tail: bytes) -> None:
    _decodes_or_raises_value_error(bytes((version,)) + tail)


@settings(max_examples=200, deadline=None)
@given(ops_strategy, st.booleans())
def test_engine_states_round_trip_through_the_codec(ops: Any, with_seq: bool) -> None:
    """Also the history's bytes a state keeps as it goes (appends, results, trims past a
    short history) are those of its records written afresh."""
    for engine in (engine_with(), engine_with(historySize=3)):
        state = SessionState()
        for event in build(ops, with_seq=with_seq):
            state, _ = engine.step(state, event, event.ts)
            data = codec.encode(state)
            assert codec.encode(codec.decode(data)) == data
            # as the records write afresh (a copy that has kept none of their bytes)
            assert codec.encode(dataclasses.replace(state, _record_bytes=None)) == data


@settings(max_examples=100, deadline=None)
@given(ops_strategy, st.booleans(), st.sampled_from(["written", "pure 5", "pure 4"]), st.data())
def test_a_session_read_back_steps_on_as_one_never_written(
    ops: Any, with_seq: bool, codec_kind: str, draw: Any
) -> None:
    """The worker's round trip: a session written after each event and read back gives
    the outputs of one kept in memory throughout, events out of order (parked) too."""
    events = draw.draw(st.permutations(build(ops, with_seq=with_seq)), label="order")
    version = 4 if codec_kind == "pure 4" else 5 if codec_kind == "pure 5" else None
    engine = engine_with(warningThreshold=2, criticalThreshold=3, historySize=5)
    kept: SessionState | None = None
    restored: SessionState | None = None
    for event in events:
        kept, expected = engine.step(kept, event, event.ts)
        restored, outputs = engine.step(restored, event, event.ts)
        assert list(map(comparable, outputs)) == list(map(comparable, expected))
        if version is None:
            restored = codec.decode(codec.encode(restored))
        else:
            with pure_codec():
                data = codec.encode(restored, version)
                assert data[0] == version
                restored = codec.decode(data)
        assert restored == kept


def test_the_bytes_follow_the_history_order() -> None:
    """Equal states give equal bytes in every process: records in history order,
    nothing in hash order (format 3's string table was in order of first use)."""
    engine = Engine()
    state: SessionState | None = None
    for tool in ("zeta", "alpha", "mid"):
        state, _ = engine.step(state, call(tool, {}), 1)
    assert state is not None
    data = codec.encode(state)
    assert data.index(b"zeta") < data.index(b"alpha") < data.index(b"mid")


def test_the_persisted_enums_name_every_action_and_detector() -> None:
    assert set(codec.ACTIONS) == set(get_args(Action))
    assert set(codec.DETECTORS) == {None, *get_args(Detector)}


def test_unknown_format_version_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown session state format"):
        codec.decode(bytes((9,)) + STATES[0][1:])
    with pytest.raises(ValueError):
        codec.decode(b"")


@pytest.mark.parametrize(("field", "code"), [(1, -1), (1, 4), (2, -1), (2, 99)])
def test_a_decision_of_no_known_action_or_detector_is_corrupt(field: int, code: int) -> None:
    """A decision keeps its action and detector as indexes into the persisted enums: one
    out of range - a negative one too, which Python would read from the end - is
    corrupt, not another verdict."""
    data = codec.encode(codec.decode(STATES[-1]), 4)
    body = msgspec.msgpack.decode(data[17:])  # untyped: the array as written
    assert body[7], "the sample has decisions"
    body[7][0][field] = code
    with pytest.raises(ValueError, match="corrupt"):
        codec.decode(data[:17] + msgspec.msgpack.encode(body))
