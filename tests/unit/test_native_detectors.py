"""The native detectors (native/src/engine/, issue 27) against detectors.py: every field.

The Rust core judges a call on a run's history as ``detectors.detect`` does; these tests
drive it through its test-only PyO3 entry point ``detect_history`` on hypothesis's
histories (few tools and signatures, repeating results, unknown-tool names, several runs),
every config knob (thresholds as resolve_config clamps them and as a hand-built
ResolvedConfig may hold them, each detector on and off), on every call the engine judges
in the engine corpus, and with the hostile strings as tool and unknown-tool names. The
history views (state.py's run_history and recent_count) and the fingerprints are held to
the Python's too. A string with a lone surrogate cannot reach Rust's ``str``: the entry
points answer None for it, and the engine keeps such a call in Python.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loopfuse.streams.engine import step
from loopfuse.streams.engine.config import ResolvedConfig, resolve_config
from loopfuse.streams.engine.detectors import Detection, detect, guard_message
from loopfuse.streams.engine.fingerprint import (
    hash32,
    hash64,
    is_known_poll,
    result_fingerprint,
    signature,
)
from loopfuse.streams.engine.history import Record
from loopfuse.streams.engine.state import SessionState, run_key
from tests.fixtures.hostile_strings import HOSTILE
from tests.support import engine_corpus
from tests.support.engine_corpus import corpora
from tests.support.engine_corpus import run as run_corpus

#: What ``detect`` takes after the history: tool, sig, args_token, known_poll, config,
#: run, recent.
Call = tuple[str, int, str, bool, ResolvedConfig, str | None, int]

TOOLS = ("read", "exec", "command_status", "process")
SIGS = (7, 11, 0xDEADBEEF, 2**64 - 1, 0)  # 0: "no other side" to ping-pong, as in Python
RESULTS = (0, 0, 1, 2, 2**63 + 5)  # 0: no result yet
UNKNOWN = (None, None, "web_x", "web_y", "")
RUNS = (None, "", "r1", "agent:run-2")


def fields(found: Detection | None) -> tuple[Any, ...]:
    """A Detection as the native entry point gives it: its fields, () for none."""
    if found is None:
        return ()
    return (
        found.level,
        found.detector,
        found.count,
        found.message,
        found.warning_key,
        found.paired_tool_name,
        found.detail,
    )


def has_surrogate(*texts: str | None) -> bool:
    return any(
        text is not None
        and not text.isascii()
        and any("\ud800" <= char <= "\udfff" for char in text)
        for text in texts
    )


def same_detection(native: ModuleType, history: list[Record], call: Call) -> tuple[Any, ...]:
    """The native detection, asserted equal to the Python one field for field (None
    where a string of the inputs has a lone surrogate)."""
    got = native.detect_history(history, *call)
    tool, _, args_token, _, _, run, _ = call
    texts = [tool, args_token, run] + [t for rec in history for t in (rec.tool, rec.unknown)]
    if has_surrogate(*texts):
        assert got is None
        return ()
    expected = fields(detect(history, *call))
    assert got == expected, (history, call)
    return expected


record = st.builds(
    Record,
    tool=st.sampled_from(TOOLS),
    sig=st.sampled_from(SIGS),
    run=st.sampled_from([run_key(r) for r in RUNS[1:]] + [0]),
    call=st.sampled_from((0, 5, 2**32 - 1)),
    result=st.sampled_from(RESULTS),
    unknown=st.sampled_from(UNKNOWN),
    ts=st.integers(0, 2**53),
)

#: Thresholds as a hand-built ResolvedConfig may hold them (0, negative, beyond 64 bits).
raw_threshold = st.one_of(st.integers(1, 25), st.integers(-2, 0), st.just(10**30))
#: Values resolve_config clamps or refuses (falls back to the default for).
block_value = st.one_of(st.none(), st.integers(-1, 25), st.sampled_from((2.0, 2.5, True, "3")))

hand_built = st.builds(
    ResolvedConfig,
    enabled=st.sampled_from((True, False, None)),
    history_size=st.integers(1, 60),
    warning_threshold=raw_threshold,
    critical_threshold=raw_threshold,
    unknown_tool_threshold=raw_threshold,
    global_circuit_breaker_threshold=raw_threshold,
    generic_repeat=st.booleans(),
    known_poll_no_progress=st.booleans(),
    ping_pong=st.booleans(),
    guard_window_size=st.integers(1, 5),
)


@st.composite
def resolved(draw: st.DrawFn) -> ResolvedConfig:
    block: dict[str, Any] = {"enabled": True}
    for key in (
        "warningThreshold",
        "criticalThreshold",
        "globalCircuitBreakerThreshold",
        "unknownToolThreshold",
        "historySize",
    ):
        value = draw(block_value)
        if value is not None:
            block[key] = value
    block["detectors"] = {
        name: draw(st.booleans()) for name in ("genericRepeat", "knownPollNoProgress", "pingPong")
    }
    return resolve_config(block)


@st.composite
def judged(draw: st.DrawFn) -> tuple[list[Record], Call]:
    """A session's history, the run's view of it and the call judged on it."""
    history = draw(st.lists(record, max_size=60))
    tool = draw(st.sampled_from(TOOLS))
    sig = draw(st.sampled_from(SIGS))
    run = draw(st.sampled_from(RUNS))
    state = SessionState(history=history)
    view = state.run_history(run_key(run))
    recent = state.recent_count(sig, view)
    if draw(st.integers(0, 4)) == 0:
        recent = draw(st.integers(0, 70))  # detect takes any count: hold it to the Python
    config = draw(st.one_of(resolved(), hand_built))
    known_poll = draw(st.booleans())
    token = draw(st.sampled_from(("t", "0123456789abcdef0123456789abcdef")))
    return view, (tool, sig, token, known_poll, config, run, recent)


@settings(max_examples=2000, deadline=None)
@given(judged())
def test_every_detection_is_the_pythons(
    native: ModuleType, case: tuple[list[Record], Call]
) -> None:
    same_detection(native, *case)


@st.composite
def looping(draw: st.DrawFn) -> tuple[list[Record], Call]:
    """Histories that reach the thresholds: one call repeated, or two alternating, with
    few results, so each row of the decision table is hit (not only "allow")."""
    length = draw(st.integers(0, 60))
    sides = draw(st.sampled_from(((7,), (7, 11), (7, 11, 7, 7))))
    # steady: each side keeps one outcome (no progress); else outcomes vary and go missing
    steady = draw(st.booleans())
    outcome = {side: draw(st.sampled_from(RESULTS[1:4])) for side in sides}
    unknown = draw(st.sampled_from(UNKNOWN))
    tool = draw(st.sampled_from(TOOLS))
    history = [
        Record(
            tool if i % 2 == 0 else "exec",
            sides[i % len(sides)],
            0,
            0,
            outcome[sides[i % len(sides)]] if steady else draw(st.sampled_from(RESULTS)),
            unknown,
            i,
        )
        for i in range(length)
    ]
    sig = draw(st.sampled_from((7, 11)))
    config = draw(st.one_of(resolved(), hand_built))
    recent = sum(rec.sig == sig for rec in history)
    run = draw(st.sampled_from(RUNS))
    return history, (tool, sig, "t", draw(st.booleans()), config, run, recent)


@settings(max_examples=2000, deadline=None)
@given(looping())
def test_every_looping_detection_is_the_pythons(
    native: ModuleType, case: tuple[list[Record], Call]
) -> None:
    same_detection(native, *case)


def test_the_looping_histories_reach_every_row_of_the_table(native: ModuleType) -> None:
    found: set[tuple[str, str]] = set()

    # derandomized: the same examples every run, so reaching every row is no matter of luck
    @settings(max_examples=1500, deadline=None, database=None, derandomize=True)
    @given(looping())
    def collect(case: tuple[list[Record], Call]) -> None:
        detected = same_detection(native, *case)
        if detected:
            found.add((detected[0], detected[1]))

    collect()
    assert found >= {
        ("critical", "unknown_tool_repeat"),
        ("critical", "global_circuit_breaker"),
        ("critical", "known_poll_no_progress"),
        ("warning", "known_poll_no_progress"),
        ("critical", "ping_pong"),
        ("warning", "ping_pong"),
        ("critical", "generic_repeat"),
        ("warning", "generic_repeat"),
    }


def _engine_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[list[Record], Call]]:
    """Every call the Python engine judges on the engine corpus, with its run's history
    as detect saw it."""
    seen: list[tuple[list[Record], Call]] = []

    def recording(history: list[Record], *call: Any) -> Detection | None:
        seen.append((list(history), call))
        return detect(history, *call)

    monkeypatch.setattr(step, "detect", recording)
    # the Python engine's own calls, not the native fold's (which runs the default path)
    monkeypatch.setattr(engine_corpus, "native_for", lambda engine: None)
    for _, config, lines in corpora():
        run_corpus(lines, config)
    return seen


def test_every_call_of_the_engine_corpus(
    native: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    judged_calls = _engine_calls(monkeypatch)
    detections = [same_detection(native, history, call) for history, call in judged_calls]
    assert len(judged_calls) > 1_000
    assert {d[1] for d in detections if d} >= {
        "generic_repeat",
        "ping_pong",
        "known_poll_no_progress",
        "unknown_tool_repeat",
    }


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_names_round_trip_into_messages_and_keys(native: ModuleType, name: str) -> None:
    payload = HOSTILE[name]
    config = ResolvedConfig(enabled=True)
    sig = 7
    # the payload as the tool and as the unknown-tool name: a block naming both
    unknown = [Record(payload, sig, 0, 0, 3, payload, i) for i in range(10)]
    assert same_detection(native, unknown, (payload, sig, "t", False, config, payload, 10)) or (
        has_surrogate(payload)
    )
    # the payload as the tool of a ping-pong's other side, and of a generic repeat
    pong = [
        Record(payload if i % 2 else "read", 11 if i % 2 else sig, 0, 0, 5, None, i)
        for i in range(20)
    ]
    for tool, call_sig in ((payload, sig), ("read", 11)):
        recent = sum(rec.sig == call_sig for rec in pong)
        same_detection(native, pong, (tool, call_sig, "t", False, config, None, recent))
    repeat = [Record(payload, sig, 0, 0, 0, None, i) for i in range(10)]
    same_detection(native, repeat, (payload, sig, payload, False, config, "r1", 10))
    if not has_surrogate(payload):
        assert native.guard_message(payload, 3, 3) == guard_message(payload, 3, 3)
    else:
        assert native.guard_message(payload, 3, 3) is None


@settings(max_examples=500, deadline=None)
@given(
    st.lists(record, max_size=60), st.integers(1, 40), st.sampled_from(RUNS), st.sampled_from(SIGS)
)
def test_the_run_view_and_recent_count_are_state_pys(
    native: ModuleType, records: list[Record], history_size: int, run: str | None, sig: int
) -> None:
    state = SessionState()
    for rec in records:
        state.append(rec, history_size)
    view = state.run_history(run_key(run))
    got_view, got_recent = native.history_view(records, history_size, run_key(run), sig)
    assert got_view == [tuple(getattr(rec, f) for f in Record.__struct_fields__) for rec in view]
    assert got_recent == state.recent_count(sig, view)


names = st.one_of(
    st.sampled_from(sorted(HOSTILE.values())),
    st.text(max_size=40),
    st.sampled_from(("error:x", "error:", "", "process", "command_status")),
)


def same_value(native_value: Any, python: Any, *texts: str | None) -> None:
    """The native value is the Python's, or None where a text has a lone surrogate."""
    assert native_value == (None if has_surrogate(*texts) else python(*texts))


