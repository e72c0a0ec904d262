"""A labelled corpus of agent sessions, and what each config detects on it.

Sessions drawn with realistic tool output (build logs with timestamps, test runners'
"in 3.21s", ``kubectl get pods`` with its AGE column, ``curl -v`` with request ids and
ports, ``git status``, Gemini CLI's shell tool with its process group), each labelled
``loop`` (nothing progresses: the agent should have been stopped) or ``healthy`` (pollers
that really progress, logs that really grow, pagination, fix-and-retest cycles).

    python bench/loop_corpus.py [--sessions 12] [--seed 7] [--write DIR]

replays the corpus with ``loopfuse replay`` (the native judge where built) under
OpenClaw's defaults with detection on, then with the ``volatileResults`` rule, the
``identicalCalls`` cap (its defaults, 10 and 20, and 20 and 40), and both, and prints a table: loops warned and blocked (true
positives), healthy sessions warned and blocked (false positives), and the median call
at which a loop was first warned and first blocked; then the same per scenario. The
last line is the masking's throughput over every string of the corpus's results,
``mask_python_mb_s=<float> mask_native_mb_s=<float>`` (the native one where built).
``--write DIR`` also leaves the corpus there (``corpus.jsonl``, ``labels.json``,
the configs). Deterministic for a seed.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

T0 = 1_796_000_000_000  # 2026-11-30, ms

#: The configs compared: OpenClaw's defaults with detection on, then each rule.
CONFIGS: dict[str, dict[str, Any]] = {
    "default": {"tools": {"loopDetection": {"enabled": True}}},
    "volatileResults": {
        "tools": {"loopDetection": {"enabled": True}},
        "loopfuse": {"rules": {"volatileResults": {}}},
    },
    "identicalCalls": {
        "tools": {"loopDetection": {"enabled": True}},
        "loopfuse": {"rules": {"identicalCalls": {}}},
    },
    "identicalCalls 20/40": {
        "tools": {"loopDetection": {"enabled": True}},
        "loopfuse": {
            "rules": {"identicalCalls": {"warningThreshold": 20, "criticalThreshold": 40}}
        },
    },
    "both": {
        "tools": {"loopDetection": {"enabled": True}},
        "loopfuse": {"rules": {"volatileResults": {}, "identicalCalls": {}}},
    },
}


@dataclass
class Session:
    """One session's calls: (tool, args, result or error text)."""

    scenario: str
    loop: bool
    calls: list[tuple[str, dict[str, Any], Any]] = field(default_factory=list)


def _clock(rng: random.Random, start: float) -> Iterator[float]:
    """Seconds since T0, moving on by a few seconds per call."""
    now = start
    while True:
        now += rng.uniform(2, 9)
        yield now


def _iso(seconds: float) -> str:
    import datetime as dt

    moment = dt.datetime.fromtimestamp(T0 / 1000 + seconds, tz=dt.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _age(seconds: float) -> str:
    """kubectl's AGE column."""
    seconds = int(seconds)
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 600:
        return f"{seconds // 60}m{seconds % 60}s"
    if seconds < 3 * 3600:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h"


def _exec(text: str, code: int = 0) -> dict[str, Any]:
    """An OpenClaw exec result: the text, and the details the outcome is taken from."""
    return {
        "content": [{"type": "text", "text": text}],
        "details": {"status": "completed", "exitCode": code, "aggregated": text},
    }


def _text(text: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}]}


# -- loops: nothing progresses, only the noise changes ------------------------------


