"""``loopfuse audit --html``: the report in a real headless Chromium.

The command runs as a user runs it; the page is opened in Debian's chromium over the
DevTools protocol: no console error, no uncaught exception, no network request,
every chart drawn with a real size, sessions sortable by a click, a screenshot kept
in the test's tmp dir, and every number on the page equal to the terminal summary's
(read back from the DOM). No chromium: the test fails (``.ci/run`` installs it).
"""

from __future__ import annotations

import re
import subprocess
import sys
import unicodedata
from pathlib import Path
from typing import Any

import pytest

from loopfuse.streams.ops.audit import AuditSummary, loop_events_from_lines
from tests.fixtures.hostile_strings import as_json, hostile_loop_events
from tests.support.chromium import chromium_page, find_chromium
from tests.support.kafka import fixture_records

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "audit_replay.jsonl"

READ_PAGE = """(() => {
  const metrics = {};
  document.querySelectorAll("[data-metric]").forEach(n => { metrics[n.dataset.metric] = n.textContent; });
  const charts = {};
  for (const id of ["chart-timeline", "chart-agents", "chart-tools", "chart-funnel"]) {
    const chart = document.querySelector("#" + id + " svg");
    const box = chart ? chart.getBoundingClientRect() : {width: 0, height: 0};
    const bars = chart ? [...chart.querySelectorAll("rect")].filter(r => {
      const b = r.getBoundingClientRect(); return b.width > 0 && b.height > 0; }).length : 0;
    charts[id] = {width: box.width, height: box.height, bars: bars};
  }
  return {rendered: document.body.dataset.rendered || "", errors: document.getElementById("report-errors").textContent,
          title: document.title, metrics: metrics, charts: charts,
          timelineBars: [...document.querySelectorAll("#chart-timeline rect")].map(r => r.dataset.detector)};
})()"""

SESSIONS_ORDER = (
    """[...document.querySelectorAll("#sessions-table tbody tr")].map(tr => tr.dataset.session)"""
)


def _click(key: str) -> str:
    return f"document.querySelector('#sessions-table th[data-key=\"{key}\"]').click()"


def _terminal_rows(text: str, title: str) -> dict[str, list[int]]:
    """name -> numbers of the rich table printed under the line ``title``."""
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip() == title)
    rows: dict[str, list[int]] = {}
    for line in lines[at + 1 :]:
        if line.startswith("└"):
            break
        if line.startswith("│"):
            cells = [c.strip() for c in line.split("│") if c.strip()]
            rows[cells[0]] = [int(c) for c in cells[1:] if c.isdigit()]
    return rows


def _expected_metrics(data: dict[str, Any]) -> dict[str, str]:
    counts = ("total", "warn", "block", "abort", "allow", "shadow")
    expected = {
        f"totals.{k}": str(data["totals"][k])
        for k in ("loop_events", "enforced", "shadow", "sessions", "runs", "agents")
    }
    for prefix, rows in (("detector", "by_detector"), ("agent", "by_agent"), ("tool", "by_tool")):
        for row in data[rows]:
            expected.update({f"{prefix}.{row['name']}.{c}": str(row[c]) for c in counts})
    for stage in data["funnel"]:
        expected[f"funnel.{stage['action']}.events"] = str(stage["events"])
        expected[f"funnel.{stage['action']}.sessions"] = str(stage["sessions"])
    expected.update({f"shadow.{a}": str(n) for a, n in data["shadow_actions"].items()})
    for row in data["sessions"]:
        for key in ("runs", "total", "warn", "block", "abort", "shadow", "max_count"):
            expected[f"session.{row['session']}.{key}"] = str(row[key])
    for detector, series in data["timeline"]["series"].items():
        expected[f"timeline.{detector}"] = str(sum(series))
    return expected


