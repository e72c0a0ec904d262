"""Per-session ordering by seq: parking, gaps given up on, late events, redelivery."""

from __future__ import annotations

from typing import Any

from loopfuse.schemas import parse_config
from loopfuse.streams.engine import Engine, SessionState, state_codec
from tests.unit.conftest import call, loop_events, run_ended, verdicts


def engine(**kwargs: Any) -> Engine:
    return Engine(parse_config({"tools": {"loopDetection": {"enabled": True}}}), **kwargs)


def feed(
    eng: Engine, events: list[Any], now: int = 2_000_000_000_000, state: SessionState | None = None
) -> tuple[SessionState, list[Any]]:
    outputs: list[Any] = []
    for event in events:
        state, produced = eng.step(state, event, now)
        outputs.extend(produced)
    assert state is not None
    return state, outputs


def test_early_events_wait_for_the_missing_one_then_apply_in_seq_order() -> None:
    eng = engine()
    calls = [call("read", {"path": f"/{i}"}, call_id=f"c{i}", seq=i) for i in range(3)]
    state, outputs = feed(eng, [calls[2], calls[1]])
    assert verdicts(outputs) == []  # seq 0 has not arrived: both wait
    state, outputs = feed(eng, [calls[0]], state=state)
    assert [v.call_id for v in verdicts(outputs)] == ["c0", "c1", "c2"]


def test_a_gap_is_given_up_after_max_parked_later_events() -> None:
    eng = engine(max_parked=3)
    later = [call("read", {"path": f"/{i}"}, call_id=f"c{i}", seq=i) for i in range(2, 5)]
    _, outputs = feed(eng, later)
    gap = [e for e in loop_events(outputs) if e.detector == "sequence_gap"]
    assert len(gap) == 1 and gap[0].count == 2
    assert gap[0].message == (
        "WARNING: gave up waiting for 2 missing event(s) of this session (seq 0..1); "
        "continuing without them."
    )
    assert [v.call_id for v in verdicts(outputs)] == ["c2", "c3", "c4"]


def test_a_gap_is_given_up_once_later_events_span_the_timeout_and_a_late_event_still_counts() -> (
    None
):
    eng = engine(gap_timeout_ms=1000)
    b = call("read", {"path": "/b"}, call_id="b", seq=1, ts=10_000)
    c = call("read", {"path": "/c"}, call_id="c", seq=2, ts=10_999)
    state, outputs = feed(eng, [b, c])
    assert verdicts(outputs) == []  # 999 ms of event time: still waiting for seq 0
    d = call("read", {"path": "/d"}, call_id="d", seq=3, ts=11_000)
    state, outputs = feed(eng, [d], state=state)
    assert [v.call_id for v in verdicts(outputs)] == ["b", "c", "d"]
    assert [e.detector for e in loop_events(outputs)] == ["sequence_gap"]
    # the lost event turns up after all: applied late, not dropped as a duplicate
    late = call("read", {"path": "/a"}, call_id="a", seq=0, ts=9_000)
    state, outputs = feed(eng, [late], state=state)
    assert [v.call_id for v in verdicts(outputs)] == ["a"]
    assert state.skipped == []  # ... and only once


def test_a_backlog_does_not_release_a_gap_early() -> None:
    """However late the worker reads them (now_ms), events minutes apart in wall time
    but close in event time keep waiting for the missing one."""
    eng = engine(gap_timeout_ms=1000)
    early = [call("read", {"path": f"/{i}"}, call_id=f"c{i}", seq=i, ts=5_000 + i) for i in (1, 2)]
    state, outputs = feed(eng, early, now=10_000_000)
    assert verdicts(outputs) == []
    state, outputs = feed(
        eng, [call("read", {}, call_id="c0", seq=0, ts=5_000)], now=20_000_000, state=state
    )
    assert [v.call_id for v in verdicts(outputs)] == ["c0", "c1", "c2"]
    assert loop_events(outputs) == []


