"""Offline replay: JSONL input events in, JSONL verdicts / loop events / dead letters out.

Uses the same decoding, engine and config as the streaming worker, and each event's
own time as the clock, so the same file always gives the same output.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Iterator
from itertools import islice
from typing import IO, Any

from loopfuse.schemas.config import DetectionConfigFile
from loopfuse.schemas.decode import DEFAULT_MAX_DEPTH, DEFAULT_MAX_EVENT_BYTES, EventRejected
from loopfuse.streams.engine import Engine
from loopfuse.streams.engine.native_step import NativeEngine, ReplayStop, native_for
from loopfuse.streams.engine.wire import decode_fingerprinted
from loopfuse.streams.worker.fold import PythonFold
from loopfuse.streams.worker.outgoing import Limits, Source, dead_letter

log = logging.getLogger("loopfuse.replay")

ORIGINAL_LIMIT = 4096


#: A replayed session's state is checkpointed (encoded) every this many steps, so an
#: event that fails can be undone without keeping a copy of the state per event.
CHECKPOINT_EVERY = 8

#: Lines read ahead and judged in one native call (NativeEngine.replay_lines: a call
#: from Python per line, and its loop, were a third of the offline path's time): a
#: line's outputs are written once its batch is judged.
BATCH_LINES = 256


def replay_lines(
    lines: Iterator[bytes],
    engine: Engine,
    *,
    max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
    limits: Limits | None = None,
) -> Iterator[bytes]:
    """Yield one JSON document (bytes, no newline) per output, in input order.

    Every line gets its outputs or a dead letter; a bad line changes nothing else
    (the same poison isolation as the worker's, see loopfuse.streams.worker.processor).
    The native fold reads BATCH_LINES lines ahead of its outputs.
    """
    limits = limits or Limits(dead_letter_original_bytes=ORIGINAL_LIMIT)
    max_identifier_bytes = limits.max_identifier_bytes
    native = native_for(engine)
    if native is not None and _bounded(limits):
        yield from _replay_native(lines, native, max_event_bytes, limits)
        return
    folds: dict[str, PythonFold] = {}
    for line_no, line in enumerate(lines, start=1):
        raw = line.rstrip(b"\r\n")
        source = Source(line=line_no, value=raw)
        try:
            event, fingerprints = decode_fingerprinted(
                raw, max_bytes=max_event_bytes, max_identifier_bytes=max_identifier_bytes
            )
        except EventRejected as exc:
            if not raw.strip():
                continue  # blank lines separate nothing in JSONL; skipping them loses nothing
            yield dead_letter(source, exc.code, exc.reason, limits).value
            continue
        except Exception as exc:  # a decoder bug must not end the replay
            log.exception("decoding line %d failed", line_no)
            yield dead_letter(source, "invalid_event", f"undecodable: {exc!r}", limits).value
            continue
        key = event.key
        fold = folds.get(key)
        if fold is None:
            fold = folds[key] = PythonFold(
                engine=engine,
                key=key.encode("utf-8", "surrogatepass"),
                limits=limits,
                base=None,
                state=None,
            )
        for message in fold.apply(event, source, event.ts, None, fingerprints):
            yield message.value
        if fold.notices:
            for notice in fold.notices:
                log.info(
                    "%s (session %s, run %s)", notice.message, notice.session_key, notice.run_id
                )
            fold.notices.clear()
        if len(fold.steps) >= CHECKPOINT_EVERY:
            fold.checkpoint()  # its messages were written as each event was judged
            for letter in fold.isolated:  # an event that broke the state: said late
                yield letter.value


#: What a native verdict or loop event can weigh at most besides its identifiers (each at
#: most ``max_identifier_bytes``, escaped at most 6x; a message names two tool names).
_OUTPUT_FIXED_BYTES = 4_096
_IDENTIFIERS_PER_OUTPUT = 16


def _bounded(limits: Limits) -> bool:
    """Whether no native output can be over the producer's size, nor a state past
    shedding, with these limits (so that what the Python fold would dead-letter for
    it never arises and the native fold needs no undo; the defaults are far inside)."""
    largest = _OUTPUT_FIXED_BYTES + 6 * _IDENTIFIERS_PER_OUTPUT * limits.max_identifier_bytes
    return largest < limits.output_budget and limits.max_state_bytes >= 65_536


def _replay_native(
    lines: Iterator[bytes], native: NativeEngine, max_event_bytes: int, limits: Limits
) -> Iterator[bytes]:
    """``replay_lines`` through the native fold (the default path): the same lines out.

    Lines are judged a batch at a time in Rust; one it leaves to the Python decoder (an
    RFC 3339 ``ts``, a big integer, every rejection) is judged alone, as before.
    Checkpoints every CHECKPOINT_EVERY steps too (``state_codec.fit``'s bytes, shedding
    the oldest evidence over the cap). It has no undo: a native step fails only if
    the Python it asks on rare paths does, and then its line is a dead letter.
    """
    states: dict[str, Any] = {}
    bounds = {
        "max_bytes": max_event_bytes,
        "max_depth": DEFAULT_MAX_DEPTH,
        "max_identifier_bytes": limits.max_identifier_bytes,
        "checkpoint_every": CHECKPOINT_EVERY,
        "max_state_bytes": limits.max_state_bytes,
    }
    judge_lines = native.replay_lines
    first_line = 1  # the line number of batch[0]
    while batch := list(islice(lines, BATCH_LINES)):
        start = 0
        source_of = _batch_source(batch, first_line)
        while start < len(batch):
            outputs, start, stop, value = judge_lines(states, batch, start, **bounds)
            yield from _written(outputs, limits, source_of)
            if stop == ReplayStop.CHECKPOINT:
                _, states[value] = native.checkpoint(states[value], limits.max_state_bytes)
            elif stop == ReplayStop.FAILED:
                log.error("judging line %d failed", first_line + start, exc_info=value)
                source = Source(line=first_line + start, value=batch[start].rstrip(b"\r\n"))
                yield dead_letter(source, "engine_error", f"engine error: {value!r}", limits).value
                start += 1
            elif stop == ReplayStop.LEFT:
                yield from _replay_alone(
                    states, batch[start], first_line + start, native, bounds, limits
                )
                start += 1
        first_line += len(batch)


def _replay_alone(
    states: dict[str, Any],
    line: bytes,
    line_no: int,
    native: NativeEngine,
    bounds: dict[str, int],
    limits: Limits,
) -> Iterator[bytes]:
    """One line the native decoder left to Python's (``replay_step``): its outputs."""
    raw = line.rstrip(b"\r\n")
    try:
        key, outputs, due = native.replay_step(states, raw, **bounds)
    except EventRejected as exc:
        if raw.strip():  # blank lines separate nothing in JSONL; skipping them loses nothing
            yield dead_letter(Source(line=line_no, value=raw), exc.code, exc.reason, limits).value
        return
    except Exception as exc:  # a native step failed: said, and nothing else stops
        log.exception("judging line %d failed", line_no)
        source = Source(line=line_no, value=raw)
        yield dead_letter(source, "engine_error", f"engine error: {exc!r}", limits).value
        return
    yield from _written(outputs, limits, lambda _: Source(line=line_no, value=raw))
    if due:
        _, states[key] = native.checkpoint(states[key], limits.max_state_bytes)


def _batch_source(batch: list[bytes], first_line: int) -> Callable[[tuple[Any, ...]], Source]:
    """The dead letter's source of a batch's rejection (its line's index last)."""
    return lambda rejection: Source(
        line=first_line + rejection[3], value=batch[rejection[3]].rstrip(b"\r\n")
    )


def _written(
    outputs: list[Any], limits: Limits, source_of: Callable[[tuple[Any, ...]], Source]
) -> Iterator[bytes]:
    """A native step's outputs as replay writes them: verdicts and loop events as they
    are, a rejection as the dead letter of its line (``source_of`` it), notices logged."""
    for output in outputs:
        if type(output) is bytes:  # a verdict or a loop event, as published
            yield output
        elif output[0] == "rejection":
            yield dead_letter(source_of(output), output[1], output[2], limits).value
        else:
            log.info("%s (session %s, run %s)", output[2], output[3], output[4])


def _progress_lines(stream: IO[bytes], total: int | None) -> Iterator[bytes]:
    """Wrap a byte stream with a progress bar on stderr (only used on a terminal)."""
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        DownloadColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),  # stdout carries the verdicts' JSON lines
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
