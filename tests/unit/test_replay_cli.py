"""`loopfuse replay` on JSONL fixtures: verdicts in input order, dead letters, config errors."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from loopfuse.streams.cli import main

FIXTURES = Path(__file__).parent.parent / "fixtures"


def replay(*args: str, stdin: bytes | None = None) -> tuple[int, list[dict], str]:
    proc = subprocess.run(
        [sys.executable, "-m", "loopfuse.streams.cli", "replay", *args],
        input=stdin,
        capture_output=True,
        timeout=60,
    )
    lines = [json.loads(line) for line in proc.stdout.decode().splitlines()]
    return proc.returncode, lines, proc.stderr.decode()


def test_polling_loop_warns_then_blocks_with_the_spec_messages() -> None:
    code, out, _ = replay(
        "--config", str(FIXTURES / "small.json5"), str(FIXTURES / "polling_loop.jsonl")
    )
    assert code == 0
    verdicts = [line for line in out if line["type"] == "verdict"]
    assert [v["action"] for v in verdicts] == ["allow"] * 3 + ["warn", "warn", "block"]
    assert verdicts[3]["message"] == (
        "WARNING: You have called process 3 times with identical arguments and no progress. "
        "Stop polling and either (1) increase wait time between checks, or (2) report the task "
        "as failed if the process is stuck."
    )
    assert verdicts[5]["message"] == (
        "CRITICAL: Called process with identical arguments and no progress 5 times. This "
        "appears to be a stuck polling loop. Session execution blocked to prevent resource waste."
    )
    loop_events = [line for line in out if line["type"] == "loop_event"]
    assert [(e["detector"], e["count"], e["action"]) for e in loop_events] == [
        ("known_poll_no_progress", 5, "block")
    ]
    # the loop event is written right after the verdict it belongs to (input order)
    assert out.index(loop_events[0]) == out.index(verdicts[5]) + 1


def test_malformed_lines_become_dead_letters_and_the_next_event_is_judged() -> None:
    code, out, _ = replay(str(FIXTURES / "malformed.jsonl"))
    assert code == 0
    assert [line["type"] for line in out] == ["verdict"] + ["dead_letter"] * 5 + ["verdict"]
    dead = out[1:6]
    assert [d["line"] for d in dead] == [2, 3, 4, 5, 6]
    assert [d["error_code"] for d in dead] == [
        "invalid_json",
        "invalid_event",
        "unknown_type",
        "not_an_object",
        "invalid_event",
    ]
    assert "call_id" in dead[1]["reason"]
    assert "seq" in dead[4]["reason"]
    assert dead[0]["original"] == "this is not json"
    assert out[-1]["call_id"] == "b" and out[-1]["action"] == "allow"


def test_compaction_loop_aborts_with_the_call_id_of_the_tripping_result() -> None:
    code, out, _ = replay("-", stdin=(FIXTURES / "compaction_loop.jsonl").read_bytes())
    assert code == 0
    aborts = [line for line in out if line["type"] == "verdict" and line["action"] == "abort"]
    assert len(aborts) == 1
    assert aborts[0]["call_id"] == "t2"
    assert aborts[0]["detector"] == "compaction_loop_persisted"
    assert aborts[0]["message"].startswith("CRITICAL: tool exec repeated 3 times")


def test_guard_arming_is_logged_with_verbose() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "loopfuse.streams.cli",
            "-v",
            "replay",
            str(FIXTURES / "compaction_loop.jsonl"),
        ],
        capture_output=True,
        timeout=60,
    )
    assert "post-compaction guard armed for 3 attempts" in proc.stderr.decode()


def test_replay_is_deterministic() -> None:
    args = ("--config", str(FIXTURES / "small.json5"), str(FIXTURES / "polling_loop.jsonl"))
    assert replay(*args)[1] == replay(*args)[1]


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (
            "{tools: {loopDetection: {warningThreshold: 10, criticalThreshold: 5}}}",
            "tools.loopDetection.warningThreshold must be lower than criticalThreshold.",
        ),
        ("{tools: {loopDetection: {historySize: 0}}}", "tools.loopDetection.historySize"),
        (
            "{agents: {list: [{id: 'a', tools: {loopDetection: {typo: 1}}}]}}",
            "agents.list[0].tools.loopDetection.typo: unknown key",
        ),
        ("{not json5", "not valid JSON/JSON5"),
    ],
)
def test_invalid_config_exits_nonzero_with_one_line(
    tmp_path: Path, content: str, expected: str
) -> None:
    config = tmp_path / "openclaw.json5"
    config.write_text(content)
    code, out, stderr = replay("--config", str(config), str(FIXTURES / "polling_loop.jsonl"))
    assert code == 2
    assert out == []
    assert expected in stderr
    assert len(stderr.strip().splitlines()) == 1


def test_unreadable_files_exit_nonzero(tmp_path: Path) -> None:
    code, _, stderr = replay(
        "--config", str(tmp_path / "missing.json"), str(FIXTURES / "polling_loop.jsonl")
    )
    assert code == 2 and "cannot read config file" in stderr
    code, _, stderr = replay(str(tmp_path / "missing.jsonl"))
    assert code == 2 and "cannot read" in stderr


def test_in_process_main_writes_jsonl(monkeypatch: pytest.MonkeyPatch) -> None:
    buffer = io.BytesIO()

    class FakeStdout:
        def __init__(self) -> None:
            self.buffer = buffer

    monkeypatch.setattr(sys, "stdout", FakeStdout())
    assert main(["replay", str(FIXTURES / "polling_loop.jsonl")]) == 0
    lines = buffer.getvalue().decode().splitlines()
    # no config file: detection is off, so six plain allows
    assert [json.loads(line)["action"] for line in lines] == ["allow"] * 6


def test_hostile_lines_are_dead_letters_and_replay_goes_on_to_exit_0() -> None:
    """Each of these once stopped replay (or the worker) at the line; now each gets a
    dead letter with a reason and every line after it is judged."""
    good = (FIXTURES / "polling_loop.jsonl").read_bytes().splitlines()
    call = json.loads(good[0])
    hostile = [
        json.dumps(call)[:-1].encode() + b', "ts": 1e300}',
        json.dumps(call)[:-1].encode() + b', "ts": 18446744073709551615}',
        json.dumps(call)[:-1].encode() + b', "seq": 9223372036854775808}',
        json.dumps({**call, "tool_name": "t" * 300_000}).encode(),
        json.dumps({**call, "type": []}).encode(),
        json.dumps({**call, "session_key": "k" * 600_000}).encode(),
    ]
    lines = [hostile[0], *good[:3], *hostile[1:], *good[3:]]
    code, out, err = replay(
        "--config", str(FIXTURES / "small.json5"), "-", stdin=b"\n".join(lines) + b"\n"
    )
    assert code == 0, err
    letters = [line for line in out if line["type"] == "dead_letter"]
    assert [d["line"] for d in letters] == [1, 5, 6, 7, 8, 9]
    assert all(d["reason"] and len(d["original"]) <= 4096 for d in letters)
    assert {d["error_code"] for d in letters} == {"invalid_event", "unknown_type"}
    verdicts = [line for line in out if line["type"] == "verdict"]
    assert [v["action"] for v in verdicts] == ["allow"] * 3 + ["warn", "warn", "block"]


def test_the_progress_bar_goes_to_stderr_and_stdout_stays_jsonl() -> None:
    events = str(FIXTURES / "polling_loop.jsonl")
    plain = subprocess.run(
        [sys.executable, "-m", "loopfuse.streams.cli", "replay", events],
        capture_output=True,
        timeout=60,
        check=True,
    )
    forced = subprocess.run(
        [sys.executable, "-m", "loopfuse.streams.cli", "replay", "--progress", events],
        capture_output=True,
        timeout=60,
        check=True,
        env={**os.environ, "FORCE_COLOR": "1", "COLUMNS": "80"},
    )
    assert forced.stdout == plain.stdout and b"\x1b" not in forced.stdout
    assert b"replay" in forced.stderr  # the bar was drawn, on stderr


def test_a_time_no_consumer_can_show_is_a_dead_letter_saying_so() -> None:
    # 2**53-1 ms is year 287396: tail and the report could not show it. Now (ms since
    # epoch) and the last millisecond of year 9999 are judged as before.
    call = (
        '{"type":"tool_call","event_id":"e%d","session_key":"s","call_id":"c%d",'
        '"tool_name":"read","args":{},"ts":%s}'
    )
    lines = [
        call % (1, 1, "1796032800000"),
        call % (2, 2, "253402300799999"),
        call % (3, 3, "9007199254740991"),
        call % (4, 4, '"+10000-01-01T00:00:00Z"'),
        call % (5, 5, "253402300800000"),
    ]
    code, out, _ = replay(stdin="\n".join(lines).encode() + b"\n")

    assert code == 0
    assert [line["type"] for line in out] == ["verdict", "verdict"] + ["dead_letter"] * 3
    for dead in out[2:3] + out[4:]:
        assert dead["error_code"] == "invalid_event"
        assert dead["reason"].startswith(
            "ts: ts must be epoch milliseconds in 0 .. 253402300799999"
        )
        assert "9999-12-31T23:59:59.999Z" in dead["reason"]
    assert out[3]["reason"].startswith("ts: ts is not an RFC 3339 time")