def build_retry(rng: random.Random, calls: int) -> Session:
    session = Session("build retried (timestamps, duration, tmp dir)", True)
    clock = _clock(rng, rng.uniform(0, 9e4))
    for _ in range(calls):
        now = next(clock)
        tmp = "".join(rng.choices("abcdefghijkABCDEFGHIJ0123456789", k=6))
        log = (
            f"[{_iso(now)}] cmake --build /tmp/tmp.{tmp}/build\n"
            "[ 50%] Building C object CMakeFiles/app.dir/main.c.o\n"
            "main.c:12:5: error: 'cfg' undeclared (first use in this function)\n"
            "make[2]: *** [CMakeFiles/app.dir/main.c.o] Error 1\n"
            f"[{_iso(now + rng.uniform(1, 4))}] build failed after {rng.uniform(1, 9):.2f}s"
        )
        session.calls.append(("exec", {"command": "make"}, _exec(log, 2)))
    return session


def test_retry(rng: random.Random, calls: int) -> Session:
    session = Session("tests re-run, same failure (pytest 'in 3.21s')", True)
    for _ in range(calls):
        out = (
            "============================= test session starts ==============================\n"
            "collected 4 items\n\ntests/test_api.py ..F.\n\n"
            "FAILED tests/test_api.py::test_orders - AssertionError: assert 500 == 200\n"
            f"========================= 1 failed, 3 passed in {rng.uniform(0.5, 6):.2f}s "
            "=========================="
        )
        session.calls.append(("exec", {"command": "pytest -q tests/test_api.py"}, _exec(out, 1)))
    return session


def kubectl_pending(rng: random.Random, calls: int) -> Session:
    session = Session("kubectl get pods, pod stuck Pending (AGE)", True)
    clock = _clock(rng, rng.uniform(30, 500))
    suffix = "".join(rng.choices("bcdfghjklmnpqrstvwxz2456789", k=5))
    for _ in range(calls):
        now = next(clock)
        out = (
            "NAME                          READY   STATUS    RESTARTS   AGE\n"
            f"api-7d9f8b6c5d-{suffix}        0/1     Pending   0          {_age(now)}\n"
            f"db-0                          1/1     Running   0          {_age(now + 86400 * 3)}"
        )
        session.calls.append(("exec", {"command": "kubectl get pods -n shop"}, _exec(out)))
    return session


def curl_unavailable(rng: random.Random, calls: int) -> Session:
    session = Session("curl -v to a 503 (request id, Date, port)", True)
    clock = _clock(rng, rng.uniform(0, 9e4))
    for _ in range(calls):
        now = next(clock)
        port = rng.randint(32768, 60999)
        stamp = _iso(now)
        out = (
            "*   Trying 127.0.0.1:8080...\n"
            "* Connected to localhost (127.0.0.1) port 8080 (#0)\n"
            "> GET /healthz HTTP/1.1\n> Host: localhost:8080\n>\n"
            "< HTTP/1.1 503 Service Unavailable\n"
            f"< Date: Mon, 30 Nov 2026 {stamp[11:19]} GMT\n"
            f"< X-Request-Id: {uuid.UUID(int=rng.getrandbits(128), version=4)}\n"
            f"< X-Upstream: 10.0.3.7:{port}\n"
            "<\nupstream connect error or disconnect/reset before headers"
        )
        session.calls.append(
            ("exec", {"command": "curl -v localhost:8080/healthz"}, _exec(out, 22))
        )
    return session


def gemini_shell(rng: random.Random, calls: int) -> Session:
    session = Session("Gemini CLI shell, same output (Process Group PGID)", True)
    for _ in range(calls):
        out = (
            "Command: npm run lint\nDirectory: (root)\n"
            "Stdout: src/app.ts:3:1 error 'x' is defined but never used\n"
            "Stderr: (empty)\nError: (none)\nExit Code: 1\nSignal: (none)\n"
            f"Background PIDs: (none)\nProcess Group PGID: {rng.randint(1000, 99999)}"
        )
        session.calls.append(("run_shell_command", {"command": "npm run lint"}, _text(out)))
    return session


def git_status_loop(rng: random.Random, calls: int) -> Session:
    session = Session("git status over and over, nothing changes", True)
    out = (
        "On branch main\nChanges not staged for commit:\n  modified:   src/app.ts\n\n"
        'no changes added to commit (use "git add" and/or "git commit -a")'
    )
    for _ in range(calls):
        session.calls.append(("exec", {"command": "git status"}, _exec(out)))
    return session


