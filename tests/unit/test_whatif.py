"""``loopfuse whatif``'s comparison, window preparation and rendering on hand-made inputs
(the command against a live worker: tests/integration/test_whatif.py)."""

from __future__ import annotations

import io
import re
from typing import Any

import orjson
import pytest
from rich.console import Console

from loopfuse.streams.engine import Engine
from loopfuse.streams.ops.topic_reader import RangeRecord
from loopfuse.streams.ops.whatif import (
    Outcome,
    UsageError,
    add_issued,
    document,
    judge_tenant,
    parse_offsets,
    prepare,
)
from loopfuse.streams.ops.whatif_diff import WhatIf, verdict_parts
from loopfuse.streams.ops.whatif_report import render_html, render_terminal
from loopfuse.streams.replay import replay_lines
from tests.fixtures.hostile_strings import HOSTILE
from tests.support.terminal import foreign_bytes


def verdict(
    seq: int, action: str = "allow", detector: str | None = None, **extra: Any
) -> dict[str, Any]:
    return {
        "type": "verdict",
        "session_key": extra.pop("session", "s1"),
        "run_id": "r",
        "call_id": f"c{seq}",
        "seq": seq,
        "incarnation": None,
        "agent_id": extra.pop("agent", "ops-bot"),
        "tool_name": extra.pop("tool", "exec"),
        "action": action,
        "detector": detector,
        "message": extra.pop("message", None),
        **extra,
    }


def compare(issued: list[dict[str, Any]], candidate: list[dict[str, Any]]) -> dict[str, Any]:
    whatif = WhatIf()
    for document_ in issued:
        parts = verdict_parts(document_, "")
        assert parts is not None
        whatif.issued(*parts)
    for document_ in candidate:
        parts = verdict_parts(document_, "")
        assert parts is not None
        whatif.judged(*parts)
    return whatif.to_dict()


def test_the_same_verdicts_are_no_change() -> None:
    verdicts = [
        verdict(0),
        verdict(2, "warn", "generic_repeat"),
        verdict(4, "block", "generic_repeat"),
    ]

    data = compare(verdicts, verdicts)

    assert data["totals"]["calls_compared"] == 3
    assert data["totals"]["calls_changed"] == data["totals"]["sessions_changed"] == 0
    assert data["sessions"] == []
    assert all(not data["newly"][a] and not data["no_longer"][a] for a in data["newly"])


def test_a_stricter_candidate_newly_blocks_and_aborts_and_a_looser_one_no_longer() -> None:
    issued = [
        verdict(0),
        verdict(2, "warn", "generic_repeat"),
        verdict(4, "warn", "generic_repeat"),
    ]
    stricter = [
        verdict(0),
        verdict(2, "warn", "generic_repeat"),
        verdict(4, "block", "generic_repeat"),
        verdict(4, "abort", "tool_loop_run_ended"),
    ]

    data = compare(issued, stricter)

    assert data["totals"]["calls_compared"] == 3
    assert data["totals"]["calls_changed"] == 2  # seq 4's verdict, and its new abort
    assert data["newly"]["block"] == data["newly"]["abort"] == [{"tenant": "", "session": "s1"}]
    assert data["newly"]["warn"] == []
    rows = {
        (r["action"], r["detector"]): (r["issued"], r["candidate"])
        for r in data["by_action_detector"]
    }
    assert rows[("warn", "generic_repeat")] == (2, 1)
    assert rows[("block", "generic_repeat")] == (0, 1)
    assert rows[("abort", "tool_loop_run_ended")] == (0, 1)
    (agent,) = data["by_agent"]
    assert agent["name"] == "ops-bot"
    assert agent["issued"]["warn"] == 2 and agent["candidate"]["abort"] == 1
    (session,) = data["sessions"]
    assert [(c["seq"], c["issued"], c["candidate"], c["changed"]) for c in session["calls"]] == [
        (0, "allow", "allow", False),
        (2, "warn (generic_repeat)", "warn (generic_repeat)", False),
        (4, "warn (generic_repeat)", "block (generic_repeat)", True),
        (4, None, "abort (tool_loop_run_ended)", True),
    ]

    looser = compare(stricter, issued)
    assert (
        looser["no_longer"]["block"]
        == looser["no_longer"]["abort"]
        == [{"tenant": "", "session": "s1"}]
    )


