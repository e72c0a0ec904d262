"""The worker's session fold, native and in Python: the same messages, routes, dead
letters, notices, metrics and state bytes.

processor.py folds a session on the native fold (``NativeFold``) wherever
``native_for`` accepts the engine, and on the Python one (``PythonFold``) elsewhere.
Both run here over the same records, in one process: seeded random sessions with
hostile strings, disorder, losses and gateway restarts
(tests/support/generated_sessions.py), with replies named (some to partitions the
worker does not have, some malformed), cut into random batches, with the timer's
releases between them and the state cache dropped now and then (the state then read
back from its bytes). Tight limits make states shed and overflow, and outputs too
large, so the way back (isolation, rejection) is compared too. Under the fleet breaker
both folds overlay the same live breakers on their verdicts and send the same strikes.
"""

from __future__ import annotations

import json
import logging
import random
from typing import Any

import pytest

from loopfuse.schemas.config import parse_config
from loopfuse.streams.engine import Engine
from loopfuse.streams.engine.fleet import ToolBreaker
from loopfuse.streams.engine.native import NATIVE
from loopfuse.streams.worker.fold import NativeFold, PythonFold
from loopfuse.streams.worker.outgoing import RECORD_OVERHEAD_BYTES, Limits
from loopfuse.streams.worker.processor import (
    DictStore,
    InputRecord,
    Message,
    OutputTopics,
    SessionProcessor,
)
from tests.support.generated_sessions import generated_lines
from tests.unit.test_processor import INPUTS, Clock, Offsets

pytestmark = pytest.mark.skipif(
    NATIVE is None or not hasattr(NATIVE, "ReadEvent"), reason="the native judge is not built"
)

REPLIES = {"loopfuse.replies": 8}
OUT = OutputTopics("verdicts", "loops", "dead", replies=REPLIES)
CONFIGS: dict[str, dict[str, Any]] = {
    "enabled": {
        "tools": {"loopDetection": {"enabled": True, "warningThreshold": 3, "criticalThreshold": 5}}
    },
    "not set": {},
    "detectors off": {
        "tools": {
            "loopDetection": {
                "enabled": True,
                "detectors": {"genericRepeat": False, "pingPong": False},
            }
        }
    },
    "rules": {
        "tools": {"loopDetection": {"enabled": True, "warningThreshold": 3}},
        "loopfuse": {
            "rules": {
                "runEnding": {"blockedStreak": 2},
                "cycle": {"shadow": True},
                "repeatedFailure": {"warningThreshold": 2},
                "runCaps": {"maxToolCalls": 12, "tokensPerRun": 4_000, "costPerSession": 0.5},
                "tools": {"read": {"exempt": True}, "exec": {"criticalThreshold": 4}},
            }
        },
    },
}
CONFIGS["volatile results and identical calls"] = {
    "tools": {"loopDetection": {"enabled": True, "warningThreshold": 3, "criticalThreshold": 5}},
    "loopfuse": {
        "rules": {
            "volatileResults": {"patterns": [{"prefix": "#", "chars": "hex"}]},
            "identicalCalls": {"warningThreshold": 3, "criticalThreshold": 6},
        }
    },
    "agents": {
        "list": [{"id": "run-ender", "loopfuse": {"rules": {"identicalCalls": {"shadow": True}}}}]
    },
}
TIGHT = Limits(
    max_state_bytes=3_000, max_output_bytes=RECORD_OVERHEAD_BYTES + 900, max_identifier_bytes=256
)


def _records(seed: int, volatile: bool = False) -> list[InputRecord]:
    """The generated sessions as input records, most of them naming a reply; with
    ``volatile``, some sessions' results carry per-call noise."""
    rng = random.Random(seed)
    records = []
    offsets: dict[tuple[str, int], int] = {}
    asks: dict[str, Any] = {}
    for line in generated_lines(seed, sessions=60, events=30, usage=True, volatile=volatile):
        event = json.loads(line)
        key = event.get("session_key") or event.get("run_id") or ""
        if key not in asks:
            asks[key] = rng.choice(["none", "routed", "routed", "routed", "unroutable", "bad"])
        ask = asks[key]
        if ask == "routed" or (ask == "unroutable" and rng.random() < 0.5):
            event["reply_to"] = {
                "topic": "loopfuse.replies",
                "partition": rng.randrange(8) if ask == "routed" else 9,
                "requester": f"gw-{event.get('incarnation')}",
            }
        elif ask == "bad" and rng.random() < 0.3:
            event["reply_to"] = rng.choice(
                [{"topic": 3}, "x", {"topic": "t", "partition": -1, "requester": "r"}]
            )
        topic = {"tool_call": "calls", "tool_result": "results"}.get(event["type"], "compactions")
        record_key = key.encode("utf-8", "surrogatepass") if isinstance(key, str) else b""
        partition = sum(record_key) % 3
        offset = offsets.get((topic, partition), 0)
        offsets[(topic, partition)] = offset + 1
        records.append(
            InputRecord(topic, partition, offset, record_key, json.dumps(event).encode())
        )
    return records


