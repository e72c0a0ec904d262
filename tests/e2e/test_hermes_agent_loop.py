"""The Hermes plugin inside Hermes' own agent loop: ``hermes chat -q`` (hermes-agent 0.19.0)
against a scripted model on loopback, the plugin loaded from its entry point, a real
worker on the session's broker. Only the LLM is scripted: Hermes runs its loop, its
``terminal`` tool, its context compressor; what the model received on each turn is
read from the scripted model's log.

Runs in a gateway's base install (tests/integration/test_gateway_install.py), where
hermes-agent is; the worker comes from the development install (LOOPFUSE_WORKER_PYTHON).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from loopfuse.streams.gateway.client import TIMEOUT_MESSAGE
from loopfuse.streams.local.worker_process import WorkerProcess, topic_settings, unique_topics
from tests.support.harness import read_all, unique, worker_settings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

HERMES = Path(sys.executable).parent / "hermes"
#: warning 3, critical 5; after a compaction the guard aborts a loop of 3 calls; the
#: agent "run-ender" also has run endings (defaults: the
#: run's second critical, or 3 blocked calls in a row, end it).
CONFIG = {
    "tools": {
        "loopDetection": {
            "enabled": True,
            "warningThreshold": 3,
            "criticalThreshold": 5,
            "postCompactionGuard": {"windowSize": 3},
        }
    },
    "agents": {"list": [{"id": "run-ender", "loopfuse": {"rules": {"runEnding": {}}}}]},
}
HALT = "because it hit the tool-call guardrail (loopfuse_abort)"


def terminal(command: str) -> dict[str, Any]:
    return {"tool_calls": [{"name": "terminal", "arguments": {"command": command}}]}


@dataclass
class Run:
    """One ``hermes chat -q`` run: what the model was sent, turn by turn, and the answer."""

    requests: list[dict[str, Any]]
    answer: str
    session_key: str

    def tool_results(self) -> list[str]:
        """The tool result each agent-loop turn after the first carried (the last message)."""
        turns = [r for r in self.requests if r["turn"] >= 0]
        return [
            str(r["messages"][-1].get("content"))
            for r in turns[1:]
            if r["messages"][-1].get("role") == "tool"
        ]


@pytest.fixture(scope="module")
def worker(
    kafka_bootstrap: str, kafka_broker_kind: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, str]]:
    roles = unique_topics("hermes-loop")
    tmp = tmp_path_factory.mktemp("hermes-loop-worker")
    config = tmp / "loop-detection.json"
    config.write_text(json.dumps(CONFIG))
    settings = worker_settings(
        kafka_bootstrap,
        kafka_broker_kind,
        roles,
        unique("hermes-loop"),
        tmp / "data",
        config_file=config,
    )
    process = WorkerProcess(settings, log_path=tmp / "worker.log").start()
    try:
        process.wait_ready(90)
        yield topic_settings(roles)
    finally:
        process.stop()


def hermes_run(
    tmp: Path,
    steps: list[dict[str, Any]],
    plugin: dict[str, Any],
    *,
    max_turns: int = 12,
    compress: bool = False,
    after_compaction: dict[str, Any] | None = None,
) -> Run:
    """Hermes with the plugin, one query, the model answering ``steps`` then repeating."""
    home = tmp / f"home-{uuid.uuid4().hex[:6]}"
    home.mkdir()
    script = tmp / "script.json"
    script_body: dict[str, Any] = {"steps": steps, "then": "repeat"}
    if after_compaction is not None:
        script_body["when_seen"] = {"text": "[CONTEXT COMPACTION", "step": after_compaction}
    script.write_text(json.dumps(script_body))
    log = tmp / f"requests-{uuid.uuid4().hex[:6]}.jsonl"
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
    )
    try:
        assert model.stdout is not None
        url = model.stdout.readline().strip().rsplit(" ", 1)[-1]
        config: dict[str, Any] = {
            "model": {
                "provider": "custom",
                "base_url": url,
                "default": "scripted",
                "api_key": "scripted",
                "context_length": 64_000,
            },
            "agent": {"max_turns": max_turns},
            # no background memory / skill review after the run (it asks the model again)
            "memory": {"nudge_interval": 0},
            "skills": {"creation_nudge_interval": 0},
            "plugins": {"enabled": ["loopfuse"], "entries": {"loopfuse": plugin}},
        }
        if compress:
            # Compact in place once the transcript passes 76% of the 64k window (Hermes
            # raises any threshold under 0.75 to 0.75 for windows below 512k).
            config["compression"] = {
                "enabled": True,
                "threshold": 0.76,
                "protect_last_n": 2,
                "protect_first_n": 1,
            }
        (home / "config.yaml").write_text(yaml.safe_dump(config))
        done = subprocess.run(
            [str(HERMES), "chat", "-q", "fix the build", "-Q", "--ignore-rules", "--yolo"],
            capture_output=True,
            text=True,
            timeout=240,
            cwd=tmp,
            env={**os.environ, "HERMES_HOME": str(home)},
        )
    finally:
        model.terminate()
        model.wait(10)
    assert done.returncode == 0, done.stderr[-3000:]
    requests = [json.loads(line) for line in log.read_text().splitlines()]
    session = next(
        line.split(":", 1)[1].strip()
        for line in (done.stdout + done.stderr).splitlines()
        if line.startswith("session_id:")
    )
    return Run(requests, done.stdout, session)


def published(bootstrap: str, topic: str, session: str) -> list[dict[str, Any]]:
    records = asyncio.run(read_all(bootstrap, topic, 4))
    return [e for _, _, _, v in records if v and (e := orjson.loads(v))["session_key"] == session]


def test_a_loop_is_warned_then_blocked_and_the_tool_stops_running(
    tmp_path: Path, kafka_bootstrap: str, worker: dict[str, str]
) -> None:
    counter = tmp_path / "ran.txt"
    run = hermes_run(
        tmp_path,
        [terminal(f"echo ran >> {counter}; echo still broken")],
        {"bootstrap_servers": kafka_bootstrap, "gateway_timeout": 20, **worker},
    )
    results = run.tool_results()
    assert len(results) >= 8
    for n, result in enumerate(results, 1):  # what the model received after call n
        parsed = json.loads(result)
        if n <= 3:
            assert parsed == {"output": "still broken", "exit_code": 0, "error": None}
        elif n <= 5:
            assert parsed["output"] == "still broken"
            assert parsed["loopfuse_warning"].startswith(
                f"WARNING: You have called terminal {n - 1} times with identical arguments"
            )
        else:
            assert parsed == {
                "error": "CRITICAL: Called terminal with identical arguments and "
                "identical outcomes 5 times. Session execution blocked to "
                "prevent runaway loops."
            }
    assert counter.read_text().count("ran") == 5  # calls 1-5 ran; from call 6 none did
    # every call the model made was published, the blocked ones too
    calls = published(kafka_bootstrap, worker["topic_tool_calls"], run.session_key)
    made = len([r for r in run.requests if r["turn"] >= 0])
    assert len([e for e in calls if e["type"] == "tool_call"]) == made


def test_a_compaction_in_place_reaches_kafka_and_a_loop_after_it_ends_the_run(
    tmp_path: Path, kafka_bootstrap: str, worker: dict[str, str]
) -> None:
    # Calls with 30 kB of output each fill 76% of a 64k-token window after about
    # seven: Hermes compacts in place (same session id); right after, the model loops.
    growth = [terminal(f"head -c 30000 /dev/zero | tr '\\0' a; echo part {i}") for i in range(12)]
    run = hermes_run(
        tmp_path,
        growth,
        {"bootstrap_servers": kafka_bootstrap, "gateway_timeout": 20, **worker},
        max_turns=40,
        compress=True,
        after_compaction=terminal("echo still broken"),
    )
    marked = [
        r["turn"]
        for r in run.requests
        if any("[CONTEXT COMPACTION" in str(m.get("content")) for m in r["messages"])
    ]
    assert marked, "Hermes did not compact"
    events = published(kafka_bootstrap, worker["topic_compactions"], run.session_key)
    assert [e["type"] for e in events].count("compaction") == 1
    # The guard aborted the loop within its window of 3 calls, and Hermes ended the run
    # after that batch with its own hard stop's answer, long before max_turns.
    after = [r for r in run.requests if r["turn"] >= marked[0]]
    assert len(after) <= 4, [str(r["messages"][-1].get("content"))[:120] for r in after]
    assert HALT in run.answer


def test_with_run_endings_the_run_ends_at_its_second_critical(
    tmp_path: Path, kafka_bootstrap: str, worker: dict[str, str]
) -> None:
    run = hermes_run(
        tmp_path,
        [terminal("echo still broken")],
        {
            "bootstrap_servers": kafka_bootstrap,
            "gateway_timeout": 20,
            "agent_id": "run-ender",
            **worker,
        },
        max_turns=40,
    )
    turns = [r for r in run.requests if r["turn"] >= 0]
    # calls 1-5 ran, 6 was blocked (the run's first critical), 7 blocked again: the
    # second critical (runEnding's criticalsPerRun, 2) aborts, and Hermes ends the run
    # after that batch: call 7's result never reaches the model, no 8th turn comes.
    assert len(turns) == 7, len(turns)
    assert HALT in run.answer
    calls = published(kafka_bootstrap, worker["topic_tool_calls"], run.session_key)
    assert len([e for e in calls if e["type"] == "tool_call"]) == 7  # every call published


def test_a_healthy_run_is_untouched(
    tmp_path: Path, kafka_bootstrap: str, worker: dict[str, str]
) -> None:
    steps = [terminal(f"echo step {i}") for i in range(6)] + [{"text": "built"}]
    run = hermes_run(
        tmp_path, steps, {"bootstrap_servers": kafka_bootstrap, "gateway_timeout": 20, **worker}
    )
    assert [json.loads(r)["output"] for r in run.tool_results()] == [f"step {i}" for i in range(6)]
    assert "built" in run.answer


def test_without_a_worker_the_fail_policy_decides(tmp_path: Path, kafka_bootstrap: str) -> None:
    topics = topic_settings(unique_topics("hermes-loop-down"))  # no worker reads them
    counter = tmp_path / "ran.txt"
    run = hermes_run(
        tmp_path,
        [terminal(f"echo ran >> {counter}"), {"text": "gave up"}],
        {
            "bootstrap_servers": kafka_bootstrap,
            "gateway_timeout": 2,
            "fail_policy": "closed",
            **topics,
        },
    )
    assert [json.loads(r) for r in run.tool_results()] == [
        {"error": TIMEOUT_MESSAGE.format(what="blocked", policy="closed")}
    ]
    assert not counter.exists()