@settings(max_examples=1000, deadline=None)
@given(names, names, st.one_of(st.none(), st.sampled_from(("poll", "log", "list")), names))
def test_the_fingerprints_are_fingerprint_pys(
    native: ModuleType, tool: str, token: str, action: str | None
) -> None:
    same_value(native.signature(tool, token), signature, tool, token)
    same_value(native.hash64(token), hash64, token)
    same_value(native.hash32(token), hash32, token)
    same_value(native.result_fingerprint(token), result_fingerprint, token)
    same_value(native.run_key(token), run_key, token)
    same_value(native.is_known_poll(tool, action), is_known_poll, tool, action)
    same_value(native.is_known_poll("process", action), is_known_poll, "process", action)
    assert native.run_key(None) == run_key(None) == 0


def test_lone_surrogates_are_left_to_python(native: ModuleType) -> None:
    half = "half\ud800"
    config = ResolvedConfig(enabled=True)
    history = [Record("read", 7, 0, 0, 0, None, 0)] * 10
    assert native.detect_history(history, half, 7, "t", False, config, None, 10) is None
    assert (
        native.detect_history(
            [Record(half, 7, 0, 0, 0, None, 0)], "read", 7, "t", False, config, None, 1
        )
        is None
    )
    assert native.signature(half, "t") is None and native.hash64(half) is None
    assert native.detect_history(history, "read", 7, "t", False, config, None, 10) == fields(
        detect(history, "read", 7, "t", False, config, None, 10)
    )
