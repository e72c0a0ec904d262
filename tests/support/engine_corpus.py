"""Everything the engine produces on a fixed corpus, as lines: the native-vs-pure check.

    python -m tests.support.engine_corpus OUT

Writes to OUT, one line each: which engine ran, then per corpus every output of every
step (verdicts and loop events as their published JSON, rejections and notices as
their fields), every session's final state bytes and those bytes decoded and encoded
again, in both formats (5 is the native codec's where it is built, the pure one's
where not: the same bytes). tests/unit/test_native_identity.py runs it under two
engines and compares.

The corpus: the examples (each with its config), the test fixtures, the
benchmark's workload with deliveries out of order, duplicated and lost, so that
parking, gaps and redeliveries run too, and random sessions with hostile strings
(tests/support/generated_sessions.py) under eight kinds of config, the opt-in rules
among them. tests/unit/test_native_identity.py runs it under the native and the pure
engine.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from bench.engine import build_workload
from loopfuse.schemas import DetectionConfigFile, load_config, parse_config
from loopfuse.schemas.decode import EventRejected, decode_event
from loopfuse.streams.engine import (
    Engine,
    LoopEvent,
    Notice,
    Output,
    Rejection,
    SessionState,
    Verdict,
    state_codec,
)
from loopfuse.streams.engine.native_step import NativeEngine, native_for
from loopfuse.streams.engine.wire import decode_fingerprinted
from tests.support.generated_sessions import generated_lines

ROOT = Path(__file__).resolve().parents[2]


def _disorderly(lines: list[bytes], seed: int) -> list[bytes]:
    """The lines with some neighbours swapped, some repeated and some left out."""
    rng = random.Random(seed)
    out = list(lines)
    for index in range(len(out) - 1):
        if rng.random() < 0.05:
            out[index], out[index + 1] = out[index + 1], out[index]
    kept: list[bytes] = []
    for line in out:
        roll = rng.random()
        if roll < 0.01:
            continue  # lost: a gap the engine gives up on
        kept.append(line)
        if roll > 0.98:
            kept.append(line)  # redelivered
    return kept


def corpora() -> list[tuple[str, DetectionConfigFile, list[bytes]]]:
    enabled = parse_config({"tools": {"loopDetection": {"enabled": True}}})
    found = []
    for events in sorted((ROOT / "examples" / "rules").glob("*.jsonl")):
        config = load_config(events.with_suffix(".json5"))
        found.append((events.name, config, events.read_bytes().splitlines()))
    small = load_config(ROOT / "tests" / "fixtures" / "small.json5")
    for name in ("compaction_loop", "polling_loop", "malformed"):
        lines = (ROOT / "tests" / "fixtures" / f"{name}.jsonl").read_bytes().splitlines()
        found.append((name, small, lines))
    workload = build_workload(60, 40, 7)
    found.append(("workload", enabled, workload))
    found.append(("workload, disorderly", enabled, _disorderly(workload, 7)))
    # Random sessions with hostile strings, under each kind of config (seeded: a
    # difference can be run again)
    for seed, (name, config) in enumerate(_GENERATED_CONFIGS.items()):
        lines = generated_lines(seed, volatile=name.startswith("volatile"))
        found.append((f"generated, {name}", parse_config(config), lines))
    return found


#: The configs the generated sessions run under: detection off (recording and the
#: guard only), on by default, tight thresholds and a small history and guard window,
#: explicitly disabled, shadow mode with payloads in loop events, and the opt-in rules.
_GENERATED_CONFIGS: dict[str, dict[str, Any]] = {
    "not set": {},
    "enabled": {"tools": {"loopDetection": {"enabled": True}}},
    "tight": {
        "tools": {
            "loopDetection": {
                "enabled": True,
                "historySize": 12,
                "warningThreshold": 3,
                "criticalThreshold": 5,
                "globalCircuitBreakerThreshold": 7,
                "unknownToolThreshold": 3,
                "postCompactionGuard": {"windowSize": 2},
                "detectors": {"pingPong": True, "genericRepeat": True, "knownPollNoProgress": True},
            }
        }
    },
    "detectors off": {
        "tools": {
            "loopDetection": {
                "enabled": True,
                "warningThreshold": 2,
                "detectors": {"pingPong": False, "genericRepeat": False},
            }
        }
    },
    "disabled": {"tools": {"loopDetection": {"enabled": False}}},
    "shadow with payloads": {
        "tools": {"loopDetection": {"enabled": True, "warningThreshold": 3}},
        "loopfuse": {"enforce": False, "includePayloadsInLoopEvents": True},
    },
    "rules": {
        "tools": {
            "loopDetection": {"enabled": True, "warningThreshold": 4, "criticalThreshold": 6}
        },
        "loopfuse": {
            "rules": {
                "cycle": {"maxPeriod": 4},
                "repeatedFailure": {"warningThreshold": 2, "criticalThreshold": 4},
                "argumentChurn": {},
                "runCaps": {"maxToolCalls": 30, "warnAt": 0.5},
                "runEnding": {"criticalsPerRun": 2, "blockedStreak": 3},
                "tools": {"read": {"exempt": True}, "exec": {"warningThreshold": 2}},
            }
        },
        "agents": {
            "list": [{"id": "run-ender", "tools": {"loopDetection": {"warningThreshold": 2}}}]
        },
    },
    "volatile results and identical calls": {
        "tools": {
            "loopDetection": {"enabled": True, "warningThreshold": 3, "criticalThreshold": 5}
        },
        "loopfuse": {
            "rules": {
                "volatileResults": {
                    "patterns": [{"prefix": "job ", "chars": "id"}, {"prefix": "#", "chars": "hex"}]
                },
                "identicalCalls": {"warningThreshold": 4, "criticalThreshold": 7},
            }
        },
        "agents": {
            "list": [
                {
                    "id": "run-ender",
                    "loopfuse": {
                        "rules": {
                            "volatileResults": {"tools": ["exec", "process"]},
                            "identicalCalls": {"shadow": True},
                        }
                    },
                }
            ]
        },
    },
}


def corpus_steps() -> Iterator[tuple[SessionState, list[Output]]]:
    """The corpora stepped by the Python engine (each with its config, the parking
    bounds the differential tests use): each step's session state and outputs, then,
    once a corpus is read, each session's release (its state, and what went)."""
    for _, config, lines in corpora():
        engine = Engine(config, max_parked=16, gap_timeout_ms=5_000)
        states: dict[str, SessionState] = {}
        for raw in lines:
            try:
                event, fingerprints = decode_fingerprinted(raw)
            except EventRejected:
                continue
            states[event.key], outputs = engine.step(
                states.get(event.key), event, event.ts, event.ts - 1_000, fingerprints
            )
            yield states[event.key], outputs
        for state in states.values():
            yield state, engine.release(state, state.touched_ms + 60_000, None)


