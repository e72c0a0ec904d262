"""Redelivery: duplicate events and a consumer-group offset rewind change no verdict.

At-least-once delivery means the worker sees events again: a gateway retries a
send (same event_id / seq), or the group's offsets go back (a crash before the
commit, or an operator resetting them). The engine dedupes by seq (else event_id)
in the session state, so every re-emitted verdict must be identical (same
verdict_id, same content) and the state must be what an uninterrupted run has:
events produced after the rewind get the verdicts of a run that never saw one.
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor

from loopfuse.streams.local.worker_process import WorkerProcess
from tests.support.harness import (
    Collector,
    committed_offsets,
    compare,
    encode,
    expected_verdicts,
    generate,
    new_topics,
    produce,
    settle,
    unique,
    worker_settings,
)

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(300)]

PARTITIONS = 4


def unsequenced(prefix: str, n_sessions: int, steps: int) -> list[dict[str, Any]]:
    """Sessions without seq (deduped by event_id; applied in arrival order, so they
    all go to one topic): a polling loop interleaved with healthy reads."""
    events: list[dict[str, Any]] = []
    for s in range(n_sessions):
        key = f"{prefix}-noseq{s}"
        for i in range(steps):
            poll = i % 3 != 2
            args = {"action": "poll", "sessionId": "x"} if poll else {"path": f"/f{i}"}
            tool = "process" if poll else "read"
            result = {"content": "running"} if poll else {"content": f"c{i}"}
            common = {
                "session_key": key,
                "run_id": "r",
                "call_id": f"c{i}",
                "tool_name": tool,
                "args": args,
            }
            events.append(common | {"type": "tool_call", "event_id": f"{key}-c{i}"})
            events.append(
                common | {"type": "tool_result", "event_id": f"{key}-r{i}", "result": result}
            )
    for n, e in enumerate(events):
        e["ts"] = 1_790_000_000_000 + n
    return events


class FaustNamedAssignor(RoundRobinPartitionAssignor):
    name = "faust"


async def commit_offsets(bootstrap: str, group: str, offsets: dict[TopicPartition, int]) -> None:
    """Commit ``offsets`` for ``group`` (which must have no live member).

    Joins the group as its only member, commits, and leaves: aiokafka has no admin
    call that commits for a group, and the embedded broker refuses a consumer's
    commit from outside the group (generation -1: UnknownMemberId). Joining works on
    both brokers.
    """
    consumer = AIOKafkaConsumer(
        *sorted({tp.topic for tp in offsets}),
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        session_timeout_ms=6_000,
        heartbeat_interval_ms=1_000,
        # The group's protocol is Faust's assignor: join under the same name.
        partition_assignment_strategy=(FaustNamedAssignor,),
    )
    await consumer.start()
    try:
        deadline = time.monotonic() + 60
        while not set(offsets) <= consumer.assignment():
            assert time.monotonic() < deadline, f"never assigned: {consumer.assignment()}"
            await consumer.getmany(timeout_ms=200, max_records=1)  # drives the join
        await consumer.commit(dict(offsets))
    finally:
        await consumer.stop()


async def test_duplicates_and_offset_rewind_change_no_verdict(
    kafka_bootstrap: str, kafka_broker_kind: str, tmp_path: Path
) -> None:
    t_start = time.monotonic()
    prefix = unique("redeliver")
    events = generate(1_600, 24, seed=11, prefix=prefix + "-")
    # First part: the first half of every session; the second part after the rewind.
    by_session: dict[str, list[dict[str, Any]]] = {}
    for e in events:
        by_session.setdefault(e["session_key"], []).append(e)
    first_ids = {e["event_id"] for evs in by_session.values() for e in evs[: len(evs) // 2]}
    part_a = [e for e in events if e["event_id"] in first_ids]
    part_b = [e for e in events if e["event_id"] not in first_ids]
    noseq = unsequenced(prefix, 3, 16)
    noseq_a, noseq_b = noseq[: len(noseq) // 2], noseq[len(noseq) // 2 :]
    expected = expected_verdicts(events + noseq)
    expected_a = expected_verdicts(part_a + noseq_a)

    topics = new_topics()
    app_id = unique("loopfuse-redeliver")
    settings = worker_settings(
        kafka_bootstrap,
        kafka_broker_kind,
        topics,
        app_id,
        tmp_path / "data",
        partitions=PARTITIONS,
    )
    log_path = tmp_path / "worker.log"

    def calls_topic(msgs: list[tuple[str, bytes | None, bytes | None]]) -> list[Any]:
        return [(topics["tool_calls"], k, v) for _, k, v in msgs]

    worker = WorkerProcess(settings, log_path=log_path).start()
    try:
        await asyncio.to_thread(worker.wait_ready, 120)
        async with Collector(kafka_bootstrap, [topics["verdicts"], topics["dead_letters"]]) as out:
            verdicts = lambda: out.of(topics["verdicts"])  # noqa: E731

            def have(want: list[dict[str, Any]]) -> bool:
                got = {(v["session_key"], v["seq"], v["call_id"]) for v in verdicts()}
                return {(v["session_key"], v["seq"], v["call_id"]) for v in want} <= got

            await produce(
                kafka_bootstrap, encode(topics, part_a) + calls_topic(encode(topics, noseq_a))
            )
            await out.wait_for("verdicts of part A", lambda: have(expected_a), 90)
            await settle(out, kafka_bootstrap, settings)
            n_a = len(verdicts())

            # 1. duplicates: a random third of part A again (same event_id / seq)
            rng = random.Random(3)
            dups = rng.sample(part_a, len(part_a) // 3)
            dup_calls = sum(1 for e in dups if e["type"] == "tool_call")
            noseq_dups = [e for e in noseq_a if e["type"] == "tool_call"][:10]
            await produce(
                kafka_bootstrap, encode(topics, dups) + calls_topic(encode(topics, noseq_dups))
            )
            await settle(out, kafka_bootstrap, settings)  # every duplicate judged
            n_dup = len(verdicts()) - n_a
            print(
                f"redelivery: part A {len(part_a) + len(noseq_a)} events -> {n_a} verdicts; "
                f"{len(dups) + len(noseq_dups)} duplicates ({dup_calls + len(noseq_dups)} "
                f"tool_calls) -> {n_dup} re-emitted verdicts"
            )

            # 2. offset rewind: stop cleanly (final commit), move the group back, restart
            assert worker.stop() == 0, worker.tail()
            tps = [
                TopicPartition(t, p)
                for t in (topics["tool_calls"], topics["tool_results"], topics["compactions"])
                for p in range(PARTITIONS)
            ]
            before = await committed_offsets(kafka_bootstrap, app_id, tps)
            assert sum(before.values()) >= len(part_a) + len(dups), before
            rewound = {tp: off // 2 for tp, off in before.items() if off > 0}
            await commit_offsets(kafka_bootstrap, app_id, rewound)
            after = await committed_offsets(kafka_bootstrap, app_id, tps)
            assert {tp: after[tp] for tp in rewound} == rewound, after
            replayed = sum(before.values()) - sum(rewound.values())
            print(
                f"redelivery: committed offsets {sum(before.values())} -> rewound by "
                f"{replayed} messages over {len(rewound)} partitions"
            )

            n_before_restart = len(verdicts())
            worker = WorkerProcess(settings, log_path=log_path).start()
            await asyncio.to_thread(worker.wait_ready, 120)
            await produce(
                kafka_bootstrap, encode(topics, part_b) + calls_topic(encode(topics, noseq_b))
            )
            await out.wait_for("all verdicts", lambda: have(expected), 120)
            await settle(out, kafka_bootstrap, settings)  # late extras (wrong or duplicate)
            delivered = verdicts()
            dead = out.of(topics["dead_letters"])
    finally:
        worker.stop()

    n_reemitted = len(delivered) - n_before_restart - (len(expected) - len(expected_a))
    result = compare(expected, delivered)
    line = result.line("redelivery")
    print(
        f"redelivery: {n_reemitted} verdicts re-emitted after the rewind; "
        f"{len(dead)} dead letters; {time.monotonic() - t_start:.1f} s"
    )
    print(line)
    assert result.missing == 0 and result.wrong == 0, line + "\n" + "\n".join(result.examples)
    assert result.duplicates > 0, f"no redelivered verdicts at all: {line}"
    assert not dead, dead[:3]


def test_a_duplicate_of_an_old_tool_call_gets_its_verdict_again() -> None:
    """Offline (engine) check of the redelivery promise, for a call 20 calls back."""
    key = unique("old-dup")
    events: list[dict[str, Any]] = []
    for i in range(20):
        common = {
            "session_key": key,
            "run_id": "r",
            "call_id": f"c{i}",
            "tool_name": "read",
            "args": {"path": f"/f{i}"},
            "ts": 1_790_000_000_000 + i,
        }
        events.append(common | {"type": "tool_call", "event_id": f"{key}-c{i}", "seq": 2 * i})
        events.append(
            common
            | {
                "type": "tool_result",
                "event_id": f"{key}-r{i}",
                "seq": 2 * i + 1,
                "result": {"content": f"x{i}"},
            }
        )
    original = expected_verdicts(events)
    again = expected_verdicts([*events, events[0], events[30]])[len(original) :]
    print(
        f"redelivery(engine): duplicates of call 0 and call 15 -> {len(again)} verdict(s) "
        f"re-emitted: {[v['call_id'] for v in again]}"
    )
    assert again == [original[0], original[15]]
