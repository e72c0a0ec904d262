"""``loopfuse audit``: what the fleet's loop events say, in the terminal and as an HTML report.

Loop events come from a JSONL file (``loopfuse replay`` output: verdicts and dead
letters in it are skipped) or from the loop-events topic, read up to its end offsets
as they were at the start. One :class:`AuditSummary` is computed from them; the
terminal tables and the HTML report (``loopfuse.streams.ops.audit_report``) are both drawn from
its :meth:`AuditSummary.to_dict`, so they cannot disagree.

Shadow-mode events (``enforced: false``: the gateway was told ``allow``) are counted
apart from the enforced ones; the funnel counts enforced events only. A loop event's
``event_id`` is derived from what it judged, so a record delivered again (after a worker
crash) carries the id of the first: it is counted once, and the summary says how many
such duplicates were dropped.

Every string in a loop event comes from an agent: the terminal and the report show it
through ``ops/plain`` (controls, bidi and other format characters escaped), the
terminal never as rich markup, the report only through ``textContent``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import sys
import tempfile
from collections import Counter
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import IO, Any

import orjson
from rich.console import Console
from rich.table import Table
from rich.text import Text

from loopfuse.streams.broker_access import explain
from loopfuse.streams.ops import plain

FUNNEL = ("warn", "block", "abort")
ACTIONS = ("allow", "warn", "block", "abort")
#: Time-chart bucket widths (seconds) to choose from: ~60 buckets or fewer; a span longer
#: than 60 days gets buckets of as many whole days as keep it to that.
BUCKETS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400)
MAX_BUCKETS = 60
_DAY_MS = 86_400_000


# -- input ----------------------------------------------------------------------------


_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhdw])$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_time(text: str, now: datetime | None = None) -> int:
    """Epoch ms from RFC 3339 / ISO 8601 (``2026-11-30T10:00:00Z``; no zone = UTC), a
    date (``2026-11-30``), epoch milliseconds, or a duration ago (``90m``, ``2h``, ``7d``)."""
    text = text.strip()
    now = now or datetime.now(UTC)
    relative = _RELATIVE.match(text)
    if relative:
        try:
            ago = timedelta(seconds=float(relative.group(1)) * _UNIT[relative.group(2)])
            return int((now - ago).timestamp() * 1000)
        except OverflowError:  # 99999999999w: before year 1, which datetime cannot hold
            raise ValueError(
                f"not a time: {plain.shown(text, 40)} is further back than year 1"
            ) from None
    if text.isascii() and text.isdigit():  # not "²": isdigit() takes it, int() does not
        return int(text)
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"not a time: {plain.shown(text, 40)} "
            "(use 2026-11-30T10:00:00Z, epoch ms, or 2h / 30m / 7d ago)"
        ) from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return int(parsed.timestamp() * 1000)


def loop_events_from_lines(lines: Iterable[bytes]) -> Iterator[dict[str, Any]]:
    """The ``loop_event`` objects among JSONL lines; anything else is skipped."""
    for line in lines:
        if b'"loop_event"' not in line:  # cheap pre-filter: most replay lines are verdicts
            continue
        try:
            document = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(document, dict) and document.get("type") == "loop_event":
            yield document


async def loop_events_from_topic(
    bootstrap: str, topic: str, since_ms: int | None, kafka_options: dict[str, Any]
) -> AsyncIterator[dict[str, Any]]:
    from loopfuse.streams.ops.topic_reader import read_snapshot

    # Records are looked up by their broker time; a loop event is written after its
    # event time, so start a little earlier and filter on event_ts (skewed clocks).
    seek = None if since_ms is None else since_ms - 10 * 60 * 1000
    async for value in read_snapshot(bootstrap, topic, since_ms=seek, kafka_options=kafka_options):
        for event in loop_events_from_lines([value]):
            yield event


def _event_ts(event: dict[str, Any]) -> int | None:
    """The event's time, any integer (one no date can hold included), else None."""
    ts = event.get("event_ts")
    return ts if isinstance(ts, int) and not isinstance(ts, bool) else None


