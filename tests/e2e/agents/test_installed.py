"""The agents the end-to-end tests run are the pinned ones."""

from __future__ import annotations

import subprocess

import pytest

from tests.e2e.agents.agent_cli import AGENTS, PINNED, command


@pytest.mark.parametrize("agent", sorted(AGENTS))
def test_the_pinned_version_runs(agent: str) -> None:
    done = subprocess.run(
        [command(agent), "--version"], capture_output=True, text=True, timeout=60, check=True
    )
    assert PINNED[AGENTS[agent]] in done.stdout
