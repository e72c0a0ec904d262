"""``loopfuse whatif``: a candidate config judged on the fleet's own past traffic.

It reads a window of every served tenant's input topics (from a time or from offsets,
up to now or a time; bounded in bytes and wall-clock time) without a consumer group
and without writing anything, judges each tenant's events with the candidate config
on the engine ``loopfuse replay`` runs (given by the caller as a :data:`Judge`, so that
this module needs nothing of the worker), reads the verdicts the worker issued for the
same calls (each tenant's verdicts and reply topics) and the loop events, and compares
them (``loopfuse.streams.ops.whatif_diff``).

Sessions that began before the window are judged from their first event in it, as if
they began there, and reported as *partial*: the detectors see none of their earlier
calls, so a partial session may differ from what was issued even with the worker's own
config. The session-state changelog is not read (it holds each session's latest state,
not its state when the window opens). To judge a partial session from its first event
in the window, its events' ``seq`` are renumbered from 0 before judging (else the
engine would wait for the missing ones) and numbered back in what is compared.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import IO, TYPE_CHECKING, Any

import orjson

from loopfuse.schemas.decode import EventRejected, decode_event
from loopfuse.streams.ops import plain
from loopfuse.streams.ops.topic_reader import RangeRecord, ReadBudget, read_range
from loopfuse.streams.ops.whatif_diff import WhatIf, verdict_parts

if TYPE_CHECKING:
    from loopfuse.streams.settings import Settings

#: Judges an ordered stream of input events (wire bytes, one per item) with the
#: candidate config: its outputs (verdict, loop-event and dead-letter JSON) in order.
Judge = Callable[[Iterator[bytes]], Iterator[bytes]]

#: The output topics are read from this long before the window opens: a verdict is
#: stamped by the worker's clock, its call by the gateway's.
OUTPUT_SLACK_MS = 10 * 60 * 1000

PARTIAL_POLICY = (
    "a session begun before the window is judged from its first event in it, "
    "its earlier calls unseen"
)


@dataclass(frozen=True, slots=True)
class Tenant:
    """One tenant's topics as whatif reads them."""

    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Window:
    """What to read: from ``since_ms`` (broker time) or ``offsets``, up to ``until_ms``
    (None: the end as of the start), at most ``max_bytes`` of input records (and as
    many of output records), within ``seconds`` of wall-clock time."""

    since_ms: int | None = None
    until_ms: int | None = None
    offsets: dict[tuple[str, int], int] | None = None
    max_bytes: int | None = None
    seconds: float | None = None


@dataclass(frozen=True, slots=True)
class _Event:
    """An input record's fields that name and number it (None: not an event)."""

    session: str
    incarnation: str | None
    seq: int | None
    call_id: object


#: An event of the window as the outputs name it: (session, incarnation, seq), or for
#: an event without ``seq`` (v1 allows it) (session, incarnation, ("call", call_id)).
WindowKey = tuple[str, str | None, int | tuple[str, str]]


def window_key(session: str, incarnation: object, seq: object, call_id: object) -> WindowKey | None:
    """The window key of an event or an output naming it (None: it names no event)."""
    if incarnation is not None and not isinstance(incarnation, str):
        return None
    if isinstance(seq, int) and not isinstance(seq, bool):
        return (session, incarnation, seq)
    if seq is None and isinstance(call_id, str):
        return (session, incarnation, ("call", call_id))
    return None


def _event_of(value: bytes) -> _Event | None:
    try:
        document = orjson.loads(value)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(document, dict):
        return None
    session = document.get("session_key") or document.get("run_id") or ""
    incarnation = document.get("incarnation")
    seq = document.get("seq")
    if not isinstance(session, str) or not (incarnation is None or isinstance(incarnation, str)):
        return None
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
        seq = None
    return _Event(session, incarnation, seq, document.get("call_id"))


@dataclass
class Prepared:
    """One tenant's window, ready to judge: the lines in order, where each came from,
    and how partial sessions were renumbered."""

    lines: list[bytes] = field(default_factory=list)
    #: where each line came from (its dead letter names it)
    sources: list[RangeRecord] = field(default_factory=list)
    #: (session, incarnation) -> the first seq in the window (renumbered from 0 when > 0)
    shifts: dict[tuple[str, str | None], int] = field(default_factory=dict)
    #: every event in the window, as published
    events: set[WindowKey] = field(default_factory=set)
    #: records with no text to judge (a null value, blanks) and their dead-letter codes:
    #: the worker dead-letters them, a replay of lines skips them
    blank: list[tuple[RangeRecord, str]] = field(default_factory=list)

    @property
    def partial(self) -> set[str]:
        return {session for (session, _), first in self.shifts.items() if first > 0}


