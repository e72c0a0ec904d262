"""The gateway client takes a verdict, ``abort`` included, only for an event it published.

The client is never started: what it publishes is kept by a stand-in for its producer,
judged by the engine as the worker would judge it, and the verdicts are handed to the
client's reader as records of its reply partition (docs/wire-format.md: Reply routing).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import orjson
import pytest

from loopfuse.schemas import Verdict, validate_event
from loopfuse.streams.engine import Engine
from loopfuse.streams.gateway.client import GatewayClient, GatewaySession
from tests.unit.conftest import verdicts

ARGS = {"command": "cargo test"}
FAILING = {"details": {"status": "failed", "exitCode": 101, "aggregated": "1 failed"}}


class _Sent:
    """The client's producer here: what it would have published, in order."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    async def send(self, topic: str, value: bytes, key: bytes) -> None:
        self.events.append(orjson.loads(value))


def _client(**options: Any) -> tuple[GatewayClient, _Sent]:
    client = GatewayClient("127.0.0.1:1", timeout=0.01, **options)  # nobody answers
    sent = _Sent()
    client._producer = sent  # type: ignore[assignment]
    return client, sent


async def _compaction_loop(session: GatewaySession) -> None:
    """A compaction, then the same failing command three times: the guard's abort."""
    await session.compaction("context_overflow")
    for _ in range(3):
        verdict = await session.check("exec", ARGS)  # fail-open: no worker here
        await session.result("exec", ARGS, call_id=verdict.call_id or "", result=FAILING)


def _judged(events: list[dict[str, Any]]) -> list[Verdict]:
    """The verdicts a worker publishes for ``events`` (one session)."""
    engine, state, out = Engine(), None, []
    for raw in events:
        event = validate_event(raw)
        state, outputs = engine.step(state, event, event.ts)
        out += verdicts(outputs)
    return out


def _abort(events: list[dict[str, Any]]) -> Verdict:
    """The last abort of ``events``."""
    abort = [v for v in _judged(events) if v.action == "abort"][-1]
    assert abort.detector == "compaction_loop_persisted"
    return abort


async def test_an_abort_of_the_runs_own_result_is_taken_once() -> None:
    client, sent = _client()
    aborted: list[Verdict] = []
    client.on_abort("s", "run-V", aborted.append)
    await _compaction_loop(client.session("s", run_id="run-V"))
    abort = _abort(sent.events)
    for _ in range(2):  # redelivered: fires once
        client._deliver(abort.to_json())
    assert aborted == [abort]
    assert abort.incarnation == client.incarnation and client.stats.foreign_aborts == 0


async def test_an_abort_of_another_incarnations_events_under_the_same_keys_is_dropped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The attack: someone else publishes, under its own incarnation, the victim's
    # session key, run id and reply_to; the worker routes the abort to the victim.
    victim, _ = _client()
    aborted: list[Verdict] = []
    victim.on_abort("s", "run-V", aborted.append)
    await victim.session("s", run_id="run-V").check("read", {"path": "x"})
    attacker, sent = _client()
    await _compaction_loop(attacker.session("s", run_id="run-V"))
    forged = _abort(sent.events)
    assert (forged.session_key, forged.run_id) == ("s", "run-V")
    with caplog.at_level(logging.WARNING, "loopfuse.gateway"):
        for _ in range(3):
            victim._deliver(forged.to_json())
    assert aborted == []
    assert victim.stats.foreign_aborts == 3
    (line,) = [r.getMessage() for r in caplog.records if "abort" in r.getMessage()]
    assert "answers no call or result of this gateway" in line


async def test_an_abort_with_this_incarnation_for_an_event_it_never_published_is_dropped() -> None:
    client, sent = _client()
    aborted: list[Verdict] = []
    client.on_abort("s", "run-V", aborted.append)
    await _compaction_loop(client.session("s", run_id="run-V"))
    abort = _abort(sent.events)
    # ahead of its seq (someone using its incarnation), or another call id at its seq;
    # either carries the genuine abort's verdict id, which must not block the genuine one
    for forged in (
        abort.model_copy(update={"seq": (abort.seq or 0) + 100}),
        abort.model_copy(update={"call_id": "call-from-elsewhere"}),
        abort.model_copy(update={"incarnation": None}),
    ):
        client._deliver(forged.to_json())
    assert aborted == [] and client.stats.foreign_aborts == 3
    client._deliver(abort.to_json())
    assert aborted == [abort]


async def test_an_abort_is_for_the_run_it_names_and_only_a_watched_one() -> None:
    client, sent = _client()
    aborted: list[Verdict] = []
    client.on_abort("s", "run-V", aborted.append)
    session = client.session("s", run_id="run-W")  # a run nobody watches
    await _compaction_loop(session)
    abort = _abort(sent.events)
    client._deliver(abort.to_json())  # run-W: no callback, nothing counted
    # its events carried to run-V: not an event this client published in run-V
    client._deliver(abort.model_copy(update={"run_id": "run-V"}).to_json())
    assert aborted == [] and client.stats.foreign_aborts == 1
    await session.run_ended()
    session.new_run("run-V")
    await _compaction_loop(session)
    client._deliver(_abort(sent.events).to_json())
    assert [v.run_id for v in aborted] == ["run-V"]


async def test_a_verdict_for_another_incarnations_call_is_dropped_and_its_own_taken() -> None:
    client, sent = _client()
    session = client.session("s", run_id="run-V")
    checking = asyncio.ensure_future(session.check("exec", ARGS, timeout=5))
    await asyncio.sleep(0)
    (call,) = sent.events
    (own,) = _judged([{**call, "args": {"command": "rm -rf /"}}])
    block = own.model_copy(update={"action": "block"})
    other = _judged([call])[0].model_copy(update={"action": "block", "incarnation": "another"})
    client._deliver(other.to_json())
    client._deliver(block.to_json())  # right call and incarnation, other args: dropped
    (genuine,) = _judged([call])
    client._deliver(genuine.to_json())
    assert (await checking) == genuine
    assert client.stats.dropped_verdicts == 2 and client.stats.verdicts == 1
