"""``loopfuse tail``: loop events (or verdicts) as they are published, one line each.

Follows every partition of the loop-events topic (or of every topic verdicts go to:
the reply topics and the verdicts topic) from its end (no consumer group, nothing
committed), so any number of operators can tail alongside the workers. Filters by
agent, session and detector; a record that is not a loop event / verdict is skipped
with a note on stderr, never a crash. A record delivered again (its ``event_id`` /
``verdict_id`` shown a moment ago) is not shown again.

Every field of a record comes from an agent: each is written through ``ops/plain``, so
one record is one line of plain text whatever it holds (no control byte reaches the
terminal), and a time no date can hold is shown as its number of milliseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections import OrderedDict
from typing import IO, Any

import orjson

from loopfuse.streams.broker_access import explain
from loopfuse.streams.ops.plain import shown, shown_time

MESSAGE_CHARS = 120
#: Ids remembered to drop a record delivered again. Redelivery repeats what a worker
#: wrote since its last commit (seconds of output), so the latest ids are enough; the
#: bound keeps a tail that runs for weeks at a few MB.
SEEN_IDS = 50_000
_TIME_WIDTH = 23


def _field(value: Any, width: int = 0) -> str:
    return ("-" if value is None or value == "" else shown(value)).ljust(width)


def format_line(record: dict[str, Any]) -> str:
    """``time session run agent tool ACTION detector count=N message`` on one line."""
    # A message's own line breaks and runs of spaces are layout: one space each. Any
    # other control in it is shown escaped, like in every other field.
    message = shown(" ".join(str(record.get("message") or "").split()), MESSAGE_CHARS)
    shadow = " (shadow)" if record.get("enforced") is False else ""
    return "  ".join(
        (
            shown_time(record.get("event_ts")).ljust(_TIME_WIDTH),
            _field(record.get("session_key")),
            _field(record.get("run_id")),
            _field(record.get("agent_id")),
            _field(record.get("tool_name")),
            (shown(str(record.get("action", "?")).upper()) + shadow).ljust(5),
            _field(record.get("detector"), 22),
            f"count={shown(record.get('count', '-'))}",
            message,
        )
    ).rstrip()


class SeenIds:
    """The latest ``limit`` record ids, oldest forgotten first."""

    def __init__(self, limit: int = SEEN_IDS) -> None:
        self.limit = limit
        self._ids: OrderedDict[str, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._ids)

    def again(self, record_id: Any) -> bool:
        """Whether ``record_id`` was seen (and remember it); a record without an id
        (an older producer) is never taken for a repeat."""
        if not isinstance(record_id, str):
            return False
        if record_id in self._ids:
            self._ids.move_to_end(record_id)
            return True
        self._ids[record_id] = None
        if len(self._ids) > self.limit:
            self._ids.popitem(last=False)
        return False


class Filters:
    """Which records to show; an empty filter lets everything through."""

    def __init__(
        self,
        agents: list[str] | None = None,
        sessions: list[str] | None = None,
        detectors: list[str] | None = None,
    ) -> None:
        self.agents = set(agents or ())
        self.sessions = set(sessions or ())
        self.detectors = set(detectors or ())

    def match(self, record: dict[str, Any]) -> bool:
        return (
            _among(record.get("agent_id"), self.agents)
            and _among(record.get("session_key"), self.sessions)
            and _among(record.get("detector"), self.detectors)
        )


def _among(value: Any, wanted: set[str]) -> bool:
    """Whether a field passes a filter: any value when there is none, else one of its
    strings (a field holding an object, an array or a number is none of them)."""
    return not wanted or (isinstance(value, str) and value in wanted)


def parse_record(value: bytes, kind: str) -> dict[str, Any] | None:
    """The record as a dict when it is a ``kind`` object, else None."""
    try:
        document = orjson.loads(value)
    except orjson.JSONDecodeError:
        return None
    if isinstance(document, dict) and document.get("type") == kind:
        return document
    return None


async def tail(
    bootstrap: str,
    topics: tuple[str, ...],
    kind: str,
    filters: Filters,
    out: IO[str],
    *,
    count: int | None = None,
    kafka_options: dict[str, Any] | None = None,
) -> int:
    from loopfuse.streams.ops.topic_reader import follow

    names = ", ".join(topics)

    def ready(partitions: int) -> None:
        print(
            f"tail: following {names} ({partitions} partitions) from the end; Ctrl-C to stop",
            file=sys.stderr,
            flush=True,
        )

    lines = 0
    seen = SeenIds()
    id_field = "verdict_id" if kind == "verdict" else "event_id"
    stream = follow(bootstrap, topics, kafka_options=kafka_options, on_ready=ready)
    try:
        async for value in stream:
            record = parse_record(value, kind)
            if record is None:
                print(f"tail: skipped a record on {names} that is not a {kind}", file=sys.stderr)
                continue
            if seen.again(record.get(id_field)) or not filters.match(record):
                continue
            out.write(format_line(record) + "\n")
            out.flush()
            lines += 1
            if count is not None and lines >= count:
                break
    finally:
        await stream.aclose()
    return 0


def run_tail(args: argparse.Namespace) -> int:
    from loopfuse.streams.ops.topic_reader import TopicMissing, reader_settings, verdict_topics

    settings = reader_settings(args.bootstrap)
    kind = "verdict" if args.verdicts else "loop_event"
    if args.topic:
        topics: tuple[str, ...] = (args.topic,)
    elif args.verdicts:
        topics = verdict_topics(settings)
    else:
        topics = (settings.topic_loop_events,)
    filters = Filters(args.agent, args.session, args.detector)
    try:
        return asyncio.run(
            tail(
                settings.bootstrap_servers,
                topics,
                kind,
                filters,
                sys.stdout,
                count=args.count,
                kafka_options=settings.kafka_client_kwargs(),
            )
        )
    except TopicMissing as exc:
        print(f"loopfuse tail: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # loopfuse tail | head
        return 0
    except KeyboardInterrupt:
        return 0
    except Exception as exc:  # e.g. the broker is unreachable: one line, not a trace
        diagnosis = explain(exc, settings.bootstrap_servers, settings.kafka_client_kwargs())
        print(f"loopfuse tail: {diagnosis.message if diagnosis else exc}", file=sys.stderr)
        return 2 if diagnosis is not None and diagnosis.lasting else 1