def test_a_gap_waits_while_another_input_topic_is_behind() -> None:
    """While a backlog is read unevenly, the tool-results topic can be far ahead of
    the tool-calls topic the missing call sits on: the parked results span more than
    the timeout, but the watermark (how far every topic has been read) has not moved
    on from the missing event, so the gap holds and the call is applied in order."""
    eng = engine(gap_timeout_ms=1000)
    results_ahead = [
        call("read", {"path": f"/{i}"}, call_id=f"c{i}", seq=i, ts=5_000 + 400 * i)
        for i in range(1, 6)
    ]  # parked, spanning 1,600 ms of event time
    state: SessionState | None = None
    for event in results_ahead:
        state, outputs = eng.step(state, event, 0, watermark_ms=5_100)
        assert outputs == []
    state, outputs = eng.step(
        state, call("read", {}, call_id="c0", seq=0, ts=5_000), 0, watermark_ms=5_100
    )
    assert [v.call_id for v in verdicts(outputs)] == ["c0", "c1", "c2", "c3", "c4", "c5"]
    assert loop_events(outputs) == []


def test_a_gap_is_given_up_once_every_input_is_past_it() -> None:
    eng = engine(gap_timeout_ms=1000)
    b = call("read", {"path": "/b"}, call_id="b", seq=1, ts=10_000)
    c = call("read", {"path": "/c"}, call_id="c", seq=2, ts=12_000)
    state, outputs = eng.step(None, b, 20_000, watermark_ms=10_500)
    state, outputs = eng.step(state, c, 20_000, watermark_ms=10_999)
    assert outputs == []  # the slowest topic is 999 ms past the first parked event
    d = call("read", {"path": "/d"}, call_id="d", seq=3, ts=12_500)
    state, outputs = eng.step(state, d, 20_000, watermark_ms=11_000)
    assert [e.detector for e in loop_events(outputs)] == ["sequence_gap"]
    assert [v.call_id for v in verdicts(outputs)] == ["b", "c", "d"]


def test_max_parked_gives_a_gap_up_whatever_the_watermark() -> None:
    eng = engine(max_parked=3, gap_timeout_ms=1000)
    state: SessionState | None = None
    outputs: list[Any] = []
    for i in range(2, 5):
        state, produced = eng.step(
            state, call("read", {"path": f"/{i}"}, call_id=f"c{i}", seq=i), 0, watermark_ms=0
        )
        outputs.extend(produced)
    assert [e.detector for e in loop_events(outputs)] == ["sequence_gap"]


def test_a_run_ended_arriving_early_waits_like_any_other_event() -> None:
    eng = engine()
    state, outputs = feed(eng, [run_ended(seq=2), call("read", {}, call_id="c1", seq=1)])
    assert loop_events(outputs) == [] and verdicts(outputs) == []
    state, outputs = feed(eng, [call("read", {}, call_id="c0", seq=0)], state=state)
    assert [v.call_id for v in verdicts(outputs)] == ["c0", "c1"]
    assert state.parked == {}


def test_a_redelivered_tool_call_gets_the_identical_verdict_and_changes_nothing() -> None:
    eng = Engine(
        parse_config(
            {
                "tools": {
                    "loopDetection": {
                        "enabled": True,
                        "warningThreshold": 2,
                        "criticalThreshold": 3,
                    }
                }
            }
        )
    )
    events = [call("exec", {"command": "ls"}, call_id=f"c{i}", seq=i) for i in range(4)]
    state, outputs = feed(eng, events)
    last = verdicts(outputs)[-1]
    assert last.action == "warn"
    before = state_codec.encode(state)
    state, again = feed(eng, [events[-1]], state=state)
    assert state_codec.encode(state) == before
    (repeat,) = verdicts(again)
    assert (repeat.verdict_id, repeat.action, repeat.count, repeat.message) == (
        last.verdict_id,
        last.action,
        last.count,
        last.message,
    )
    assert loop_events(again) == []  # the audit trail is not duplicated


def test_parked_events_and_skipped_gaps_survive_the_state_bytes() -> None:
    eng = engine(gap_timeout_ms=10)
    state, _ = feed(eng, [call("read", {"path": "/x"}, call_id="x", seq=5, ts=100)])
    restored = state_codec.decode(state_codec.encode(state))
    assert restored == state
    restored, released = feed(
        eng, [call("read", {"path": "/y"}, call_id="y", seq=6, ts=200)], state=restored
    )
    assert [v.call_id for v in verdicts(released)] == ["x", "y"]
    again = state_codec.decode(state_codec.encode(restored))
    assert again.skipped == [(0, 4)] and again.next_seq == 7


