"""Broker faults on a three-node Apache Kafka cluster: nothing lost, nothing wrong.

One cluster (:class:`loopfuse.streams.local.kafka_broker.KafkaCluster`, three combined
broker + controller KRaft nodes on loopback) serves the module; topics have replication
3 and ``min.insync.replicas`` 2, and every producer is ``acks=all`` and idempotent, as
loopfuse's are on Kafka. Every fault test compares each verdict with an uninterrupted
run's (the chaos harness's verifier: missing, wrong, duplicates) and prints the longest
time a verdict partition went without a new verdict.

The default run has the cheap ones (the settings, and kill -9 of the node leading every
judged partition); the whole suite is marked ``cluster``::

    .venv/bin/python -m pytest -m cluster tests/reliability/test_cluster_faults.py
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from loopfuse.streams.gateway.client import GatewayClient, Topics
from loopfuse.streams.local.kafka_broker import KafkaCluster, kafka_unavailable_reason
from loopfuse.streams.local.worker_process import WorkerProcess
from loopfuse.streams.settings import Settings
from loopfuse.streams.worker.topics import changelog_topic, ensure_topics
from tests.integration.test_broker import (
    REPO_ROOT,
    _child_pids,
    _port_closed,
    _process_gone,
    first_stdout_line,
)
from tests.reliability.chaos import ChaosOptions, ChaosResult, partition_leaders, run_chaos
from tests.support.harness import (
    Collector,
    compare,
    encode,
    expected_verdicts,
    generate,
    http_get,
    new_topics,
    produce,
    settle,
    unique,
    worker_settings,
)

pytestmark = [pytest.mark.reliability, pytest.mark.cluster, pytest.mark.timeout(600)]

if (_REASON := kafka_unavailable_reason()) is not None:
    pytest.skip(f"Apache Kafka cannot run here: {_REASON}", allow_module_level=True)

#: What the worker is told on the cluster.
REPLICATED = {"replication_factor": 3, "min_insync_replicas": 2}

#: Marks the heavy tests: deselected from the default run, run by ``-m cluster``
#: (tests/conftest.py).
full = pytest.mark.cluster_full


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    root = tmp_path_factory.mktemp("cluster")
    with KafkaCluster(3, data_dir=root / "data", log_dir=root) as running:
        yield running


@pytest.fixture
def whole(cluster: KafkaCluster) -> Iterator[KafkaCluster]:
    """The cluster with every node up, before and after the test (a failed test may
    leave nodes down)."""
    cluster.start()
    yield cluster
    cluster.start()


def _report(name: str, result: ChaosResult) -> None:
    gaps = ", ".join(f"{g:.1f}" for g in result.broker_gaps)
    print(
        f"{name}: {result.line}; longest without a verdict {result.longest_gap:.1f} s; "
        f"per fault, kill to a waiting partition's next verdict: [{gaps}] s; nodes back "
        f"after {[round(r, 1) for r in result.broker_restart_seconds]} s"
    )


def _assert_nothing_lost(result: ChaosResult) -> None:
    c = result.comparison
    assert c.missing == 0 and c.wrong == 0, f"{result.line}\n" + "\n".join(c.examples)
    assert c.delivered >= c.expected, result.line


async def test_topics_are_replicated_and_producers_wait_for_the_in_sync_replicas(
    whole: KafkaCluster,
) -> None:
    settings = Settings(
        bootstrap_servers=whole.bootstrap,
        app_id=unique("lf-rf"),
        **{f"topic_{k}": v for k, v in new_topics().items()},
        **REPLICATED,
    )
    await ensure_topics(settings)
    admin = AIOKafkaAdminClient(bootstrap_servers=whole.bootstrap)
    await admin.start()
    try:
        names = [*settings.input_topics, changelog_topic(settings), settings.topic_verdicts]
        # A new topic reaches each broker's metadata a moment after its creation: the
        # broker asked may not know it yet (no partitions, unknown topic), so ask again.
        deadline = time.monotonic() + 30
        while True:
            described = await admin.describe_topics(names)
            known = all(d["error_code"] == 0 and d["partitions"] for d in described)
            if known or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.25)
        configs = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, name) for name in names]
        )
    finally:
        await admin.close()
    assert {len(p["replicas"]) for d in described for p in d["partitions"]} == {3}
    # resources: (error code, message, type, topic, [(name, value, ...), ...])
    min_isr = {
        resource[3]: entry[1]
        for response in configs
        for resource in response.resources
        for entry in resource[4]
        if entry[0] == "min.insync.replicas"
    }
    assert min_isr == dict.fromkeys(names, "2"), configs
    gateway_topics = Topics(
        settings.topic_tool_calls,
        settings.topic_tool_results,
        settings.topic_compactions,
        settings.topic_verdicts,
    )
    async with GatewayClient(whole.bootstrap, topics=gateway_topics) as gateway:
        producer = gateway._producer
        assert producer is not None
        assert producer._sender._acks == -1  # acks=all
        assert producer._txn_manager is not None  # idempotent: a resend is not written twice


async def test_kill_9_of_the_leader_of_every_judged_partition_loses_no_verdict(
    whole: KafkaCluster, tmp_path: Path
) -> None:
    """Node 1 leads every partition of the inputs, the changelog and the verdicts; it is
    killed mid-stream and started again."""
    result = await run_chaos(
        ChaosOptions(
            kills=0,
            broker_kills=1,
            events=2_000,
            sessions=50,
            cluster=whole,
            lead_node=1,
            workdir=tmp_path,
            deadline=180.0,
        )
    )
    _report("leader kill", result)
    assert result.broker_kills == 1
    _assert_nothing_lost(result)


@full
async def test_a_rolling_restart_of_all_three_nodes_under_load_loses_no_verdict(
    whole: KafkaCluster, tmp_path: Path
) -> None:
    result = await run_chaos(
        ChaosOptions(
            kills=0,
            rolling_restart=True,
            events=4_000,
            sessions=60,
            rate=50.0,
            cluster=whole,
            workdir=tmp_path,
            deadline=180.0,
        )
    )
    _report("rolling restart", result)
    assert len(result.broker_restart_seconds) == 3  # each node stopped and started once
    _assert_nothing_lost(result)


@full
async def test_chaos_worker_and_leader_kills_together(whole: KafkaCluster, tmp_path: Path) -> None:
    result = await run_chaos(
        ChaosOptions(
            kills=2,
            broker_kills=2,
            events=3_000,
            sessions=60,
            cluster=whole,
            workdir=tmp_path,
            deadline=180.0,
        )
    )
    _report("chaos on the cluster", result)
    assert result.kills == 2 and result.broker_kills == 2
    _assert_nothing_lost(result)


async def _leader_of_changelog(bootstrap: str, settings: dict[str, str]) -> int:
    leaders = await partition_leaders(bootstrap, f"{settings['app_id']}-sessions-changelog")
    return leaders[0]


@full
async def test_a_worker_restarted_while_a_node_is_down_restores_every_session(
    whole: KafkaCluster, tmp_path: Path
) -> None:
    """Half the events judged; the node leading the changelog's partition 0 killed; the
    worker kill -9'd and started again with that node still down: it restores the
    sessions from the changelog's other replicas, and the second half's verdicts are
    the uninterrupted run's (they depend on the restored history)."""
    events = generate(2_000, 40, seed=11, prefix=unique("restore") + "-")
    expected = expected_verdicts(events)
    topics = new_topics()
    settings = worker_settings(
        whole.bootstrap, "kafka", topics, unique("lf-restore"), tmp_path / "data", **REPLICATED
    )
    messages = encode(topics, events)
    half = len(messages) // 2
    worker = WorkerProcess(settings, log_path=tmp_path / "worker.log").start()
    try:
        await asyncio.to_thread(worker.wait_ready, 120)
        async with Collector(whole.bootstrap, [topics["verdicts"]]) as out:
            await produce(whole.bootstrap, messages[:half])
            await settle(out, whole.bootstrap, settings)
            down = whole.node_at(await _leader_of_changelog(whole.bootstrap, settings))
            down.kill()
            worker.kill()
            worker.stop()
            began = time.monotonic()
            worker = WorkerProcess(
                settings, log_path=tmp_path / "worker-2.log", web_port=worker.web_port
            ).start()
            await asyncio.to_thread(worker.wait_ready, 180)
            ready_after = time.monotonic() - began
            await produce(whole.bootstrap, messages[half:])
            await out.wait_for(
                "every verdict", lambda: len(out.of(topics["verdicts"])) >= len(expected), 180
            )
            await settle(out, whole.bootstrap, settings)
            comparison = compare(expected, out.of(topics["verdicts"]))
    finally:
        worker.stop()
    print(
        f"restore with node {down.node_id} down: {comparison.line('restore')}; "
        f"restarted worker ready after {ready_after:.1f} s"
    )
    assert comparison.missing == 0 and comparison.wrong == 0, "\n".join(comparison.examples)