def prepare(records: Sequence[RangeRecord], topic_order: Sequence[str]) -> Prepared:
    """Order one tenant's records as one input (broker time, then topic, partition and
    offset: the engine puts each session's events in ``seq`` order itself) and renumber
    the sessions that began before the window. A record that is not an event goes on
    as it is: the judge gives it its dead letter."""
    rank = {topic: index for index, topic in enumerate(topic_order)}
    prepared = Prepared()
    judged: list[RangeRecord] = []
    for record in records:
        if record.value is None or not record.value.rstrip(b"\r\n").strip():
            try:
                decode_event(record.value or b"")
            except EventRejected as exc:
                prepared.blank.append((record, exc.code))
        else:
            judged.append(record)
    ordered = sorted(
        judged, key=lambda r: (r.timestamp, rank.get(r.topic, len(rank)), r.partition, r.offset)
    )
    events = [_event_of(r.value) for r in ordered if r.value is not None]
    spaces: dict[tuple[str, str | None], list[int]] = {}
    for index, event in enumerate(events):
        if event is None:
            continue
        key = window_key(event.session, event.incarnation, event.seq, event.call_id)
        if key is not None:
            prepared.events.add(key)
        if event.seq is not None:
            spaces.setdefault((event.session, event.incarnation), []).append(index)
    renumbered: set[int] = set()
    for space, indices in spaces.items():
        if min(_seq(events[i]) for i in indices) == 0:
            prepared.shifts[space] = 0
            continue
        # Begun before the window: numbered from its first event the worker would judge
        # (one it dead-letters, say a seq past the wire's bounds, stays as it was).
        valid = [i for i in indices if _judgeable(ordered[i])]
        prepared.shifts[space] = min((_seq(events[i]) for i in valid), default=0)
        renumbered.update(valid)
    for index, (record, event) in enumerate(zip(ordered, events, strict=True)):
        assert record.value is not None
        value = record.value
        if index in renumbered and event is not None:
            shift = prepared.shifts[(event.session, event.incarnation)]
            if shift:
                value = orjson.dumps({**orjson.loads(value), "seq": _seq(event) - shift})
        prepared.lines.append(value)
        prepared.sources.append(record)
    return prepared


def _seq(event: _Event | None) -> int:
    assert event is not None and event.seq is not None
    return event.seq


def _judgeable(record: RangeRecord) -> bool:
    """Whether the decoder takes the record (the worker judges it, not dead-letters it)."""
    try:
        decode_event(record.value or b"")
    except Exception:  # EventRejected, or a decoder bug: either way not renumbered
        return False
    return True


def _where(record: RangeRecord | None) -> str | None:
    return None if record is None else f"{record.topic}[{record.partition}]@{record.offset}"


def judge_tenant(tenant: str, prepared: Prepared, judge: Judge, whatif: WhatIf) -> None:
    """Judge one tenant's window with the candidate and add what it gave to ``whatif``."""
    for session in prepared.partial:
        whatif.partial((tenant, session))
    for record, code in prepared.blank:
        whatif.dead_letter(code, _where(record))
    for output in judge(iter(prepared.lines)):
        document = orjson.loads(output)
        kind = document.get("type")
        if kind == "dead_letter":
            line = document.get("line")
            source = prepared.sources[line - 1] if isinstance(line, int) else None
            whatif.dead_letter(str(document.get("error_code")), _where(source))
            continue
        session, incarnation, seq = (
            document.get("session_key"),
            document.get("incarnation"),
            document.get("seq"),
        )
        if isinstance(seq, int) and isinstance(session, str):
            document["seq"] = seq + prepared.shifts.get((session, incarnation), 0)
        if kind == "verdict":
            parts = verdict_parts(document, tenant)
            if parts is not None:
                whatif.judged(*parts)
        elif kind == "loop_event":
            whatif.loop_event(
                str(document.get("detector")),
                str(document.get("action")),
                document.get("enforced") is not False,
                candidate=True,
            )


def add_issued(
    value: bytes, tenant: str | None, windows: dict[str, Prepared], whatif: WhatIf
) -> bool:
    """Add one output record (a verdict of ``tenant``'s, or a loop event when ``tenant``
    is None) if it answers an event in the window; False when it is not readable."""
    try:
        document = orjson.loads(value)
    except orjson.JSONDecodeError:
        return False
    if not isinstance(document, dict):
        return False
    session = document.get("session_key")
    key = None
    if isinstance(session, str):
        key = window_key(
            session, document.get("incarnation"), document.get("seq"), document.get("call_id")
        )
    if key is None:
        return document.get("type") in ("verdict", "loop_event")  # a fleet-wide one: no seq
    names = list(windows) if tenant is None else [tenant]
    if not any(key in windows[name].events for name in names):
        return True  # a call outside the window
    if tenant is not None:
        parts = verdict_parts(document, tenant)
        if parts is None:
            return False
        whatif.issued(*parts)
    elif document.get("type") == "loop_event":
        whatif.loop_event(
            str(document.get("detector")),
            str(document.get("action")),
            document.get("enforced") is not False,
            candidate=False,
        )
    return True