def counter_poll(rng: random.Random, calls: int) -> Session:
    session = Session("status poll, only an attempt counter moves", True)
    start = rng.randint(1, 50)
    for n in range(calls):
        out = f'{{"job": "export-42", "state": "queued", "checked": {start + n}}}'
        session.calls.append(("job_status", {"job": "export-42"}, _text(out)))
    return session


# -- healthy: each result says something new ------------------------------------------


def rollout_progress(rng: random.Random, calls: int) -> Session:
    session = Session("kubectl rollout status, replicas come up", False)
    total = max(calls, 2)
    for n in range(calls):
        done = min(total, 1 + n)
        if done < total:
            out = (
                f'Waiting for deployment "api" rollout to finish: {done} of {total} updated '
                "replicas are available..."
            )
        else:
            out = 'deployment "api" successfully rolled out'
        session.calls.append(("exec", {"command": "kubectl rollout status deploy/api"}, _exec(out)))
    return session


def ci_poll(rng: random.Random, calls: int) -> Session:
    session = Session("CI run polled until done (steps advance)", False)
    clock = _clock(rng, rng.uniform(0, 9e4))
    for n in range(calls):
        now = next(clock)
        out = (
            f"run 8841 in_progress, step {n + 1} of {calls}: "
            f"{rng.choice(['compile', 'unit tests', 'lint', 'package'])} "
            f"(started {_iso(now - 30)}, elapsed {_age(now % 900)})"
        )
        session.calls.append(("exec", {"command": "gh run view 8841"}, _exec(out)))
    return session


def log_grows(rng: random.Random, calls: int) -> Session:
    session = Session("tail of a log that really grows", False)
    clock = _clock(rng, rng.uniform(0, 9e4))
    batch = rng.randint(100, 900)
    for _ in range(calls):
        now = next(clock)
        lines = []
        for _ in range(3):
            batch += 1
            lines.append(
                f"{_iso(now)} INFO worker[{rng.randint(100, 999)}] processed batch {batch} "
                f"({rng.randint(50, 500)} rows) in {rng.randint(5, 900)}ms"
            )
        session.calls.append(
            ("exec", {"command": "tail -n 3 /var/log/etl.log"}, _exec("\n".join(lines)))
        )
    return session


