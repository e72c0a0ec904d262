"""``loopfuse audit`` on JSONL: what it counts, and how it reads its input."""

from __future__ import annotations

import resource
import subprocess
import sys
import unicodedata
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest

from loopfuse.streams.cli import main
from loopfuse.streams.ops.audit import AuditSummary, loop_events_from_lines, parse_time
from loopfuse.streams.ops.audit_report import render_html


def _event(
    session: str, action: str, detector: str = "generic_repeat", **extra: Any
) -> dict[str, Any]:
    return {
        "type": "loop_event",
        "session_key": session,
        "run_id": "r1",
        "agent_id": "a1",
        "tool_name": "exec",
        "action": action,
        "level": "critical" if action != "warn" else "warning",
        "detector": detector,
        "count": 20,
        "enforced": True,
        "event_ts": 1_000,
        **extra,
    }


def test_funnel_counts_events_and_sessions_and_shadow_stays_apart() -> None:
    events = [
        _event("s1", "warn"),
        _event("s1", "warn"),
        _event("s1", "block"),
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


def test_a_redelivered_loop_event_is_counted_once_and_the_drop_is_said(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A worker that crashed before its commit writes the same loop events again, with
    # the same event_id (derived from what was judged): the totals must not move.
    events = [
        _event(f"s{i % 4}", ("warn", "block", "abort")[i % 3], event_id=f"id{i}", event_ts=i * 997)
        for i in range(30)
    ]
    redelivered = events[:20] + events[10:20] + events[20:] + events[25:]  # 15 twice
    once, twice = tmp_path / "once.jsonl", tmp_path / "twice.jsonl"
    once.write_bytes(b"\n".join(orjson.dumps(e) for e in events))
    twice.write_bytes(b"\n".join(orjson.dumps(e) for e in redelivered))

    expected = AuditSummary.of(events).to_dict()
    got = AuditSummary.of(redelivered).to_dict()
    assert got["totals"].pop("duplicates") == 15 and expected["totals"].pop("duplicates") == 0
    assert got == expected
    assert main(["audit", str(once)]) == 0
    plain_run = capsys.readouterr().out
    assert main(["audit", str(twice)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == (
        "dropped 15 duplicate loop events (an event_id counted already: delivered again "
        "after a worker restart)"
    )
    assert "\n".join([lines[0].replace("twice", "once"), *lines[2:]]) + "\n" == plain_run


def test_the_timeline_has_at_most_61_buckets_whatever_the_span() -> None:
    year_ms = 365 * 86_400_000
    last_date = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z
    for times in ([0, 3 * year_ms], [1_796_032_800_000, last_date], [5, 5], [0, 60 * 86_400_000]):
        events = [_event(f"s{i}", "block", event_ts=ts) for i, ts in enumerate(times)]
        timeline = AuditSummary.of(events).to_dict()["timeline"]
        assert 1 <= timeline["buckets"] <= 61, (times, timeline["bucket_s"])
        assert sum(timeline["series"]["generic_repeat"]) == len(times)
        last = timeline["start_ms"] + timeline["buckets"] * timeline["bucket_s"] * 1000
        assert timeline["start_ms"] <= min(times) and max(times) < last


def test_a_time_no_date_can_hold_is_counted_and_shown_as_its_number(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = [orjson.dumps(_event("dated", "warn", event_ts=1_796_032_800_000))]
    for i, ts in enumerate((-(2**63), 2**63, 2**64 - 1, -1, 2**53 - 1)):
        lines.append(orjson.dumps(_event(f"s{i}", "block", event_id=f"e{i}", event_ts=ts)))
    for i, ts in enumerate((b"1e300", b"-1e400", b"-184467440737095516160", b'"NaN"')):
        lines.append(
            b'{"type":"loop_event","session_key":"x%d","detector":"generic_repeat",'
            b'"action":"warn","event_ts":%s}' % (i, ts)
        )
    events, report = tmp_path / "e.jsonl", tmp_path / "r.html"
    events.write_bytes(b"\n".join(lines) + b"\n")

    assert main(["audit", str(events), "--html", str(report)]) == 0
    out = capsys.readouterr().out
    # -1e400 is no JSON a reader takes (infinity): that line is skipped
    assert out.startswith("loop events: 9 from ")
    assert "8 loop events without a time a date can hold" in out
    data = AuditSummary.of(loop_events_from_lines(events.open("rb"))).to_dict()
    assert data["totals"]["undated"] == 8
    assert data["timeline"]["buckets"] == 1 and data["timeline"]["series"]["generic_repeat"] == [1]
    times = {row["session"]: row["first_ts"] for row in data["sessions"]}
    assert times["dated"] == 1_796_032_800_000  # a date: a number, drawn as a date
    assert times["s0"] == "-9223372036854775808" and times["s1"] == str(2**63)  # digits, exact
    assert times["x0"] is None and times["x3"] is None  # no integer time at all
    assert "-9223372036854775808" in report.read_text()


def test_top_runs_are_escaped_once(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    events = tmp_path / "e.jsonl"
    events.write_bytes(orjson.dumps(_event("s\x1b[2J", "warn", run_id="r\u202e")) + b"\n")
    assert main(["audit", str(events)]) == 0
    out = capsys.readouterr().out
    assert "s\\x1b[2J / r\\u202e" in out and "\\\\" not in out


def test_the_report_shows_every_agent_string_escaped(tmp_path: Path) -> None:
    hidden = (
        "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c\u200b\ufeff\x1b"
    )
    events = [
        _event(
            f"sess{hidden}",
            "block",
            detector=f"det{hidden}",
            agent_id=f"agent{hidden}",
            tool_name="exec\u202etxt.exe",
            run_id=f"run{hidden}",
        )
    ]
    data = AuditSummary.of(events).to_dict()
    page = render_html(data, source="e.jsonl")
    assert [c for c in page if unicodedata.category(c) in ("Cc", "Cf") and c != "\n"] == []
    assert "exec\\\\u202etxt.exe" in page  # in the JSON data: the escape, as text


def test_a_since_too_far_back_is_one_line_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events = tmp_path / "e.jsonl"
    events.write_bytes(orjson.dumps(_event("s1", "warn")))
    for since in ("99999999999w", "9" * 400 + "d", "²"):
        assert main(["audit", str(events), "--since", since]) == 2
        err = capsys.readouterr().err
        assert err.startswith("loopfuse audit: not a time: ") and err.count("\n") == 1, err


def _report_run(
    tmp_path: Path, target: Path, capsys: pytest.CaptureFixture[str], events: Path | None = None
) -> tuple[int, str, str]:
    if events is None:
        events = tmp_path / "e.jsonl"
        events.write_bytes(orjson.dumps(_event("s1", "warn")) + b"\n")
    code = main(["audit", str(events), "--html", str(target)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_html_refuses_a_symlink_and_its_own_input_and_a_missing_folder_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me")
    link = tmp_path / "report.html"
    link.symlink_to(precious)
    code, out, err = _report_run(tmp_path, link, capsys)
    assert (code, out) == (2, "") and "symlink" in err and err.count("\n") == 1
    assert precious.read_text() == "keep me" and link.is_symlink()

    events = tmp_path / "e.jsonl"
    events.write_bytes(orjson.dumps(_event("s1", "warn")) + b"\n")
    before = events.read_bytes()
    code, out, err = _report_run(tmp_path, events, capsys, events=events)
    assert (code, out) == (2, "") and "its input" in err and err.count("\n") == 1
    assert events.read_bytes() == before

    code, out, err = _report_run(tmp_path, tmp_path / "no" / "such" / "r.html", capsys)
    assert (code, out) == (2, "") and "no folder" in err and err.count("\n") == 1
    assert "Traceback" not in err


def test_a_report_that_cannot_be_written_whole_leaves_the_old_one(tmp_path: Path) -> None:
    # A full disk, here a 4 KB file-size limit: the new report (> 10 KB) fails midway.
    events = tmp_path / "e.jsonl"
    events.write_bytes(orjson.dumps(_event("s1", "warn")) + b"\n")
    target = tmp_path / "audit.html"
    target.write_text("the old report")

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))

    run = subprocess.run(
        [sys.executable, "-m", "loopfuse.streams.cli", "audit", str(events), "--html", str(target)],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=small_files,
    )
    assert run.returncode == 1
    assert run.stderr.startswith(f"loopfuse audit: cannot write the report {target}: ")
    assert run.stderr.count("\n") == 1, run.stderr
    assert target.read_text() == "the old report"
    assert {p.name for p in tmp_path.iterdir()} == {"e.jsonl", "audit.html"}  # no temporary


def test_html_replaces_the_report_whole_and_leaves_no_temporary_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_dir = tmp_path / "reports"
    out_dir.mkdir()
    target = out_dir / "audit.html"
    target.write_text("the old report")
    code, out, _ = _report_run(tmp_path, target, capsys)
    assert code == 0 and out.endswith(f"report: {target}\n")
    assert target.read_text().startswith("<!DOCTYPE html>")
    assert [p.name for p in out_dir.iterdir()] == ["audit.html"]
