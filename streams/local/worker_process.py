"""A stream worker in a child process: started, watched and stopped by PID.

Used by ``loopfuse demo``, the benchmarks and the reliability tests (which SIGKILL
it on purpose). The child gets its settings as ``LOOPFUSE_*`` variables, the same
way an operator configures a worker.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Self

from loopfuse.streams.local.broker import free_port, popen_tied

REPO_ROOT = Path(__file__).resolve().parents[2]
#: The Python that runs the worker: this one, unless LOOPFUSE_WORKER_PYTHON names another
#: (an install with the [worker] extra, when this one is a gateway's base install).
WORKER_PYTHON_ENV = "LOOPFUSE_WORKER_PYTHON"
TOPIC_ROLES = (
    "tool_calls",
    "tool_results",
    "compactions",
    "verdicts",
    "loop_events",
    "dead_letters",
)


def unique_topics(prefix: str) -> dict[str, str]:
    """Fresh topic names for each role, so several workers can share one broker."""
    suffix = uuid.uuid4().hex[:8]
    return {role: f"{prefix}-{role.replace('_', '-')}-{suffix}" for role in TOPIC_ROLES}


def topic_settings(topics: Mapping[str, str]) -> dict[str, str]:
    """Worker settings naming these topics (``topic_<role>``)."""
    return {f"topic_{role}": name for role, name in topics.items()}


def input_topic_for(topics: Mapping[str, str], event: Mapping[str, Any]) -> str:
    """Where a gateway would publish this event."""
    kind = event.get("type")
    role = {"tool_call": "tool_calls", "tool_result": "tool_results"}.get(str(kind), "compactions")
    return topics[role]


class WorkerProcess:
    """``python -m loopfuse.streams.worker.run`` with the given settings; never leaves an orphan
    (it dies with the process that started it: :func:`~loopfuse.streams.local.broker.popen_tied`)."""

    def __init__(
        self,
        settings: Mapping[str, str],
        *,
        log_path: Path | None = None,
        web_port: int | None = None,
        python_options: Sequence[str] = (),
    ) -> None:
        self.web_port = web_port or free_port()
        self.env = {
            **os.environ,
            **{f"LOOPFUSE_{key.upper()}": value for key, value in settings.items()},
            "LOOPFUSE_WEB_PORT": str(self.web_port),
            "PYTHONUNBUFFERED": "1",
        }
        self.log_path = log_path
        self.python_options = list(python_options)  # e.g. ["-m", "cProfile", "-o", PATH]
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> Self:
        """Start (or start again, after it exited) the worker; its log is appended to."""
        if self.log_path is not None and self._log is None:
            self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = popen_tied(
            [
                os.environ.get(WORKER_PYTHON_ENV) or sys.executable,
                *self.python_options,
                "-m",
                "loopfuse.streams.worker.run",
            ],
            # a checkout's root (its loopfuse/ first on the path); an installed copy has none
            cwd=REPO_ROOT if (REPO_ROOT / "pyproject.toml").exists() else None,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=self._log or subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            # Its own process group: a Ctrl-C in the terminal reaches us, and we stop
            # the worker in order (after the simulator, before the broker).
            start_new_session=True,
        )
        return self

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until ``/ready`` answers 200: broker reachable, partitions assigned,
        tables recovered."""
        deadline = time.monotonic() + timeout
        url = f"http://127.0.0.1:{self.web_port}/ready"
        while time.monotonic() < deadline:
            if not self.running:
                raise RuntimeError(
                    f"worker exited with code {self.proc and self.proc.returncode}\n{self.tail()}"
                )
            try:
                with urllib.request.urlopen(url, timeout=1):
                    return
            except OSError:  # connection refused, or HTTP 503 while not ready
                time.sleep(0.2)
        raise TimeoutError(f"worker not ready after {timeout:.0f} s\n{self.tail()}")

    def tail(self, chars: int = 4000) -> str:
        """The end of the worker's log, for error messages."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")[-chars:]

    def send(self, sig: signal.Signals, timeout: float = 30.0) -> int:
        """Send ``sig`` to the worker and wait for it to exit; its exit code."""
        assert self.proc is not None, "not started"
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
        return self.proc.wait(timeout)

    def kill(self) -> int | None:
        """SIGKILL, as the OOM killer would: no shutdown, no final commit."""
        return None if self.proc is None else self.send(signal.SIGKILL)

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM (a clean Faust shutdown), SIGKILL if it does not end in time."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            except ProcessLookupError:
                pass
        if self._log is not None:
            self._log.close()
            self._log = None
        return self.proc.returncode

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
