"""Verdict signatures against real workers (docs/wire-format.md: Verdict signatures).

A worker with ``LOOPFUSE_VERDICT_KEY`` signs every verdict; a gateway with the key takes
them and drops, unparsed and counted, a forged ``allow`` written to its reply partition
by someone without the key; a gateway with a key facing a worker without one gets no
verdict it trusts and falls to its fail policy. A genuinely signed ``abort`` that events
of someone else (under the gateway's session key, run id and ``reply_to``) made the
worker route to it does not end its run.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import os
import signal
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from loopfuse.schemas.events import Verdict
from loopfuse.schemas.verdict_signature import HEADER, VerdictSigner, parse_verdict_keys
from loopfuse.streams.engine.fingerprint import args_hash
from loopfuse.streams.gateway.client import (
    GatewayClient,
    GatewaySession,
    Topics,
    blocked_tool_result,
)
from loopfuse.streams.local.worker_process import WorkerProcess
from tests.support.harness import new_topics, unique, worker_settings

pytestmark = pytest.mark.timeout(300)

KEY = f"k2:{base64.b64encode(os.urandom(32)).decode()}"
OLD_KEY = f"k1:{base64.b64encode(os.urandom(32)).decode()}"
WRONG = parse_verdict_keys(f"k2:{base64.b64encode(os.urandom(32)).decode()}")[0]  # same id
ARGS = {"command": "make build"}
SAME = {"content": [{"type": "text", "text": "error: still broken"}]}

#: What a forger puts in a record's headers, given its key and value.
Forgery = Callable[[bytes, bytes], list[tuple[str, bytes]]]
UNSIGNED: Forgery = lambda key, value: []  # noqa: E731
WRONG_KEY: Forgery = lambda key, value: [VerdictSigner(WRONG).header(key, value)]  # noqa: E731
GARBAGE: Forgery = lambda key, value: [(HEADER, b"k2:" + b"A" * 43)]  # noqa: E731


@dataclasses.dataclass
class Worker:
    process: WorkerProcess
    topics: Topics


@pytest.fixture(scope="module")
def workers(
    kafka_bootstrap: str, kafka_broker_kind: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Worker, Worker]]:
    """A worker that signs (the current key of two: rotation) and one that does not."""
    tmp = tmp_path_factory.mktemp("signing")
    started = []
    for name, extra in (("signed", {"verdict_key": f"{KEY},{OLD_KEY}"}), ("plain", {})):
        roles = new_topics()
        replies = unique("rel-replies")
        topics = Topics(
            roles["tool_calls"],
            roles["tool_results"],
            roles["compactions"],
            roles["verdicts"],
            replies,
        )
        settings = worker_settings(
            kafka_bootstrap,
            kafka_broker_kind,
            roles,
            unique(name),
            tmp / name,
            reply_topics=replies,
            reply_partitions=4,
            **extra,
        )
        started.append(
            Worker(WorkerProcess(settings, log_path=tmp / f"{name}.log").start(), topics)
        )
    try:
        for worker in started:
            worker.process.wait_ready(120)
        yield started[0], started[1]
    finally:
        for worker in started:
            worker.process.stop()


@contextlib.asynccontextmanager
async def _producer(bootstrap: str) -> AsyncIterator[AIOKafkaProducer]:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        yield producer
    finally:
        await producer.stop()


async def _loop(session: GatewaySession, times: int) -> list[str]:
    actions = []
    for _ in range(times):
        verdict = await session.check("exec", ARGS)
        actions.append(verdict.action)
        outcome = blocked_tool_result(verdict) if verdict.action == "block" else SAME
        await session.result("exec", ARGS, call_id=verdict.call_id, result=outcome)
    return actions


@contextlib.contextmanager
def _frozen(process: WorkerProcess) -> Iterator[None]:
    """The worker stopped (SIGSTOP, by its PID) for a moment: its verdict waits."""
    assert process.pid is not None
    os.kill(process.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(process.pid, signal.SIGCONT)


def _forged_allow(event: dict[str, Any]) -> bytes:
    """An allow for the call ``event``: everything a gateway checks is right (the call
    id, seq, incarnation and args hash are all predictable or on the input topic)."""
    return orjson.dumps(
        {
            "type": "verdict",
            "verdict_id": "forged",
            "session_key": event["session_key"],
            "run_id": event["run_id"],
            "agent_id": None,
            "call_id": event["call_id"],
            "seq": event["seq"],
            "incarnation": event["incarnation"],
            "tool_name": "exec",
            "action": "allow",
            "level": "none",
            "detector": None,
            "count": 0,
            "message": None,
            "args_hash": args_hash(event["args"]),
            "event_ts": event["ts"],
            "decided_ts": event["ts"],
        }
    )


async def _until(what: str, probe: Any, timeout: float = 20.0) -> None:
    for _ in range(int(timeout / 0.02)):
        if probe():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


async def _forge_the_sixth_call(
    bootstrap: str, worker: Worker, gateway: GatewayClient, forgeries: list[Forgery]
) -> str:
    """Five looping calls, then the sixth (the worker blocks it) asked while the worker is
    frozen, with forged allows (each with these headers) on the gateway's reply partition
    first: the action the sixth call gets."""
    session = gateway.session(f"forge-{uuid.uuid4().hex}", run_id="run-1")
    assert await _loop(session, 5) == ["allow", "allow", "allow", "warn", "warn"]
    published: list[dict[str, Any]] = []
    session.observer = published.append
    read_before = gateway.stats.records_read
    async with _producer(bootstrap) as producer:
        with _frozen(worker.process):
            checking = asyncio.ensure_future(session.check("exec", ARGS))
            await _until("the call published", lambda: published)
            assert worker.topics.replies is not None and gateway.reply_partition is not None
            forged = _forged_allow(published[0])
            key = gateway.incarnation.encode()  # keyed as its replies are: not skipped
            for forgery in forgeries:
                await producer.send_and_wait(
                    worker.topics.replies,
                    forged,
                    key=key,
                    partition=gateway.reply_partition,
                    headers=forgery(key, forged),
                )
            # the gateway has read every forgery before the worker can answer
            await _until(
                "the forgeries read",
                lambda: (
                    gateway.stats.records_read >= read_before + len(forgeries) or checking.done()
                ),
            )
        return (await asyncio.wait_for(checking, 60)).action


async def test_a_gateway_with_the_key_gets_every_verdict_of_a_signing_worker(
    kafka_bootstrap: str, workers: tuple[Worker, Worker]
) -> None:
    signed, _ = workers
    v1 = dataclasses.replace(signed.topics, replies=None)
    async with (
        # the new key listed after the old: any listed key verifies (rotation)
        GatewayClient(
            kafka_bootstrap, topics=signed.topics, timeout=60, verdict_key=f"{OLD_KEY},{KEY}"
        ) as routed,
        GatewayClient(kafka_bootstrap, topics=v1, timeout=60, verdict_key=KEY) as old,
        GatewayClient(kafka_bootstrap, topics=signed.topics, timeout=60) as keyless,
    ):
        for gateway in (routed, old, keyless):
            session = gateway.session(f"loop-{uuid.uuid4().hex}", run_id="run-1")
            actions = await _loop(session, 6)
            assert actions == ["allow", "allow", "allow", "warn", "warn", "block"]
            assert gateway.stats.verdicts == 6 and gateway.stats.timeouts == 0
            assert gateway.stats.unsigned_verdicts == gateway.stats.bad_signatures == 0
    # the operator sees which key signs (its id), never a secret
    log = signed.process.tail(200_000)
    assert "verdicts are signed with key 'k2' (2 key(s) configured)" in log, log[-2000:]
    assert KEY.split(":", 1)[1] not in log and OLD_KEY.split(":", 1)[1] not in log


async def test_a_forged_allow_is_dropped_and_counted_and_the_call_gets_the_workers_block(
    kafka_bootstrap: str, workers: tuple[Worker, Worker]
) -> None:
    signed, _ = workers
    async with GatewayClient(
        kafka_bootstrap, topics=signed.topics, timeout=60, verdict_key=KEY
    ) as gateway:
        forgeries = [UNSIGNED, WRONG_KEY, GARBAGE]
        action = await _forge_the_sixth_call(kafka_bootstrap, signed, gateway, forgeries)
    assert action == "block"
    assert (gateway.stats.unsigned_verdicts, gateway.stats.bad_signatures) == (1, 2)
    assert gateway.stats.timeouts == 0 and gateway.stats.dropped_verdicts == 0
    # the same forgery against a gateway without the key is taken: what the key is for
    async with GatewayClient(kafka_bootstrap, topics=signed.topics, timeout=60) as keyless:
        assert await _forge_the_sixth_call(kafka_bootstrap, signed, keyless, [UNSIGNED]) == "allow"


async def test_a_gateway_with_a_key_facing_a_worker_without_one_falls_to_its_fail_policy(
    kafka_bootstrap: str, workers: tuple[Worker, Worker]
) -> None:
    _, plain = workers
    async with GatewayClient(
        kafka_bootstrap, topics=plain.topics, timeout=3.0, fail_policy="closed", verdict_key=KEY
    ) as gateway:
        session = gateway.session(f"plain-{uuid.uuid4().hex}", run_id="run-1")
        verdicts = [await session.check("read", {"path": f"/f/{n}"}) for n in range(2)]
        await _until("both verdicts read", lambda: gateway.stats.unsigned_verdicts >= 2)
    assert [v.action for v in verdicts] == ["block", "block"]  # fail-closed
    assert all("fail-closed policy" in (v.message or "") for v in verdicts)
    assert gateway.stats.timeouts == 2 and gateway.stats.verdicts == 0
    assert gateway.stats.unsigned_verdicts == 2 and gateway.stats.bad_signatures == 0


def _attack(victim_call: dict[str, Any], incarnation: str) -> list[dict[str, Any]]:
    """What an attacker who read the victim's call on the input topic publishes, in its
    own incarnation: a compaction, then three identical call/result pairs, under the
    victim's session key, run id and ``reply_to``."""
    now = victim_call["ts"]
    events: list[dict[str, Any]] = []
    for kind, call in [("compaction", None)] + [
        (kind, f"atk-{n}") for n in range(3) for kind in ("tool_call", "tool_result")
    ]:
        seq = len(events)
        event: dict[str, Any] = {
            "type": kind,
            "event_id": f"{incarnation}:{seq}",
            "session_key": victim_call["session_key"],
            "run_id": victim_call["run_id"],
            "agent_id": None,
            "incarnation": incarnation,
            "seq": seq,
            "ts": now + seq,
            "reply_to": victim_call["reply_to"],
        }
        if kind == "compaction":
            event["reason"] = "context_overflow"
        else:
            event.update(call_id=call, tool_name="exec", args={"command": "ls"})
        if kind == "tool_result":
            event["result"] = SAME
        events.append(event)
    return events


