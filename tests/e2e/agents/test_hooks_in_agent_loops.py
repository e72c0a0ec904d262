"""loopfuse inside each coding agent's own loop: Claude Code, Codex CLI and Gemini CLI with
``loopfuse hooks install <agent> --project`` in a fresh HOME and project, ``loopfuse hooks
serve`` and a real worker on the session's broker. Only the model is scripted: each agent
runs its loop, its shell tool and its hooks; what the model received after each call is
read from the scripted model's log, and a marker file the command appends to shows
whether the tool really ran.

The worker judges at warning 3, critical 5, with run endings for the three agents (their
``agent_id`` is the agent's name): a loop of identical calls runs calls 1-3, runs 4-5
with a warning, blocks call 6 (the run's first critical) and aborts at call 7 (its
second) where the agent can end a run from a hook (Claude Code, Gemini CLI); Codex CLI
cannot, so its later calls are denied with the abort's message.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from loopfuse.streams.local.worker_process import WorkerProcess
from tests.e2e.agents.agent_cli import (
    ALL,
    LOOP_DETECTION,
    Agent,
    Run,
    Workspace,
    agent_env,
    command,
    loopfuse_hooks,
    merge_settings,
    run_agent,
    scripted_model,
)
from tests.support.harness import new_topics, unique, worker_settings
from tests.support.hooks_service import HooksServer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

AGENTS = sorted(ALL)
CRITICAL = "identical arguments and identical outcomes 5 times"
ENDING = "Ending this run"
#: the name each agent's hook gives its shell tool (Codex reports it as Bash)
HOOK_TOOL = {"claude": "Bash", "codex": "Bash", "gemini": "run_shell_command"}


@pytest.fixture(scope="module")
def settings(
    kafka_bootstrap: str, kafka_broker_kind: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, str]]:
    """A worker judging with LOOP_DETECTION; its settings (the hooks service's too)."""
    tmp = tmp_path_factory.mktemp("agent-hooks")
    config = tmp / "loop-detection.json"
    config.write_text(json.dumps(LOOP_DETECTION))
    settings = worker_settings(
        kafka_bootstrap,
        kafka_broker_kind,
        new_topics(),
        unique("agent-hooks"),
        tmp / "data",
        config_file=config,
        reply_topics=unique("agent-hooks-replies"),
        reply_partitions=4,
    )
    worker = WorkerProcess(settings, log_path=tmp / "worker.log").start()
    try:
        worker.wait_ready(90)
        yield settings
    finally:
        worker.stop()


@pytest.fixture(scope="module")
def service(settings: dict[str, str]) -> Iterator[HooksServer]:
    server = HooksServer(settings, ["--port", "0", "--verdict-timeout", "20"]).start()
    try:
        yield server
    finally:
        server.stop()


def installed(agent: Agent, tmp: Path, url: str, *extra: str) -> Workspace:
    """A fresh HOME and project with the agent's loopfuse hooks installed (``--project``
    unless ``extra`` says ``--user``)."""
    ws = Workspace.make(tmp)
    scope = [] if "--user" in extra else ["--project"]
    loopfuse_hooks(ws, "install", agent.name, *scope, "--url", url, *extra)
    return ws


def looping(agent: Agent, marker: Path, calls: int) -> list[dict[str, Any]]:
    """The model asks for the same shell command ``calls`` times, then gives up. The
    command's text does not hold its output (a denial that quotes the command is not the
    output)."""
    return [agent.shell(f"echo loop >> {marker}; printf 'still %s\\n' broken")] * calls + [
        {"text": "gave up"}
    ]


def ran(marker: Path) -> int:
    """How many times the looping command really ran."""
    return marker.read_text().count("loop") if marker.exists() else 0


def loop_run(agent: Agent, tmp: Path, url: str, calls: int, *extra: str) -> tuple[Run, Path]:
    marker = tmp / f"marker-{agent.name}-{unique('m')}.txt"
    ws = installed(agent, tmp, url, *extra)
    with scripted_model(tmp, looping(agent, marker, calls)) as (model, log):
        agent.configure(ws, model)
        run = run_agent(agent, ws, model, log)
    assert run.exit_code == 0, run.stderr[-3000:]
    return run, marker


def warning(agent: Agent, times: int) -> str:
    return f"WARNING: You have called {HOOK_TOOL[agent.name]} {times} times with identical"


@pytest.mark.parametrize("name", AGENTS)
def test_a_loop_is_warned_then_blocked_then_ended(
    name: str, tmp_path: Path, service: HooksServer
) -> None:
    agent = ALL[name]
    run, marker = loop_run(agent, tmp_path, service.url, 10)
    seen = run.seen()  # what the model read after call n (index n - 1)
    for n in (1, 2, 3):
        assert "still broken" in seen[n - 1] and "WARNING" not in seen[n - 1], seen[n - 1]
    for n in (4, 5):  # ran, and the model read loopfuse's warning beside the output
        assert "still broken" in seen[n - 1] and warning(agent, n - 1) in seen[n - 1]
    # call 6 is denied: the model reads loopfuse's block as the tool's result
    assert CRITICAL in seen[5] and "still broken" not in seen[5]
    assert ran(marker) == 5  # from call 6 on, the tool never ran
    if name == "codex":
        # No hook output ends a Codex run: every later call is denied with the abort's
        # message until the model stops (here: its script's end, after call 10).
        assert len(run.turns) == 11
        assert all(ENDING in text and "still broken" not in text for text in seen[6:])
    else:
        # Call 7 aborts: the agent ends the run there, no request after it.
        assert len(run.turns) == 7


def test_codex_is_interrupted_at_the_abort_when_opted_in(
    tmp_path: Path, settings: dict[str, str]
) -> None:
    # --codex-interrupt: the service also sends SIGINT to the Codex process at the abort.
    server = HooksServer(settings, ["--port", "0", "--codex-interrupt"]).start()
    try:
        marker = tmp_path / "marker.txt"
        agent = ALL["codex"]
        ws = installed(agent, tmp_path, server.url)
        # the model thinks half a second a turn, as real ones do (or longer)
        steps = [{**step, "delay": 0.5} for step in looping(agent, marker, 10)]
        with scripted_model(tmp_path, steps) as (model, log):
            agent.configure(ws, model)
            run = run_agent(agent, ws, model, log)
    finally:
        server.stop()
    assert run.exit_code == 1  # interrupted, not answered
    assert ran(marker) == 5
    # the run ended at the abort (call 7): the model got at most the request carrying
    # call 7's denial (with an instant model Codex reaches the script's end first)
    assert len(run.turns) <= 8


@pytest.mark.parametrize("name", AGENTS)
def test_installed_for_the_user_in_a_clean_home_a_loop_is_blocked(
    name: str, tmp_path: Path, service: HooksServer
) -> None:
    agent = ALL[name]
    run, marker = loop_run(agent, tmp_path, service.url, 6, "--user")
    seen = run.seen()
    assert warning(agent, 3) in seen[3] and CRITICAL in seen[5]
    assert ran(marker) == 5


@pytest.mark.parametrize("name", AGENTS)
def test_a_healthy_session_is_untouched(name: str, tmp_path: Path, service: HooksServer) -> None:
    agent = ALL[name]
    marker = tmp_path / "marker.txt"
    ws = installed(agent, tmp_path, service.url)
    steps = [agent.shell(f"echo step {i} >> {marker}; echo built {i}") for i in range(7)]
    with scripted_model(tmp_path, [*steps, {"text": "built"}]) as (model, log):
        agent.configure(ws, model)
        run = run_agent(agent, ws, model, log)
    assert run.exit_code == 0, run.stderr[-3000:]
    seen = run.seen()
    assert len(seen) == 7
    for i, text in enumerate(seen):
        assert f"built {i}" in text and "WARNING" not in text and "CRITICAL" not in text
    assert marker.read_text() == "".join(f"step {i}\n" for i in range(7))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def service_down(name: str, policy: str, tmp_path: Path) -> None:
    agent = ALL[name]
    nothing = f"http://127.0.0.1:{_free_port()}"  # no service listens there
    extra = ("--fail-closed",) if policy == "closed" else ()
    run, marker = loop_run(agent, tmp_path, nothing, 2, *extra)
    seen = run.seen()
    assert len(seen) == 2
    if policy == "open":  # the tool runs, unjudged
        assert ran(marker) == 2
        assert all("still broken" in text for text in seen)
    else:  # the tool does not run; the model reads why
        assert ran(marker) == 0
        reason = 'onFailure is "block"' if name == "claude" else "fail-closed policy"
        assert all("still broken" not in t and reason in t for t in seen), seen


@pytest.mark.parametrize("name", AGENTS)
def test_the_service_down_lets_the_call_run_when_open(name: str, tmp_path: Path) -> None:
    service_down(name, "open", tmp_path)


@pytest.mark.parametrize("name", AGENTS)
def test_the_service_down_blocks_the_call_when_closed(name: str, tmp_path: Path) -> None:
    service_down(name, "closed", tmp_path)


def test_two_agents_sessions_with_one_id_on_one_service_stay_apart(
    tmp_path: Path, service: HooksServer
) -> None:
    # Codex loops three times; then Claude Code runs under Codex's session id and loops on
    # the same command (both hooks name the tool Bash): were the two one session, Claude's
    # calls would be the loop's 4th to 6th, warned and blocked.
    shared = tmp_path / "shared.txt"
    runs: dict[str, Run] = {}
    for name in ("codex", "claude"):
        agent = ALL[name]
        ws = installed(agent, tmp_path, service.url)
        args = ["--session-id", runs["codex"].session] if name == "claude" else []
        with scripted_model(tmp_path, looping(agent, shared, 3)) as (model, log):
            agent.configure(ws, model)
            runs[name] = run_agent(agent, ws, model, log, args=args)
        assert runs[name].exit_code == 0, runs[name].stderr[-3000:]
        runs[name].session = agent.session_id(runs[name].stdout)
    assert runs["claude"].session == runs["codex"].session
    for run in runs.values():
        seen = run.seen()
        assert len(seen) == 3
        assert all("still broken" in t and "WARNING" not in t for t in seen), seen
    assert ran(shared) == 6


@pytest.mark.parametrize("name", AGENTS)
def test_a_restarted_service_keeps_the_sessions_history(
    name: str, tmp_path: Path, settings: dict[str, str]
) -> None:
    agent = ALL[name]
    port = _free_port()
    server = HooksServer(settings, ["--port", str(port), "--verdict-timeout", "20"]).start()
    marker, restarted = tmp_path / "marker.txt", tmp_path / "restarted"
    steps = looping(agent, marker, 7)
    steps[3] = {**steps[3], "wait_for": str(restarted)}  # the model holds call 4
    ws = installed(agent, tmp_path, server.url)
    try:
        with scripted_model(tmp_path, steps) as (model, log):
            agent.configure(ws, model)
            process = subprocess.Popen(
                [command(name), *agent.argv()],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                cwd=ws.project,
                env=agent_env(ws, **agent.env(model)),
            )
            # Calls 1-3 ran and the model was asked for call 4: restart the service.
            deadline = time.monotonic() + 120
            while not (log.exists() and '"turn": 3,' in log.read_text()):
                assert time.monotonic() < deadline and process.poll() is None
                time.sleep(0.1)
            assert server.stop() == 0
            server.start()
            restarted.touch()
            out, err = process.communicate(timeout=240)
            requests = [json.loads(line) for line in log.read_text().splitlines()]
    finally:
        server.stop()
    run = Run(name, requests, process.returncode, out, err)
    seen = run.seen()
    # The restarted service remembers nothing, loopfuse does: calls 4-5 are still the
    # loop's 4th and 5th (warned), call 6 its 6th (blocked).
    assert warning(agent, 3) in seen[3] and warning(agent, 4) in seen[4]
    assert CRITICAL in seen[5]
    assert ran(marker) == 5


def test_a_loop_over_two_runs_of_a_resumed_gemini_session_is_one_loop(
    tmp_path: Path, service: HooksServer
) -> None:
    # Gemini's own detector (on here) counts within one process: resumed, the session
    # starts from zero. loopfuse counts the session's calls, whichever process made them.
    agent = ALL["gemini"]
    marker = tmp_path / "marker.txt"
    ws = installed(agent, tmp_path, service.url)
    runs = []
    for args in ([], ["--resume", "latest"]):
        with scripted_model(tmp_path, looping(agent, marker, 3)) as (model, log):
            agent.configure(ws, model)
            merge_settings(
                ws.home / ".gemini" / "settings.json", {"model": {"disableLoopDetection": False}}
            )
            runs.append(run_agent(agent, ws, model, log, args=args))
        assert runs[-1].exit_code == 0, runs[-1].stderr[-3000:]
    assert agent.session_id(runs[0].stdout) == agent.session_id(runs[1].stdout)
    seen = runs[0].seen() + runs[1].seen()  # calls 1-3, then the resumed run's 4-6
    assert all("WARNING" not in text for text in seen[:3])
    assert warning(agent, 3) in seen[3] and warning(agent, 4) in seen[4]
    assert CRITICAL in seen[5]
    assert ran(marker) == 5


@pytest.mark.parametrize("name", AGENTS)
def test_uninstall_takes_the_hooks_out(name: str, tmp_path: Path, service: HooksServer) -> None:
    agent = ALL[name]
    marker = tmp_path / "marker.txt"
    ws = installed(agent, tmp_path, service.url)
    loopfuse_hooks(ws, "uninstall", name, "--project")
    with scripted_model(tmp_path, looping(agent, marker, 7)) as (model, log):
        agent.configure(ws, model)
        run = run_agent(agent, ws, model, log)
    assert run.exit_code == 0, run.stderr[-3000:]
    assert ran(marker) == 7  # nothing judged the loop
    assert all("WARNING" not in t and "CRITICAL" not in t for t in run.seen())
