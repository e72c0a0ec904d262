"""Random sessions as wire lines, for running two engines over the same input.

The native judge (issue 27) must give the Python engine's bytes on any input, not
only on the corpus someone wrote down: :func:`generated_lines` draws sessions from a
seeded generator that mixes what detection reacts to (repeated calls, polls with and
without progress, two calls alternating, unknown tools, compactions followed by the
same call, run endings) with what ordering reacts to (seqs out of order, repeated,
lost, gateway restarts with a new incarnation, v1 events without seq) and with hostile
strings (tests/fixtures/hostile_strings.py) in every string field a gateway sends.
The draws are small on purpose (a few tools, a few argument sets), so that loops
occur by chance. Deterministic for a seed: a failing run can be run again. With
``usage=True`` results also report what they spent (the run caps' input), in draws of
their own: the sessions of a seed are otherwise the same. With ``volatile=True`` some
results carry per-call noise (times, durations, ids, PIDs, ports, temporary paths), in
draws of their own too.
"""

from __future__ import annotations

import json
import random
from typing import Any

from tests.fixtures.hostile_strings import HOSTILE

_TOOLS = ("exec", "read", "process", "web_search", "write")
_HOSTILE = tuple(HOSTILE.values())
_ARGS: tuple[Any, ...] = (
    {"command": "make test"},
    {"path": "/tmp/a"},
    {"action": "poll", "sessionId": "p1"},
    {"action": "log", "sessionId": "p1"},
    {"query": "why", "n": 3, "f": 0.5},
    {},
    [1, 2.25, None, True],
    {"nested": {"b": [1, {"c": "d"}], "a": -0.0}},
)
_RESULTS: tuple[Any, ...] = (
    {"content": [{"type": "text", "text": "ok"}]},
    {"content": [{"type": "text", "text": "error: x"}]},
    {"details": {"status": "running", "aggregated": "..."}},
    {"details": {"status": "completed", "exitCode": 0}},
    {"content": []},
    "plain text",
    None,
)
_ERRORS = ("Unknown tool: deploy_magic", "Tool not found: ghost", "boom", "timeout")


def _text(rng: random.Random, plain: str) -> str:
    """``plain`` most of the time, else a hostile string or one wrapped around it."""
    roll = rng.random()
    if roll < 0.9:
        return plain
    hostile = rng.choice(_HOSTILE)
    return hostile if roll < 0.95 else f"{plain}{hostile}"


def _volatile(rng: random.Random) -> Any:
    """Output whose per-call tokens (times, durations, ids, PIDs, ports, paths) differ
    on every draw, around words that do not: the volatileResults rule's input."""
    tokens = [
        f"2026-12-0{rng.randint(1, 9)}T1{rng.randint(0, 9)}:0{rng.randint(0, 9)}:1{rng.randint(0, 9)}Z",
        f"in {rng.randint(0, 9)}.{rng.randint(0, 99)}s",
        f"{rng.randint(1, 59)}m{rng.randint(1, 59)}s",
        f"{rng.getrandbits(32):08x}-1a2b-4c3d-9e8f-{rng.getrandbits(48):012x}",
        f"pid={rng.randint(1, 99999)}",
        f"127.0.0.1:{rng.randint(1024, 65535)}",
        f"/tmp/tmp.{rng.getrandbits(24):x}/out",
        f"job {rng.choice(['a-1', 'b.2', 'c_3'])}",
        f"#{rng.getrandbits(20):x}",
        f"{1_790_000_000 + rng.randint(0, 99)}",
        "3 passed ünï 12:3 5mb deadbeef",
    ]
    text = " ".join(tokens)  # one shape: masked, most of these are the same
    roll = rng.random()
    if roll < 0.6:
        return {"content": [{"type": "text", "text": _text(rng, text)}]}
    if roll < 0.9:
        return {"details": {"status": "completed", "exitCode": 1, "aggregated": text}}
    return [text, {"at": text}]


def _usage(rng: random.Random) -> dict[str, Any]:
    """A result's usage report: counts, a total instead of them, costs (ints too)."""
    roll = rng.random()
    if roll < 0.4:
        return {"input_tokens": rng.randint(0, 900), "output_tokens": rng.randint(0, 300)}
    if roll < 0.6:
        return {"total_tokens": rng.randint(0, 2_000), "input_tokens": 5}
    if roll < 0.9:
        return {
            "output_tokens": rng.randint(0, 50),
            "cost": rng.choice([0.01, 0.125, 1, 0.0, -0.0]),
        }
    return {"cost": rng.random() / 7, "total_tokens": None}