@dataclass
class Outcome:
    """What a run read and found."""

    whatif: WhatIf
    input_records: int = 0
    input_bytes: int = 0
    output_records: int = 0
    unreadable_outputs: int = 0
    first_ms: int | None = None
    last_ms: int | None = None
    stopped: str | None = None  # "bytes" or "time": the window was cut short


async def collect(
    bootstrap: str,
    tenants: Sequence[Tenant],
    loop_events_topic: str,
    window: Window,
    judge: Judge,
    kafka_options: dict[str, Any],
) -> Outcome:
    """Read the window, judge it, read what was issued: the comparison."""
    loop = asyncio.get_running_loop()
    deadline = None if window.seconds is None else loop.time() + window.seconds
    inputs = ReadBudget(window.max_bytes, deadline)
    tenant_of = {topic: tenant.name for tenant in tenants for topic in tenant.inputs}
    records: dict[str, list[RangeRecord]] = {tenant.name: [] for tenant in tenants}
    outcome = Outcome(WhatIf())
    async for record in read_range(
        bootstrap,
        list(tenant_of),
        since_ms=window.since_ms,
        until_ms=window.until_ms,
        offsets=window.offsets,
        budget=inputs,
        kafka_options=kafka_options,
    ):
        records[tenant_of[record.topic]].append(record)
        outcome.input_records += 1
        first, last = outcome.first_ms, outcome.last_ms
        outcome.first_ms = record.timestamp if first is None else min(first, record.timestamp)
        outcome.last_ms = record.timestamp if last is None else max(last, record.timestamp)
    outcome.input_bytes = inputs.used_bytes
    outcome.stopped = inputs.stopped
    windows: dict[str, Prepared] = {}
    for tenant in tenants:
        windows[tenant.name] = prepare(records.pop(tenant.name), tenant.inputs)
        judge_tenant(tenant.name, windows[tenant.name], judge, outcome.whatif)
    if outcome.first_ms is None:
        return outcome  # nothing in the window: nothing was issued for it
    start = min(outcome.first_ms, window.since_ms or outcome.first_ms) - OUTPUT_SLACK_MS
    output_of: dict[str, str | None] = {
        topic: tenant.name for tenant in tenants for topic in tenant.outputs
    }
    output_of[loop_events_topic] = None
    outputs = ReadBudget(window.max_bytes, deadline)
    async for record in read_range(
        bootstrap, list(output_of), since_ms=start, budget=outputs, kafka_options=kafka_options
    ):
        if record.value is None:
            continue
        outcome.output_records += 1
        if not add_issued(record.value, output_of[record.topic], windows, outcome.whatif):
            outcome.unreadable_outputs += 1
    outcome.stopped = outcome.stopped or outputs.stopped
    return outcome


def _time(ms: int | None) -> str | None:
    if ms is None:
        return None
    moment = datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")
    return moment.replace("+00:00", "Z")


def document(
    outcome: Outcome,
    *,
    candidate: str,
    tenants: list[str],
    judged_by: str = "",
    session_rows: int = 1000,
) -> dict[str, Any]:
    """The whole result as plain data: what ``--json`` prints and both views draw."""
    return {
        "candidate": candidate,
        "judged_by": judged_by,
        "window": {
            "tenants": tenants,
            "input_records": outcome.input_records,
            "input_bytes": outcome.input_bytes,
            "first": _time(outcome.first_ms),
            "last": _time(outcome.last_ms),
            "output_records": outcome.output_records,
            "unreadable_outputs": outcome.unreadable_outputs,
            "stopped": outcome.stopped,
        },
        "partial_policy": PARTIAL_POLICY,
        **outcome.whatif.to_dict(session_rows=session_rows),
    }


# -- the command ----------------------------------------------------------------------


class UsageError(ValueError):
    """A flag the command cannot use (said in one line, exit status 2)."""


