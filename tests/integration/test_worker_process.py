"""The worker launcher: a worker never outlives the process that started it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from loopfuse.streams.local.worker_process import REPO_ROOT
from tests.support.harness import new_topics, unique, worker_settings

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0) until it is reaped; it is not running.
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_worker_dies_with_the_process_that_started_it(
    kafka_bootstrap: str, kafka_broker_kind: str, tmp_path: Path
) -> None:
    settings = worker_settings(
        kafka_bootstrap, kafka_broker_kind, new_topics(), unique("orphan"), tmp_path
    )
    # The parent starts a worker, waits until it is ready, prints its pid and dies
    # without stopping it.
    parent = textwrap.dedent(
        f"""
        import os, sys
        from loopfuse.streams.local.worker_process import WorkerProcess
        worker = WorkerProcess({settings!r}).start()
        worker.wait_ready(120)
        print(worker.pid, flush=True)
        sys.stdin.readline()
        os._exit(0)
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", parent],
        cwd=REPO_ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stdin is not None
    worker_pid = int(proc.stdout.readline() or 0)
    try:
        assert worker_pid and _alive(worker_pid), "the worker did not start"
        proc.stdin.write(b"\n")
        proc.stdin.flush()
        proc.wait(timeout=10)
        deadline = time.monotonic() + 30
        while _alive(worker_pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(worker_pid), "the worker outlived its parent"
    finally:
        if worker_pid and _alive(worker_pid):
            os.kill(worker_pid, 9)
        proc.kill()
