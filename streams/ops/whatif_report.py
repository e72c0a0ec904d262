"""``loopfuse whatif``'s outputs: the terminal summary and the HTML report.

Both are drawn from one document (``loopfuse.streams.ops.whatif.document``: the run's
window and ``WhatIf.to_dict``), which ``--json`` prints as it is. Every agent string (sessions,
agents, tools, messages) is shown through ``loopfuse.streams.ops.plain``: in the
terminal as a rich ``Text`` (never markup), in the page escaped inside tables the
server writes (the page runs no script at all), in the audit report's style.
"""

from __future__ import annotations

import html
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from loopfuse.streams.ops import plain
from loopfuse.streams.ops.audit_report import REPORT_CSS
from loopfuse.streams.ops.whatif_diff import LOOP_ACTIONS

STOPPED = {
    "bytes": "--max-bytes reached: the window was cut short (what was read is compared)",
    "time": "--max-seconds reached: the window was cut short (what was read is compared)",
}


def tenant_name(name: str) -> str:
    return name or "(default)"


def _name(value: str) -> Text:
    return plain.text(value) if value else Text("(none)", style="dim")


def _session_line(entry: dict[str, str]) -> str:
    return f"{tenant_name(entry['tenant'])} / {plain.shown(entry['session'])}"


def _call_line(call: dict[str, Any]) -> str:
    mark = "*" if call["changed"] else " "
    where = f"seq {call['seq']}" if call["seq"] is not None else "seq -"
    tool = plain.shown(call["tool"] or "-", 40)
    issued = call["issued"] or "none"
    candidate = call["candidate"] or "none"
    line = f"  {mark} {where} {tool} call {plain.shown(call['call_id'] or '-', 40)}: "
    line += f"{issued} -> {candidate}"
    if call["changed"] and call["message"]:
        line += f": {plain.shown(call['message'], 100)}"
    return line


