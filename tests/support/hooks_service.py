"""``loopfuse hooks serve`` in a child process, for the tests: started, asked, stopped by PID.

The service gets its Kafka settings as ``LOOPFUSE_*`` variables (the worker's, so it
reads the topics that worker writes) and prints ``loopfuse hooks: serving on URL``
once its gateway client is up; :meth:`HooksServer.start` waits for that line.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Self

REPO_ROOT = Path(__file__).resolve().parents[2]
_SERVING = re.compile(r"loopfuse hooks: serving on (http://\S+)")
#: Worker settings the service does not need (its own Kafka and topic ones are kept).
_WORKER_ONLY = ("app_id", "store", "data_dir", "config_file", "web_port")


class HooksServer:
    def __init__(
        self, settings: Mapping[str, str], args: Sequence[str] = (), log_path: Path | None = None
    ) -> None:
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("LOOPFUSE_")},
            **{
                f"LOOPFUSE_{key.upper()}": value
                for key, value in settings.items()
                if key not in _WORKER_ONLY
            },
            "PYTHONUNBUFFERED": "1",
        }
        self.args = list(args)
        self.log_path = log_path
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""
        self._lines: list[str] = []
        self._log: IO[str] | None = None

    def start(self, timeout: float = 60.0) -> Self:
        self._lines = []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "loopfuse.streams.cli", "hooks", "serve", *self.args],
            cwd=REPO_ROOT,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        found = threading.Event()

        def read(stream: IO[str]) -> None:
            for line in stream:
                self._lines.append(line)
                match = _SERVING.search(line)
                if match:
                    self.url = match.group(1)
                    found.set()

        assert self.proc.stdout is not None
        threading.Thread(target=read, args=(self.proc.stdout,), daemon=True).start()
        deadline = time.monotonic() + timeout
        while not found.wait(0.1):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                output = "".join(self._lines)
                self.stop()
                raise RuntimeError(f"loopfuse hooks serve did not start:\n{output}")
        return self

    def output(self) -> str:
        return "".join(self._lines)

    def stop(self) -> int | None:
        """SIGTERM (the service stops cleanly), then SIGKILL after 20 s; the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait(20)
