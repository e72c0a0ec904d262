"""Two workers in one consumer group: the partitions are split, and when one is
SIGKILLed the other takes over its partitions and their state (changelog recovery).

Which worker owns what is the group coordinator's answer (``DescribeGroups``; from
the workers' logs on the embedded broker, see tests/support/pair.py). Verdicts of sessions spanning the kill must equal the
engine's (``Engine.replay``).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from loopfuse.streams.local.worker_process import WorkerProcess
from tests.support.harness import (
    Collector,
    compare,
    encode,
    expected_verdicts,
    generate,
    new_topics,
    produce,
    produce_paced,
    settle,
    unique,
    worker_settings,
)
from tests.support.pair import owned, start_pair

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(300)]

PARTITIONS = 4


async def test_two_workers_split_partitions_and_one_takes_over_after_sigkill(
    kafka_bootstrap: str, kafka_broker_kind: str, tmp_path: Path
) -> None:
    t_start = time.monotonic()
    topics = new_topics()
    app_id = unique("loopfuse-pair")
    settings = worker_settings(
        kafka_bootstrap,
        kafka_broker_kind,
        topics,
        app_id,
        tmp_path / "data",
        partitions=PARTITIONS,
    )
    events = generate(3_000, 48, seed=21, prefix=unique("pair") + "-")
    expected = expected_verdicts(events)
    messages = encode(topics, events)
    first, rest = messages[:1_000], messages[1_000:]
    a = WorkerProcess(settings, log_path=tmp_path / "worker-a.log")
    b = WorkerProcess(settings, log_path=tmp_path / "worker-b.log")
    try:
        pa, pb = await start_pair(a, b, topics["tool_calls"], PARTITIONS)
        split_s = time.monotonic() - t_start
        print(f"two-workers: split after {split_s:.1f} s: A owns {sorted(pa)}, B owns {sorted(pb)}")

        async with Collector(kafka_bootstrap, [topics["verdicts"]]) as out:
            await produce(kafka_bootstrap, first)
            n_first = len(expected_verdicts(events[:1_000]))
            await out.wait_for(
                "verdicts of the first part",
                lambda: len(out.of(topics["verdicts"])) >= n_first,
                90,
            )
            # The rest flows while A dies: sessions on A's partitions span the kill. Kill
            # it once both workers have judged the next 500 events (A its share of them),
            # with ~1,500 still to come.
            producer = asyncio.create_task(produce_paced(kafka_bootstrap, rest, rate=150))
            judged_before_kill = {
                (v["session_key"], v["seq"]) for v in expected_verdicts(events[:1_500])
            }
            await out.wait_for(
                "verdicts of the next 500 events",
                lambda: (
                    judged_before_kill
                    <= {(v["session_key"], v["seq"]) for v in out.of(topics["verdicts"])}
                ),
                60,
            )
            assert not producer.done(), "the rest was all produced before the kill"
            a.kill()
            killed = time.monotonic()
            a.stop()
            deadline = time.monotonic() + 90
            while await owned(b, topics["tool_calls"]) != set(range(PARTITIONS)):
                assert time.monotonic() < deadline, f"B never took over\n{b.tail()}"
                await asyncio.sleep(0.5)
            await asyncio.to_thread(b.wait_ready, 90)
            takeover_s = time.monotonic() - killed
            print(
                f"two-workers: A killed; B owns all {PARTITIONS} partitions and is ready "
                f"{takeover_s:.1f} s later"
            )
            await producer
            want = {(v["session_key"], v["seq"]) for v in expected}
            await out.wait_for(
                "all verdicts",
                lambda: want <= {(v["session_key"], v["seq"]) for v in out.of(topics["verdicts"])},
                120,
            )
            await settle(out, kafka_bootstrap, settings)  # anything extra shows up now
            delivered = out.of(topics["verdicts"])
        assert b.running, b.tail()
    finally:
        a.stop()
        b.stop()

    result = compare(expected, delivered)
    a_sessions = {v["session_key"] for v in delivered}  # all sessions span the kill
    print(
        f"two-workers: {len(events)} events over {len(a_sessions)} sessions; "
        f"{time.monotonic() - t_start:.1f} s"
    )
    print(result.line("two-workers"))
    assert result.missing == 0 and result.wrong == 0, (
        result.line("two-workers") + "\n" + "\n".join(result.examples)
    )
