"""``loopfuse audit --bootstrap``: the loop-events topic read to its end, then a summary."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from loopfuse.streams.ops.audit import AuditSummary, in_range, loop_events_from_lines
from tests.support.kafka import FIXTURE, new_topic, produce

ROOT = Path(__file__).resolve().parents[2]


def _audit(*args: str) -> list[str]:
    run = subprocess.run(
        [sys.executable, "-m", "loopfuse.streams.cli", "audit", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stderr
    return run.stdout.splitlines()


async def test_topic_and_jsonl_give_the_same_summary(kafka_bootstrap: str) -> None:
    topic = await new_topic(kafka_bootstrap, partitions=3)
    # the whole replay output (verdicts, loop events, a dead letter), as a worker would mix
    # them if they shared a topic: only loop events count
    await produce(kafka_bootstrap, topic, [line for line in FIXTURE.read_bytes().splitlines()])

    from_topic = _audit("--bootstrap", kafka_bootstrap, "--topic", topic)
    from_file = _audit(str(FIXTURE))

    assert from_topic[0].startswith(f"loop events: 61 from {topic} at {kafka_bootstrap} ")
    assert from_topic[0].split(" (", 1)[1] == from_file[0].split(" (", 1)[1]
    assert from_topic[1:] == from_file[1:]  # every table, row for row


async def test_time_range_on_the_topic(kafka_bootstrap: str) -> None:
    topic = await new_topic(kafka_bootstrap)
    events = list(loop_events_from_lines(FIXTURE.open("rb")))
    await produce(kafka_bootstrap, topic, events)
    times = sorted(e["event_ts"] for e in events)
    since, until = times[10], times[40]
    expected = AuditSummary.of(e for e in events if in_range(e, since, until)).to_dict()["totals"]
    assert 0 < expected["loop_events"] < len(events)

    lines = _audit(
        "--bootstrap",
        kafka_bootstrap,
        "--topic",
        topic,
        "--since",
        str(since),
        "--until",
        str(until),
    )

    assert lines[0].startswith(f"loop events: {expected['loop_events']} from {topic}")
    assert f"(enforced {expected['enforced']}, shadow {expected['shadow']})" in lines[0]


async def test_loop_events_written_twice_count_once(kafka_bootstrap: str) -> None:
    # A worker killed before its commit writes its last loop events again.
    topic = await new_topic(kafka_bootstrap, partitions=3)
    events = list(loop_events_from_lines(FIXTURE.open("rb")))
    await produce(kafka_bootstrap, topic, events + events[20:45])

    from_topic = _audit("--bootstrap", kafka_bootstrap, "--topic", topic)
    from_file = _audit(str(FIXTURE))

    assert from_topic[0].startswith(f"loop events: {len(events)} from {topic}")
    assert from_topic[1].startswith("dropped 25 duplicate loop events")
    assert from_topic[0].split(" (", 1)[1] == from_file[0].split(" (", 1)[1]
    assert from_topic[2:] == from_file[1:]  # every table, row for row
