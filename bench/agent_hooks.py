"""What loopfuse's hooks cost inside each coding agent's loop, what the hooks service
waits for a verdict, and when each agent's own loop detector stops a loop beside loopfuse.

    python bench/agent_hooks.py [--broker kafka|embedded|HOST:PORT] [--rounds 5] \
        [--calls 10] [--agents claude,codex,gemini] [--loop-calls 20] [--service-calls 300]

Needs the pinned agents (tests/e2e/agents: npm ci, as ./dev test runs it). One worker
(warning 3, critical 5, run endings for the three agents) and one ``loopfuse hooks
serve`` on the broker, then:

1. per agent, ``--rounds`` pairs of runs, with and without ``loopfuse hooks install
   <agent> --project`` and alternated, each ``--calls`` distinct shell commands against
   the scripted model: the gap between consecutive model requests is one turn of the
   agent's loop (the model's answer, the agent's work, the tool, the hooks); the hook's
   cost per call is the median gap with it minus the median without;
2. the service's verdict wait: its own p50 and p99 (``GET /healthz``) over the calls of
   the agents' runs, then ``--service-calls`` PreToolUse hooks POSTed to it as Claude
   Code posts them (distinct sessions of three calls, each with its PostToolUse), timed
   from the request to the answer;
3. the same looping command (``--loop-calls`` times), per agent, with only the agent's
   own loop detector (Gemini CLI's ``model.disableLoopDetection`` false; Claude Code and
   Codex CLI have none) and with loopfuse: how many times the tool ran, and the call at
   which the run ended (or ``-`` when the model's script ran out first).

docs/gateway-integration.md quotes it.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from loopfuse.streams.local.worker_process import WorkerProcess  # noqa: E402
from tests.e2e.agents.agent_cli import (  # noqa: E402
    ALL,
    LOOP_DETECTION,
    Agent,
    Run,
    Workspace,
    loopfuse_hooks,
    merge_settings,
    run_agent,
    scripted_model,
)
from tests.support.brokers import run_on  # noqa: E402
from tests.support.harness import new_topics, unique, worker_settings  # noqa: E402
from tests.support.hooks_service import HooksServer  # noqa: E402


def one_run(
    agent: Agent,
    tmp: Path,
    steps: list[dict[str, Any]],
    url: str | None,
    own_detector: bool = False,
) -> Run:
    """One run of ``agent``; with loopfuse's hooks when ``url`` (the service) is given."""
    ws = Workspace.make(tmp)
    if url is not None:
        loopfuse_hooks(ws, "install", agent.name, "--project", "--url", url)
    with scripted_model(tmp, steps) as (model, log):
        agent.configure(ws, model)
        if own_detector and agent.name == "gemini":
            merge_settings(
                ws.home / ".gemini" / "settings.json", {"model": {"disableLoopDetection": False}}
            )
        return run_agent(agent, ws, model, log, timeout=600)


def turn_gaps(run: Run) -> list[float]:
    """Seconds between consecutive agent-loop requests: one turn each."""
    times = [turn["at"] for turn in run.turns]
    return [b - a for a, b in itertools.pairwise(times)]


def overhead(agent: Agent, tmp: Path, url: str, rounds: int, calls: int) -> str:
    gaps: dict[str, list[float]] = {"with": [], "without": []}
    for _ in range(rounds):
        for mode in ("without", "with"):
            tag = uuid.uuid4().hex[:6]
            steps = [agent.shell(f"echo {tag} {i}") for i in range(calls)] + [{"text": "done"}]
            run = one_run(agent, tmp, steps, url if mode == "with" else None)
            if run.exit_code != 0 or len(run.turns) != calls + 1:
                raise SystemExit(f"{agent.name} {mode}: {run.exit_code} {run.stderr[-2000:]}")
            gaps[mode] += turn_gaps(run)
    med = {mode: statistics.median(values) * 1000 for mode, values in gaps.items()}
    return (
        f"{agent.name:>6}: turn gap median without hooks {med['without']:.1f} ms, with "
        f"{med['with']:.1f} ms: {med['with'] - med['without']:+.1f} ms a tool call "
        f"({len(gaps['with'])} turns each)"
    )


async def own_figures(url: str) -> str:
    """The service's own verdict wait (``GET /healthz``) over the agents' calls so far."""
    async with aiohttp.ClientSession() as http, http.get(f"{url}/healthz") as r:
        wait = (await r.json())["verdict_wait_ms"]
    return (
        f"service: its own verdict wait over the agents' {wait['count']} calls (/healthz) "
        f"p50 {wait['p50']} ms, p99 {wait['p99']} ms"
    )