def test_a_redelivered_old_allowed_tool_call_gets_allow_again() -> None:
    eng = engine()
    events = [call("read", {"path": f"/{i}"}, call_id=f"c{i}", seq=i) for i in range(50)]
    state, outputs = feed(eng, events)
    first = verdicts(outputs)[3]
    state, again = feed(eng, [events[3]], state=state)
    (repeat,) = verdicts(again)
    assert (repeat.verdict_id, repeat.action, repeat.call_id) == (first.verdict_id, "allow", "c3")


def test_old_non_allow_verdicts_beyond_the_ring_are_not_guessed() -> None:
    eng = Engine(
        parse_config(
            {
                "tools": {
                    "loopDetection": {
                        "enabled": True,
                        "warningThreshold": 2,
                        "criticalThreshold": 3,
                    }
                }
            }
        )
    )
    # the same call over and over: warns from the 3rd call on, one decision each
    events = [call("exec", {"command": "ls"}, call_id=f"c{i}", seq=i) for i in range(20)]
    state, outputs = feed(eng, events)
    assert verdicts(outputs)[2].action == "warn"
    state, again = feed(eng, [events[2]], state=state)
    assert verdicts(again) == []  # forgotten: better no verdict than a wrong "allow"
    state, again = feed(eng, [events[19]], state=state)
    assert [v.action for v in verdicts(again)] == ["warn"]


def test_a_session_waiting_on_a_gap_is_not_idle() -> None:
    eng = engine()
    state, _ = feed(eng, [call("read", {}, call_id="c0", seq=0)], now=1_000)
    state, _ = feed(eng, [call("read", {}, call_id="c2", seq=2)], now=9_000)
    assert state_codec.idle_stamps(state_codec.encode(state))[0] == 9_000


def test_a_session_is_stamped_with_its_newest_event_time() -> None:
    eng = engine()
    state, _ = feed(eng, [call("read", {}, call_id="c0", seq=0, ts=5_000)], now=10_000)
    # parked (seq 1 missing) and older than the last one: the newest event time stays
    state, _ = feed(eng, [call("read", {}, call_id="c2", seq=2, ts=7_000)], now=11_000, state=state)
    state, _ = feed(eng, [call("read", {}, call_id="c1", seq=1, ts=6_000)], now=12_000, state=state)
    assert state_codec.idle_stamps(state_codec.encode(state)) == (12_000, 7_000)
    # a gateway clock running ahead counts as the worker's now
    state, _ = feed(
        eng, [call("read", {}, call_id="c3", seq=3, ts=99_000)], now=13_000, state=state
    )
    assert state_codec.idle_stamps(state_codec.encode(state)) == (13_000, 13_000)
    # a redelivered event is no sign of life
    state, _ = feed(
        eng, [call("read", {}, call_id="c3", seq=3, ts=99_000)], now=50_000, state=state
    )
    assert state_codec.decode(state_codec.encode(state)).last_event_ms == 13_000


#: A session with one pending call (seq 0, ts 5000, touched at 10 000) as format 3
#: wrote it (3eeaf21).
SMALL_V3 = bytes.fromhex(
    "0310270000000000008813000000000000020472656164027231020100010284ed6bac475f0d66"
    "00000000000000008f4e01005d7bfbc5000000000000000000000000000000000000"
)


def test_state_written_before_event_stamps_still_reads() -> None:
    eng = engine()
    state, _ = feed(eng, [call("read", {}, call_id="c0", seq=0, ts=5_000)], now=10_000)
    raw = state_codec.encode(state)
    # The same state as format 3 wrote it (3eeaf21): with no guards and no warnings,
    # format 2 is format 3 without its incarnation bookkeeping at the end (8-byte
    # incarnation, no retired, nothing pending) ...
    v3 = SMALL_V3
    assert state_codec.encode(state_codec.decode(v3)) == raw
    assert v3[-10:] == bytes(10)
    v2 = bytes((2,)) + v3[1:-10]
    assert state_codec.encode(state_codec.decode(v2)) == raw
    # ... and format 1 is format 2 without the 8-byte event stamp after touched_ms.
    old = bytes((1,)) + v2[1:9] + v2[17:]
    restored = state_codec.decode(old)
    assert (restored.touched_ms, restored.last_event_ms, restored.next_seq) == (10_000, 0, 1)
    assert state_codec.idle_stamps(old) == (10_000, 0)
    assert len(restored.history) == 1