def _line(output: Any) -> bytes:
    if isinstance(output, Verdict | LoopEvent):
        return output.to_json()
    if isinstance(output, Rejection):
        return orjson.dumps(["rejection", output.code, output.reason, output.event.event_id])
    if isinstance(output, Notice):
        return orjson.dumps(["notice", output.level, output.message, output.session_key])
    raise TypeError(f"unexpected output {output!r}")


def run(lines: list[bytes], config: DetectionConfigFile) -> list[bytes]:
    engine = Engine(config, max_parked=16, gap_timeout_ms=5_000)
    native = native_for(engine)
    if native is not None:
        return _run_native(native, lines)
    states: dict[str, SessionState] = {}
    out: list[bytes] = []
    for raw in lines:
        try:
            # the route replay and the worker take: the native judge's fingerprints, if built
            event, fingerprints = decode_fingerprinted(raw)
        except EventRejected as exc:
            out.append(orjson.dumps(["dead_letter", exc.code, exc.reason]))
            continue
        key = event.key
        states[key], outputs = engine.step(
            states.get(key), event, event.ts, event.ts - 1_000, fingerprints
        )
        out.extend(map(_line, outputs))
    for key, state in sorted(states.items()):
        for output in engine.release(state, state.touched_ms + 60_000, None):
            out.append(_line(output))
        for version in (4, 5):
            data = state_codec.encode(state, version)
            again = state_codec.encode(state_codec.decode(data), version)
            out.append(orjson.dumps(["state", key, data.hex()]))
            out.append(orjson.dumps(["again", key, again.hex()]))
    return out


def _native_line(output: tuple[Any, ...]) -> bytes:
    if output[0] in ("verdict", "loop_event"):
        return bytes(output[1])
    if output[0] == "rejection":
        return orjson.dumps(list(output))
    return orjson.dumps(list(output[:4]))  # a notice, as _line writes it


def _run_native(native: NativeEngine, lines: list[bytes]) -> list[bytes]:
    """``run`` through the native fold (the default path), which must give its lines."""
    states: dict[str, Any] = {}
    out: list[bytes] = []
    for raw in lines:
        try:
            # the key (the worker has it from the record) and the clocks run() uses
            decoded = decode_event(raw)
            key, ts = decoded.key, decoded.ts
            states[key], outputs = native.step(states.get(key), raw, ts, ts - 1_000)
        except EventRejected as exc:
            out.append(orjson.dumps(["dead_letter", exc.code, exc.reason]))
            continue
        out.extend(map(_native_line, outputs))
    for key, state in sorted(states.items()):
        for output in native.release(state, state.touched_ms + 60_000, None):
            out.append(_native_line(output))
        python = NativeEngine.to_python(state)
        for version in (4, 5):
            data = state_codec.encode(python, version)
            back = NativeEngine.to_python(NativeEngine.from_python(state_codec.decode(data)))
            out.append(orjson.dumps(["state", key, data.hex()]))
            out.append(orjson.dumps(["again", key, state_codec.encode(back, version).hex()]))
    return out


def main() -> None:
    lines: list[bytes] = []
    for name, config, events in corpora():
        lines.append(orjson.dumps(["corpus", name, len(events)]))
        lines.extend(run(events, config))
    Path(sys.argv[1]).write_bytes(b"\n".join(lines) + b"\n")


if __name__ == "__main__":
    main()
