"""Builders for validated wire events and filters for engine outputs, shared by the unit tests."""

from __future__ import annotations

import dataclasses
import importlib
import itertools
from types import ModuleType
from typing import Any

import pytest

from loopfuse.schemas import LoopEvent, Verdict, parse_config, validate_event
from loopfuse.streams.engine import native as choice

_counter = itertools.count(1)
_MISSING: Any = object()

OK_RESULT = {"content": [{"type": "text", "text": "ok"}], "details": {}}
LOOP_BLOCK_RESULT = {
    "content": [{"type": "text", "text": "CRITICAL: blocked"}],
    "details": {"status": "blocked", "deniedReason": "tool-loop", "reason": "CRITICAL: blocked"},
}


def _next() -> int:
    return next(_counter)


def _common(
    kind: str,
    session: str | None,
    run: str | None,
    agent: str | None,
    seq: int | None,
    ts: int | None,
    event_id: str | None,
) -> dict[str, Any]:
    n = _next()
    data: dict[str, Any] = {
        "type": kind,
        "event_id": event_id or f"ev-{n}",
        "ts": ts if ts is not None else 1_700_000_000_000 + n,
    }
    for key, value in (
        ("session_key", session),
        ("run_id", run),
        ("agent_id", agent),
        ("seq", seq),
    ):
        if value is not None:
            data[key] = value
    return data


def _with_args(
    data: dict[str, Any], args: Any, args_hash: str | None, args_action: str | None
) -> dict[str, Any]:
    if args_hash is not None:
        data["args_hash"] = args_hash
    else:
        data["args"] = args
    if args_action is not None:
        data["args_action"] = args_action
    return data


def call(
    tool: str,
    args: Any = None,
    *,
    session: str | None = "s1",
    run: str | None = "r1",
    call_id: str | None = None,
    seq: int | None = None,
    agent: str | None = None,
    ts: int | None = None,
    event_id: str | None = None,
    args_hash: str | None = None,
    args_action: str | None = None,
) -> Any:
    """A validated tool_call; ``args`` defaults to {} (pass args_hash to send a hash instead)."""
    data = _common("tool_call", session, run, agent, seq, ts, event_id)
    data["call_id"] = call_id or f"call-{data['event_id']}"
    data["tool_name"] = tool
    _with_args(data, {} if args is None and args_hash is None else args, args_hash, args_action)
    return validate_event(data)


def result(
    tool: str,
    args: Any = None,
    *,
    result: Any = _MISSING,
    error: Any = None,
    result_hash: str | None = None,
    unknown_tool: str | None = None,
    session: str | None = "s1",
    run: str | None = "r1",
    call_id: str | None = None,
    seq: int | None = None,
    agent: str | None = None,
    ts: int | None = None,
    event_id: str | None = None,
    args_hash: str | None = None,
    args_action: str | None = None,
    usage: dict[str, Any] | None = None,
) -> Any:
    """A validated tool_result; with no outcome given the result is a plain "ok" success."""
    data = _common("tool_result", session, run, agent, seq, ts, event_id)
    data["call_id"] = call_id or f"orphan-{data['event_id']}"
    data["tool_name"] = tool
    _with_args(data, {} if args is None and args_hash is None else args, args_hash, args_action)
    if error is not None:
        data["error"] = error
    elif result_hash is not None:
        data["result_hash"] = result_hash
    else:
        data["result"] = OK_RESULT if result is _MISSING else result
    if unknown_tool is not None:
        data["unknown_tool"] = unknown_tool
    if usage is not None:
        data["usage"] = usage
    return validate_event(data)


def pair(tool: str, args: Any = None, **kwargs: Any) -> list[Any]:
    """A tool_call and its tool_result (same call id); outcome kwargs go to the result."""
    outcome_keys = {"result", "error", "result_hash", "unknown_tool"}
    call_kwargs = {k: v for k, v in kwargs.items() if k not in outcome_keys}
    call_kwargs.pop("seq", None)
    the_call = call(tool, args, **call_kwargs)
    result_kwargs = {k: v for k, v in kwargs.items() if k not in {"call_id", "seq", "event_id"}}
    return [the_call, result(tool, args, call_id=the_call.call_id, **result_kwargs)]


def compaction(
    *,
    session: str | None = "s1",
    run: str | None = "r1",
    reason: str | None = "context_overflow",
    seq: int | None = None,
    agent: str | None = None,
    ts: int | None = None,
    event_id: str | None = None,
) -> Any:
    data = _common("compaction", session, run, agent, seq, ts, event_id)
    if reason is not None:
        data["reason"] = reason
    return validate_event(data)


def run_ended(
    *,
    session: str | None = "s1",
    run: str | None = "r1",
    seq: int | None = None,
    agent: str | None = None,
    ts: int | None = None,
    event_id: str | None = None,
) -> Any:
    return validate_event(_common("run_ended", session, run, agent, seq, ts, event_id))


def loop_config(**loop: Any) -> dict[str, Any]:
    """An OpenClaw-shaped config document with detection enabled plus ``loop`` fields."""
    return {"tools": {"loopDetection": {"enabled": True, **loop}}}


def engine_with(**loop: Any) -> Any:
    """An Engine whose global loopDetection block is ``enabled: true`` plus ``loop``."""
    from loopfuse.streams.engine import Engine

    return Engine(parse_config(loop_config(**loop)))


def verdicts(outputs: list[Any]) -> list[Verdict]:
    """The verdicts among the outputs (pydantic models or their engine-side mirrors)."""
    return [o for o in outputs if getattr(o, "type", None) == "verdict"]


def loop_events(outputs: list[Any]) -> list[LoopEvent]:
    return [o for o in outputs if getattr(o, "type", None) == "loop_event"]


def notices(outputs: list[Any]) -> list[Any]:
    return [o for o in outputs if type(o).__name__ == "Notice"]


def actions(outputs: list[Any]) -> list[str]:
    return [v.action for v in verdicts(outputs)]


def last_verdict(outputs: list[Any]) -> Verdict:
    found = verdicts(outputs)
    assert found, "no verdict in outputs"
    return found[-1]


def repeat_pairs(tool: str, args: Any, times: int, **kwargs: Any) -> list[Any]:
    """``times`` identical call/result pairs."""
    return [event for _ in range(times) for event in pair(tool, args, **kwargs)]


def comparable(output: Any) -> Any:
    """An output as plain data without its decision time (the only wall-clock-ish field)."""
    if hasattr(output, "model_dump"):
        data = output.model_dump()
    elif dataclasses.is_dataclass(output) and not isinstance(output, type):
        data = {f.name: getattr(output, f.name) for f in dataclasses.fields(output)}
    else:
        return (type(output).__name__, repr(output))
    data.pop("decided_ts", None)
    return (type(output).__name__, repr(sorted(data.items())))


@pytest.fixture(scope="module")
def native() -> ModuleType:
    """The built native engine module (skipped where it is not built; a stale build fails)."""
    if not (choice.ENGINE_DIR / choice.STAMP).exists():
        pytest.skip("the native engine is not built here (./dev test builds it where cargo is)")
    stamp = (choice.ENGINE_DIR / choice.STAMP).read_text().strip()
    assert stamp == choice.source_digest(), "the native build is stale: ./dev test rebuilds it"
    return importlib.import_module(choice.MODULE)
