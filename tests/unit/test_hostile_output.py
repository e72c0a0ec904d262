"""The payload corpus through every operator view: nothing of an agent's reaches the
terminal but plain text.

``loopfuse audit`` and ``loopfuse config check`` run as an operator runs them, on a
pseudo-terminal (so rich styles and links what it would style and link); the demo's
live view is drawn on a console that believes it is a colour terminal. What arrives is
checked byte for byte: no control byte (ESC, BEL, CR, DEL, C1), bidi or format
character from the data, no style but the command's own (those it uses for the same
records with plain words in them), every payload shown as its escaped text.
``loopfuse tail`` is tested on a broker in tests/integration/test_tail.py.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

from rich.console import Console

from loopfuse.streams.local.demo import LatestLoopEvents, render
from loopfuse.streams.local.simulator import FleetStats
from loopfuse.streams.ops.plain import shown
from loopfuse.streams.ops.tail import format_line
from tests.fixtures.hostile_strings import HOSTILE, as_json, benign, hostile_loop_events
from tests.support.terminal import SGR, foreign_bytes, run_in_terminal

LOOP_EVENT: dict[str, Any] = {
    "type": "loop_event",
    "session_key": "s1",
    "run_id": "r1",
    "agent_id": "a1",
    "call_id": "c1",
    "tool_name": "exec",
    "action": "block",
    "level": "critical",
    "detector": "generic_repeat",
    "count": 20,
    "message": "CRITICAL: stop",
    "enforced": True,
    "event_ts": 1_796_032_800_000,
}
# What a reader of the terminal must find verbatim: markup as text, escapes as text.
VERBATIM = (
    "[/bold]",
    "[link=https://evil.example]click[/link]",
    "[bold red on white]x",
    ":red_circle: :warning:",
    r"\x1b]0;owned\x07",
    r"ok\x0dFORGED",
    r"one\x0atwo",
    r"abc\u202egnp.exe",
    r"\\x1b[31m",
)


def _jsonl(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_bytes(b"".join(as_json(r) + b"\n" for r in records))
    return path


def test_audit_shows_every_payload_as_plain_text_and_writes_the_report(tmp_path: Path) -> None:
    events = hostile_loop_events(LOOP_EVENT)
    hostile = _jsonl(tmp_path / "hostile.jsonl", events)
    plain = _jsonl(tmp_path / "plain.jsonl", benign(events))

    seen = run_in_terminal(
        "audit", str(hostile), "--top", "200", "--html", str(tmp_path / "r.html")
    )
    baseline = run_in_terminal("audit", str(plain), "--top", "200")

    assert seen.returncode == 0, seen.stderr
    assert foreign_bytes(seen.output) == []
    assert seen.styles <= baseline.styles, seen.styles - baseline.styles
    assert b"\x1b]" not in seen.output  # no OSC: no hyperlink, no window title
    for text in VERBATIM:
        assert text in seen.text, text
    assert (tmp_path / "r.html").stat().st_size > 10_000
    assert f"report: {tmp_path / 'r.html'}" in seen.text


def test_config_check_shows_agent_ids_and_tool_names_as_plain_text(tmp_path: Path) -> None:
    def config(names: list[str]) -> str:
        return json.dumps(
            {
                "tools": {"loopDetection": {"enabled": True}},
                "agents": {"list": [{"id": name} for name in names]},
                "loopfuse": {
                    "providerSendTools": names,
                    "rules": {
                        "tools": {
                            name: {"exempt": True} if i % 2 else {"warningThreshold": 5}
                            for i, name in enumerate(names)
                        }
                    },
                },
            }
        )

    payloads = list(HOSTILE.values())
    (tmp_path / "hostile.json").write_text(config(payloads))
    (tmp_path / "plain.json").write_text(config([f"plain{i}" for i in range(len(payloads))]))

    seen = run_in_terminal("config", "check", str(tmp_path / "hostile.json"))
    baseline = run_in_terminal("config", "check", str(tmp_path / "plain.json"))

    assert seen.returncode == 0, seen.stderr
    assert foreign_bytes(seen.output) == []
    assert seen.styles <= baseline.styles, seen.styles - baseline.styles
    assert b"\x1b]" not in seen.output
    for payload in payloads:
        if len(payload) < 40:  # a short one is never wrapped: the agent's heading shows it whole
            assert f"agent {shown(payload)}\n" in seen.text, payload
    assert r"half\ud800" in seen.text  # a lone surrogate, which stdout could not even encode


def _view(records: list[bytes]) -> bytes:
    feed = LatestLoopEvents(keep=len(records))
    for record in records:
        feed.add(record)
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, color_system="truecolor", width=200)
    console.print(render(FleetStats(), feed, 1.0, 30.0, "embedded 127.0.0.1:9092"))
    return out.getvalue().encode("utf-8", "surrogateescape")


def test_demo_view_shows_loop_events_as_plain_text_and_skips_what_is_not_an_object() -> None:
    events = [e for e in hostile_loop_events(LOOP_EVENT) if "\ud800" not in e["event_id"]]
    not_objects = [b"[1, 2]", b'"a string"', b"17", b"not json", b"null"]

    seen = _view([as_json(e) for e in events[-12:]] + not_objects)
    baseline = _view([as_json(e) for e in benign(events[-12:])])

    assert foreign_bytes(seen) == []
    assert set(SGR.findall(seen)) <= set(SGR.findall(baseline))
    assert b"\x1b]" not in seen
    assert b"5 skipped: not a JSON object" in seen


def test_a_tail_line_is_one_plain_line_whatever_a_record_holds() -> None:
    for event in hostile_loop_events(LOOP_EVENT):
        line = format_line(event)
        assert "\n" not in line and foreign_bytes(line.encode("utf-8", "surrogateescape")) == []
    # a time beyond year 9999 (an older worker's loop event) is shown, not raised
    line = format_line({**LOOP_EVENT, "event_ts": 2**53 - 1})
    assert line.startswith("9007199254740991 ms ")
