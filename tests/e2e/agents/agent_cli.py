"""Where the pinned agents are, and the environment they run in."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
BIN = HERE / "node_modules" / ".bin"
PINNED: dict[str, str] = json.loads((HERE / "package.json").read_text())["dependencies"]
#: The command of each agent, and its npm package.
AGENTS = {
    "claude": "@anthropic-ai/claude-code",
    "codex": "@openai/codex",
    "gemini": "@google/gemini-cli",
}


def command(agent: str) -> str:
    """The agent's executable; a test fails (never skips) when it is not installed."""
    path = BIN / agent
    if not path.exists():
        pytest.fail(
            f"{path} is missing: install the pinned agents with "
            "`npm ci --ignore-scripts && PATH=$PWD/node_modules/.bin:$PATH npm rebuild` "
            f"in {HERE} (./dev test does)"
        )
    return str(path)


def agent_env(home: Path, **extra: str) -> dict[str, str]:
    """The agent's environment: its own HOME, the pinned Node 24 first on PATH, no proxy
    (everything it talks to is on loopback)."""
    keep = {k: v for k, v in os.environ.items() if k in ("LANG", "LC_ALL", "TERM", "TZ")}
    return {
        **keep,
        "HOME": str(home),
        "PATH": f"{BIN}:/usr/local/bin:/usr/bin:/bin",
        "NO_PROXY": "127.0.0.1,localhost",
        **extra,
    }