async def test_events_under_a_gateways_keys_and_reply_to_cannot_abort_its_run(
    kafka_bootstrap: str, workers: tuple[Worker, Worker]
) -> None:
    signed, _ = workers
    topics = signed.topics
    async with GatewayClient(kafka_bootstrap, topics=topics, timeout=60, verdict_key=KEY) as victim:
        aborted: list[Verdict] = []
        session = victim.session(f"victim-{uuid.uuid4().hex}", run_id="run-V")
        victim.on_abort(session.session_key, "run-V", aborted.append)
        published: list[dict[str, Any]] = []
        session.observer = published.append  # what an open input topic shows anyone
        assert (await session.check("read", {"path": "/etc/motd"})).action == "allow"
        attack = _attack(published[0], uuid.uuid4().hex)
        destination = {
            "compaction": topics.compactions,
            "tool_call": topics.tool_calls,
            "tool_result": topics.tool_results,
        }
        async with _producer(kafka_bootstrap) as producer:
            for event in attack:
                await producer.send_and_wait(
                    destination[event["type"]],
                    orjson.dumps(event),
                    key=session.session_key.encode(),
                )
        # the victim reads its call's verdict, the attacker's three and the abort: all
        # signed by the worker and routed to the victim's partition
        await _until(
            "the attack's verdicts routed to the victim", lambda: victim.stats.records_read >= 5
        )
        await asyncio.sleep(0.5)  # an abort taken would have fired by now
        assert aborted == []
        # the victim's own loop after a compaction still ends its run
        await session.compaction("context_overflow")
        for _ in range(3):
            verdict = await session.check("exec", ARGS)
            await session.result("exec", ARGS, call_id=verdict.call_id or "", result=SAME)
        await _until("the victim's own abort", lambda: aborted)
    (abort,) = aborted
    assert (abort.incarnation, abort.call_id, abort.detector) == (
        victim.incarnation,
        verdict.call_id,
        "compaction_loop_persisted",
    )
    assert victim.stats.foreign_aborts == 1
    assert victim.stats.unsigned_verdicts == victim.stats.bad_signatures == 0