async def test_report_renders_in_chromium_and_agrees_with_the_terminal(tmp_path: Path) -> None:
    if find_chromium() is None:
        pytest.fail("chromium not found: apt-get install chromium (.ci/run installs it)")
    report = tmp_path / "audit.html"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "loopfuse.streams.cli",
            "audit",
            str(FIXTURE),
            "--html",
            str(report),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stderr
    terminal = run.stdout
    data = AuditSummary.of(loop_events_from_lines(FIXTURE.open("rb"))).to_dict()
    assert data["totals"]["enforced"] > 0 and data["totals"]["shadow"] > 0  # the fixture has both

    async with chromium_page() as page:
        await page.open(report.as_uri())
        seen = await page.evaluate(READ_PAGE)
        by_session = await page.evaluate(_click("session") + ";" + SESSIONS_ORDER)
        by_session_desc = await page.evaluate(_click("session") + ";" + SESSIONS_ORDER)
        by_abort = await page.evaluate(_click("abort") + ";" + SESSIONS_ORDER)
        shot = await page.screenshot(tmp_path / "audit.png")
        console_errors, exceptions, requests = page.console_errors, page.exceptions, page.requests

    # loaded cleanly, offline
    assert seen["rendered"] == "true" and seen["errors"] == "", seen["errors"]
    assert not console_errors and not exceptions, (console_errors, exceptions)
    assert [url for url in requests if not url.startswith("file://")] == []
    # charts drawn, with real sizes
    for chart, box in seen["charts"].items():
        assert box["width"] > 100 and box["height"] > 20 and box["bars"] > 0, (chart, box)
    assert set(seen["timelineBars"]) == set(data["timeline"]["series"])
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
    # sortable sessions table
    names = [row["session"] for row in data["sessions"]]
    assert by_session == sorted(names) and by_session_desc == sorted(names, reverse=True)
    aborts = {row["session"]: row["abort"] for row in data["sessions"]}
    assert [aborts[s] for s in by_abort] == sorted(aborts.values(), reverse=True)

    # the page's numbers are the summary's ...
    expected = _expected_metrics(data)
    assert {k: seen["metrics"].get(k) for k in expected} == expected
    # ... and the terminal's
    totals = re.search(r"loop events: (\d+) .*\(enforced (\d+), shadow (\d+)\)", terminal)
    assert totals is not None
    assert list(totals.groups()) == [
        seen["metrics"][f"totals.{k}"] for k in ("loop_events", "enforced", "shadow")
    ]
    counts = ("total", "warn", "block", "abort", "allow", "shadow")
    for title, prefix in (("by detector", "detector"), ("by agent", "agent"), ("by tool", "tool")):
        rows = _terminal_rows(terminal, title)
        assert rows, title
        for name, numbers in rows.items():
            assert numbers == [int(seen["metrics"][f"{prefix}.{name}.{c}"]) for c in counts]
    funnel = _terminal_rows(terminal, "funnel (enforced)")
    for action in ("warn", "block", "abort"):
        assert funnel[action] == [
            int(seen["metrics"][f"funnel.{action}.events"]),
            int(seen["metrics"][f"funnel.{action}.sessions"]),
        ]