def render_terminal(data: dict[str, Any], console: Console, *, calls: int) -> None:
    def say(line: str) -> None:
        console.print(Text(line))  # a Text: no markup, whatever it holds

    window, totals = data["window"], data["totals"]
    tenants = ", ".join(tenant_name(t) for t in window["tenants"])
    say(
        f"whatif {plain.shown(data['candidate'])}: {window['input_records']} input records "
        f"({window['input_bytes']} bytes) of tenants {tenants}, broker time "
        f"{window['first'] or '-'} .. {window['last'] or '-'}"
        + (f", judged by {data['judged_by']}" if data["judged_by"] else "")
    )
    if window["stopped"]:
        say(STOPPED[window["stopped"]])
    say(
        f"sessions: {totals['sessions']}, partial: {totals['partial_sessions']} "
        f"({data['partial_policy']})"
    )
    say(
        f"calls compared: {totals['calls_compared']}; changed: {totals['calls_changed']} "
        f"in {totals['sessions_changed']} sessions"
    )
    notes = [
        (
            totals["unanswered"],
            "judged, but no issued verdict found (the worker has not answered yet, or "
            "the reply topic's retention dropped it)",
        ),
        (totals["not_judged"], "issued, but no candidate verdict (its event is a dead letter)"),
        (totals["fleet_breaker"], "issued by the fleet breaker (fleet-wide: not judged here)"),
        (totals["duplicates"], "issued verdicts written twice (counted once)"),
        (window["unreadable_outputs"], "output records that are not verdicts or loop events"),
    ]
    for count, what in notes:
        if count:
            say(f"{count} {what}")
    if data["dead_letters"]:
        letters = ", ".join(f"{plain.shown(code)} {n}" for code, n in data["dead_letters"].items())
        say(f"dead letters (input the candidate cannot judge): {letters}")
        for letter in data["dead_letter_records"][:5]:
            say(f"  {plain.shown(letter['code'])} at {plain.shown(letter['record'] or '-')}")
    rows = data["by_action_detector"]
    if rows:
        table = Table(title="verdicts by action and detector", title_justify="left")
        for column in ("action", "detector", "issued", "candidate", "change"):
            table.add_column(
                column, justify="left" if column in ("action", "detector") else "right"
            )
        for row in rows:
            change = row["candidate"] - row["issued"]
            table.add_row(
                row["action"],
                plain.text(row["detector"] or "-"),
                str(row["issued"]),
                str(row["candidate"]),
                f"{change:+d}" if change else "0",
            )
        console.print(table)
    for what, key in (("agent", "by_agent"), ("tool", "by_tool")):
        changed = [r for r in data[key] if r["issued"] != r["candidate"]]
        if not changed:
            continue
        table = Table(title=f"by {what} (where it changes)", title_justify="left")
        table.add_column(what)
        for side in ("issued", "candidate"):
            for action in LOOP_ACTIONS:
                table.add_column(f"{side} {action}", justify="right")
        for row in changed:
            table.add_row(
                _name(row["name"]),
                *(str(row[side][a]) for side in ("issued", "candidate") for a in LOOP_ACTIONS),
            )
        console.print(table)
    for action in LOOP_ACTIONS:
        for label, key in (("newly", "newly"), ("no longer", "no_longer")):
            entries = data[key][action]
            if entries:
                shown = ", ".join(_session_line(e) for e in entries[:10])
                more = f" (+{len(entries) - 10} more)" if len(entries) > 10 else ""
                say(f"{label} {action}: {len(entries)} sessions: {shown}{more}")
    if data["loop_events"]:
        table = Table(title="loop events", title_justify="left")
        for column in ("detector", "action", "enforced", "issued", "candidate"):
            table.add_column(
                column, justify="right" if column in ("issued", "candidate") else "left"
            )
        for row in data["loop_events"]:
            if row["issued"] != row["candidate"]:
                table.add_row(
                    plain.text(row["detector"]),
                    plain.text(row["action"]),
                    "yes" if row["enforced"] else "shadow",
                    str(row["issued"]),
                    str(row["candidate"]),
                )
        if table.row_count:
            console.print(table)
    if not totals["sessions_changed"]:
        say("no change: the candidate gives every compared call the verdict that was issued")
        return
    say("changed sessions (* a call whose verdict changes; issued -> candidate):")
    for session in data["sessions"]:
        agent = plain.shown(session["agent"] or "-", 60)
        partial = " [partial]" if session["partial"] else ""
        say(f"{_session_line(session)} agent {agent}{partial}")
        changed = [c for c in session["calls"] if c["changed"]]
        for call in changed[:calls]:
            say(_call_line(call))
        if len(changed) > calls:
            say(f"    (+{len(changed) - calls} more changed calls: --json or --html has them all)")
    if data["sessions_shown"] < totals["sessions_changed"]:
        say(f"(+{totals['sessions_changed'] - data['sessions_shown']} more changed sessions)")


# -- HTML -----------------------------------------------------------------------------

#: The page runs no script: every value is written escaped into its tables.
CSP = "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"


def _cell(value: object, limit: int | None = 200, css: str = "text") -> str:
    return f'<td class="{css}">{html.escape(plain.shown(value, limit))}</td>'


def _number(value: int) -> str:
    return f"<td>{value}</td>"


def _table(head: list[str], rows: list[str]) -> str:
    if not rows:
        return '<p class="muted">none</p>'
    header = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    return f"<table><tr>{header}</tr>{''.join(rows)}</table>"