def test_tenants_sessions_are_apart_and_what_cannot_be_compared_is_counted_not_changed() -> None:
    whatif = WhatIf()
    for tenant in ("", "acme"):
        for document_ in (verdict(0), verdict(2, "warn", "ping_pong")):
            parts = verdict_parts(document_, tenant)
            assert parts is not None
            whatif.issued(*parts)
    # acme's session gets another verdict: only acme's session changes
    for tenant, action in (("", "warn"), ("acme", "block")):
        for document_ in (verdict(0), verdict(2, action, "ping_pong")):
            parts = verdict_parts(document_, tenant)
            assert parts is not None
            whatif.judged(*parts)
    issued_twice = verdict_parts(verdict(0), "")
    fleet = verdict_parts(verdict(6, "block", "fleet_tool_breaker"), "")
    unanswered = verdict_parts(verdict(8), "")
    assert issued_twice and fleet and unanswered
    whatif.issued(*issued_twice)  # a worker restart wrote it again
    whatif.issued(*fleet)  # the fleet breaker: not judged per session
    whatif.judged(*unanswered)  # the worker has not answered it yet

    data = whatif.to_dict()

    assert [(s["tenant"], s["session"]) for s in data["sessions"]] == [("acme", "s1")]
    assert data["totals"]["duplicates"] == 1
    assert data["totals"]["fleet_breaker"] == 1
    assert data["totals"]["unanswered"] == 1
    assert data["totals"]["calls_compared"] == 4


@pytest.mark.parametrize(
    "hostile",
    [
        [1, 2],
        "verdict",
        {"type": "verdict"},
        {**verdict(0), "action": "explode"},
        {**verdict(0), "seq": "1"},
        {**verdict(0), "seq": True},
        {**verdict(0), "session_key": None},
    ],
)
def test_a_malformed_verdict_is_not_one(hostile: object) -> None:
    assert verdict_parts(hostile, "") is None


def _record(offset: int, event: dict[str, Any] | bytes | None, topic: str = "calls") -> RangeRecord:
    value = event if isinstance(event, bytes) or event is None else orjson.dumps(event)
    return RangeRecord(topic, 0, offset, 1_000 + offset, value)


def _looping(session: str, calls: int) -> list[dict[str, Any]]:
    events = []
    for n in range(calls):
        base = {"session_key": session, "run_id": "r", "call_id": f"c{n}", "tool_name": "exec"}
        base |= {"args": {"command": "make"}, "ts": 1_000 + 2 * n}
        events.append({**base, "type": "tool_call", "seq": 2 * n, "event_id": f"{session}-{2 * n}"})
        events.append(
            {**base, "type": "tool_result", "seq": 2 * n + 1, "event_id": f"{session}-{2 * n + 1}"}
            | {"result": {"content": "error: 1"}, "ts": 1_001 + 2 * n}
        )
    return events


def _judge(lines: Any) -> Any:
    return replay_lines(lines, Engine(None))


def test_a_session_begun_before_the_window_is_judged_from_there_and_numbered_back() -> None:
    events = _looping("old", 10)
    window = [_record(i, e) for i, e in enumerate(events[6:])]  # from call c3 (seq 6)
    window += [_record(100, None), _record(101, b"not json")]

    prepared = prepare(window, ["calls"])
    whatif = WhatIf()
    judge_tenant("", prepared, _judge, whatif)

    assert prepared.partial == {"old"}
    assert prepared.shifts[("old", None)] == 6
    assert [orjson.loads(line)["seq"] for line in prepared.lines[:3]] == [0, 1, 2]
    data = whatif.to_dict()
    assert data["totals"]["partial_sessions"] == 1
    assert data["dead_letters"] == {"empty_message": 1, "invalid_json": 1}
    assert data["dead_letter_records"] == [
        {"code": "empty_message", "record": "calls[0]@100"},
        {"code": "invalid_json", "record": "calls[0]@101"},
    ]
    # the candidate's verdicts are keyed by the seqs as published (calls c3..c9)
    judged = whatif.sessions[("", "old")].calls
    assert sorted(key[5] for key in judged) == [6, 8, 10, 12, 14, 16, 18]
    # so the verdict the worker issued for call c3 (seq 6) is compared with it
    assert add_issued(
        orjson.dumps(verdict(6, session="old", call_id="c3")), "", {"": prepared}, whatif
    )
    assert whatif.to_dict()["totals"]["calls_compared"] == 1


def test_a_record_the_worker_dead_letters_stays_a_dead_letter_in_a_partial_session() -> None:
    events = _looping("old", 6)
    past_bounds = {**events[0], "seq": 2**60, "event_id": "huge"}  # seq over 2**53 - 1
    no_call_id = {k: v for k, v in events[1].items() if k != "call_id"} | {"seq": 4}
    window = [_record(0, past_bounds), _record(1, no_call_id)]
    window += [_record(2 + i, e) for i, e in enumerate(events[6:])]

    prepared = prepare(window, ["calls"])
    whatif = WhatIf()
    judge_tenant("", prepared, _judge, whatif)

    assert prepared.shifts[("old", None)] == 6  # from the first event the worker judges
    assert prepared.lines[:2] == [orjson.dumps(past_bounds), orjson.dumps(no_call_id)]
    data = whatif.to_dict()
    assert sum(data["dead_letters"].values()) == 2
    judged = whatif.sessions[("", "old")].calls
    assert sorted(key[5] for key in judged) == [6, 8, 10]


