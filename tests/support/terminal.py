"""What an operator's terminal receives: a command run on a pseudo-terminal, its bytes
as written, and the checks that no byte of them is an agent's doing.

A pty (not a pipe) because rich styles, links and colours only what it believes is a
terminal; raw mode so the bytes arrive as the command wrote them (no LF -> CRLF).
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
import tty
import unicodedata
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: Select Graphic Rendition: the only escape sequence rich writes for a table or a line.
SGR = re.compile(rb"\x1b\[[0-9;]*m")
_FOREIGN_CATEGORIES = {"Cc", "Cf", "Cs", "Co", "Zl", "Zp"}


@dataclass
class Terminal:
    returncode: int
    output: bytes  # what reached the terminal (stdout)
    stderr: str

    @property
    def styles(self) -> set[bytes]:
        return set(SGR.findall(self.output))

    @property
    def text(self) -> str:
        """The output as the operator reads it: styles taken away."""
        return SGR.sub(b"", self.output).decode("utf-8")


def run_in_terminal(*args: str, columns: int = 200, timeout: float = 120) -> Terminal:
    """``python -m loopfuse.streams.cli ARGS`` with its stdout on a pty ``columns`` wide."""
    master, slave = pty.openpty()
    tty.setraw(slave)
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 60, columns, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR", "COLUMNS")}
    env.update(TERM="xterm-256color", COLORTERM="truecolor")
    process = subprocess.Popen(
        [sys.executable, "-m", "loopfuse.streams.cli", *args],
        stdin=subprocess.DEVNULL,
        stdout=slave,
        stderr=subprocess.PIPE,
        env=env,
        cwd=ROOT,
    )
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if not ready:
                if process.poll() is not None:
                    break
                continue
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the command closed its side
                break
            if not chunk:
                break
            chunks.append(chunk)
        else:
            raise TimeoutError(f"{args} did not finish in {timeout} s")
        assert process.stderr is not None
        stderr = process.stderr.read().decode("utf-8", "replace")
        returncode = process.wait(timeout)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        os.close(master)
        if process.stderr is not None:
            process.stderr.close()
    return Terminal(returncode, b"".join(chunks), stderr)


def foreign_bytes(output: bytes) -> list[str]:
    """Everything in ``output`` that is not plain printable text, a newline or one of
    rich's own styles: control bytes (ESC, BEL, CR, DEL, C1), bidi and other format
    characters, invalid UTF-8. Empty when nothing of the agent's reached the terminal."""
    rest = SGR.sub(b"", output)
    try:
        decoded = rest.decode("utf-8")
    except UnicodeDecodeError as exc:
        return [f"invalid UTF-8 at byte {exc.start}: {rest[exc.start : exc.start + 8]!r}"]
    found = []
    for at, char in enumerate(decoded):
        if char != "\n" and unicodedata.category(char) in _FOREIGN_CATEGORIES:
            found.append(f"{char!r} at {at}: ...{decoded[max(at - 30, 0) : at + 10]!r}")
    return found
