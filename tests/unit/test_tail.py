"""``loopfuse tail``: its filters, its line, its memory of ids shown (bounded)."""

from __future__ import annotations

from loopfuse.streams.ops.tail import Filters, SeenIds, format_line


def test_a_repeat_is_seen_and_the_oldest_id_is_forgotten_past_the_limit() -> None:
    seen = SeenIds(limit=3)
    assert [seen.again(i) for i in ("a", "b", "a", "c", "d")] == [False, False, True, False, False]
    assert len(seen) == 3  # "b" went first: "a" was seen again after it
    assert [seen.again(i) for i in ("a", "c", "d", "b")] == [True, True, True, False]
    assert seen.again(None) is False and seen.again(None) is False  # no id: never a repeat
    for i in range(10_000):
        seen.again(str(i))
    assert len(seen) == 3


def test_filters_take_any_json_value_and_an_odd_one_simply_does_not_match() -> None:
    filters = Filters(agents=["ops-bot"], sessions=["s1"], detectors=["generic_repeat"])
    wanted = {"agent_id": "ops-bot", "session_key": "s1", "detector": "generic_repeat"}
    assert filters.match(wanted)
    for odd in ({"x": 1}, ["ops-bot"], 7, 1.5, True, None, {"ops-bot": "s1"}):
        for field in wanted:
            assert not filters.match({**wanted, field: odd}), (field, odd)
    assert Filters().match({"agent_id": {"x": [1]}, "session_key": [], "detector": {}})


def test_the_action_column_is_escaped_once() -> None:
    line = format_line({"action": "\x1b[2Jblock", "enforced": False, "event_ts": -(2**63)})
    assert "\\X1B[2JBLOCK (shadow)" not in line and "\\\\x1b" not in line
    assert "\\x1b[2JBLOCK (shadow)" in line
    assert line.startswith("-9223372036854775808 ms ")  # a time no date can hold
