"""A worker restarting onto a backlog judges every waiting event, once, in seq order.

Regression test for the hole the long chaos run found (streams/worker/faust_compat/recovery.py):
when table recovery ended, Faust resumed fetching the input topics, then sought
each partition to its committed offset, then resumed flow control, which cleared
its queues - dropping input fetched in between - and counted the dropped offsets
as a processed "gap", so they were committed unjudged. Sessions then waited on
seq gaps that never filled, and gave them up as lost. It needs a restart with
committed offsets, a changelog to recover, and a backlog large enough to be in
flight while the offsets are looked up: exactly what this test builds, three times.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from loopfuse.streams.local.worker_process import WorkerProcess
from tests.support.harness import (
    Collector,
    compare,
    create_topics,
    encode,
    expected_verdicts,
    generate,
    new_topics,
    produce,
    settle,
    unique,
    worker_committed,
    worker_settings,
)

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(300)]

# More partitions make the committed-offset lookups (one request each) take longer,
# and a small batch leaves more of the fetched backlog queued: both widen the window.
PARTITIONS = 12
ROUNDS = 3


async def test_a_restart_onto_a_backlog_judges_every_waiting_event(
    kafka_bootstrap: str, kafka_broker_kind: str, tmp_path: Path
) -> None:
    # Every round: a burst of events while the worker is down, then a restart.
    events = generate(6_000 * (ROUNDS + 1), 240, seed=11, prefix=unique("backlog") + "-")
    expected = expected_verdicts(events)
    topics = new_topics()
    settings = worker_settings(
        kafka_bootstrap,
        kafka_broker_kind,
        topics,
        unique("loopfuse-backlog"),
        tmp_path / "data",
        commit_interval=0.5,
        partitions=PARTITIONS,
        batch_max=200,
    )
    messages = encode(topics, events)
    size = len(messages) // (ROUNDS + 1)
    pieces = [messages[i * size : (i + 1) * size] for i in range(ROUNDS)]
    pieces.append(messages[ROUNDS * size :])
    worker = WorkerProcess(settings, log_path=tmp_path / "worker.log")
    # The inputs before a producer could auto-create them (on the embedded broker), the
    # outputs before the collector subscribes (Apache Kafka creates none on demand).
    await create_topics(kafka_bootstrap, topics.values(), PARTITIONS)
    try:
        async with Collector(kafka_bootstrap, [topics["verdicts"], topics["loop_events"]]) as out:

            def judged() -> set[tuple[str, int]]:
                return {(v["session_key"], v["seq"]) for v in out.of(topics["verdicts"])}

            for number, piece in enumerate(pieces, start=1):
                # The backlog waits on the broker while no worker runs.
                await produce(kafka_bootstrap, piece)
                sent = events[: number * size] if number < len(pieces) else events
                keys = {(e["session_key"], e["seq"]) for e in sent}
                due = {(v["session_key"], v["seq"]) for v in expected} & keys
                worker.start()
                worker.wait_ready(120)
                await out.wait_for(
                    f"start {number}: the backlog judged", lambda due=due: due <= judged(), 120
                )
                if number < len(pieces):
                    # Killed once its input is committed: the next start recovers the
                    # table from the changelog and resumes from the committed offsets.
                    await worker_committed(kafka_bootstrap, settings, 20)
                    assert worker.send(signal.SIGKILL) == -signal.SIGKILL
            await settle(out, kafka_bootstrap, settings)  # anything extra (a wrong verdict)
            delivered = out.of(topics["verdicts"])
            gaps = [e for e in out.of(topics["loop_events"]) if e["detector"] == "sequence_gap"]
    finally:
        worker.stop()
    comparison = compare(expected, delivered)
    print(comparison.line("backlog"), f"sequence_gap_events={len(gaps)}")
    assert comparison.ok, "\n".join(comparison.examples)
    # Nothing was lost, so no gap may have been given up on either.
    assert gaps == [], gaps[:3]
