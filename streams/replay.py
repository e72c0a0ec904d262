"""Offline replay: JSONL input events in, JSONL verdicts / loop events / dead letters out.

Uses the same decoding, engine and config as the streaming worker, and each event's
own time as the clock, so the same file always gives the same output.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from typing import IO

from schemas.config import DetectionConfigFile
from schemas.decode import DEFAULT_MAX_EVENT_BYTES, EventRejected, decode_event
from schemas.events import DeadLetter
from streams.engine import Engine, Notice, Rejection, SessionState

log = logging.getLogger("loopfuse.replay")

ORIGINAL_LIMIT = 4096


def dead_letter_for_line(line_no: int, raw: bytes, code: str, reason: str) -> DeadLetter:
    text = raw[:ORIGINAL_LIMIT].decode("utf-8", "replace")
    return DeadLetter(
        error_code=code,  # type: ignore[arg-type]
        reason=reason,
        line=line_no,
        original=text,
        original_size=len(raw),
        original_truncated=len(raw) > ORIGINAL_LIMIT,
    )


def replay_lines(
    lines: Iterator[bytes],
    engine: Engine,
    *,
    max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
) -> Iterator[bytes]:
    """Yield one JSON document (bytes, no newline) per output, in input order."""
    states: dict[str, SessionState] = {}
    for line_no, line in enumerate(lines, start=1):
        raw = line.rstrip(b"\r\n")
        if not raw.strip():
            continue  # blank lines separate nothing in JSONL; skipping them loses nothing
        try:
            event = decode_event(raw, max_bytes=max_event_bytes)
        except EventRejected as exc:
            yield (
                dead_letter_for_line(line_no, raw, exc.code, exc.reason)
                .model_dump_json(exclude_none=True)
                .encode()
            )
            continue
        key = event.key
        states[key], outputs = engine.step(states.get(key), event, event.ts)
        for output in outputs:
            if isinstance(output, Notice):
                log.info(
                    "%s (session %s, run %s)", output.message, output.session_key, output.run_id
                )
            elif isinstance(output, Rejection):
                yield (
                    dead_letter_for_line(line_no, raw, output.code, output.reason)
                    .model_dump_json(exclude_none=True)
                    .encode()
                )
            else:
                yield output.to_json()


def _progress_lines(stream: IO[bytes], total: int | None) -> Iterator[bytes]:
    """Wrap a byte stream with a progress bar on stderr (only used on a terminal)."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        DownloadColumn(),
        TimeRemainingColumn(),
        console=None,
        transient=True,
        redirect_stdout=False,
        redirect_stderr=False,
    ) as progress:
        task = progress.add_task("replay", total=total)
        for line in stream:
            progress.update(task, advance=len(line))
            yield line


def run_replay(
    events_path: str,
    config: DetectionConfigFile | None,
    out: IO[bytes],
    *,
    progress: bool | None = None,
) -> int:
    engine = Engine(config)
    try:
        stream: IO[bytes] = sys.stdin.buffer if events_path == "-" else open(events_path, "rb")  # noqa: SIM115
    except OSError as exc:
        print(f"loopfuse replay: cannot read {events_path}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    with stream:
        total = None
        if events_path != "-":
            total = os.fstat(stream.fileno()).st_size
        show = sys.stderr.isatty() and (total or 0) > 1_000_000 if progress is None else progress
        lines: Iterator[bytes] = _progress_lines(stream, total) if show else iter(stream)
        try:
            for document in replay_lines(lines, engine):
                out.write(document)
                out.write(b"\n")
        except BrokenPipeError:  # e.g. `loopfuse replay big.jsonl | head`
            return 0
        except OSError as exc:
            print(f"loopfuse replay: read error: {exc}", file=sys.stderr)
            return 2
    out.flush()
    return 0
