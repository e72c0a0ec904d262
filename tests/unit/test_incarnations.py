"""A gateway that restarts counts seq from 0 again under a new incarnation: the session
goes on, with exactly the verdicts an uninterrupted gateway would have got."""

from __future__ import annotations

from typing import Any

from msgspec.structs import replace

from loopfuse.schemas import parse_config
from loopfuse.streams.engine import Engine, SessionState, state_codec
from tests.unit.conftest import call, result, verdicts

LOOP = {"command": "make test"}
NOW = 2_000_000_000_000


def engine() -> Engine:
    return Engine(
        parse_config(
            {
                "tools": {
                    "loopDetection": {
                        "enabled": True,
                        "warningThreshold": 3,
                        "criticalThreshold": 5,
                    }
                }
            }
        )
    )


def looping(
    n: int, *, incarnation: str | None, start_ts: int, run: str = "r1", seq0: int = 0
) -> list[Any]:
    """``n`` identical exec calls with identical results, numbered from ``seq0``."""
    events = []
    for i in range(n):
        seq = seq0 + 2 * i
        ts = start_ts + 10 * seq
        events.append(
            call(
                "exec",
                LOOP,
                call_id=f"c{i}",
                seq=seq,
                ts=ts,
                run=run,
                event_id=f"{incarnation}:{seq}",
            )
        )
        events[-1] = replace(events[-1], incarnation=incarnation)
        events.append(
            result(
                "exec",
                LOOP,
                call_id=f"c{i}",
                seq=seq + 1,
                ts=ts + 5,
                run=run,
                result={"content": "1 failing"},
                event_id=f"{incarnation}:{seq + 1}",
            )
        )
        events[-1] = replace(events[-1], incarnation=incarnation)
    return events


def judged(
    eng: Engine, events: list[Any], state: SessionState | None = None, watermark: int | None = None
) -> tuple[SessionState, list[Any]]:
    outputs: list[Any] = []
    for event in events:
        state, produced = eng.step(state, event, NOW, watermark)
        outputs.extend(produced)
    assert state is not None
    return state, outputs


def shape(outputs: list[Any]) -> list[tuple[str, str | None, int, str | None]]:
    return [(v.action, v.detector, v.count, v.message) for v in verdicts(outputs)]


def test_a_restarted_gateway_gets_the_verdicts_of_an_uninterrupted_one() -> None:
    uninterrupted = judged(engine(), looping(8, incarnation="gw-a", start_ts=1_000))[1]
    eng = engine()
    state, before = judged(eng, looping(4, incarnation="gw-a", start_ts=1_000))
    _, after = judged(eng, looping(4, incarnation="gw-b", start_ts=2_000), state)
    assert shape(before + after) == shape(uninterrupted)
    assert [v.action for v in verdicts(after)] == ["warn", "block", "block", "block"]


def test_without_an_incarnation_a_restart_looks_like_redelivery() -> None:
    """What v1 gateways get: seq 0 again is taken for a duplicate (hence the extension)."""
    eng = engine()
    state, _ = judged(eng, looping(4, incarnation=None, start_ts=1_000))
    restarted = [
        replace(e, event_id=f"new-{e.event_id}")
        for e in looping(4, incarnation=None, start_ts=2_000)
    ]
    _, after = judged(eng, restarted, state)
    assert {v.action for v in verdicts(after)} == {"allow"}


def test_verdict_ids_differ_across_incarnations_for_reused_call_ids() -> None:
    eng = engine()
    state, before = judged(eng, looping(2, incarnation="gw-a", start_ts=1_000))
    _, after = judged(eng, looping(2, incarnation="gw-b", start_ts=2_000), state)
    first, second = verdicts(before), verdicts(after)
    assert [v.call_id for v in first] == [v.call_id for v in second]
    assert not {v.verdict_id for v in first} & {v.verdict_id for v in second}
    assert {v.incarnation for v in second} == {"gw-b"}


def test_the_new_seq_space_waits_until_the_old_ones_last_events_are_read() -> None:
    """A worker behind on the results topic reads the restarted gateway's first call
    before the old gateway's last result: the call waits for the watermark."""
    eng = engine()
    old = looping(4, incarnation="gw-a", start_ts=1_000)
    new = looping(4, incarnation="gw-b", start_ts=2_000)
    uninterrupted = shape(judged(engine(), old + new)[1])
    state, out1 = judged(eng, old[:-1], watermark=1_000)  # the last result is still unread
    state, out2 = judged(eng, new[:1], state, watermark=1_070)
    assert verdicts(out2) == []  # waiting: the results topic is read up to ts 1070 only
    state, out3 = judged(eng, old[-1:], state, watermark=1_075)
    assert verdicts(out3) == []
    out4 = eng.release(state, NOW, 2_000)  # every input read past the new first call
    _, out5 = judged(eng, new[1:], state, watermark=None)
    assert shape(out1 + out2 + out3 + out4 + out5) == uninterrupted


def test_release_opens_a_waiting_seq_space_when_nothing_is_left_to_read() -> None:
    eng = engine()
    state, _ = judged(eng, looping(2, incarnation="gw-a", start_ts=1_000))
    state, waiting = judged(
        eng, looping(1, incarnation="gw-b", start_ts=2_000)[:1], state, watermark=1_500
    )
    assert verdicts(waiting) == []
    assert [v.call_id for v in verdicts(eng.release(state, NOW, None))] == ["c0"]
    assert state.pending == []


def test_redelivered_events_of_a_closed_seq_space_change_nothing() -> None:
    eng = engine()
    old = looping(3, incarnation="gw-a", start_ts=1_000)
    state, _ = judged(eng, old)
    state, _ = judged(eng, looping(1, incarnation="gw-b", start_ts=2_000), state)
    before = state_codec.encode(state)
    _, again = judged(eng, old, state)
    assert verdicts(again) == []  # nobody waits for a restarted gateway's old verdicts
    assert state_codec.encode(state) == before


def test_a_seq_space_waiting_to_open_keeps_no_raw_payloads() -> None:
    eng = engine()
    state, _ = judged(eng, looping(1, incarnation="gw-a", start_ts=1_000))
    secret = {"command": "curl -H 'Authorization: Bearer s3cr3t' https://x"}
    first = replace(call("exec", secret, call_id="c0", seq=0, ts=5_000), incarnation="gw-b")
    state, _ = judged(eng, [first], state, watermark=1_000)
    assert len(state.pending) == 1
    assert b"s3cr3t" not in state_codec.encode(state)
    restored = state_codec.decode(state_codec.encode(state))
    assert [v.args_hash for v in verdicts(eng.release(restored, NOW, None))] == [
        verdicts(judged(engine(), [first])[1])[0].args_hash
    ]


def test_the_waiting_bytes_kept_up_to_date_equal_a_recount() -> None:
    eng = engine()
    events = looping(6, incarnation="gw-a", start_ts=1_000)
    restarted = looping(3, incarnation="gw-b", start_ts=2_000)
    state: SessionState | None = None
    # every other event first (parking), a restart in the middle, then the rest
    for event in [*events[1::2], *restarted[::-1], *events[0::2]]:
        state, _ = eng.step(state, event, NOW, 1_500)
        assert state is not None
        recount = state_codec.decode(state_codec.encode(state))
        assert state.waiting_bytes() == recount.waiting_bytes()
