"""``loopfuse audit`` on JSONL: what it counts, and how it reads its input."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest

from loopfuse.streams.cli import main
from loopfuse.streams.ops.audit import AuditSummary, parse_time


def _event(session: str, action: str, detector: str = "generic_repeat", **extra: Any) -> dict[str, Any]:
    return {
        "type": "loop_event", "session_key": session, "run_id": "r1", "agent_id": "a1",
        "tool_name": "exec", "action": action, "level": "critical" if action != "warn" else "warning",
        "detector": detector, "count": 20, "enforced": True, "event_ts": 1_000, **extra,
    }


def test_funnel_counts_events_and_sessions_and_shadow_stays_apart() -> None:
    events = [
        _event("s1", "warn"), _event("s1", "warn"), _event("s1", "block"),
        _event("s2", "warn"),
        _event("s3", "abort", "compaction_loop_persisted"),
        _event("s4", "block", enforced=False),  # shadow: the gateway was told allow
    ]
    data = AuditSummary.of(events).to_dict()

    totals = data["totals"]
    assert (totals["loop_events"], totals["enforced"], totals["shadow"]) == (6, 5, 1)
    assert data["funnel"] == [
        {"action": "warn", "events": 3, "sessions": 2},
        {"action": "block", "events": 1, "sessions": 1},
        {"action": "abort", "events": 1, "sessions": 1},
    ]
    assert data["shadow_actions"]["block"] == 1
    generic = next(r for r in data["by_detector"] if r["name"] == "generic_repeat")
    assert (generic["total"], generic["block"], generic["shadow"]) == (4, 1, 1)
    assert data["top_sessions"][0]["name"] == "s1" and data["top_sessions"][0]["total"] == 3


def test_only_loop_event_lines_count_and_the_time_range_applies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    replay_output = tmp_path / "out.jsonl"
    lines = [
        {"type": "verdict", "action": "block", "detector": "generic_repeat", "session_key": "s9"},
        {"type": "dead_letter", "error_code": "invalid_json", "reason": "loop_event"},
        _event("s1", "warn", event_ts=1_000),
        _event("s2", "block", event_ts=5_000),
        _event("s3", "block", event_ts=9_000),
    ]
    replay_output.write_bytes(b"\n".join(orjson.dumps(x) for x in lines) + b"\nnot json\n")

    assert main(["audit", str(replay_output)]) == 0
    assert capsys.readouterr().out.startswith("loop events: 3 from ")
    assert main(["audit", str(replay_output), "--since", "5000", "--until", "9000"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("loop events: 1 from ") and "s2" in out and "s1" not in out


def test_unreadable_input_or_bad_time_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["audit", str(tmp_path / "missing.jsonl")]) == 2
    assert "cannot read" in capsys.readouterr().err
    assert main(["audit", str(tmp_path / "missing.jsonl"), "--since", "yesterday-ish"]) == 2
    assert "not a time" in capsys.readouterr().err


def test_time_forms() -> None:
    now = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
    noon = int(now.timestamp() * 1000)
    assert parse_time("2026-11-30T12:00:00Z") == noon
    assert parse_time("2026-11-30T13:00:00+01:00") == noon
    assert parse_time("2026-11-30 12:00") == noon  # no zone: UTC
    assert parse_time(str(noon)) == noon
    assert parse_time("2h", now) == noon - 2 * 3600 * 1000
    assert parse_time("30m", now) == noon - 30 * 60 * 1000