def process_poll(rng: random.Random, calls: int) -> Session:
    session = Session("process poll while a download progresses", False)
    for n in range(calls):
        percent = min(100, (n + 1) * 100 // calls)
        out = f"downloaded {percent}% ({percent * 12} MB of 1200 MB), eta {rng.randint(1, 90)}s"
        details = {"status": "running" if percent < 100 else "completed", "aggregated": out}
        session.calls.append(
            (
                "process",
                {"action": "poll", "sessionId": "dl-1"},
                {"content": [], "details": details},
            )
        )
    return session


def pagination(rng: random.Random, calls: int) -> Session:
    session = Session("pagination (page=N)", False)
    for page in range(calls):
        ids = ", ".join(str(page * 50 + i) for i in range(3))
        out = f'{{"page": {page}, "orders": [{ids}, ...], "requestId": "{uuid.uuid4()}"}}'
        session.calls.append(
            ("fetch", {"url": f"https://api.example.com/orders?page={page}"}, _text(out))
        )
    return session


def fix_and_retest(rng: random.Random, calls: int) -> Session:
    session = Session("edit, re-run tests: failures go down", False)
    failing = max(2, calls // 2)
    for n in range(calls):
        if n % 2 == 0:
            session.calls.append(
                ("edit", {"path": "src/api.py", "patch": f"fix {n}"}, _text("applied 1 hunk"))
            )
        else:
            failing = max(0, failing - 1)
            out = (
                f"{failing} failed, {20 - failing} passed in {rng.uniform(0.5, 6):.2f}s"
                if failing
                else f"20 passed in {rng.uniform(0.5, 6):.2f}s"
            )
            session.calls.append(
                ("exec", {"command": "pytest -q"}, _exec(out, 1 if failing else 0))
            )
    return session


def status_between_edits(rng: random.Random, calls: int) -> Session:
    session = Session("git status between edits", False)
    for n in range(calls):
        if n % 2 == 0:
            session.calls.append(
                ("write", {"path": f"src/m{n}.ts", "text": "export {}"}, _text("ok"))
            )
        else:
            files = "\n".join(f"  new file:   src/m{i}.ts" for i in range(0, n, 2))
            session.calls.append(
                ("exec", {"command": "git status"}, _exec(f"On branch main\n{files}"))
            )
    return session


def short_repeat(rng: random.Random, calls: int) -> Session:
    session = Session("a command run twice or three times (date; make)", False)
    for _ in range(min(calls, rng.randint(2, 3))):
        now = rng.uniform(0, 9e4)
        out = f"{_iso(now)}\nmake: 'app' is up to date."
        session.calls.append(("exec", {"command": "date; make"}, _exec(out)))
    return session


#: (generator, how many calls: the range a session of it is drawn from)
SCENARIOS: list[tuple[Callable[[random.Random, int], Session], tuple[int, int]]] = [
    (build_retry, (25, 45)),
    (test_retry, (25, 45)),
    (kubectl_pending, (25, 45)),
    (curl_unavailable, (25, 45)),
    (gemini_shell, (25, 45)),
    (git_status_loop, (25, 45)),
    (counter_poll, (25, 45)),
    (rollout_progress, (4, 12)),
    (ci_poll, (8, 30)),
    (log_grows, (10, 40)),
    (process_poll, (5, 25)),
    (pagination, (10, 40)),
    (fix_and_retest, (6, 20)),
    (status_between_edits, (6, 20)),
    (short_repeat, (2, 3)),
]


def corpus(sessions_per_scenario: int, seed: int) -> list[tuple[str, Session]]:
    rng = random.Random(seed)
    out = []
    for make, (low, high) in SCENARIOS:
        for index in range(sessions_per_scenario):
            out.append((f"{make.__name__}-{index}", make(rng, rng.randint(low, high))))
    return out


def events(key: str, session: Session) -> Iterator[dict[str, Any]]:
    """The session's wire events: each call and its result, in order."""
    for n, (tool, args, outcome) in enumerate(session.calls):
        base = {"session_key": key, "run_id": f"{key}-run", "agent_id": "bench"}
        ts = T0 + n * 4_000
        yield {**base, "type": "tool_call", "event_id": f"{key}-{n}c", "seq": 2 * n, "ts": ts,
               "call_id": f"c{n}", "tool_name": tool, "args": args}  # fmt: skip
        yield {**base, "type": "tool_result", "event_id": f"{key}-{n}r", "seq": 2 * n + 1,
               "ts": ts + 2_000, "call_id": f"c{n}", "tool_name": tool, "args": args,
               "result": outcome}  # fmt: skip


@dataclass
class Detected:
    """What a config made of one session: the call numbers (1-based) first warned and
    first blocked, None where none was."""

    warn: int | None = None
    block: int | None = None


def replay(corpus_file: Path, config_file: Path) -> dict[str, Detected]:
    """``loopfuse replay`` over the corpus: each session's first warn and first block."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "loopfuse.streams.cli",
            "replay",
            "--config",
            str(config_file),
            str(corpus_file),
        ],
        check=True,
        capture_output=True,
    )
    found: dict[str, Detected] = {}
    for line in done.stdout.splitlines():
        output = json.loads(line)
        if output.get("type") != "verdict":
            continue
        seen = found.setdefault(output["session_key"], Detected())
        number = int(output["call_id"][1:]) + 1
        if output["action"] == "warn" and seen.warn is None:
            seen.warn = number
        if output["action"] in ("block", "abort") and seen.block is None:
            seen.block = number
            seen.warn = number if seen.warn is None else seen.warn
    return found


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for child in value.values():
            yield from _strings(child)
    elif isinstance(value, list):
        for child in value:
            yield from _strings(child)


def mask_speed(sessions: list[tuple[str, Session]]) -> str:
    """MB/s of the masking over the corpus's result strings: Python, and native."""
    from loopfuse.streams.engine.native import NATIVE
    from loopfuse.streams.engine.volatile import mask_text

    texts = [text for _, s in sessions for _, _, outcome in s.calls for text in _strings(outcome)]
    size = sum(len(text.encode()) for text in texts)

    def best(mask: Callable[[str], Any]) -> float:
        times = []
        for _ in range(5):
            start = time.perf_counter()
            for text in texts:
                mask(text)
            times.append(time.perf_counter() - start)
        return size / min(times) / 1e6

    native = "-" if NATIVE is None else f"{best(lambda t: NATIVE.mask_volatile(t, [])):.0f}"
    return f"mask_python_mb_s={best(mask_text):.1f} mask_native_mb_s={native}"


def _median(values: list[int]) -> str:
    return f"{statistics.median(values):g}" if values else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=12, help="sessions per scenario")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--write", type=Path, help="leave the corpus and configs here")
    options = parser.parse_args()
    sessions = corpus(options.sessions, options.seed)
    with tempfile.TemporaryDirectory() as scratch:
        folder = options.write or Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        corpus_file = folder / "corpus.jsonl"
        with corpus_file.open("w") as out:
            for key, session in sessions:
                for event in events(key, session):
                    out.write(json.dumps(event) + "\n")
        labels = {
            key: {"scenario": s.scenario, "loop": s.loop, "calls": len(s.calls)}
            for key, s in sessions
        }
        (folder / "labels.json").write_text(json.dumps(labels, indent=1))
        results: dict[str, dict[str, Detected]] = {}
        for name, config in CONFIGS.items():
            config_file = folder / f"{name.replace(' ', '-').replace('/', '-')}.json"
            config_file.write_text(json.dumps(config))
            results[name] = replay(corpus_file, config_file)
    loops = [key for key, s in sessions if s.loop]
    healthy = [key for key, s in sessions if not s.loop]
    print(f"corpus: {len(loops)} loop sessions, {len(healthy)} healthy, seed {options.seed}")
    print()
    print("| config | loops warned | loops blocked | first warn (median call) | first block (median call) "
          "| healthy warned | healthy blocked |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for name, found in results.items():
        seen = {key: found.get(key, Detected()) for key, _ in sessions}
        warned = [warn for k in loops if (warn := seen[k].warn) is not None]
        blocked = [block for k in loops if (block := seen[k].block) is not None]
        false_warn = sum(seen[k].warn is not None for k in healthy)
        false_block = sum(seen[k].block is not None for k in healthy)
        print(
            f"| {name} | {len(warned)}/{len(loops)} | {len(blocked)}/{len(loops)} "
            f"| {_median(warned)} | {_median(blocked)} "
            f"| {false_warn}/{len(healthy)} | {false_block}/{len(healthy)} |"
        )
    print()
    print("Per scenario: sessions blocked (warned), per config")
    print()
    print("| scenario | loop | " + " | ".join(results) + " |")
    print("|---|---|" + "---|" * len(results))
    for make, _ in SCENARIOS:
        keys = [key for key, _s in sessions if key.startswith(f"{make.__name__}-")]
        scenario = dict(sessions)[keys[0]]
        cells = []
        for found in results.values():
            blocked = sum(found.get(k, Detected()).block is not None for k in keys)
            warned = sum(found.get(k, Detected()).warn is not None for k in keys)
            cells.append(f"{blocked} ({warned})")
        print(
            f"| {scenario.scenario} | {'yes' if scenario.loop else 'no'} | "
            + " | ".join(cells)
            + " |"
        )
    print()
    print(mask_speed(sessions))


if __name__ == "__main__":
    main()