def _json_time(ts: int | None) -> int | str | None:
    """A time as the report's data carries it: a number when it is a date, else its
    digits as text (JSON numbers past 2**53 lose digits in the page's JavaScript)."""
    return str(ts) if ts is not None and not plain.is_date(ts) else ts


def in_range(event: dict[str, Any], since_ms: int | None, until_ms: int | None) -> bool:
    ts = _event_ts(event)
    if ts is None:
        return since_ms is None and until_ms is None
    return (since_ms is None or ts >= since_ms) and (until_ms is None or ts < until_ms)


# -- the summary ----------------------------------------------------------------------


def _text(value: Any, missing: str = "-") -> str:
    return missing if value is None or value == "" else str(value)


@dataclass
class _Tally:
    """Counts of one row (a detector, an agent, a tool, a session or a run)."""

    actions: Counter[str] = field(default_factory=Counter)
    shadow: int = 0

    @property
    def total(self) -> int:
        return sum(self.actions.values())

    def row(self) -> dict[str, int]:
        return {
            "total": self.total,
            **{action: self.actions[action] for action in ACTIONS},
            "shadow": self.shadow,
        }


@dataclass
class _Session:
    tally: _Tally = field(default_factory=_Tally)
    agent: str = "-"
    runs: set[str] = field(default_factory=set)
    detectors: Counter[str] = field(default_factory=Counter)
    max_count: int = 0
    first_ts: int | None = None
    last_ts: int | None = None


