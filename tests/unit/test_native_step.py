"""The native fold (native/src/session.rs) against the Python engine, in one process.

tests/unit/test_native_identity.py runs the engine corpus through the native and the
pure engine in two processes; these go further, each comparing every output line and
every final state's bytes of the native fold with the Python fold's (the ``Engine``
with the native decoder's tokens, which that test holds to the pure engine):

* more random sessions (tests/support/generated_sessions.py), seeds not in the corpus,
  under the default-path configs, with a restart of the state - native state to the
  Python engine's bytes and back - after every few events, as a worker's recovery would;
* the fixtures with RFC 3339 timestamps, which the native decoder leaves to Python
  (the fold then takes the event as Python decoded it);
* run ids padded with each of the characters Python's ``str.strip`` removes;
* a call whose redelivery must give the verdict it had.

Skips only where the module is not built.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import orjson
import pytest

from loopfuse.schemas import parse_config
from loopfuse.schemas.config import DetectionConfigFile
from loopfuse.schemas.decode import EventRejected, decode_event
from loopfuse.streams.engine import Engine, SessionState, state_codec
from loopfuse.streams.engine.native_step import NativeEngine, native_for
from loopfuse.streams.engine.wire import decode_fingerprinted
from tests.support.engine_corpus import _line, _native_line
from tests.support.generated_sessions import generated_lines

ROOT = Path(__file__).resolve().parents[2]

CONFIGS: dict[str, dict[str, Any]] = {
    "not set": {},
    "enabled": {"tools": {"loopDetection": {"enabled": True}}},
    "tight": {
        "tools": {
            "loopDetection": {
                "enabled": True,
                "historySize": 8,
                "warningThreshold": 2,
                "criticalThreshold": 4,
                "globalCircuitBreakerThreshold": 5,
                "unknownToolThreshold": 2,
                "postCompactionGuard": {"windowSize": 2},
            }
        }
    },
    "shadow": {
        "tools": {"loopDetection": {"enabled": True, "warningThreshold": 3}},
        "loopfuse": {"enforce": False},
    },
    # a send tool's outcome is its details without per-send ids (fingerprint.py)
    "send tools": {
        "tools": {"loopDetection": {"enabled": True, "warningThreshold": 3}},
        "loopfuse": {"providerSendTools": ["process", "write", "notify"]},
    },
    # a call's loop event carries its raw args, written natively as orjson writes them
    "payloads": {
        "tools": {"loopDetection": {"enabled": True, "warningThreshold": 3}},
        "loopfuse": {"includePayloadsInLoopEvents": True},
    },
}
#: Every opt-in rule (issue 14) but the fleet breaker (the worker's overlay, not the
#: engine's), tight enough to fire on the generated sessions: enforced, only reported,
#: and each agent's own over the global ones.
_RULES: dict[str, Any] = {
    "runEnding": {"criticalsPerRun": 3, "blockedStreak": 2},
    "cycle": {"maxPeriod": 4},
    "repeatedFailure": {"warningThreshold": 2, "criticalThreshold": 3},
    "argumentChurn": {},
    "runCaps": {
        "maxToolCalls": 14,
        "tokensPerRun": 6_000,
        "tokensPerSession": 9_000,
        "costPerRun": 0.5,
        "costPerSession": 1,
        "warnAt": 0.7,
    },
    "tools": {
        "read": {"exempt": True},
        "exec": {"warningThreshold": 2, "criticalThreshold": 3},
        "write": {"globalCircuitBreakerThreshold": 4},
    },
}
RULE_CONFIGS: dict[str, dict[str, Any]] = {
    "rules": {
        "tools": {
            "loopDetection": {"enabled": True, "warningThreshold": 3, "criticalThreshold": 6}
        },
        "loopfuse": {"rules": _RULES},
    },
    "rules shadowed": {
        "tools": {"loopDetection": {"enabled": True, "warningThreshold": 3}},
        "loopfuse": {
            "rules": {
                name: ({**rule, "shadow": True} if name != "tools" else rule)
                for name, rule in _RULES.items()
            }
        },
    },
    "rules per agent": {
        "tools": {
            "loopDetection": {"enabled": True, "warningThreshold": 4, "criticalThreshold": 7}
        },
        "loopfuse": {"rules": {"runCaps": {"maxToolCalls": 9}, "cycle": {"shadow": True}}},
        "agents": {
            "list": [
                {
                    "id": "run-ender",
                    "loopfuse": {
                        "rules": {
                            "runEnding": {},
                            "repeatedFailure": {"criticalThreshold": 2},
                            "cycle": {"shadow": False, "maxPeriod": 3},
                        }
                    },
                },
                {
                    "id": "agent-1",
                    "tools": {"loopDetection": {"enabled": False}},
                    "loopfuse": {
                        "rules": {"argumentChurn": {}, "tools": {"exec": {"exempt": True}}}
                    },
                },
                {
                    "id": "agent-2",
                    "loopfuse": {
                        "rules": {
                            "runCaps": {"maxToolCalls": None, "costPerSession": 0.3, "warnAt": 0.5}
                        }
                    },
                },
            ]
        },
    },
    "rules not enforced": {
        "tools": {"loopDetection": {"enabled": True, "warningThreshold": 3}},
        "loopfuse": {"enforce": False, "rules": _RULES},
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
                "identicalCalls": {"warningThreshold": 3, "criticalThreshold": 6},
                "runEnding": {},
            }
        },
        "agents": {
            "list": [
                {
                    "id": "run-ender",
                    "loopfuse": {
                        "rules": {
                            "volatileResults": {"tools": ["exec"]},
                            "identicalCalls": {"shadow": True},
                        }
                    },
                },
                {"id": "agent-1", "loopfuse": {"rules": {"volatileResults": {"enabled": False}}}},
            ]
        },
    },
}


def _python(config: DetectionConfigFile, lines: list[bytes]) -> tuple[list[bytes], list[bytes]]:
    engine = Engine(config, max_parked=16, gap_timeout_ms=5_000)
    states: dict[str, SessionState] = {}
    out: list[bytes] = []
    for raw in lines:
        try:
            event, fingerprints = decode_fingerprinted(raw)
        except EventRejected as exc:
            out.append(orjson.dumps(["dead_letter", exc.code, exc.reason]))
            continue
        states[event.key], outputs = engine.step(
            states.get(event.key), event, event.ts, event.ts - 1_000, fingerprints
        )
        out.extend(map(_line, outputs))
    finals = []
    for _key, state in sorted(states.items()):
        out.extend(map(_line, engine.release(state, state.touched_ms + 60_000, None)))
        finals.append(state_codec.encode(state))
    return out, finals


def _native(
    config: DetectionConfigFile, lines: list[bytes], restart_every: int = 0
) -> tuple[list[bytes], list[bytes]]:
    engine = Engine(config, max_parked=16, gap_timeout_ms=5_000)
    native = native_for(engine)
    assert native is not None, "a default-path config"
    states: dict[str, Any] = {}
    out: list[bytes] = []
    for index, raw in enumerate(lines):
        try:
            decoded = decode_event(raw)
            key = decoded.key
            states[key], outputs = native.step(states.get(key), raw, decoded.ts, decoded.ts - 1_000)
        except EventRejected as exc:
            out.append(orjson.dumps(["dead_letter", exc.code, exc.reason]))
            continue
        out.extend(map(_native_line, outputs))
        if restart_every and index % restart_every == 0:
            # to the state's bytes (as the Python engine writes them) and back
            data = state_codec.encode(NativeEngine.to_python(states[key]))
            states[key] = NativeEngine.from_python(state_codec.decode(data))
    finals = []
    for _key, state in sorted(states.items()):
        out.extend(map(_native_line, native.release(state, state.touched_ms + 60_000, None)))
        finals.append(state_codec.encode(NativeEngine.to_python(state)))
    return out, finals


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("seed", [101, 202])
def test_generated_sessions(native: ModuleType, name: str, seed: int) -> None:
    config = parse_config(CONFIGS[name])
    lines = generated_lines(seed, sessions=80, events=60)
    python = _python(config, lines)
    assert len(python[0]) > 2_000
    assert _native(config, lines) == python
    assert _native(config, lines, restart_every=7) == python


@pytest.mark.parametrize("name", sorted(RULE_CONFIGS))
@pytest.mark.parametrize("seed", [101, 202, 303])
def test_generated_sessions_under_the_rules(native: ModuleType, name: str, seed: int) -> None:
    """The opt-in rules natively (stage 5), over sessions whose results report usage:
    every line and final state (the rules' tallies in it) is the Python fold's, with a
    restart through the Python engine's bytes every few events."""
    config = parse_config(RULE_CONFIGS[name])
    volatile = name.startswith("volatile")
    lines = generated_lines(seed, sessions=80, events=60, usage=True, volatile=volatile)
    python = _python(config, lines)
    assert len(python[0]) > 2_000
    assert _native(config, lines) == python
    assert _native(config, lines, restart_every=5) == python


def test_the_rules_fire_in_the_generated_sessions(native: ModuleType) -> None:
    """The comparisons above are of every rule's verdicts and loop events, enforced and
    only reported, and of tallies in the final states."""
    found: set[tuple[str, str, bool]] = set()
    finals: list[bytes] = []
    for name in ("rules", "rules shadowed"):
        out, states = _python(
            parse_config(RULE_CONFIGS[name]), generated_lines(101, 80, 60, usage=True)
        )
        finals += states
        for value in map(orjson.loads, out):
            if isinstance(value, dict) and value.get("detector"):
                found.add((value["detector"], value["action"], value.get("enforced", True)))
    detectors = {detector for detector, _, _ in found}
    # (argument churn needs a rotation chance does not draw: the next test's)
    assert {
        "tool_loop_run_ended",
        "cycle",
        "repeated_failure",
        "run_call_cap",
        "token_budget",
        "cost_budget",
    } <= detectors, detectors
    assert ("run_call_cap", "abort", True) in found
    assert ("tool_loop_run_ended", "abort", True) in found
    assert {d for d, _, enforced in found if enforced is False} >= {"cycle", "repeated_failure"}
    with_tallies = [state_codec.decode(data).rules for data in finals]
    assert sum(rules is not None and bool(rules.runs) for rules in with_tallies) > 40


def test_identical_calls_and_masked_results_decide_in_the_generated_sessions(
    native: ModuleType,
) -> None:
    """The comparisons above hold identical-call verdicts, enforced and only reported,
    and masking that turns results the same."""
    name = "volatile results and identical calls"
    lines = generated_lines(101, 80, 60, usage=True, volatile=True)
    masked, _ = _python(parse_config(RULE_CONFIGS[name]), lines)
    plain = RULE_CONFIGS[name] | {
        "loopfuse": {"rules": {"identicalCalls": {"warningThreshold": 3, "criticalThreshold": 6}}}
    }
    unmasked, _ = _python(parse_config(plain), lines)
    found = {
        (value["detector"], value["action"], value.get("enforced", True))
        for value in map(orjson.loads, masked)
        if isinstance(value, dict) and value.get("detector")
    }
    assert ("identical_calls", "block", True) in found
    assert ("identical_calls", "block", False) in found
    blocks = [
        sum(b'"action":"block"' in line and b'"detector":"generic_repeat"' in line for line in out)
        for out in (masked, unmasked)
    ]
    assert blocks[0] > blocks[1], blocks


def test_decisions_happen_in_the_generated_sessions(native: ModuleType) -> None:
    """The comparisons above are not of allows only."""
    out, _ = _python(parse_config(CONFIGS["tight"]), generated_lines(101, 80, 60))
    found = {(v["action"], v["detector"]) for v in map(orjson.loads, out) if isinstance(v, dict)}
    assert {
        ("warn", "generic_repeat"),
        ("block", "generic_repeat"),
        ("warn", "ping_pong"),
        ("abort", "compaction_loop_persisted"),
        ("allow", "sequence_gap"),
    } <= found


def test_events_left_to_the_python_decoder(native: ModuleType) -> None:
    """RFC 3339 timestamps: the native decoder leaves these events to Python, whose
    event and tokens the fold then takes."""
    lines = [
        line
        for name in ("polling_loop", "compaction_loop")
        for line in (ROOT / "tests" / "fixtures" / f"{name}.jsonl").read_bytes().splitlines()
    ]
    assert all(native.event_fingerprints(raw, 1 << 20, 64, 512) is None for raw in lines)
    config = parse_config(
        {
            "tools": {
                "loopDetection": {"enabled": True, "warningThreshold": 3, "criticalThreshold": 5}
            }
        }
    )
    python = _python(config, lines)
    assert any(b'"action":"block"' in line or b'"action":"abort"' in line for line in python[0])
    assert _native(config, lines) == python


def test_run_ids_padded_with_what_str_strip_removes(native: ModuleType) -> None:
    spaces = [chr(c) for c in range(sys.maxunicode + 1) if chr(c).isspace()]
    assert len(spaces) == 29
    rng = random.Random(5)
    lines = []
    for index, space in enumerate([*spaces, "\u200b", "x"]):  # U+200B is no space to Python
        for step in range(12):
            run = (space * rng.randint(0, 2)) + "run" + (space * rng.randint(1, 2))
            body = {
                "type": "tool_call",
                "session_key": f"s{index}",
                "run_id": run,
                "event_id": f"e{index}-{step}",
                "call_id": f"c{step}",
                "tool_name": "exec",
                "args": {"command": "make"},
                "ts": 1_790_000_000_000 + step,
            }
            lines.append(orjson.dumps(body))
            if step % 4 == 3:
                ended = {
                    "type": "run_ended",
                    "session_key": f"s{index}",
                    "run_id": run,
                    "event_id": f"end{index}-{step}",
                    "ts": 1_790_000_000_000 + step,
                }
                lines.append(orjson.dumps(ended))
    config = parse_config({"tools": {"loopDetection": {"enabled": True, "warningThreshold": 3}}})
    python = _python(config, lines)
    assert sum(b'"warn"' in line for line in python[0]) > 20
    assert _native(config, lines) == python


def test_failures_waiting_and_hashed(native: ModuleType) -> None:
    """Repeated failure over results that wait (a seq gap, a restarted gateway), across
    restarts through the state's bytes, and errors sent as tokens: the same lines as
    the Python fold, and the failures counted."""
    from loopfuse.streams.engine.fingerprint import result_token

    lines: list[bytes] = []
    for session in range(6):
        common = {"session_key": f"f{session}", "run_id": "r", "agent_id": "a"}
        events: list[dict[str, Any]] = []
        for step in range(8):
            args = {"url": f"https://example.com/{step}"}
            outcome: dict[str, Any] = (
                {"result_hash": result_token("fetch", None, error="HTTP 503")}
                if session % 2
                else {"error": f"timeout (request id req_{step:04d}9f8e7d6c5b)"}
            )
            incarnation = "g1" if step < 4 else "g2"
            seq = 2 * (step % 4)
            events += [
                {
                    "type": "tool_call",
                    "event_id": f"c{step}",
                    "call_id": f"c{step}",
                    "tool_name": "fetch",
                    "args": args,
                    "seq": seq,
                    "incarnation": incarnation,
                    "ts": 1_790_000_000_000 + 10 * step,
                },
                {
                    "type": "tool_result",
                    "event_id": f"r{step}",
                    "call_id": f"c{step}",
                    "tool_name": "fetch",
                    "args": args,
                    "seq": seq + 1,
                    "incarnation": incarnation,
                    "ts": 1_790_000_000_001 + 10 * step,
                    **outcome,
                },
            ]
        # each result before its call, and the restarted gateway's first events early
        for index in range(0, len(events), 2):
            events[index], events[index + 1] = events[index + 1], events[index]
        events[6:10] = [*events[8:10], *events[6:8]]
        lines += [orjson.dumps({**common, **event}) for event in events]
    config = parse_config(
        {
            "loopfuse": {
                "rules": {"repeatedFailure": {"warningThreshold": 2, "criticalThreshold": 3}}
            }
        }
    )
    python = _python(config, lines)
    found = [line for line in python[0] if b'"repeated_failure"' in line]
    assert len(found) > 6
    assert _native(config, lines) == python
    assert _native(config, lines, restart_every=2) == python


def test_argument_churn(native: ModuleType) -> None:
    """One tool rotating through argument sets with one stable outcome (OpenClaw's
    no-progress argument churn), with the cycle rule off and on: the same lines."""
    lines = []
    for step in range(30):
        common = {
            "session_key": "churn",
            "run_id": "r",
            "call_id": f"c{step}",
            "tool_name": "exec",
            "args": {"command": f"make {step % 3}"},
            "ts": 1_790_000_000_000 + step,
        }
        lines.append(orjson.dumps({**common, "type": "tool_call", "event_id": f"e{step}"}))
        lines.append(
            orjson.dumps(
                {
                    **common,
                    "type": "tool_result",
                    "event_id": f"r{step}",
                    "result": {"content": [{"type": "text", "text": "same"}]},
                }
            )
        )
    for rules in ({"argumentChurn": {}}, {"argumentChurn": {}, "cycle": {"shadow": True}}):
        config = parse_config(
            {
                "tools": {
                    "loopDetection": {
                        "enabled": True,
                        "warningThreshold": 5,
                        "criticalThreshold": 40,
                    }
                },
                "loopfuse": {"rules": rules},
            }
        )
        python = _python(config, lines)
        churned = [line for line in python[0] if b'"argument_churn"' in line]
        assert churned, rules
        assert _native(config, lines) == python
        assert _native(config, lines, restart_every=3) == python


def test_native_for_takes_every_config(native: ModuleType) -> None:
    for config in (
        {"tools": {"loopDetection": {"enabled": True}}},
        {"loopfuse": {"rules": {"cycle": {}}}},
        {"loopfuse": {"providerSendTools": ["notify"]}},
        {"loopfuse": {"includePayloadsInLoopEvents": True}},
        {"agents": {"list": [{"id": "a", "loopfuse": {"rules": {"cycle": {}}}}]}},
    ):
        assert native_for(Engine(parse_config(config))) is not None, config


#: Args whose JSON orjson writes in forms of its own (floats' exponents, escapes), hostile
#: strings, one over the loop event's bound (null there), and one the native reader
#: leaves to Python (an integer past 64 bits): the same bytes in each call's loop event.
_PAYLOADS: tuple[Any, ...] = (
    {"f": [1e-7, 1e16, 1.5e300, 5e-324, 0.1, 123456789.125, -0.0, 1e15, 0.00001, 2.5e-5]},
    {'\u0000 \u001f "\\ \u2028 \u00e9 \U0001f600': ["\x1b[31m", "<@here>", "\x7f"]},
    {"big": "x" * 70_000},
    {"n": 2**70, "m": -(2**63), "k": 2**63 - 1},
    [[], {}, None, True, False, ""],
)


def _wire(event: dict[str, Any]) -> bytes:
    return json.dumps(event, ensure_ascii=False, separators=(",", ":")).encode()


def test_payloads_in_loop_events(native: ModuleType) -> None:
    lines = []
    for index, args in enumerate(_PAYLOADS):
        for step in range(8):
            common = {
                "session_key": f"s{index}",
                "call_id": f"c{step}",
                "tool_name": "exec",
                "args": args,
                "ts": 1_790_000_000_000 + step,
            }
            # the standard library's writer: orjson refuses integers past 64 bits
            lines.append(_wire({**common, "type": "tool_call", "event_id": f"e{step}"}))
            lines.append(
                _wire({**common, "type": "tool_result", "event_id": f"r{step}", "result": "same"})
            )
    config = parse_config(
        {
            "tools": {
                "loopDetection": {"enabled": True, "warningThreshold": 3, "criticalThreshold": 5}
            },
            "loopfuse": {"includePayloadsInLoopEvents": True},
        }
    )
    python = _python(config, lines)
    published = {
        orjson.loads(line)["session_key"]: orjson.loads(line)["args"]
        for line in python[0]
        if b'"loop_event"' in line
    }
    # every session's blocks carry its args (the big integer as the decoder's float),
    # but the one over the bound: null
    assert published["s0"] == _PAYLOADS[0] and published["s1"] == _PAYLOADS[1], published
    assert published["s2"] is None and published["s4"] == _PAYLOADS[4]
    assert published["s3"] == {"n": float(2**70), "m": -(2**63), "k": 2**63 - 1}
    assert _native(config, lines) == python
    assert _native(config, lines, restart_every=3) == python


def test_send_tools_outcomes_without_their_volatile_ids(native: ModuleType) -> None:
    """A configured send tool's results differ only in per-send ids and times: the same
    outcome, so repeating the send is no progress, natively as in Python; a tool not
    configured keeps them (different outcomes: progress)."""
    lines = []
    for step in range(8):
        for tool in ("notify", "other"):
            common = {
                "session_key": f"send-{tool}",
                "run_id": "r",
                "call_id": f"c{step}",
                "tool_name": tool,
                "args": {"to": "ops", "text": "stuck"},
                "ts": 1_790_000_000_000 + step,
            }
            details = {
                "messageId": f"m-{step}",
                "sentAt": 1_790_000_000_000 + step,
                "channel": "ops",
                "receipt": {"n": step},
            }
            lines.append(orjson.dumps({**common, "type": "tool_call", "event_id": f"e{step}"}))
            lines.append(
                orjson.dumps(
                    {
                        **common,
                        "type": "tool_result",
                        "event_id": f"r{step}",
                        "result": {"details": details},
                    }
                )
            )
    config = parse_config(
        {
            "tools": {
                "loopDetection": {"enabled": True, "warningThreshold": 3, "criticalThreshold": 5}
            },
            "loopfuse": {"providerSendTools": ["notify"]},
        }
    )
    python = _python(config, lines)
    blocked = {
        orjson.loads(line)["session_key"] for line in python[0] if b'"action":"block"' in line
    }
    assert blocked == {"send-notify"}
    assert _native(config, lines) == python


def test_replay_gives_the_python_folds_lines(
    native: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``loopfuse replay`` (streams/replay.py) takes the native fold on the default path:
    every line it writes is the Python fold's, dead letters and checkpoints included."""
    from bench.engine import build_workload
    from loopfuse.streams import replay

    fixtures = (ROOT / "tests" / "fixtures" / "polling_loop.jsonl").read_bytes().splitlines()
    orphan = orjson.dumps(
        {
            "type": "tool_result",
            "session_key": "o",
            "event_id": "o1",
            "call_id": "never",
            "tool_name": "read",
            "result": "x",
            "ts": 5,
        }
    )
    lines = generated_lines(303, sessions=60, events=50) + build_workload(60, 30, 9)
    # across batches: lines ending CRLF, blank ones, RFC 3339 times (the Python
    # decoder's to read), a rejection by the step (its dead letter names its line)
    for at, extra in ((7, b"\r\n"), (300, b""), (301, b"  "), (520, orphan), (777, orphan)):
        lines.insert(at, extra)
    lines[10] += b"\r\n"
    lines[600:600] = fixtures
    assert len(lines) > 8 * replay.BATCH_LINES
    for name in ("enabled", "tight", "not set"):
        config = parse_config(CONFIGS[name])
        native_lines = list(replay.replay_lines(iter(lines), Engine(config)))
        with monkeypatch.context() as patched:
            patched.setattr(replay, "native_for", lambda engine: None)
            python_lines = list(replay.replay_lines(iter(lines), Engine(config)))
        assert len(python_lines) > 2_500
        assert any(b'"dead_letter"' in line or b"invalid_event" in line for line in python_lines)
        assert sum(b'"orphan_result"' in line for line in python_lines) > 2
        assert native_lines == python_lines, name


def test_replay_says_which_line_a_native_step_failed_on(
    native: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A native step that raises (the Python it asks failed) makes its line's dead
    letter; the lines after it are judged as ever."""
    from loopfuse.streams import replay
    from loopfuse.streams.engine import native_step

    def failing(text: str) -> int:
        raise RuntimeError("the identity of a failure could not be taken")

    config = parse_config({"loopfuse": {"rules": {"repeatedFailure": {}}}})
    lines = [
        orjson.dumps(
            {
                "type": "tool_call",
                "session_key": "s",
                "event_id": f"c{n}",
                "call_id": f"c{n}",
                "tool_name": "read",
                "args": {"n": n},
                "ts": 10 + n,
            }
        )
        for n in range(600)
    ]
    lines.insert(
        400,
        orjson.dumps(
            {
                "type": "tool_result",
                "session_key": "s",
                "event_id": "r",
                "call_id": "c1",
                "tool_name": "read",
                "args": {"n": 1},
                "error": "boom",
                "ts": 500,
            }
        ),
    )
    monkeypatch.setattr(native_step, "failure_identity", failing)
    out = [orjson.loads(line) for line in replay.replay_lines(iter(lines), Engine(config))]
    letters = [line for line in out if line["type"] == "dead_letter"]
    assert [(d["error_code"], d["line"]) for d in letters] == [("engine_error", 401)]
    assert "could not be taken" in letters[0]["reason"]
    assert sum(line["type"] == "verdict" for line in out) == 600

    def interrupted(text: str) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(native_step, "failure_identity", interrupted)
    with pytest.raises(KeyboardInterrupt):  # not a line's failure: it stops the replay
        list(replay.replay_lines(iter(lines), Engine(config)))


def test_replay_sheds_a_state_over_its_cap_as_the_python_fold_does(
    native: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A history of 2,000 records does not fit the state's 64 KiB: at its checkpoints the
    state sheds its oldest records (state_codec.fit), which changes what is detected
    later; the native replay does it at the same steps, to the same lines."""
    from bench.engine import build_workload
    from loopfuse.streams import replay

    config = parse_config(
        {
            "tools": {
                "loopDetection": {
                    "enabled": True,
                    "historySize": 3000,
                    "warningThreshold": 300,
                    "criticalThreshold": 5000,
                    "globalCircuitBreakerThreshold": 6000,
                }
            }
        }
    )
    lines = build_workload(17, 2_000, 4)  # the 17th session loops (a generic repeat)
    native_lines = list(replay.replay_lines(iter(lines), Engine(config)))
    with monkeypatch.context() as patched:
        patched.setattr(replay, "native_for", lambda engine: None)
        shed: list[int] = []
        fit = state_codec.fit

        def counting(state: SessionState, cap: int) -> bytes:
            before = len(state.history)
            data = fit(state, cap)
            shed.append(before - len(state.history))
            return data

        patched.setattr(state_codec, "fit", counting)
        python_lines = list(replay.replay_lines(iter(lines), Engine(config)))
    assert sum(shed) > 500, "the Python fold shed records"
    assert any(b'"generic_repeat"' in line for line in python_lines)
    assert native_lines == python_lines


def test_a_native_engine_is_collected(native: ModuleType) -> None:
    """The Judge holds the engine's resolver (a bound method: a cycle through Rust),
    so it must show the collector what it holds, or every replay would leak its engine."""
    import gc
    import weakref

    held = native_for(Engine(parse_config(CONFIGS["enabled"])))
    assert held is not None
    ref = weakref.ref(held)
    del held
    gc.collect()
    assert ref() is None


def test_waiting_events_are_written_as_the_python_engine_writes_them(native: ModuleType) -> None:
    """Events parked on a gap and pending a gateway restart, with every field a waiting
    event keeps (a reply, usage counts, a result with nothing recorded, strings to
    escape), are written natively as the Python engine writes them; one with a usage
    cost (a float, which msgspec writes its own way) is left to Python, same bytes."""
    fold = native_for(Engine(parse_config(CONFIGS["not set"])))
    assert fold is not None
    ts = 1_790_000_000_000
    common = {"session_key": 'agent:1:"s"\n\u2028\u00e9\x7f', "run_id": "r\t1", "agent_id": "a"}
    reply = {"topic": "loopfuse.replies", "partition": 1, "requester": "gw-\\1"}
    events: list[dict[str, Any]] = [
        {
            "type": "tool_call",
            "event_id": "e0",
            "incarnation": "g1",
            "seq": 0,
            "ts": ts,
            "call_id": "c0",
            "tool_name": "read",
            "args": {"path": "x"},
        },
        # seq 1 never comes: these wait on the gap
        {
            "type": "tool_result",
            "event_id": "e2",
            "incarnation": "g1",
            "seq": 2,
            "ts": ts + 1,
            "call_id": "c1",
            "tool_name": "read",
            "args": {"path": "x"},
            "result": None,
            "usage": {"input_tokens": 3, "total_tokens": 9},
            "reply_to": reply,
        },
        {
            "type": "tool_result",
            "event_id": "e3",
            "incarnation": "g1",
            "seq": 3,
            "ts": ts + 2,
            "call_id": "c2",
            "tool_name": "nope",
            "error": "Tool nope not found",
            "unknown_tool": "Nope",
        },
        {
            "type": "compaction",
            "event_id": "e4",
            "incarnation": "g1",
            "seq": 4,
            "ts": ts + 3,
            "reason": "full",
        },
        # another incarnation, later than the watermark: it waits for the input to move on
        {
            "type": "tool_call",
            "event_id": "e5",
            "incarnation": "g2",
            "seq": 0,
            "ts": ts + 10_000,
            "call_id": "c3",
            "tool_name": "exec",
            "args_hash": "ab" * 16,
            "args_action": "poll",
            "reply_to": reply,
        },
        {"type": "run_ended", "event_id": "e6", "incarnation": "g2", "seq": 1, "ts": ts + 10_001},
    ]
    state = None
    for event in events:
        raw = orjson.dumps({**common, **event})
        state, _ = fold.step(state, raw, ts + 20_000, ts)
        body = state.v4_body()
        assert body is not None
        python = NativeEngine.to_python(state)
        for version in (4, 5):
            written = state_codec.encode_body(state.touched_ms, state.last_event_ms, body, version)
            assert written == state_codec.encode(python, version)
        assert state.checkpoint(17 + len(body)) == written == state_codec.v5.write(python)
    assert len(python.parked) == 3 and len(python.pending) == 2
    assert state_codec.decode(written).parked == python.parked
    # a usage cost waiting: Python writes the state, and the checkpoint is its bytes
    costly = {**common, **events[1], "event_id": "e7", "seq": 5, "usage": {"cost": 1e-7}}
    state, _ = fold.step(state, orjson.dumps(costly), ts + 20_000, ts)
    assert state.v4_body() is None and state.checkpoint(65_536) is None
    data, kept = fold.checkpoint(state, 65_536)
    assert kept is state
    assert data == state_codec.encode(NativeEngine.to_python(state))


def test_a_native_state_writes_the_python_engines_bytes(native: ModuleType) -> None:
    """A native state's bytes (native/src/state_bytes.rs: version 4's body, and format 5
    from it or straight from the state, the checkpoint's) are the bytes the Python engine
    writes for the same state, after every event; the checkpoint holds the cap to version
    4's size, as ``state_codec.fit`` does."""
    from bench.engine import build_workload

    compared = waiting = 0
    for name in ("not set", "tight"):
        fold = native_for(Engine(parse_config(CONFIGS[name])))
        assert fold is not None
        states: dict[str, Any] = {}
        for raw in generated_lines(404, sessions=40, events=40) + build_workload(30, 20, 2):
            try:
                event = decode_event(raw)
            except EventRejected:
                continue
            states[event.key], _ = fold.step(states.get(event.key), raw, event.ts, None)
            state = states[event.key]
            body = state.v4_body()
            if body is None:
                continue  # a waiting event has a usage cost: the Python engine writes it
            python = NativeEngine.to_python(state)
            for version in (4, 5):
                written = state_codec.encode_body(
                    state.touched_ms, state.last_event_ms, body, version
                )
                assert written == state_codec.encode(python, version)
            assert state.checkpoint(17 + len(body)) == written == state_codec.v5.write(python)
            assert state.checkpoint(16 + len(body)) is None
            compared += 1
            waiting += bool(python.parked or python.pending)
    assert compared > 3_000
    assert waiting > 300  # events parked on a gap or pending a restart, as their JSON
