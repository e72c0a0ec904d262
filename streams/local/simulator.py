"""Fleet simulator: concurrent simulated agent sessions driven through the gateway client.

Each session behaves like an agent of one kind: healthy, or stuck in a generic
repeat, a polling loop, a ping-pong, retries of a missing tool, or a loop that
survives a context compaction. It acts on the verdicts it gets (a blocked call is
not run; the agent gives up and starts a new run), and it knows which verdict each
call should get: it folds its own events through a local engine with the same
config (verdicts are a deterministic function of a session's events in seq order),
so any verdict that differs — lost, late, reordered, misrouted state — is a mismatch.
Seeded and reproducible.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from loopfuse.schemas import validate_event
from loopfuse.schemas.config import DetectionConfigFile
from loopfuse.schemas.events import Verdict
from loopfuse.streams.engine import Engine, SessionState
from loopfuse.streams.engine.outputs import Verdict as ExpectedVerdict
from loopfuse.streams.gateway.client import GatewayClient, GatewaySession, blocked_tool_result

KINDS = ("healthy", "generic_repeat", "polling", "ping_pong", "unknown_tool", "compaction_loop")

DEMO_CONFIG: dict[str, Any] = {"tools": {"loopDetection": {"enabled": True}}}


def _text(rng: random.Random, words: int) -> str:
    vocabulary = [
        "build",
        "test",
        "lint",
        "deploy",
        "cache",
        "index",
        "fetch",
        "parse",
        "render",
        "store",
        "query",
    ]
    return " ".join(rng.choice(vocabulary) for _ in range(words))


@dataclass
class Step:
    """One thing the simulated agent does: a call and what the tool would return."""

    tool: str
    args: Any
    result: Any = None
    error: str | None = None
    compaction_before: bool = False


class Behaviour:
    """What an agent of one kind does next; ``restart`` after it gave up on a run."""

    kind = "healthy"

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.step_no = 0

    def restart(self) -> None:
        self.step_no = 0

    def next_step(self) -> Step:
        self.step_no += 1
        rng = self.rng
        tool = rng.choice(["read", "exec", "web_search", "write"])
        n = rng.randint(0, 10**9)
        args: dict[str, Any] = {
            "read": {"path": f"/src/file_{n}.py"},
            "exec": {"command": f"pytest -k case_{n}"},
            "web_search": {"query": _text(rng, 4) + f" {n}"},
            "write": {"path": f"/tmp/out_{n}.txt", "content": _text(rng, 30)},
        }[tool]
        return Step(tool, args, {"content": [{"type": "text", "text": _text(rng, 40) + str(n)}]})


class GenericRepeat(Behaviour):
    kind = "generic_repeat"

    def next_step(self) -> Step:
        self.step_no += 1
        return Step(
            "exec",
            {"command": "npm run build"},
            {"content": [{"type": "text", "text": "error TS2304: cannot find name 'x'"}]},
        )


class Polling(Behaviour):
    kind = "polling"

    def next_step(self) -> Step:
        self.step_no += 1
        return Step(
            "process",
            {"action": "poll", "sessionId": "build-1"},
            {
                "content": [{"type": "text", "text": "still running"}],
                "details": {"status": "running", "aggregated": "compiling (41%)"},
            },
        )


class PingPong(Behaviour):
    kind = "ping_pong"

    def next_step(self) -> Step:
        self.step_no += 1
        if self.step_no % 2:
            return Step(
                "read", {"path": "/src/app.py"}, {"content": [{"type": "text", "text": "v1"}]}
            )
        return Step(
            "exec",
            {"command": "python /src/app.py"},
            {"content": [{"type": "text", "text": "KeyError"}]},
        )


class UnknownTool(Behaviour):
    kind = "unknown_tool"

    def next_step(self) -> Step:
        self.step_no += 1
        return Step(
            "deploy_to_prod",
            {"target": f"cluster-{self.step_no}"},
            error="Unknown tool: deploy_to_prod",
        )


class CompactionLoop(Behaviour):
    """A few healthy-looking calls, then a compaction, then the same failing call."""

    kind = "compaction_loop"

    def next_step(self) -> Step:
        self.step_no += 1
        if self.step_no <= 3:
            return Step("read", {"path": f"/notes/{self.step_no}.md"}, {"content": []})
        return Step(
            "exec",
            {"command": "cargo test"},
            {"details": {"status": "failed", "exitCode": 101, "aggregated": "1 test failed"}},
            compaction_before=self.step_no == 4,
        )


BEHAVIOURS: dict[str, type[Behaviour]] = {
    cls.kind: cls
    for cls in (Behaviour, GenericRepeat, Polling, PingPong, UnknownTool, CompactionLoop)
}


@dataclass
class FleetStats:
    sessions: int = 0
    tool_calls: int = 0
    actions: Counter[str] = field(default_factory=Counter)
    detectors: Counter[str] = field(default_factory=Counter)
    mismatches: int = 0
    mismatch_examples: list[str] = field(default_factory=list)
    timeouts: int = 0
    latest: deque[Verdict] = field(default_factory=lambda: deque(maxlen=8))
    latencies_ms: deque[float] = field(default_factory=lambda: deque(maxlen=5000))
    by_kind: dict[str, Counter[str]] = field(default_factory=dict)

    def count(self, kind: str, verdict: Verdict) -> None:
        """Count one verdict in the total and in its session kind's row alike.

        Aborts arrive for a tool_result through the gateway's abort callback, not as
        the answer to a check: counting them in one place keeps the live view's rows
        adding up to its ``all`` row.
        """
        self.actions[verdict.action] += 1
        self.by_kind.setdefault(kind, Counter())[verdict.action] += 1
        if verdict.detector:
            self.detectors[verdict.detector] += 1
            self.latest.append(verdict)

    def summary_line(self) -> str:
        a = self.actions
        return (
            f"demo: sessions={self.sessions} tool_calls={self.tool_calls} allow={a['allow']} "
            f"warn={a['warn']} block={a['block']} abort={a['abort']} mismatches={self.mismatches}"
        )


class SimulatedSession:
    """One simulated agent session and the local engine that says what it should get."""

    def __init__(
        self,
        client: GatewayClient,
        index: int,
        kind: str,
        config: DetectionConfigFile,
        stats: FleetStats,
        seed: int,
        pace: float,
    ) -> None:
        self.rng = random.Random(seed * 1_000_003 + index)
        self.kind = kind
        self.behaviour = BEHAVIOURS[kind](self.rng)
        self.stats = stats
        self.pace = pace
        self.run_no = 0
        self.session: GatewaySession = client.session(
            f"sim:{seed}:{index}:{kind}", run_id=self._run_id(), agent_id=f"agent-{kind}"
        )
        self.client = client
        self.expected_engine = Engine(config)
        self.expected_state: SessionState | None = None
        self.expected_aborts: list[str] = []
        self.expected: list[ExpectedVerdict] = []
        self.aborted_runs: set[str] = set()
        self.abort_seen = asyncio.Event()
        client.on_abort(self.session.session_key, self.session.run_id, self._aborted)

    def _run_id(self) -> str:
        return f"run-{self.run_no}"

    async def _aborted(self, verdict: Verdict) -> None:
        self.stats.count(self.kind, verdict)
        self.aborted_runs.add(verdict.run_id or "")
        self.abort_seen.set()

    def _expect(self, event: dict[str, Any]) -> list[ExpectedVerdict]:
        """Fold the event we just published through the local engine."""
        validated = validate_event(event)
        self.expected_state, outputs = self.expected_engine.step(
            self.expected_state, validated, validated.ts
        )
        return [o for o in outputs if isinstance(o, ExpectedVerdict)]

    def _mismatch(self, what: str) -> None:
        self.stats.mismatches += 1
        if len(self.stats.mismatch_examples) < 10:
            self.stats.mismatch_examples.append(f"{self.session.session_key}: {what}")

    async def _new_run(self) -> None:
        await self.session.run_ended()
        self.run_no += 1
        self.session.new_run(self._run_id())
        self.client.on_abort(self.session.session_key, self.session.run_id, self._aborted)
        self.behaviour.restart()

    def _observe(self, event: dict[str, Any]) -> None:
        self.expected.extend(self._expect(event))

    def _check(self, call_id: str, verdict: Verdict) -> None:
        expected = [v for v in self.expected if v.action != "abort"]
        self.expected = [v for v in self.expected if v.action == "abort"]
        if not expected:
            self._mismatch(f"call {call_id}: no expected verdict")
            return
        want = expected[0]
        got = (verdict.action, verdict.detector, verdict.count, verdict.message)
        if got != (want.action, want.detector, want.count, want.message):
            self._mismatch(
                f"call {call_id}: got {verdict.action}/{verdict.detector}/{verdict.count}, "
                f"expected {want.action}/{want.detector}/{want.count}"
            )

    async def run(self, stop: asyncio.Event) -> None:
        stats = self.stats
        stats.sessions += 1
        stats.by_kind.setdefault(self.kind, Counter())
        self.session.observer = self._observe
        while not stop.is_set():
            step = self.behaviour.next_step()
            if step.compaction_before:
                self.abort_seen.clear()
                await self.session.compaction("context_overflow")
            call_id = self.session.new_call_id()
            published_before = len(self.expected)
            asked = time.perf_counter()
            verdict = await self.session.check(step.tool, step.args, call_id=call_id)
            if len(self.expected) > published_before:
                stats.latencies_ms.append((time.perf_counter() - asked) * 1000)
            stats.tool_calls += 1
            stats.count(self.kind, verdict)
            if len(self.expected) > published_before:  # else: from the sticky-block cache
                self._check(call_id, verdict)
            if verdict.action == "block":
                # The agent gets OpenClaw's blocked tool result (records nothing), gives up.
                await self.session.result(
                    step.tool, step.args, call_id=call_id, result=blocked_tool_result(verdict)
                )
                await self._new_run()
            else:
                await self.session.result(
                    step.tool, step.args, call_id=call_id, result=step.result, error=step.error
                )
                aborts = [v for v in self.expected if v.action == "abort"]
                self.expected = []
                if aborts:
                    self.expected_aborts.append(aborts[0].run_id or "")
                    try:
                        await asyncio.wait_for(self.abort_seen.wait(), 10.0)
                    except TimeoutError:
                        self._mismatch(f"run {self.session.run_id}: expected an abort, none came")
                    await self._new_run()
            await asyncio.sleep(self.rng.uniform(0.5, 1.5) * self.pace)

    def check_aborts(self) -> None:
        unexpected = self.aborted_runs - set(self.expected_aborts)
        for run in sorted(unexpected):
            self._mismatch(f"run {run}: aborted, but no abort was expected")


async def run_fleet(
    client: GatewayClient,
    *,
    sessions: int,
    duration: float,
    seed: int,
    config: DetectionConfigFile,
    stats: FleetStats | None = None,
    pace: float = 0.02,
) -> FleetStats:
    """Run ``sessions`` simulated sessions (all kinds, round-robin) for ``duration`` s."""
    stats = stats or FleetStats()
    stop = asyncio.Event()
    fleet = [
        SimulatedSession(client, index, KINDS[index % len(KINDS)], config, stats, seed, pace)
        for index in range(sessions)
    ]
    tasks = [asyncio.create_task(member.run(stop)) for member in fleet]
    await asyncio.sleep(duration)
    stop.set()
    await asyncio.gather(*tasks)
    for member in fleet:
        member.check_aborts()
    stats.timeouts = client.timeouts
    return stats
