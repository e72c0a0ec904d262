"""The pinned agents, each run once (one prompt, non-interactive) in its own agent loop
against the scripted model: where each is, how it is pointed at the model on loopback,
how a command hook is added to it, and what the run did (the model's requests, the
agent's answer).

Only the model is scripted. Each agent runs its own loop, its own shell tool (Claude
Code's ``Bash``, Codex's ``exec_command``, Gemini's ``run_shell_command``) and its own
hooks; every run has its own HOME and project directory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[2]
BIN = HERE / "node_modules" / ".bin"
PINNED: dict[str, str] = json.loads((HERE / "package.json").read_text())["dependencies"]
#: The command of each agent, and its npm package.
AGENTS = {
    "claude": "@anthropic-ai/claude-code",
    "codex": "@openai/codex",
    "gemini": "@google/gemini-cli",
}
PROMPT = "fix the build"
#: The worker's loopDetection config for the agents' tests and bench: warning 3, critical
#: 5, and run endings for the three agents (the hooks service's agent id is the agent's
#: name), so a loop's second critical aborts the run.
LOOP_DETECTION = {
    "tools": {"loopDetection": {"enabled": True, "warningThreshold": 3, "criticalThreshold": 5}},
    "agents": {"list": [{"id": name, "loopfuse": {"rules": {"runEnding": {}}}} for name in AGENTS]},
}

Json = dict[str, Any]


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


@dataclass
class Workspace:
    """One run's own HOME and project directory (the agent's working directory)."""

    home: Path
    project: Path

    @classmethod
    def make(cls, tmp: Path) -> Workspace:
        root = tmp / f"run-{uuid.uuid4().hex[:8]}"
        home, project = root / "home", root / "project"
        home.mkdir(parents=True)
        project.mkdir()
        return cls(home, project)


def merge_settings(path: Path, update: Json) -> None:
    """Merge ``update`` into the JSON settings file at ``path`` (hook lists appended)."""
    current: Json = json.loads(path.read_text()) if path.exists() else {}
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(current.get(key), dict):
            for inner, entries in value.items():
                old = current[key].get(inner)
                current[key][inner] = (
                    old + entries
                    if isinstance(old, list) and isinstance(entries, list)
                    else entries
                )
        else:
            current[key] = value
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(current, indent=2))


class Agent:
    """How one agent is set up and run; subclasses per agent."""

    name: str
    #: the agent's shell tool and the argument holding the command
    shell_tool: str
    shell_arg: str
    #: the hook event before a tool runs
    before_tool: str

    def shell(self, command: str) -> Json:
        """A script step: the model asks for one shell command."""
        return {"tool_calls": [{"name": self.shell_tool, "arguments": {self.shell_arg: command}}]}

    def configure(self, ws: Workspace, model_url: str) -> None:
        """Point the agent at the scripted model (``model_url`` ends in /v1)."""
        raise NotImplementedError

    def env(self, model_url: str) -> dict[str, str]:
        return {}

    def argv(self) -> list[str]:
        raise NotImplementedError

    def add_command_hook(self, ws: Workspace, event: str, command: str) -> None:
        """A command hook for ``event`` on every tool (the agent's own settings format)."""
        raise NotImplementedError

    def session_id(self, stdout: str) -> str:
        raise NotImplementedError


class Claude(Agent):
    name = "claude"
    shell_tool, shell_arg = "Bash", "command"
    before_tool = "PreToolUse"

    def configure(self, ws: Workspace, model_url: str) -> None:
        pass  # the environment points it at the model

    def env(self, model_url: str) -> dict[str, str]:
        return {
            "ANTHROPIC_BASE_URL": model_url.removesuffix("/v1"),
            "ANTHROPIC_API_KEY": "scripted",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        }

    def argv(self) -> list[str]:
        return ["-p", PROMPT, "--output-format", "json", "--allowedTools", "Bash"]

    def add_command_hook(self, ws: Workspace, event: str, command: str) -> None:
        entry = {"matcher": "*", "hooks": [{"type": "command", "command": command}]}
        merge_settings(ws.project / ".claude" / "settings.json", {"hooks": {event: [entry]}})

    def session_id(self, stdout: str) -> str:
        return str(json.loads(stdout)["session_id"])


class Codex(Agent):
    name = "codex"
    shell_tool, shell_arg = "exec_command", "cmd"
    before_tool = "PreToolUse"

    def configure(self, ws: Workspace, model_url: str) -> None:
        config = ws.home / ".codex" / "config.toml"
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(
            'model = "scripted"\n'
            'model_provider = "scripted"\n'
            "[model_providers.scripted]\n"
            'name = "scripted"\n'
            f'base_url = "{model_url}"\n'
            'wire_api = "responses"\n'
            # a trusted project: Codex reads a project's .codex/ (its hooks) only then
            f"[projects.{json.dumps(str(ws.project))}]\n"
            'trust_level = "trusted"\n'
        )

    def argv(self) -> list[str]:
        # the shell tool writes the marker file: no sandbox (the run's HOME is its own)
        return [
            "exec",
            "--skip-git-repo-check",
            "--dangerously-bypass-hook-trust",
            "--dangerously-bypass-approvals-and-sandbox",
            "--json",
            PROMPT,
        ]

    def add_command_hook(self, ws: Workspace, event: str, command: str) -> None:
        with (ws.home / ".codex" / "config.toml").open("a") as config:
            config.write(
                f"\n[[hooks.{event}]]\n[[hooks.{event}.hooks]]\n"
                f'type = "command"\ncommand = {json.dumps(command)}\n'
            )

    def session_id(self, stdout: str) -> str:
        for line in stdout.splitlines():
            event = json.loads(line)
            if event.get("type") == "thread.started":
                return str(event["thread_id"])
        raise AssertionError(f"no thread.started in Codex's output: {stdout[-2000:]}")


class Gemini(Agent):
    name = "gemini"
    shell_tool, shell_arg = "run_shell_command", "command"
    before_tool = "BeforeTool"

    def configure(self, ws: Workspace, model_url: str) -> None:
        merge_settings(
            ws.home / ".gemini" / "settings.json",
            {
                "security": {"auth": {"selectedType": "gemini-api-key"}},
                # Gemini's own loop detector off: loopfuse is the one under test
                "model": {"disableLoopDetection": True},
                "general": {"disableAutoUpdate": True, "disableUpdateNag": True},
                "telemetry": {"enabled": False},
                "privacy": {"usageStatisticsEnabled": False},
            },
        )

    def env(self, model_url: str) -> dict[str, str]:
        # A trusted workspace: Gemini reads the project's settings (its hooks) only in one;
        # --skip-trust alone trusts it after they were read (0.61.0).
        return {
            "GEMINI_API_KEY": "scripted",
            "GOOGLE_GEMINI_BASE_URL": model_url.removesuffix("/v1"),
            "GEMINI_CLI_TRUST_WORKSPACE": "true",
        }

    def argv(self) -> list[str]:
        return ["-p", PROMPT, "--output-format", "json", "--approval-mode", "yolo", "--skip-trust"]

    def add_command_hook(self, ws: Workspace, event: str, command: str) -> None:
        entry = {"matcher": ".*", "hooks": [{"type": "command", "command": command}]}
        merge_settings(ws.project / ".gemini" / "settings.json", {"hooks": {event: [entry]}})

    def session_id(self, stdout: str) -> str:
        return str(json.loads(stdout)["session_id"])


ALL: dict[str, Agent] = {a.name: a for a in (Claude(), Codex(), Gemini())}


@dataclass
class Run:
    """What one agent run did: the scripted model's log, and the agent's own output."""

    agent: str
    requests: list[Json]
    exit_code: int
    stdout: str
    stderr: str
    session: str = ""  # the agent's session id, once a test read it

    @property
    def turns(self) -> list[Json]:
        """The agent-loop requests (turn 0 asks for the first call)."""
        return [r for r in self.requests if r["turn"] >= 0]

    def received(self) -> list[Json]:
        """Per tool call, in order, the result the model received for it (the first tool
        result of the request after the call's)."""
        return [turn["results"][0] for turn in self.turns[1:] if turn["results"]]

    def seen(self) -> list[str]:
        """Per tool call, in order, all the model read after it: the tool's result and what
        the agent added beside it (a hook's message)."""
        return [
            "\n".join([r["output"] for r in turn["results"]] + turn["notes"])
            for turn in self.turns[1:]
        ]


@contextmanager
def scripted_model(tmp: Path, steps: list[Json], then: str = "stop") -> Iterator[tuple[str, Path]]:
    """The scripted model on loopback: its URL (ending in /v1) and its request log."""
    tag = uuid.uuid4().hex[:8]
    script, log = tmp / f"script-{tag}.json", tmp / f"requests-{tag}.jsonl"
    script.write_text(json.dumps({"steps": steps, "then": then}))
    model = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.support.scripted_model",
            "--script",
            str(script),
            "--log",
            str(log),
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO_ROOT,
    )
    try:
        assert model.stdout is not None
        yield model.stdout.readline().strip().rsplit(" ", 1)[-1], log
    finally:
        model.terminate()
        model.wait(10)


