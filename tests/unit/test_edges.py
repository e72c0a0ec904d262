"""Hostile input is normal input: bounds at decode, no secret in errors, strict configs,
opt-in payloads, and a property that nothing a gateway sends escapes as an exception."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loopfuse.schemas import ConfigError, load_config, parse_config
from loopfuse.schemas.decode import EventRejected, decode_event
from loopfuse.streams.engine import Engine, LoopEvent, state_codec
from loopfuse.streams.replay import replay_lines
from loopfuse.streams.worker.fold import PythonFold
from loopfuse.streams.worker.outgoing import Limits, Source
from tests.unit.conftest import call, result

ROOT = Path(__file__).resolve().parents[2]


def _dumps(data: Any) -> bytes:
    return json.dumps(data, ensure_ascii=False).encode("utf-8", "surrogatepass")


def _event(**fields: Any) -> bytes:
    return _dumps(
        {
            "type": "tool_call",
            "event_id": "e",
            "session_key": "s",
            "ts": 5,
            "call_id": "c",
            "tool_name": "exec",
            "args": {},
            **fields,
        }
    )


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"ts": 2**64}, "ts:"),
        ({"ts": -1}, "ts:"),
        ({"seq": 2**63}, "seq:"),
        ({"tool_name": "x" * 300_000}, "tool_name is 300000 bytes, the limit is 512"),
        ({"session_key": "é" * 300}, "session_key is 600 bytes"),
        ({"incarnation": "i" * 513}, "incarnation is 513 bytes"),
        ({"args_hash": "h" * 1000, "args": None}, "args"),
    ],
)
def test_values_out_of_bounds_are_rejected_with_a_reason(
    fields: dict[str, Any], reason: str
) -> None:
    data = _event(**fields)
    if "args_hash" in fields:
        data = _dumps({k: v for k, v in json.loads(data).items() if k != "args"})
    with pytest.raises(EventRejected) as caught:
        decode_event(data)
    assert caught.value.code == "invalid_event"
    assert reason.split(" ")[0] in caught.value.reason


def test_the_identifier_bound_is_a_setting() -> None:
    assert decode_event(_event(tool_name="x" * 600), max_identifier_bytes=1024).tool_name


def test_duplicate_config_keys_are_an_error_naming_the_key_path(tmp_path: Path) -> None:
    path = tmp_path / "dup.json5"
    path.write_text("{tools: {loopDetection: {enabled: true, enabled: false}}}")
    with pytest.raises(ConfigError, match=r"tools\.loopDetection\.enabled: duplicate key"):
        load_config(path)
    path.write_text(
        '{agents: {list: [{id: "a", tools: {loopDetection: {historySize: 5, historySize: 9}}}]}}'
    )
    with pytest.raises(ConfigError, match=r"agents\.list\[0\]\.tools\.loopDetection\.historySize"):
        load_config(path)


def test_a_deeply_nested_config_is_a_one_line_error(tmp_path: Path) -> None:
    path = tmp_path / "deep.json"
    path.write_text('{"a":' * 20_000 + "1" + "}" * 20_000)
    with pytest.raises(ConfigError, match="nested too deeply"):
        load_config(path)


def test_a_settings_error_names_the_variable_and_never_prints_a_secret() -> None:
    env = {
        **os.environ,
        "LOOPFUSE_SASL_MECHANISM": "PLAIN",
        "LOOPFUSE_SASL_PASSWORD": "hunter2-very-secret",
        "LOOPFUSE_SASL_USERNAME": "u",
    }
    for command in (
        ["-m", "loopfuse.streams.worker.run"],
        ["-m", "loopfuse.streams.cli", "worker"],
    ):
        done = subprocess.run(
            [sys.executable, *command],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2
        assert "LOOPFUSE_SASL_MECHANISM needs LOOPFUSE_SECURITY_PROTOCOL" in done.stderr
        assert "hunter2" not in done.stderr + done.stdout
        assert "Traceback" not in done.stderr and "LOOPFUSE_SETTINGS" not in done.stderr


def _looping(engine: Engine) -> list[LoopEvent]:
    args = {"command": "make test"}
    events = [
        e
        for i in range(4)
        for e in (call("exec", args, call_id=f"c{i}"), result("exec", args, call_id=f"c{i}"))
    ]
    return [o for o in engine.replay(events) if isinstance(o, LoopEvent)]


def test_payloads_in_loop_events_only_when_configured() -> None:
    block = {"enabled": True, "warningThreshold": 2, "criticalThreshold": 3}
    off = _looping(Engine(parse_config({"tools": {"loopDetection": block}})))
    on = _looping(
        Engine(
            parse_config(
                {
                    "tools": {"loopDetection": block},
                    "loopfuse": {"includePayloadsInLoopEvents": True},
                }
            )
        )
    )
    assert off and {e.args is None for e in off} == {True}
    assert on and {orjson.dumps(e.args) for e in on} == {b'{"command":"make test"}'}


# -- nothing a gateway sends escapes -------------------------------------------------

_KEYS = [
    "type",
    "event_id",
    "session_key",
    "run_id",
    "agent_id",
    "incarnation",
    "seq",
    "ts",
    "call_id",
    "tool_name",
    "args",
    "args_hash",
    "args_action",
    "result",
    "result_hash",
    "error",
    "unknown_tool",
    "reason",
    "\ue000key",
    "details",
    "content",
]
_BIG = "x" * 600_000
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=30),
    st.sampled_from(
        [
            "tool_call",
            "tool_result",
            "compaction",
            "run_ended",
            "s1",
            "exec",
            "process",
            "poll",
            _BIG,
            "\ue000\U0001f600",
            "unknown tool: ghost",
        ]
    ),
)
_json = st.recursive(
    _scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.sampled_from(_KEYS), children, max_size=6),
    ),
    max_leaves=20,
)
_base = {
    "type": "tool_call",
    "event_id": "e",
    "session_key": "s1",
    "ts": 1_000,
    "call_id": "c",
    "tool_name": "exec",
    "args": {},
}


@st.composite
def _events(draw: Any) -> bytes:
    data = dict(_base) if draw(st.booleans()) else {}
    data.update(draw(st.dictionaries(st.sampled_from(_KEYS), _json, max_size=8)))
    raw = _dumps(data)
    if draw(st.integers(0, 9)) == 0 and raw.endswith(b"}"):
        # deeper than any JSON encoder recurses: written out, not encoded
        depth = draw(st.integers(50, 20_000))
        raw = (
            raw[:-1]
            + (b"," if len(raw) > 2 else b"")
            + (b'"args":' + b"[" * depth + b"1" + b"]" * depth + b"}")
        )
    return raw


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(_events(), min_size=1, max_size=12))
def test_any_json_gets_outputs_or_a_dead_letter_within_bounds(lines: list[bytes]) -> None:
    engine = Engine(parse_config({"tools": {"loopDetection": {"enabled": True}}}))
    limits = Limits(max_state_bytes=65_536)
    folds: dict[str, PythonFold] = {}
    for number, raw in enumerate(lines, start=1):
        source = Source(line=number, value=raw)
        try:
            event = decode_event(raw)
        except EventRejected:
            continue
        fold = folds.setdefault(
            event.key,
            PythonFold(engine=engine, key=event.key.encode(), limits=limits, base=None, state=None),
        )
        for message in fold.apply(event, source, 2_000_000_000_000, None):
            assert len(message.value) <= limits.output_budget
        data, _ = fold.checkpoint()
        assert data is None or len(data) <= limits.max_state_bytes
        if data is not None:
            state_codec.decode(data)
    # replay judges the same lines without raising, one output or more per valid line
    assert all(isinstance(doc, bytes) for doc in replay_lines(iter(lines), engine))


def test_a_state_over_its_cap_sheds_its_oldest_history() -> None:
    engine = Engine(
        parse_config({"tools": {"loopDetection": {"enabled": True, "historySize": 5000}}})
    )
    limits = Limits(max_state_bytes=16_384)
    fold = PythonFold(engine=engine, key=b"s1", limits=limits, base=None, state=None)
    for i in range(2_000):
        event = call(f"tool-{i % 300}-" + "n" * 400, {"i": i}, call_id=f"c{i}")
        fold.apply(event, Source(line=i), 2_000_000_000_000, None)
    data, messages = fold.checkpoint()
    assert data is not None and len(data) <= 16_384
    assert fold.shed == 1 and len(messages) == 2_000