@full
async def test_quorum_loss_makes_the_worker_unready_not_dead_and_loses_nothing(
    whole: KafkaCluster, tmp_path: Path
) -> None:
    """Two of three nodes down: no controller quorum, no leader elections, no write with
    acks=all. /ready answers 503 naming the unreachable leaders, /livez stays 200, a
    gateway falls to its fail policy within its timeout; once the nodes are back,
    judging resumes and every verdict is the uninterrupted run's."""
    events = generate(1_500, 30, seed=13, prefix=unique("quorum") + "-")
    expected = expected_verdicts(events)
    topics = new_topics()
    settings = worker_settings(
        whole.bootstrap, "kafka", topics, unique("lf-quorum"), tmp_path / "data", **REPLICATED
    )
    messages = encode(topics, events)
    half = len(messages) // 2
    worker = WorkerProcess(settings, log_path=tmp_path / "worker.log").start()
    try:
        await asyncio.to_thread(worker.wait_ready, 120)
        gateway_topics = Topics(
            topics["tool_calls"], topics["tool_results"], topics["compactions"], topics["verdicts"]
        )
        gateway_session = unique("quorum-gateway")
        async with (
            Collector(whole.bootstrap, [topics["verdicts"]]) as out,
            GatewayClient(
                whole.bootstrap, topics=gateway_topics, timeout=2.0, fail_policy="closed"
            ) as gateway,
        ):
            await produce(whole.bootstrap, messages[:half])
            await settle(out, whole.bootstrap, settings)
            for node in whole.nodes[:2]:
                node.kill()
            began = time.monotonic()
            ready, body = 200, ""
            while ready == 200 and time.monotonic() - began < 30:
                ready, body = http_get(worker.web_port, "/ready", timeout=5)
                await asyncio.sleep(0.5)
            unready_after = time.monotonic() - began
            assert ready == 503, body
            assert "partition leaders unreachable" in body, body
            asked = time.monotonic()
            decision = await gateway.session(gateway_session, run_id="r").check(
                "read", {"path": "a"}
            )
            answered = time.monotonic() - asked
            # Alive all along: a restart would not bring the quorum back.
            live = set()
            while time.monotonic() - began < 45:
                live.add(http_get(worker.web_port, "/livez", timeout=5)[0])
                await asyncio.sleep(1.0)
            print(
                f"quorum loss: /ready 503 after {unready_after:.1f} s ({body}); a gateway "
                f"call decided {decision.action!r} by its fail policy after {answered:.1f} s"
            )
            assert live == {200}, live
            assert gateway.stats.timeouts == 1 and decision.action == "block"
            await asyncio.to_thread(whole.start)
            back = time.monotonic()
            await asyncio.to_thread(worker.wait_ready, 180)
            print(f"quorum back: worker ready {time.monotonic() - back:.1f} s after the nodes")
            await produce(whole.bootstrap, messages[half:])
            await out.wait_for(
                "every verdict", lambda: len(out.of(topics["verdicts"])) >= len(expected), 180
            )
            await settle(out, whole.bootstrap, settings)
            # the gateway's call of the outage is judged once the quorum is back: not
            # part of the uninterrupted run
            delivered = [
                v for v in out.of(topics["verdicts"]) if v["session_key"] != gateway_session
            ]
            comparison = compare(expected, delivered)
    finally:
        worker.stop()
    print(f"quorum loss: {comparison.line('quorum')}")
    assert comparison.missing == 0 and comparison.wrong == 0, "\n".join(comparison.examples)


def test_loopfuse_broker_kafka_nodes_3_prints_three_addresses_and_stops_them_all() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "loopfuse.streams.cli", "broker", "--kafka", "--nodes", "3"],
        cwd=REPO_ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        line = first_stdout_line(proc, 180).strip()
        assert line.startswith("bootstrap="), line
        addresses = line.removeprefix("bootstrap=").split(",")
        assert len(addresses) == 3 and all(a.startswith("127.0.0.1:") for a in addresses), line
        ports = [int(a.rsplit(":", 1)[1]) for a in addresses]
        assert not any(_port_closed("127.0.0.1", port) for port in ports)
        nodes = _child_pids(proc.pid)
        assert len(nodes) == 3, nodes
        proc.terminate()
        stdout, stderr = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stderr.decode()
    assert stdout == b"", "only the bootstrap line belongs on stdout"
    assert "3 KRaft nodes" in stderr.decode()
    assert all(_port_closed("127.0.0.1", port) for port in ports)
    assert all(_process_gone(pid) for pid in nodes)


def test_loopfuse_broker_nodes_needs_kafka() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "loopfuse.streams.cli", "broker", "--nodes", "3"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2 and "--nodes needs --kafka" in done.stderr