def render_html(data: dict[str, Any]) -> str:
    window, totals = data["window"], data["totals"]
    cards = "".join(
        f'<div class="card"><b data-metric="{key}">{totals[key]}</b><span>{html.escape(label)}</span></div>'
        for key, label in (
            ("sessions", "sessions"),
            ("partial_sessions", "partial sessions"),
            ("calls_compared", "calls compared"),
            ("calls_changed", "calls changed"),
            ("sessions_changed", "sessions changed"),
            ("unanswered", "no issued verdict found"),
            ("dead_letters", "dead letters"),
        )
    )
    pairs = [
        f"<tr>{_cell(r['action'])}{_cell(r['detector'] or '-')}{_number(r['issued'])}"
        f"{_number(r['candidate'])}{_number(r['candidate'] - r['issued'])}</tr>"
        for r in data["by_action_detector"]
    ]

    def side_rows(key: str) -> list[str]:
        return [
            f"<tr>{_cell(r['name'] or '(none)')}"
            + "".join(_number(r["issued"][a]) for a in LOOP_ACTIONS)
            + "".join(_number(r["candidate"][a]) for a in LOOP_ACTIONS)
            + "</tr>"
            for r in data[key]
        ]

    side_head = ["", "issued warn", "block", "abort", "candidate warn", "block", "abort"]
    moves = [
        f"<tr>{_cell(label + ' ' + action)}{_number(len(data[key][action]))}"
        f"{_cell(', '.join(_session_line(e) for e in data[key][action][:50]) or '-', None)}</tr>"
        for action in LOOP_ACTIONS
        for label, key in (("newly", "newly"), ("no longer", "no_longer"))
    ]
    loops = [
        f"<tr>{_cell(r['detector'])}{_cell(r['action'])}{_cell('yes' if r['enforced'] else 'shadow')}"
        f"{_number(r['issued'])}{_number(r['candidate'])}</tr>"
        for r in data["loop_events"]
    ]
    sessions = []
    for session in data["sessions"]:
        calls = "".join(
            f"<tr>{_cell('*' if c['changed'] else '')}{_cell(c['seq'] if c['seq'] is not None else '-')}"
            f"{_cell(c['tool'] or '-')}{_cell(c['call_id'] or '-')}{_cell(c['issued'] or 'none')}"
            f"{_cell(c['candidate'] or 'none')}{_cell(c['message'] or '')}</tr>"
            for c in session["calls"]
        )
        title = f"{_session_line(session)} (agent {plain.shown(session['agent'] or '-')})"
        if session["partial"]:
            title += " [partial]"
        sessions.append(
            f"<details><summary>{html.escape(title)}</summary><table><tr><th></th><th>seq</th>"
            "<th>tool</th><th>call</th><th>issued</th><th>candidate</th><th>message</th></tr>"
            f"{calls}</table></details>"
        )
    subtitle = (
        f"candidate {plain.shown(data['candidate'], None)} on {window['input_records']} input "
        f"records of tenants {', '.join(tenant_name(t) for t in window['tenants'])}, broker "
        f"time {window['first'] or '-'} .. {window['last'] or '-'}"
    )
    notes = [data["partial_policy"]]
    if window["stopped"]:
        notes.append(STOPPED[window["stopped"]])
    body = "".join(
        [
            f'<section class="wide"><h2>Totals</h2><div class="cards">{cards}</div>',
            "".join(f'<p class="muted">{html.escape(n)}</p>' for n in notes),
            "</section>",
            "<section><h2>Verdicts by action and detector</h2>",
            _table(["action", "detector", "issued", "candidate", "change"], pairs),
            "</section>",
            "<section><h2>Sessions that would newly reach, or no longer reach</h2>",
            _table(["", "sessions", "which"], moves),
            "</section>",
            '<section><h2>By agent</h2><div class="scroll">',
            _table(["agent", *side_head[1:]], side_rows("by_agent")),
            "</div></section>",
            '<section><h2>By tool</h2><div class="scroll">',
            _table(["tool", *side_head[1:]], side_rows("by_tool")),
            "</div></section>",
            '<section class="wide"><h2>Loop events</h2>',
            _table(["detector", "action", "enforced", "issued", "candidate"], loops),
            "</section>",
            '<section class="wide"><h2>Changed sessions (* a changed call)</h2><div class="scroll">',
            "".join(sessions) or '<p class="muted">none</p>',
            "</div></section>",
        ]
    )
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">\n'
        f"<title>loopfuse whatif</title>\n<style>{REPORT_CSS}</style>\n</head>\n<body>\n"
        f"<header><h1>loopfuse whatif</h1><p>{html.escape(subtitle)}</p></header>\n"
        f"<main>{body}</main>\n</body>\n</html>\n"
    )
