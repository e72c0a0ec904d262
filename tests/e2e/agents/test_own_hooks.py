"""Each agent in its own loop, with a command hook of the test's own: the loop runs the
shell tool on every call, and the agent calls its before-tool hook each time, with the
call's tool and command (the mechanism loopfuse's hooks ride on)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.agents.agent_cli import ALL, Workspace, run_agent, scripted_model

pytestmark = pytest.mark.timeout(300)

CALLS = 4


@pytest.mark.parametrize("name", sorted(ALL))
def test_a_looping_shell_runs_each_time_and_calls_the_hook_each_time(
    name: str, tmp_path: Path
) -> None:
    agent = ALL[name]
    marker, hooked = tmp_path / "marker.txt", tmp_path / "hook-calls"
    hooked.mkdir()
    loop = agent.shell(f"echo loop >> {marker}; echo still broken")
    ws = Workspace.make(tmp_path)
    with scripted_model(tmp_path, [loop] * CALLS + [{"text": "gave up"}]) as (url, log):
        agent.configure(ws, url)
        # the hook keeps what it was given (one file a call) and allows the call
        agent.add_command_hook(
            ws, agent.before_tool, f"cat > {hooked}/$(date +%s%N).json; echo '{{}}'"
        )
        run = run_agent(agent, ws, url, log)
    assert run.exit_code == 0, run.stderr[-3000:]
    assert len(run.turns) == CALLS + 1
    # the model received the command's output after each call: the tool ran each time
    received = run.received()
    assert len(received) == CALLS
    assert all("still broken" in r["output"] and not r["error"] for r in received), received
    assert marker.read_text() == "loop\n" * CALLS
    given = [json.loads(p.read_text()) for p in sorted(hooked.iterdir())]
    assert len(given) == CALLS
    session = agent.session_id(run.stdout)
    for event in given:
        assert event["session_id"] == session
        assert "echo loop >>" in json.dumps(event["tool_input"])