async def verdict_wait(url: str, calls: int) -> str:
    waits: list[float] = []
    async with aiohttp.ClientSession() as http:
        session = ""
        for n in range(calls):
            if n % 3 == 0:  # a session of three distinct calls: every verdict an allow
                session = f"bench-{n // 3}-{uuid.uuid4().hex[:6]}"
            call = {
                "session_id": session,
                "transcript_path": f"/tmp/{session}.jsonl",
                "cwd": "/work",
                "tool_name": "Bash",
                "tool_input": {"command": f"make test {n}"},
                "tool_use_id": f"toolu_{n}",
            }
            start = time.perf_counter()
            async with http.post(
                f"{url}/claude", json={**call, "hook_event_name": "PreToolUse"}
            ) as r:
                assert r.status == 200 and await r.json() == {}, await r.text()
            waits.append(time.perf_counter() - start)
            after = {
                **call,
                "hook_event_name": "PostToolUse",
                "tool_response": {"stdout": "ok", "stderr": "", "interrupted": False},
            }
            async with http.post(f"{url}/claude", json=after) as r:
                assert r.status == 200
    waits.sort()
    p50, p99 = waits[len(waits) // 2], waits[int(len(waits) * 0.99) - 1]
    return (
        f"service: verdict wait (PreToolUse POST to answer, {calls} calls) "
        f"p50 {p50 * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms"
    )


def detectors(agent: Agent, tmp: Path, url: str, calls: int) -> list[str]:
    lines = []
    for mode in ("own detector", "loopfuse"):
        marker = tmp / f"loop-{agent.name}-{uuid.uuid4().hex[:6]}.txt"
        loop = agent.shell(f"echo loop >> {marker}; printf 'still %s\\n' broken")
        steps = [loop] * calls + [{"text": "gave up"}]
        own = mode == "own detector"
        run = one_run(agent, tmp, steps, None if own else url, own_detector=own)
        ran = marker.read_text().count("loop") if marker.exists() else 0
        made = min(len(run.turns), calls)  # each agent-loop request asked for one call
        ended = str(len(run.turns)) if len(run.turns) <= calls else "-"
        lines.append(
            f"{agent.name:>6} {mode:>12}: the tool ran {ran} of {made} calls; run ended at "
            f"call {ended}"
        )
    return lines


async def bench(args: argparse.Namespace, bootstrap: str, embedded: bool) -> None:
    with tempfile.TemporaryDirectory(prefix="loopfuse-bench-agents-") as workdir:
        tmp = Path(workdir)
        config = tmp / "loop-detection.json"
        config.write_text(json.dumps(LOOP_DETECTION))
        settings = worker_settings(
            bootstrap,
            "tansu" if embedded else "kafka",
            new_topics(),
            unique("bench-agents"),
            tmp / "data",
            config_file=config,
            reply_topics=unique("bench-agents-replies"),
            reply_partitions=4,
        )
        worker = WorkerProcess(settings, log_path=tmp / "worker.log").start()
        service = None
        try:
            worker.wait_ready(120)
            service = HooksServer(settings, ["--port", "0", "--verdict-timeout", "20"]).start()
            agents = [ALL[name] for name in args.agents.split(",")]
            for agent in agents:
                print(overhead(agent, tmp, service.url, args.rounds, args.calls), flush=True)
            print(await own_figures(service.url), flush=True)
            print(await verdict_wait(service.url, args.service_calls), flush=True)
            for agent in agents:
                for line in detectors(agent, tmp, service.url, args.loop_calls):
                    print(line, flush=True)
        finally:
            if service is not None:
                service.stop()
            worker.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--broker", default=None, metavar="kafka|embedded|HOST:PORT")
    parser.add_argument("--rounds", type=int, default=5, help="pairs of runs per agent")
    parser.add_argument("--calls", type=int, default=10, help="tool calls per run")
    parser.add_argument("--agents", default="claude,codex,gemini")
    parser.add_argument("--loop-calls", type=int, default=20)
    parser.add_argument("--service-calls", type=int, default=300)
    args = parser.parse_args()
    run_on(args.broker, lambda b, e: bench(args, b, e))
    return 0


if __name__ == "__main__":
    sys.exit(main())