def agent_env(ws: Workspace, **extra: str) -> dict[str, str]:
    """The agent's environment: its own HOME, the pinned Node 24 first on PATH, no proxy
    (everything it talks to is on loopback)."""
    keep = {k: v for k, v in os.environ.items() if k in ("LANG", "LC_ALL", "TZ")}
    return {
        **keep,
        "HOME": str(ws.home),
        "PATH": f"{BIN}:{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
        "NO_PROXY": "127.0.0.1,localhost",
        **extra,
    }


def run_agent(
    agent: Agent,
    ws: Workspace,
    model_url: str,
    log: Path,
    *,
    args: Sequence[str] = (),
    timeout: float = 180,
) -> Run:
    """One run of ``agent`` in ``ws`` (configured, hooks added) against ``model_url``,
    with ``args`` after the agent's own."""
    done = subprocess.run(
        [command(agent.name), *agent.argv(), *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ws.project,
        env=agent_env(ws, **agent.env(model_url)),
    )
    requests = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return Run(agent.name, requests, done.returncode, done.stdout, done.stderr)


def loopfuse_hooks(ws: Workspace, *args: str) -> str:
    """``loopfuse hooks ARGS`` (install, uninstall) as a user runs it in the project, with
    the run's HOME; its output."""
    done = subprocess.run(
        [str(Path(sys.executable).parent / "loopfuse"), "hooks", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ws.project,
        env={**os.environ, "HOME": str(ws.home)},
        check=True,
    )
    return done.stdout