def _report(tmp_path: Path, name: str, events: list[dict[str, Any]]) -> Path:
    source = tmp_path / f"{name}.jsonl"
    source.write_bytes(b"".join(as_json(e) + b"\n" for e in events))
    report = tmp_path / f"{name}.html"
    run = subprocess.run(
        [sys.executable, "-m", "loopfuse.streams.cli", "audit", str(source), "--html", str(report)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stderr
    return report


RENDERED = """(() => ({rendered: document.body.dataset.rendered || "",
  errors: document.getElementById("report-errors").textContent,
  bars: document.querySelectorAll("#chart-timeline rect").length,
  narrowest: Math.min(...[...document.querySelectorAll("#chart-timeline rect")].map(
    r => r.getBoundingClientRect().width)),
  times: [...document.querySelectorAll("#sessions-table tbody td")].map(td => td.textContent),
  injected: document.body.dataset.injected || "", owned: String(window.owned)}))()"""


async def test_report_draws_any_time_span_and_times_no_date_can_hold(tmp_path: Path) -> None:
    base = fixture_records("loop_event")[0]
    year_ms = 365 * 86_400_000
    apart = _report(
        tmp_path,
        "apart",
        [
            {**base, "event_id": "a", "event_ts": base["event_ts"]},
            {**base, "event_id": "b", "event_ts": base["event_ts"] + 3 * year_ms},
        ],
    )
    # ts near 2**53-1, from a worker before ts was bounded: Date throws RangeError on it
    far = _report(tmp_path, "far", [{**base, "event_id": "c", "event_ts": 2**53 - 1}])

    async with chromium_page() as page:
        await page.open(apart.as_uri())
        seen_apart = await page.evaluate(RENDERED)
        await page.open(far.as_uri())
        seen_far = await page.evaluate(RENDERED)
        exceptions = page.exceptions

    assert seen_apart["rendered"] == "true" and seen_apart["errors"] == ""
    # at most 61 buckets across the chart (not 1,096 one-day ones): each bar can be seen
    assert seen_apart["bars"] == 2 and seen_apart["narrowest"] > 10, seen_apart["narrowest"]
    assert seen_far["rendered"] == "true" and seen_far["errors"] == "", seen_far["errors"]
    assert "9007199254740991 ms" in seen_far["times"]
    assert not exceptions


async def test_report_runs_its_own_script_only(tmp_path: Path) -> None:
    base = fixture_records("loop_event")[0]
    report = _report(
        tmp_path, "hostile", [e for e in hostile_loop_events(base) if "\ud800" not in e["event_id"]]
    )
    page_text = report.read_text()
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]*)"', page_text)
    assert csp is not None
    policy = dict(part.strip().split(" ", 1) for part in csp.group(1).split(";"))
    assert re.fullmatch(r"'sha256-[A-Za-z0-9+/]{43}='", policy["script-src"])
    assert (policy["base-uri"], policy["form-action"], policy["default-src"]) == ("'none'",) * 3
    # An escaping bug, simulated: markup that got into the page as markup.
    injected = report.with_name("injected.html")
    injected.write_text(
        page_text.replace(
            "</body>",
            '<script>document.body.dataset.injected = "ran"</script>'
            '<img src="x" onerror="document.body.dataset.injected = \'ran\'"></body>',
        )
    )

    async with chromium_page() as page:
        await page.open(report.as_uri())
        seen = await page.evaluate(RENDERED)
        await page.open(injected.as_uri())
        seen_injected = await page.evaluate(RENDERED)
        requests = page.requests

    assert seen["rendered"] == "true" and seen["errors"] == "" and seen["owned"] == "undefined"
    assert seen_injected["rendered"] == "true" and seen_injected["injected"] == ""
    assert [url for url in requests if not url.startswith("file://")] == []


SHOWN_TEXT = """(() => ({rendered: document.body.dataset.rendered || "",
  errors: document.getElementById("report-errors").textContent,
  labels: [...document.querySelectorAll("svg text, svg title")].map(n => n.textContent),
  cells: [...document.querySelectorAll("td, th, .legend")].map(n => n.textContent)}))()"""


async def test_report_shows_bidi_and_format_characters_escaped_and_any_time(
    tmp_path: Path,
) -> None:
    base = fixture_records("loop_event")[0]
    marks = "\u202a\u202b\u202c\u202d\u2066\u2067\u2068\u2069\u200e\u200f\u061c\u200b"
    events = [
        {
            **base,
            "event_id": "bidi",
            "tool_name": "exec\u202etxt.exe",
            "agent_id": f"a{marks}",
            "session_key": f"s{marks}",
            "detector": f"d{marks}",
        },
        # times no date can hold: counted, the report still written, shown as numbers
        {**base, "event_id": "past", "session_key": "past", "event_ts": -(2**63)},
        {**base, "event_id": "future", "session_key": "future", "event_ts": 2**63},
    ]
    report = _report(tmp_path, "bidi", events)

    async with chromium_page() as page:
        await page.open(report.as_uri())
        seen = await page.evaluate(SHOWN_TEXT)
        times = await page.evaluate(RENDERED)
        exceptions = page.exceptions

    assert seen["rendered"] == "true" and seen["errors"] == "", seen["errors"]
    shown = seen["labels"] + seen["cells"]
    assert [c for text in shown for c in text if unicodedata.category(c) in ("Cc", "Cf")] == []
    assert "exec\\u202etxt.exe" in seen["cells"]  # the tools table
    assert "exec\\u202etxt.exe" in seen["labels"]  # beside its bar
    assert "-9223372036854775808 ms" in times["times"] and f"{2**63} ms" in times["times"]
    assert not exceptions