def parse_offsets(values: Sequence[str], inputs: Sequence[str]) -> dict[tuple[str, int], int]:
    """``TOPIC:PARTITION=OFFSET`` (comma-separated or repeated) of the input topics read."""
    offsets: dict[tuple[str, int], int] = {}
    for item in (part.strip() for value in values for part in value.split(",")):
        if not item:
            continue
        topic, colon, rest = item.rpartition(":")
        partition, equals, offset = rest.partition("=")
        if not (colon and equals and partition.isdigit() and offset.isdigit()):
            raise UsageError(f"--offsets takes TOPIC:PARTITION=OFFSET, got {plain.shown(item, 80)}")
        if topic not in inputs:
            raise UsageError(
                f"--offsets names {plain.shown(topic, 80)}, which is not an input topic read "
                f"({', '.join(inputs)})"
            )
        offsets[(topic, int(partition))] = int(offset)
    return offsets


def tenants_read(settings: Settings, chosen: Sequence[str] | None) -> list[Tenant]:
    """The served tenants (LOOPFUSE_TENANTS and the default one), or those ``--tenant``
    picks ('' is the default tenant)."""
    served = {tenant.name: tenant for tenant in settings.served_tenants}
    names = list(served) if not chosen else list(dict.fromkeys(chosen))
    unknown = [name for name in names if name not in served]
    if unknown:
        known = ", ".join(name or "'' (the default tenant)" for name in served)
        raise UsageError(
            f"--tenant {plain.shown(unknown[0], 80)} is not served (served: {known}; "
            "LOOPFUSE_TENANTS names the others)"
        )
    return [Tenant(name, served[name].inputs, served[name].outputs) for name in names]


def run_whatif(args: Any, judge: Judge, *, judged_by: str = "", out: IO[str] | None = None) -> int:
    """``loopfuse whatif``: the flags in ``args`` (see the CLI), the candidate as ``judge``
    (``judged_by`` names the engine behind it)."""
    from rich.console import Console
    from rich.text import Text

    from loopfuse.streams.broker_access import explain
    from loopfuse.streams.ops.audit import (
        ReportRefused,
        check_report_target,
        parse_time,
        write_report,
    )
    from loopfuse.streams.ops.topic_reader import TopicMissing, reader_settings
    from loopfuse.streams.ops.whatif_report import render_html, render_terminal

    def fail(message: str) -> None:
        print(f"loopfuse whatif: {message}", file=sys.stderr)

    settings = reader_settings(args.bootstrap)
    try:
        tenants = tenants_read(settings, args.tenant)
        starts = [value for value in (args.since, args.from_time) if value is not None]
        if len(starts) > 1:
            raise UsageError("give --since or --from, not both")
        since_ms = parse_time(starts[0]) if starts else None
        until_ms = None if args.until is None else parse_time(args.until)
        inputs = [topic for tenant in tenants for topic in tenant.inputs]
        offsets = parse_offsets(args.offsets, inputs) if args.offsets else None
        if since_ms is None and offsets is None:
            raise UsageError("give where the window starts: --since, --from or --offsets")
        if args.max_bytes <= 0 or args.max_seconds <= 0 or args.calls < 0:
            raise UsageError("--max-bytes and --max-seconds must be more than 0, --calls 0 or more")
        if args.html is not None:
            check_report_target(args.html, None)
    except (UsageError, ValueError, ReportRefused, OSError) as exc:
        fail(str(exc))
        return 2
    window = Window(since_ms, until_ms, offsets, args.max_bytes, args.max_seconds)
    try:
        outcome = asyncio.run(
            collect(
                settings.bootstrap_servers,
                tenants,
                settings.topic_loop_events,
                window,
                judge,
                settings.kafka_client_kwargs(),
            )
        )
    except TopicMissing as exc:
        fail(str(exc))
        return 2
    except Exception as exc:  # e.g. KafkaConnectionError: one line, not a trace
        diagnosis = explain(exc, settings.bootstrap_servers, settings.kafka_client_kwargs())
        fail(f"cannot read the window: {diagnosis.message if diagnosis else exc}")
        return 2 if diagnosis is not None and diagnosis.lasting else 1
    data = document(
        outcome,
        candidate=args.config,
        tenants=[tenant.name for tenant in tenants],
        judged_by=judged_by,
    )
    stream = out or sys.stdout
    if args.json:
        stream.write(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        console = Console(file=stream, width=120, highlight=False, soft_wrap=True)
        render_terminal(data, console, calls=args.calls)
    if args.html is not None:
        try:
            write_report(args.html, render_html(data))
        except OSError as exc:
            fail(f"cannot write the report {plain.shown(args.html)}: {exc.strerror or exc}")
            return 1
        if not args.json:
            Console(file=stream, highlight=False).print(Text(f"report: {plain.shown(args.html)}"))
    return 0