def _run(
    records: list[InputRecord],
    config: dict[str, Any],
    limits: Limits,
    native: bool,
    seed: int,
    breakers: dict[str, ToolBreaker] | None = None,
) -> tuple[list[list[Message]], dict[bytes, bytes], bytes, set[type]]:
    """Every batch's messages, the store at the end, the metrics, the folds used.
    ``breakers``: the fleet breaker's live tools (then strikes are sent too), changed
    between batches as the worker's board would be."""
    engine = Engine(parse_config(config))
    clock = Clock()
    out = (
        OUT
        if breakers is None
        else OutputTopics("verdicts", "loops", "dead", "strikes", replies=REPLIES)
    )
    proc = SessionProcessor(
        engine,
        INPUTS,
        out,
        DictStore(),
        Offsets(answered=None),
        limits=limits,
        clock=clock,
        breakers=breakers,
    )
    assert (proc.native is not None) is True  # the native build judges this config
    if not native:
        proc.native = None
    folds: set[type] = set()
    original = proc._fold

    def fold(key: bytes) -> Any:
        made = original(key)
        folds.add(type(made))
        return made

    proc._fold = fold  # type: ignore[method-assign]
    rng = random.Random(seed)
    batches: list[list[Message]] = []
    at = 0
    while at < len(records):
        size = rng.randint(1, 40)
        batches.append(proc.process(records[at : at + size]))
        at += size
        clock.now += rng.choice([0, 5, 1_000, 40_000])
        if rng.random() < 0.3:
            batches.append(proc.release_waiting())
        if rng.random() < 0.2:
            proc.decoded.clear()  # read back from the bytes next time
        if breakers is not None and rng.random() < 0.2:  # the board moved on
            tool = rng.choice(["exec", "process", "write", "web_search"])
            if tool in breakers:
                del breakers[tool]
            else:
                breakers[tool] = ToolBreaker(
                    tool, rng.randint(2, 30), 300, 0, 1_790_000_000_000 + rng.randint(0, 200_000)
                )
    assert isinstance(proc.store, DictStore)
    # the counters, without the wall time each was created at
    counters = b"\n".join(
        line for line in proc.metrics.render().splitlines() if b"_created" not in line
    )
    return batches, dict(proc.store.data), counters, folds


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("tight", [False, True], ids=["default limits", "tight limits"])
@pytest.mark.parametrize("seed", [1, 2])
def test_the_native_fold_sends_what_the_python_fold_sends(
    config: str, tight: bool, seed: int, caplog: pytest.LogCaptureFixture
) -> None:
    records = _records(seed, volatile=config.startswith("volatile"))
    limits = TIGHT if tight else Limits()
    with caplog.at_level(logging.INFO, logger="loopfuse.processor"):
        native = _run(records, CONFIGS[config], limits, True, seed)
        native_log = [r.getMessage() for r in caplog.records]
        caplog.clear()
        python = _run(records, CONFIGS[config], limits, False, seed)
        python_log = [r.getMessage() for r in caplog.records]
    assert native[3] == {NativeFold} and python[3] == {PythonFold}
    assert len(native[0]) == len(python[0])
    for got, expected in zip(native[0], python[0], strict=True):
        assert got == expected
    assert native[1] == python[1]  # every session's state bytes
    assert native[2] == python[2]  # metrics: verdicts by action, routes, dead letters, sheds
    assert native_log == python_log  # notices, unroutable replies

    sent = [message for batch in native[0] for message in batch]
    topics = {topic for topic, _, _, _ in sent}
    assert {"loopfuse.replies", "verdicts", "dead"} <= topics
    assert any(b'"type":"loop_event"' in value for _, _, value, _ in sent)
    if tight and config == "enabled":  # the ways back were taken (other configs: by chance)
        codes = {json.loads(value)["error_code"] for topic, _, value, _ in sent if topic == "dead"}
        assert {"output_too_large"} <= codes, codes
        assert b"loopfuse_state_shed_total" in native[2]


FLEET: dict[str, Any] = {
    "tools": {"loopDetection": {"enabled": True, "warningThreshold": 3, "criticalThreshold": 5}},
    "loopfuse": {
        "rules": {
            "fleetBreaker": {"action": "block"},
            "repeatedFailure": {},
            "tools": {"write": {"exempt": True}},
        }
    },
    "agents": {
        "list": [
            {"id": "agent-1", "loopfuse": {"rules": {"fleetBreaker": {"action": "warn"}}}},
            {"id": "agent-2", "loopfuse": {"rules": {"fleetBreaker": {"shadow": True}}}},
            {"id": "agent-3", "loopfuse": {"rules": {"fleetBreaker": {"enabled": False}}}},
        ]
    },
}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_fleet_breaker_on_both_folds(seed: int) -> None:
    """The overlay of broken tools on verdicts (block, warn, shadowed, off, exempt, an
    event time past the breaker's end) and the strikes: the same messages."""
    records = _records(seed)
    broken = {
        tool: ToolBreaker(tool, 7, 300, 0, 1_790_000_040_000)
        for tool in ("exec", "read", "process", "web_search")
    }
    native = _run(records, FLEET, Limits(), True, seed, dict(broken))
    python = _run(records, FLEET, Limits(), False, seed, dict(broken))
    assert native[3] == {NativeFold} and python[3] == {PythonFold}
    for got, expected in zip(native[0], python[0], strict=True):
        assert got == expected
    assert native[1] == python[1] and native[2] == python[2]
    sent = [message for batch in native[0] for message in batch]
    assert any(topic == "strikes" for topic, _, _, _ in sent)
    raised = [
        json.loads(value)
        for topic, _, value, _ in sent
        if topic in ("verdicts", "loopfuse.replies") and b"fleet_tool_breaker" in value
    ]
    assert {v["action"] for v in raised} == {"warn", "block"}