def test_events_without_seq_are_matched_by_their_call() -> None:
    events = [{k: v for k, v in e.items() if k != "seq"} for e in _looping("v1", 6)]
    prepared = prepare([_record(i, e) for i, e in enumerate(events)], ["calls"])
    whatif = WhatIf()
    judge_tenant("", prepared, _judge, whatif)
    for n in range(6):
        action = "allow" if n < 2 else "warn" if n < 4 else "block"
        issued = verdict(0, action, None if n < 2 else "generic_repeat", session="v1")
        issued |= {"seq": None, "call_id": f"c{n}"}
        assert add_issued(orjson.dumps(issued), "", {"": prepared}, whatif)

    data = whatif.to_dict()

    assert data["totals"]["calls_compared"] == 6
    assert data["totals"]["unanswered"] == 0


def test_output_records_outside_the_window_or_unreadable() -> None:
    prepared = prepare([_record(0, _looping("s", 1)[0])], ["calls"])
    whatif = WhatIf()
    windows = {"": prepared}

    assert not add_issued(b"\x00{", "", windows, whatif)
    assert not add_issued(b"[]", "", windows, whatif)
    assert add_issued(orjson.dumps(verdict(40, session="s")), "", windows, whatif)  # not ours
    assert add_issued(orjson.dumps(verdict(0, session="s")), "", windows, whatif)
    assert whatif.to_dict()["totals"]["not_judged"] == 1


def test_offsets_name_input_topics_read() -> None:
    assert parse_offsets(["calls:0=5,calls:1=7", "results:0=2"], ["calls", "results"]) == {
        ("calls", 0): 5,
        ("calls", 1): 7,
        ("results", 0): 2,
    }
    with pytest.raises(UsageError, match="not an input topic"):
        parse_offsets(["loopfuse.verdicts:0=1"], ["calls"])
    with pytest.raises(UsageError, match="TOPIC:PARTITION=OFFSET"):
        parse_offsets(["calls:x=1"], ["calls"])


def _hostile_document(payload: str) -> dict[str, Any]:
    """A window where one call, every string of it ``payload``, goes from allow to block."""
    strings = {"session": payload, "agent": payload, "tool": payload, "call_id": payload}
    issued = verdict(2, "allow", **strings)
    candidate = verdict(2, "block", "generic_repeat", message=payload, **strings)
    whatif = WhatIf()
    for side, doc in ((whatif.issued, issued), (whatif.judged, candidate)):
        parts = verdict_parts(doc, "")
        assert parts is not None
        side(*parts)
    whatif.dead_letter(payload, payload)
    return document(Outcome(whatif), candidate=payload, tenants=[""])


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_agent_strings_are_plain_text_in_the_terminal_and_the_page(name: str) -> None:
    payload = HOSTILE[name]
    data = _hostile_document(payload)
    out = io.BytesIO()
    console = Console(
        file=io.TextIOWrapper(out, encoding="utf-8", write_through=True),
        width=400,
        force_terminal=True,
        color_system="standard",
    )

    render_terminal(data, console, calls=5)
    page = render_html(data)

    assert foreign_bytes(out.getvalue()) == []
    assert b"\x1b]" not in out.getvalue()  # no OSC: no hyperlink, no window title
    text = out.getvalue().decode()
    assert "changed sessions" in text and "block (generic_repeat)" in text
    if payload.startswith("["):
        assert payload in text  # markup is shown as typed, never read
    assert "<script>" not in page and "<img" not in page
    assert "script-src" not in page and "default-src 'none'" in page


def test_the_page_shows_the_numbers_of_the_json() -> None:
    issued = [verdict(0), verdict(2, "warn", "generic_repeat")]
    candidate = [verdict(0), verdict(2, "block", "generic_repeat")]
    whatif = WhatIf()
    for side, documents in ((whatif.issued, issued), (whatif.judged, candidate)):
        for doc in documents:
            parts = verdict_parts(doc, "")
            assert parts is not None
            side(*parts)
    data = document(Outcome(whatif, input_records=4), candidate="b.json", tenants=[""])

    page = render_html(data)

    metrics = dict(re.findall(r'data-metric="(\w+)">(\d+)<', page))
    assert metrics == {key: str(data["totals"][key]) for key in metrics}
    assert metrics["calls_changed"] == "1" and metrics["sessions_changed"] == "1"
    assert "block (generic_repeat)" in page and "newly block" in page