@dataclass
class AuditSummary:
    """Loop-event counts: the single source of the terminal tables and the HTML report."""

    enforced: int = 0
    shadow: int = 0
    skipped: int = 0  # loop events without the fields a count needs
    duplicates: int = 0  # loop events whose event_id was counted already (redelivered)
    by_detector: dict[str, _Tally] = field(default_factory=dict)
    by_agent: dict[str, _Tally] = field(default_factory=dict)
    by_tool: dict[str, _Tally] = field(default_factory=dict)
    sessions: dict[str, _Session] = field(default_factory=dict)
    runs: dict[tuple[str, str], _Tally] = field(default_factory=dict)
    funnel_sessions: dict[str, set[str]] = field(default_factory=dict)
    shadow_actions: Counter[str] = field(default_factory=Counter)
    # (event_ts, detector) of each loop event whose time is a date (plain.is_date)
    times: list[tuple[int, str]] = field(default_factory=list)
    # Every id counted: no bound, as the summary itself already grows with the events.
    seen: set[str] = field(default_factory=set)

    @classmethod
    def of(cls, events: Iterable[dict[str, Any]]) -> AuditSummary:
        summary = cls()
        for event in events:
            summary.add(event)
        return summary

    def add(self, event: dict[str, Any]) -> None:
        event_id = event.get("event_id")
        if isinstance(event_id, str):
            if event_id in self.seen:
                self.duplicates += 1
                return
            self.seen.add(event_id)
        detector, action, session = (
            event.get("detector"),
            event.get("action"),
            event.get("session_key"),
        )
        if not isinstance(detector, str) or action not in ACTIONS or not isinstance(session, str):
            self.skipped += 1
            return
        shadow = event.get("enforced") is False
        agent = _text(event.get("agent_id"))
        tool = _text(event.get("tool_name"))
        run = _text(event.get("run_id"))
        tallies = [
            self.by_detector.setdefault(detector, _Tally()),
            self.by_agent.setdefault(agent, _Tally()),
            self.by_tool.setdefault(tool, _Tally()),
            self.runs.setdefault((session, run), _Tally()),
        ]
        state = self.sessions.setdefault(session, _Session(agent=agent))
        tallies.append(state.tally)
        for tally in tallies:
            if shadow:
                tally.shadow += 1
            else:
                tally.actions[action] += 1
        state.runs.add(run)
        state.detectors[detector] += 1
        count = event.get("count")
        if isinstance(count, int):
            state.max_count = max(state.max_count, count)
        ts = _event_ts(event)
        if ts is not None:
            state.first_ts = ts if state.first_ts is None else min(state.first_ts, ts)
            state.last_ts = ts if state.last_ts is None else max(state.last_ts, ts)
            if plain.is_date(ts):
                self.times.append((ts, detector))
        if shadow:
            self.shadow += 1
            self.shadow_actions[action] += 1
        else:
            self.enforced += 1
            if action in FUNNEL:
                self.funnel_sessions.setdefault(action, set()).add(session)

    # -- views ------------------------------------------------------------------------

    @property
    def total(self) -> int:
        return self.enforced + self.shadow

    def funnel(self) -> list[dict[str, Any]]:
        """warn -> block -> abort: enforced loop events and distinct sessions per stage."""
        detector_rows = self.by_detector.values()
        return [
            {
                "action": action,
                "events": sum(t.actions[action] for t in detector_rows),
                "sessions": len(self.funnel_sessions.get(action, ())),
            }
            for action in FUNNEL
        ]

    def timeline(self) -> dict[str, Any]:
        """Loop events per time bucket and detector (enforced and shadow alike), at most
        MAX_BUCKETS + 1 buckets whatever the span: two events years apart make wide
        buckets, not millions of them. A loop event without a time a date can hold (an
        older worker let any through) is counted in the totals as ``undated`` and is
        not on the chart: -2**63 ms would stretch it over 292 million years."""
        if not self.times:
            return {"start_ms": None, "bucket_s": 0, "buckets": 0, "series": {}}
        start = min(ts for ts, _ in self.times)
        end = max(ts for ts, _ in self.times)
        span_s = (end - start) / 1000
        bucket_s = next((b for b in BUCKETS if span_s / b < MAX_BUCKETS), None)
        if bucket_s is None:
            # the fewest whole days per bucket with span / bucket < MAX_BUCKETS
            bucket_s = ((end - start) // (_DAY_MS * MAX_BUCKETS) + 1) * 86_400
        start = start - start % (bucket_s * 1000)
        buckets = int((end - start) // (bucket_s * 1000)) + 1
        series: dict[str, list[int]] = {}
        for ts, detector in self.times:
            row = series.setdefault(detector, [0] * buckets)
            row[int((ts - start) // (bucket_s * 1000))] += 1
        return {
            "start_ms": start,
            "bucket_s": bucket_s,
            "buckets": buckets,
            "series": dict(sorted(series.items())),
        }

    def to_dict(self, top: int = 10, session_rows: int = 2000) -> dict[str, Any]:
        def table(rows: dict[str, _Tally], limit: int | None = None) -> list[dict[str, Any]]:
            ordered = sorted(rows.items(), key=lambda kv: (-(kv[1].total + kv[1].shadow), kv[0]))
            return [{"name": name, **tally.row()} for name, tally in ordered[:limit]]

        sessions = sorted(
            self.sessions.items(), key=lambda kv: (-(kv[1].tally.total + kv[1].tally.shadow), kv[0])
        )
        runs = sorted(self.runs.items(), key=lambda kv: (-(kv[1].total + kv[1].shadow), kv[0]))
        return {
            "totals": {
                "loop_events": self.total,
                "enforced": self.enforced,
                "shadow": self.shadow,
                "sessions": len(self.sessions),
                "runs": len(self.runs),
                "agents": len(self.by_agent),
                "tools": len(self.by_tool),
                "skipped": self.skipped,
                "duplicates": self.duplicates,
                "undated": self.total - len(self.times),
            },
            "by_detector": table(self.by_detector),
            "by_agent": table(self.by_agent, top),
            "by_tool": table(self.by_tool, top),
            "top_sessions": [
                {"name": key, "agent": s.agent, **s.tally.row()} for key, s in sessions[:top]
            ],
            "top_runs": [
                {"session": key, "run": run, **tally.row()} for (key, run), tally in runs[:top]
            ],
            "funnel": self.funnel(),
            "shadow_actions": {a: self.shadow_actions[a] for a in ACTIONS},
            "timeline": self.timeline(),
            "sessions": [
                {
                    "session": key,
                    "agent": s.agent,
                    "runs": len(s.runs),
                    **s.tally.row(),
                    "max_count": s.max_count,
                    "detectors": dict(s.detectors.most_common()),
                    "first_ts": _json_time(s.first_ts),
                    "last_ts": _json_time(s.last_ts),
                }
                for key, s in sessions[:session_rows]
            ],
            "sessions_shown": min(len(sessions), session_rows),
        }


# -- terminal -------------------------------------------------------------------------

COUNT_COLUMNS = ("total", "warn", "block", "abort", "allow", "shadow")


def _count_table(title: str, first: str, rows: list[dict[str, Any]], extra: str = "") -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column(first)
    if extra:
        table.add_column(extra)
    for column in COUNT_COLUMNS:
        table.add_column(column, justify="right")
    for row in rows:
        # names are the agents' strings: Text, never markup
        cells = [plain.text(row["name"])]
        if extra:
            cells.append(plain.text(row[extra]))
        table.add_row(*cells, *(str(row[c]) for c in COUNT_COLUMNS))
    return table


def _top(what: str, total: int, rows: list[dict[str, Any]]) -> str:
    return f"by {what[:-1]}" if len(rows) >= total else f"top {len(rows)} of {total} {what}"


def render_terminal(data: dict[str, Any], console: Console, source: str) -> None:
    def say(line: str) -> None:
        console.print(Text(line))  # a Text: no markup, no emoji codes, whatever it holds

    totals = data["totals"]
    say(
        f"loop events: {totals['loop_events']} from {plain.shown(source)} "
        f"(enforced {totals['enforced']}, shadow {totals['shadow']}) in "
        f"{totals['sessions']} sessions, {totals['runs']} runs, {totals['agents']} agents"
    )
    if totals["duplicates"]:
        say(
            f"dropped {totals['duplicates']} duplicate loop events "
            "(an event_id counted already: delivered again after a worker restart)"
        )
    if totals["skipped"]:
        say(f"skipped {totals['skipped']} loop events without detector/action/session")
    if totals["undated"]:
        say(
            f"{totals['undated']} loop events without a time a date can hold (none, before "
            "1970 or after year 9999): counted, not on the time chart"
        )
    if not totals["loop_events"]:
        return
    say("columns: total = enforced loop events (warn+block+abort+allow); shadow = enforced: false")
    console.print(_count_table("by detector", "detector", data["by_detector"]))
    console.print(
        _count_table(_top("agents", totals["agents"], data["by_agent"]), "agent", data["by_agent"])
    )
    console.print(
        _count_table(_top("tools", totals["tools"], data["by_tool"]), "tool", data["by_tool"])
    )
    console.print(_count_table("top sessions", "session", data["top_sessions"], extra="agent"))
    runs = [{**row, "name": f"{row['session']} / {row['run']}"} for row in data["top_runs"]]
    console.print(_count_table("top runs", "session / run", runs))
    funnel = Table(title="funnel (enforced)", title_justify="left")
    funnel.add_column("stage")
    funnel.add_column("loop events", justify="right")
    funnel.add_column("sessions", justify="right")
    for stage in data["funnel"]:
        funnel.add_row(stage["action"], str(stage["events"]), str(stage["sessions"]))
    console.print(funnel)
    shadow = data["shadow_actions"]
    if not totals["shadow"]:
        say("shadow mode (enforced: false): no loop events")
        return
    say(
        f"shadow mode (enforced: false, all allowed): {totals['shadow']} loop events; "
        "would have been " + ", ".join(f"{a} {shadow[a]}" for a in ACTIONS)
    )


# -- the report file ------------------------------------------------------------------


class ReportRefused(ValueError):
    """The ``--html`` target is one the report must not be written to (said in one line)."""


def check_report_target(path: str, events: str | None) -> None:
    """Refuse, before anything is read or printed, a target the report cannot or must
    not replace: a missing folder, a directory, a symlink (writing through it would
    overwrite whatever it points at), or the input itself."""
    folder = os.path.dirname(path) or "."
    if not os.path.isdir(folder):
        raise ReportRefused(
            f"cannot write the report {plain.shown(path)}: no folder {plain.shown(folder)}"
        )
    if os.path.islink(path):
        raise ReportRefused(f"refusing to write the report through the symlink {plain.shown(path)}")
    if os.path.isdir(path):
        raise ReportRefused(f"cannot write the report {plain.shown(path)}: it is a directory")
    if (
        events is not None
        and events != "-"
        and os.path.exists(path)
        and os.path.exists(events)
        and os.path.samefile(path, events)
    ):
        raise ReportRefused(f"refusing to write the report over its input {plain.shown(events)}")


def write_report(path: str, page: str) -> None:
    """Write ``page`` to a temporary file beside ``path`` and rename it over ``path``: a
    reader (or a crash) sees the old report or the new one, never half of one, and a
    rename replaces a symlink that appeared meanwhile instead of writing through it."""
    folder = os.path.dirname(path) or "."
    handle, temporary = tempfile.mkstemp(
        dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".tmp"
    )
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(page)
        # mkstemp makes it 0600; a report is as readable as any file the user creates
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, 0o666 & ~umask)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


# -- the command ----------------------------------------------------------------------


def _collect_file(path: str) -> Iterator[dict[str, Any]]:
    if path == "-":
        yield from loop_events_from_lines(sys.stdin.buffer)
        return
    with open(path, "rb") as stream:
        yield from loop_events_from_lines(stream)


async def _collect_topic(
    bootstrap: str, topic: str, since: int | None, until: int | None, options: dict[str, Any]
) -> AuditSummary:
    summary = AuditSummary()
    async for event in loop_events_from_topic(bootstrap, topic, since, options):
        if in_range(event, since, until):
            summary.add(event)
    return summary


def _fail(message: str) -> None:
    print(f"loopfuse audit: {message}", file=sys.stderr)


def run_audit(
    *,
    events: str | None,
    bootstrap: str | None,
    topic: str | None,
    since: str | None,
    until: str | None,
    html: str | None,
    top: int,
    out: IO[str] | None = None,
) -> int:
    try:
        since_ms = None if since is None else parse_time(since)
        until_ms = None if until is None else parse_time(until)
    except ValueError as exc:
        _fail(str(exc))
        return 2
    if events is not None and bootstrap is not None:
        _fail("give a JSONL file or --bootstrap, not both")
        return 2
    if html is not None:
        try:
            check_report_target(html, events)
        except (ReportRefused, OSError) as exc:
            _fail(str(exc))
            return 2
    if events is not None:
        try:
            summary = AuditSummary.of(
                e for e in _collect_file(events) if in_range(e, since_ms, until_ms)
            )
        except OSError as exc:
            _fail(f"cannot read {plain.shown(events)}: {exc.strerror or exc}")
            return 2
        source = "stdin" if events == "-" else events
    else:
        from loopfuse.streams.ops.topic_reader import TopicMissing, reader_settings

        settings = reader_settings(bootstrap)
        topic = topic or settings.topic_loop_events
        try:
            summary = asyncio.run(
                _collect_topic(
                    settings.bootstrap_servers,
                    topic,
                    since_ms,
                    until_ms,
                    settings.kafka_client_kwargs(),
                )
            )
        except TopicMissing as exc:
            _fail(str(exc))
            return 2
        except Exception as exc:  # e.g. KafkaConnectionError: one line, not a trace
            diagnosis = explain(exc, settings.bootstrap_servers, settings.kafka_client_kwargs())
            _fail(f"cannot read {plain.shown(topic)}: {diagnosis.message if diagnosis else exc}")
            return 2 if diagnosis is not None and diagnosis.lasting else 1
        source = f"{topic} at {settings.bootstrap_servers}"
    data = summary.to_dict(top=top)
    # soft_wrap: a long summary line stays one line (greppable); tables still fit 120
    console = Console(file=out or sys.stdout, width=120, highlight=False, soft_wrap=True)
    render_terminal(data, console, source)
    if html is not None:
        from loopfuse.streams.ops.audit_report import render_html

        try:
            write_report(html, render_html(data, source=source))
        except OSError as exc:  # e.g. the folder went away or is read-only: one line
            _fail(f"cannot write the report {plain.shown(html)}: {exc.strerror or exc}")
            return 1
        console.print(Text(f"report: {plain.shown(html)}"))
    return 0
