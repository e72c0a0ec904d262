"""Broker trouble: the broker is down when the worker starts, and it goes away and
comes back while the worker runs.

Each test starts a broker of its own, of the session's kind (Apache Kafka, or the
embedded broker: ``tests.support.brokers.own_broker``), on a port that it keeps
across restarts. Two kinds of restart:

- *kept*: an Apache Kafka node stopped and started again keeps its topics, records,
  committed offsets and the table's changelog on disk: to the worker it is only an
  outage (the embedded broker, memory only, cannot do this one);
- *empty*: the broker comes back with nothing (the embedded broker's only restart;
  on Kafka its data folder is wiped and a new cluster formatted): a total data loss
  that the worker must survive too.

Behaviour measured (and asserted):

(a) broker down at start: ``loopfuse worker`` does not wait for it; its pre-flight
    (topic creation) fails and the process exits with code 1 and one clear line,
    ``loopfuse worker: cannot create topics on HOST:PORT: ...``. /ready never says
    200 and nothing restarts it (no silent crash loop: a supervisor must restart
    it). Once the broker is up, a new worker on the same settings works.
(b) broker gone while running: the worker stays up, /ready answers 503
    ``broker unreachable`` within ~1 s while it is gone. When the broker is back
    with its data, the worker goes on judging where it stopped. When it is back
    empty, the worker's broker probe sees that its topics are gone, logs so
    ("the broker has lost topics ...") and re-creates them with the configured
    partition count before it says ready again, so the gateways' next events do
    not auto-create input topics of the broker's default size (4 on Tansu, not
    LOOPFUSE_PARTITIONS=2). It goes on judging with the session state it holds in
    memory: the sessions' next verdicts are the ones an uninterrupted run gives.
    (Until this was fixed the worker said ready without its topics, kept consuming
    partitions 0-1 of the auto-created 4, and sessions on 2-3 never got a verdict.)
(c) the broker comes back with an input topic of another size (someone else
    created it first): the worker cannot repair that, says so naming the topic,
    and exits with code 2, as it does at start-up.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from loopfuse.streams.local.broker import free_port
from loopfuse.streams.local.worker_process import WorkerProcess
from tests.support.brokers import kind_of, own_broker, restart_empty
from tests.support.harness import (
    Collector,
    Comparison,
    compare,
    encode,
    expected_verdicts,
    generate,
    http_get,
    new_topics,
    produce,
    settle,
    unique,
    without_clock,
    worker_settings,
)

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(300)]

PARTITIONS = 2  # not Tansu's default, so an auto-created topic would show


def _partition_of(key: str, partitions: int) -> int:
    from aiokafka.partitioner import murmur2  # the default partitioner

    return (murmur2(key.encode()) & 0x7FFFFFFF) % partitions


async def topic_partitions(bootstrap: str) -> dict[str, int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5_000)
    await admin.start()
    try:
        names = await admin.list_topics()
        described = await admin.describe_topics(list(names)) if names else []
    finally:
        await admin.close()
    return {d["topic"]: len(d.get("partitions") or ()) for d in described}


async def test_broker_down_at_start_exits_clearly_then_works(
    kafka_broker_kind: str, tmp_path: Path
) -> None:
    port = free_port()
    broker = own_broker(tmp_path / "broker", port)
    topics = new_topics()
    settings = worker_settings(
        broker.bootstrap,
        kind_of(broker),
        topics,
        unique("loopfuse-nobroker"),
        tmp_path / "data",
        partitions=PARTITIONS,
    )
    worker = WorkerProcess(settings, log_path=tmp_path / "worker.log")
    try:
        t0 = time.monotonic()
        worker.start()
        statuses = set()
        while worker.running and time.monotonic() - t0 < 90:
            statuses.add(http_get(worker.web_port, "/ready", timeout=1)[0])
            await asyncio.sleep(0.3)
        exited_s = time.monotonic() - t0
        assert not worker.running, "worker neither became usable nor exited within 90 s"
        code = worker.stop()
        log = worker.tail()
        print(
            f"broker-down: worker exited with code {code} after {exited_s:.1f} s; /ready "
            f"statuses seen {sorted(statuses)}; log: {log.strip().splitlines()[-1][:300]!r}"
        )
        assert code == 1, log
        assert 200 not in statuses
        assert f"loopfuse worker: cannot create topics on {broker.bootstrap}" in log, log

        broker.start()
        events = generate(200, 4, seed=2, prefix=unique("nb") + "-")
        expected = expected_verdicts(events)
        worker = WorkerProcess(settings, log_path=tmp_path / "worker2.log").start()
        await asyncio.to_thread(worker.wait_ready, 120)
        async with Collector(broker.bootstrap, [topics["verdicts"]]) as out:
            await produce(broker.bootstrap, encode(topics, events))
            await out.wait_for(
                "verdicts", lambda: len(out.of(topics["verdicts"])) >= len(expected), 60
            )
            await settle(out, broker.bootstrap, settings)  # a duplicate would show up now
            delivered = out.of(topics["verdicts"])
        result = compare(expected, delivered)
        print(result.line("broker-down(after start)"))
        assert result.ok and result.duplicates == 0, result.examples
    finally:
        worker.stop()
        broker.close()


@dataclass
class Outage:
    empty: bool  # the broker came back empty (else with its data)
    not_ready_after: float | None
    last_status: tuple[int, str]
    still_running: bool
    ready_again_s: float
    topics_before: dict[str, int]
    topics_when_ready: dict[str, int]
    topics_after_events: dict[str, int]
    before: Comparison
    after: Comparison
    after_by_partition: dict[int, int]
    unsettled: str | None  # why the new events were not all judged and committed
    log: str


@pytest.fixture(scope="module", params=["kept", "empty"])
async def outage(
    request: pytest.FixtureRequest,
    kafka_broker_kind: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Outage:
    """Run an outage scenario once; the tests below assert on its figures."""
    tmp_path = tmp_path_factory.mktemp("outage")
    broker = own_broker(tmp_path / "broker")
    empty = request.param == "empty"
    if not empty and kind_of(broker) == "tansu":
        pytest.skip("the embedded broker keeps nothing across a restart")
    broker.start()
    topics = new_topics()
    app_id = unique("loopfuse-outage")
    settings = worker_settings(
        broker.bootstrap,
        kind_of(broker),
        topics,
        app_id,
        tmp_path / "data",
        partitions=PARTITIONS,
    )
    events = generate(600, 12, seed=8, prefix=unique("out") + "-")
    by_session: dict[str, list[int]] = {}
    for i, e in enumerate(events):
        by_session.setdefault(e["session_key"], []).append(i)
    cut = {i for idx in by_session.values() for i in idx[: len(idx) // 2]}
    part1 = [e for i, e in enumerate(events) if i in cut]
    part2 = [e for i, e in enumerate(events) if i not in cut]
    expected1 = expected_verdicts(part1)
    expected = expected_verdicts(events)
    expected2 = [v for v in expected if v not in expected1]
    worker = WorkerProcess(settings, log_path=tmp_path / "worker.log").start()
    try:
        await asyncio.to_thread(worker.wait_ready, 120)
        before = await topic_partitions(broker.bootstrap)
        async with Collector(broker.bootstrap, [topics["verdicts"]]) as out:
            await produce(broker.bootstrap, encode(topics, part1))
            await out.wait_for(
                "part 1 verdicts", lambda: len(out.of(topics["verdicts"])) >= len(expected1), 60
            )
            await settle(out, broker.bootstrap, settings)  # anything extra (a wrong verdict)
            delivered1 = out.of(topics["verdicts"])

        broker.stop()
        gone = time.monotonic()
        seen: list[tuple[float, int, str]] = []
        while time.monotonic() - gone < 10:
            status, body = http_get(worker.web_port, "/ready", timeout=2)
            seen.append((time.monotonic() - gone, status, body))
            await asyncio.sleep(0.5)
        not_ready_after = next((t for t, s, _ in seen if s != 200), None)
        still_running = worker.running
        print(
            f"outage: broker stopped; /ready first non-200 after {not_ready_after} s; "
            f"last {seen[-1][1]} {seen[-1][2]}; worker running {still_running}"
        )

        if empty:
            restart_empty(broker)  # same port, nothing on it
        else:
            broker.start()  # same port, same data
        back = time.monotonic()
        await asyncio.to_thread(worker.wait_ready, 120)
        ready_s = time.monotonic() - back
        after_ready = await topic_partitions(broker.bootstrap)
        print(
            f"outage: broker back ({request.param}); worker ready again after {ready_s:.1f} s; "
            f"topics then {after_ready}"
        )
        async with Collector(broker.bootstrap, [topics["verdicts"]]) as out:
            await produce(broker.bootstrap, encode(topics, part2))
            after_events = await topic_partitions(broker.bootstrap)
            print(f"outage: topics after new events {after_events}")
            # Every new event judged and committed, every verdict read; if that never
            # happens, the test of the return says how far it got.
            try:
                await settle(out, broker.bootstrap, settings, timeout=45)
                unsettled = None
            except AssertionError as exc:
                unsettled = str(exc)
            delivered2 = out.of(topics["verdicts"])
    finally:
        worker.stop()
        broker.close()

    n = after_events.get(topics["tool_calls"], PARTITIONS)
    by_partition: dict[int, int] = {}
    for v in expected2:
        if v in [without_clock(d) for d in delivered2]:
            p = _partition_of(v["session_key"], n)
            by_partition[p] = by_partition.get(p, 0) + 1
    result = Outage(
        empty,
        not_ready_after,
        seen[-1][1:],
        still_running,
        ready_s,
        before,
        after_ready,
        after_events,
        compare(expected1, delivered1),
        # A broker that kept its data still holds part 1's verdicts on the topic, which
        # the collector reads from its start: then all of them are compared.
        compare(expected2 if empty else expected, delivered2),
        by_partition,
        unsettled,
        (tmp_path / "worker.log").read_text(errors="replace"),
    )
    print(f"outage: topics before the outage {before}")
    print(result.after.line("outage(after return)"))
    print(f"outage: verdicts after the return by the session's partition (of {n}): {by_partition}")
    return result


async def test_worker_reports_not_ready_while_the_broker_is_gone(outage: Outage) -> None:
    assert outage.before.ok, outage.before.examples
    assert outage.still_running
    assert outage.not_ready_after is not None and outage.not_ready_after <= 6, outage
    status, body = outage.last_status
    assert status == 503 and "broker unreachable" in body, outage.last_status
    assert outage.ready_again_s < 60


async def test_worker_resumes_judging_after_the_broker_comes_back(outage: Outage) -> None:
    after = outage.after
    # Only an empty broker has lost the topics; one that kept its data has not.
    assert ("the broker has lost topics" in outage.log) == outage.empty, outage.log[-2000:]
    assert after.ok, after.line("outage(after return)") + "\n" + "\n".join(after.examples)
    assert outage.unsettled is None, outage.unsettled
    changelog = [t for t in outage.topics_after_events if t.endswith("-sessions-changelog")]
    assert changelog, f"the changelog was not re-created: {outage.topics_after_events}"
    calls = [n for t, n in outage.topics_after_events.items() if t.startswith("rel-calls-")]
    assert calls == [PARTITIONS], outage.topics_after_events


async def test_an_input_topic_back_with_another_size_stops_the_worker(
    kafka_broker_kind: str, tmp_path: Path
) -> None:
    broker = own_broker(tmp_path / "broker")
    broker.start()
    topics = new_topics()
    settings = worker_settings(
        broker.bootstrap,
        kind_of(broker),
        topics,
        unique("loopfuse-resized"),
        tmp_path / "data",
        partitions=PARTITIONS,
    )
    worker = WorkerProcess(settings, log_path=tmp_path / "worker.log").start()
    try:
        await asyncio.to_thread(worker.wait_ready, 120)
        # Restart the broker empty and create the calls topic with another size at
        # once; the worker probes every 2 s, so it rarely gets there first: then
        # the topic exists with the right size and we try again.
        for _ in range(5):
            restart_empty(broker)
            admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap)
            await admin.start()
            try:
                response = await admin.create_topics(
                    [NewTopic(topics["tool_calls"], PARTITIONS + 2, 1)]
                )
            finally:
                await admin.close()
            # aiokafka answers a topic's error in the response instead of raising it
            errors = {error[1] for error in response.topic_errors}
            if errors == {0}:
                break
            assert errors == {TopicAlreadyExistsError.errno}, response
            # The worker re-created it: once it is ready on this broker, try again.
            await asyncio.to_thread(worker.wait_ready, 60)
        else:
            pytest.fail("the worker re-created the topic first in 5 attempts")
        deadline = time.monotonic() + 60
        while worker.running and time.monotonic() < deadline:
            await asyncio.sleep(0.3)
        assert not worker.running, "the worker kept running with a wrongly sized input topic"
        code = worker.stop()
        log = worker.tail()
        print(f"resized: worker exited with code {code}: {log.strip().splitlines()[-1][:300]!r}")
        assert code == 2, log
        assert (
            f"topic {topics['tool_calls']!r} has {PARTITIONS + 2} partitions, "
            f"expected {PARTITIONS}" in log
        ), log
    finally:
        worker.stop()
        broker.close()