def _session(
    rng: random.Random,
    index: int,
    events: int,
    usage: random.Random | None,
    noise: random.Random | None = None,
) -> list[dict[str, Any]]:
    key = _text(rng, f"agent:{index % 3}:session:{index}")
    agent = rng.choice([None, "run-ender", f"agent-{index % 4}", _text(rng, "a")])
    runs = [f"run-{index}", f" run-{index} ", f"run-{index}-b", None]
    tools = [_text(rng, tool) for tool in rng.sample(_TOOLS, 3)] + ["deploy_magic"]
    incarnation: str | None = rng.choice([None, f"gw-{index}-0"])
    numbered = rng.random() < 0.85
    noisy = noise is not None and noise.random() < 0.5  # every result with per-call noise
    seq = 0
    run = runs[0]
    out: list[dict[str, Any]] = []
    ts = 1_790_000_000_000 + index * 1_000
    loop_tool, loop_args = rng.choice(tools), rng.choice(_ARGS)
    for step in range(events):
        ts += rng.choice([0, 1, 250, 1_000, 4_000, -50])  # a clock can step back
        roll = rng.random()
        base: dict[str, Any] = {"session_key": key, "event_id": f"e-{index}-{step}", "ts": ts}
        if run is not None:
            base["run_id"] = run
        if agent is not None:
            base["agent_id"] = agent
        if incarnation is not None:
            base["incarnation"] = incarnation
        if roll < 0.03:
            base["type"] = "compaction"
            if rng.random() < 0.5:
                base["reason"] = _text(rng, "context_overflow")
            bodies = [base]
        elif roll < 0.05:
            base["type"] = "run_ended"
            run = rng.choice(runs)
            bodies = [base]
        elif roll < 0.07 and incarnation is not None:
            incarnation = f"gw-{index}-{step}"  # the gateway restarted: seq from 0
            seq = 0
            continue
        else:
            looping = rng.random() < 0.6
            tool = loop_tool if looping else rng.choice(tools)
            args = loop_args if looping else rng.choice(_ARGS)
            call_id = _text(rng, f"call-{step}") if rng.random() < 0.99 else None  # None: invalid
            call: dict[str, Any] = {**base, "type": "tool_call", "tool_name": tool}
            if rng.random() < 0.1:
                call["args_hash"] = f"{rng.getrandbits(64):016x}"
            else:
                call["args"] = args
            if call_id is not None:
                call["call_id"] = call_id
            if rng.random() < 0.1:
                call["args_action"] = rng.choice(["poll", "log", "send"])
            result: dict[str, Any] = {
                **base,
                "type": "tool_result",
                "tool_name": tool,
                "event_id": f"e-{index}-{step}-r",
                "ts": ts + 10,
            }
            if call_id is not None:
                result["call_id"] = call_id
            if rng.random() < 0.3:
                if "args" in call:
                    result["args"] = call["args"]
                else:
                    result["args_hash"] = call["args_hash"]
            outcome = rng.random()
            if tool == "deploy_magic" or outcome < 0.1:
                result["error"] = _text(rng, rng.choice(_ERRORS))
                if rng.random() < 0.2:
                    result["unknown_tool"] = tool
            elif outcome < 0.15:
                result["result_hash"] = f"{rng.getrandbits(64):016x}"
            elif looping and outcome < 0.8:
                result["result"] = _RESULTS[index % 3]  # the same outcome, again
            else:
                result["result"] = _text(rng, "x") if outcome > 0.97 else rng.choice(_RESULTS)
            if usage is not None and usage.random() < 0.5:
                result["usage"] = _usage(usage)
            if noisy and noise is not None and "result" in result:
                result["result"] = _volatile(noise)
            bodies = [call] if rng.random() < 0.05 else [call, result]
        for body in bodies:
            if numbered:
                body["seq"] = seq
                seq += 1
            out.append(body)
    return out


def _disorder(rng: random.Random, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Neighbours swapped, some events repeated, a few lost (gaps to give up on)."""
    out = list(events)
    for index in range(len(out) - 1):
        if rng.random() < 0.08:
            out[index], out[index + 1] = out[index + 1], out[index]
    kept: list[dict[str, Any]] = []
    for event in out:
        roll = rng.random()
        if roll < 0.02:
            continue
        kept.append(event)
        if roll > 0.96:
            kept.append(event)
    return kept


def generated_lines(
    seed: int, sessions: int = 120, events: int = 40, usage: bool = False, volatile: bool = False
) -> list[bytes]:
    """Wire lines of ``sessions`` random sessions, interleaved as topics deliver them."""
    rng = random.Random(seed)
    spent = random.Random(seed + 1) if usage else None
    noise = random.Random(seed + 2) if volatile else None
    streams = [
        _disorder(rng, _session(rng, index, rng.randint(1, events), spent, noise))
        for index in range(sessions)
    ]
    lines: list[bytes] = []
    while streams:
        stream = rng.choice(streams)
        # json, not orjson: a lone surrogate goes out as its \\ud800 escape, as a
        # JavaScript gateway's JSON.stringify writes it
        lines.append(json.dumps(stream.pop(0)).encode())
        if not stream:
            streams.remove(stream)
    return lines
