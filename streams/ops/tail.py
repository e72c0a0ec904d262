"""``loopfuse tail``: loop events (or verdicts) as they are published, one line each.

Follows every partition of the topic from its end (no consumer group, nothing
committed), so any number of operators can tail alongside the workers. Filters by
agent, session and detector; a record that is not a loop event / verdict is skipped
with a note on stderr, never a crash.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from datetime import UTC, datetime
from typing import IO, Any

import orjson

MESSAGE_CHARS = 120


def _time(ms: Any) -> str:
    if not isinstance(ms, int):
        return "-" * 23
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:23]


def _field(value: Any, width: int = 0) -> str:
    text = "-" if value is None or value == "" else str(value)
    return text.ljust(width)


def format_line(record: dict[str, Any]) -> str:
    """``time session run agent tool ACTION detector count=N message`` on one line."""
    message = " ".join(str(record.get("message") or "").split())
    if len(message) > MESSAGE_CHARS:
        message = message[: MESSAGE_CHARS - 1] + "…"
    shadow = " (shadow)" if record.get("enforced") is False else ""
    return "  ".join(
        (
            _time(record.get("event_ts")),
            _field(record.get("session_key")),
            _field(record.get("run_id")),
            _field(record.get("agent_id")),
            _field(record.get("tool_name")),
            _field(str(record.get("action", "?")).upper() + shadow, 5),
            _field(record.get("detector"), 22),
            f"count={record.get('count', '-')}",
            message,
        )
    ).rstrip()


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
            (not self.agents or record.get("agent_id") in self.agents)
            and (not self.sessions or record.get("session_key") in self.sessions)
            and (not self.detectors or record.get("detector") in self.detectors)
        )


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
    topic: str,
    kind: str,
    filters: Filters,
    out: IO[str],
    *,
    count: int | None = None,
    kafka_options: dict[str, Any] | None = None,
) -> int:
    from loopfuse.streams.ops.topic_reader import follow

    def ready(partitions: int) -> None:
        print(
            f"tail: following {topic} ({partitions} partitions) from the end; Ctrl-C to stop",
            file=sys.stderr,
            flush=True,
        )

    shown = 0
    stream = follow(bootstrap, topic, kafka_options=kafka_options, on_ready=ready)
    try:
        async for value in stream:
            record = parse_record(value, kind)
            if record is None:
                print(f"tail: skipped a record on {topic} that is not a {kind}", file=sys.stderr)
                continue
            if not filters.match(record):
                continue
            out.write(format_line(record) + "\n")
            out.flush()
            shown += 1
            if count is not None and shown >= count:
                break
    finally:
        await stream.aclose()
    return 0


def run_tail(args: argparse.Namespace) -> int:
    from loopfuse.streams.ops.topic_reader import TopicMissing, reader_settings

    settings = reader_settings(args.bootstrap)
    kind = "verdict" if args.verdicts else "loop_event"
    topic = args.topic or (settings.topic_verdicts if args.verdicts else settings.topic_loop_events)
    filters = Filters(args.agent, args.session, args.detector)
    try:
        return asyncio.run(
            tail(
                settings.bootstrap_servers,
                topic,
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
        print(f"loopfuse tail: {exc}", file=sys.stderr)
        return 1
