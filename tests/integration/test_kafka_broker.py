"""The Apache Kafka launcher (loopfuse.streams.local.kafka_broker): one KRaft node that serves Kafka
clients on loopback, keeps its data across a restart, and leaves nothing behind.

These tests start nodes of their own (not the session broker) because they stop them;
each start costs the JVM's start-up (5-10 s here). They need Java 17+ and Maven (or
resolved jars) and say so when those are missing.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest

from loopfuse.streams.local.kafka_broker import ApacheKafka, kafka_unavailable_reason
from tests.integration.test_broker import (
    REPO_ROOT,
    _child_pids,
    _port_closed,
    _process_gone,
    _round_trip,
    first_stdout_line,
)
from tests.support.harness import read_all, unique

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

if (_REASON := kafka_unavailable_reason()) is not None:
    pytest.skip(f"Apache Kafka cannot run here: {_REASON}", allow_module_level=True)


def _listening_ports(pid: int) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket ``pid`` listens on (from /proc/net/tcp*)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = fd.readlink().as_posix()
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            fields = row.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                address, port = fields[1].split(":")
                found.add((address, int(port, 16)))
    return found


async def test_a_node_serves_clients_on_loopback_only_and_leaves_nothing(tmp_path: Path) -> None:
    kafka = ApacheKafka(log_path=tmp_path / "kafka.log")
    async with kafka:
        pid = kafka.pid
        assert pid is not None
        data = kafka.data_dir
        assert (data / "logs" / "meta.properties").exists()
        await _round_trip(kafka.bootstrap)
        listening = _listening_ports(pid)
        # The client listener and the controller's, both on 127.0.0.1 (0100007F, or
        # as the JVM binds it, the IPv4-mapped ::ffff:127.0.0.1): nothing of Kafka's
        # (no JMX, no wildcard bind) is reachable from elsewhere.
        assert {port for _, port in listening} >= {kafka.port}
        assert len(listening) == 2, listening
        loopback = {"0100007F", "0000000000000000FFFF00000100007F"}
        assert {address for address, _ in listening} <= loopback, listening
    assert not kafka.running
    assert _process_gone(pid)
    assert _port_closed("127.0.0.1", kafka.port)
    assert not data.exists(), "the temporary data folder outlived the node"


async def test_a_restart_keeps_the_records_and_a_kill_loses_none_acknowledged(
    tmp_path: Path,
) -> None:
    kafka = ApacheKafka(log_path=tmp_path / "kafka.log", data_dir=tmp_path / "node")
    try:
        await kafka.start_async()
        bootstrap = kafka.bootstrap
        topic = unique("lf-kafka-restart")
        await _round_trip_into(bootstrap, topic, [b"before-stop"])

        await asyncio.to_thread(kafka.stop)
        await kafka.start_async()
        assert kafka.bootstrap == bootstrap
        await _round_trip_into(bootstrap, topic, [b"before-kill"])

        await asyncio.to_thread(kafka.kill)  # kill -9: an unclean shutdown, log recovery
        await kafka.start_async()
        values = [value for _, _, _, value in await read_all(bootstrap, topic, 1)]
        assert values == [b"before-stop", b"before-kill"]
    finally:
        await asyncio.to_thread(kafka.close)
    assert (tmp_path / "node" / "logs").is_dir(), "a given data folder is the caller's to keep"


async def test_wipe_brings_a_new_empty_cluster_on_the_same_port(tmp_path: Path) -> None:
    kafka = ApacheKafka(log_path=tmp_path / "kafka.log")
    try:
        await kafka.start_async()
        port = kafka.port
        topic = unique("lf-kafka-wipe")
        await _round_trip_into(kafka.bootstrap, topic, [b"gone"])
        await asyncio.to_thread(kafka.stop)
        kafka.wipe()
        await kafka.start_async()
        assert kafka.port == port
        from aiokafka.admin import AIOKafkaAdminClient

        admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap)
        await admin.start()
        try:
            assert topic not in await admin.list_topics()
        finally:
            await admin.close()
    finally:
        await asyncio.to_thread(kafka.close)


async def _round_trip_into(bootstrap: str, topic: str, values: list[bytes]) -> None:
    from aiokafka import AIOKafkaProducer
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.errors import TopicAlreadyExistsError

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 1, 1)])
    except TopicAlreadyExistsError:
        pass
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for value in values:
            await producer.send_and_wait(topic, value, key=b"k")
    finally:
        await producer.stop()


def test_loopfuse_broker_kafka_prints_bootstrap_and_stops_on_sigterm() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "loopfuse.streams.cli", "broker", "--kafka"],
        cwd=REPO_ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        started = time.monotonic()
        line = first_stdout_line(proc, 120)
        assert line.startswith("bootstrap=127.0.0.1:"), line
        port = int(line.strip().rsplit(":", 1)[1])
        print(f"loopfuse broker --kafka: bootstrap after {time.monotonic() - started:.1f} s")
        assert not _port_closed("127.0.0.1", port)
        nodes = _child_pids(proc.pid)
        assert len(nodes) == 1, nodes
        proc.terminate()
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stderr.decode()
    assert stdout == b"", "only the bootstrap line belongs on stdout"
    assert "Apache Kafka" in stderr.decode()
    assert _port_closed("127.0.0.1", port)
    assert _process_gone(nodes[0])
