"""The gateway client against a real worker: verdicts, time-outs, sticky blocks, aborts."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from loopfuse.schemas import Verdict
from loopfuse.streams.gateway.client import GatewayClient, Topics, blocked_tool_result
from loopfuse.streams.local.worker_process import REPO_ROOT, WorkerProcess
from tests.support.harness import RULES_CONFIG, Collector, new_topics, unique, worker_settings

pytestmark = pytest.mark.timeout(180)

SAME = {"content": [{"type": "text", "text": "error: still broken"}]}


def _topics(roles: dict[str, str] | None = None) -> Topics:
    """The gateway's four topics of ``roles`` (fresh ones when not given)."""
    roles = roles or new_topics()
    return Topics(
        roles["tool_calls"], roles["tool_results"], roles["compactions"], roles["verdicts"]
    )


async def _unread_topics(bootstrap: str) -> Topics:
    """Topics of their own that no worker reads: no verdict comes unless a test sends it."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    topics = dataclasses.replace(_topics(), replies=unique("rel-replies"))
    assert topics.replies is not None
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics(
            [NewTopic(t, 1, 1) for t in (topics.tool_calls, topics.verdicts)]
            + [NewTopic(topics.replies, 4, 1)]
        )
    finally:
        await admin.close()
    return topics


@pytest.fixture(scope="module")
def worker(
    kafka_bootstrap: str, kafka_broker_kind: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[WorkerProcess, Topics]]:
    """One worker for the module, on topics of its own."""
    roles = new_topics()
    topics = _topics(roles)
    tmp = tmp_path_factory.mktemp("gateway")
    settings = worker_settings(
        kafka_bootstrap,
        kafka_broker_kind,
        roles,
        unique("gw-test"),
        tmp / "data",
        config_file=RULES_CONFIG,
    )  # run-ender's rule
    process = WorkerProcess(settings, log_path=tmp / "worker.log").start()
    try:
        process.wait_ready(90)
        yield process, topics
    finally:
        process.stop()


@pytest.fixture
async def client(
    kafka_bootstrap: str, worker: tuple[WorkerProcess, Topics]
) -> AsyncIterator[GatewayClient]:
    async with GatewayClient(kafka_bootstrap, topics=worker[1], timeout=30) as gateway:
        yield gateway


async def _loop(session: Any, times: int, *, args: Any = None) -> list[Verdict]:
    args = args or {"command": "make build"}
    verdicts = []
    for _ in range(times):
        verdict = await session.check("exec", args)
        verdicts.append(verdict)
        outcome = blocked_tool_result(verdict) if verdict.action == "block" else SAME
        await session.result("exec", args, call_id=verdict.call_id, result=outcome)
    return verdicts


async def test_check_returns_the_verdicts_of_a_looping_session(client: GatewayClient) -> None:
    session = client.session(f"loop-{uuid.uuid4().hex}", run_id="run-1")
    verdicts = await _loop(session, 6)
    # counts are of the calls before this one: the 4th identical call is the 3rd repeat
    assert [v.action for v in verdicts] == ["allow", "allow", "allow", "warn", "warn", "block"]
    assert [v.count for v in verdicts[3:]] == [3, 4, 5]
    assert verdicts[-1].message == (
        "CRITICAL: Called exec with identical arguments and identical outcomes 5 times. "
        "Session execution blocked to prevent runaway loops."
    )
    assert blocked_tool_result(verdicts[-1]) == {
        "content": [{"type": "text", "text": verdicts[-1].message}],
        "details": {
            "status": "blocked",
            "deniedReason": "tool-loop",
            "reason": verdicts[-1].message,
        },
    }


async def test_a_block_is_sticky_without_a_round_trip(client: GatewayClient) -> None:
    session = client.session(f"sticky-{uuid.uuid4().hex}", run_id="run-1")
    verdicts = await _loop(session, 6)
    assert verdicts[-1].action == "block"
    published: list[dict[str, Any]] = []
    session.observer = published.append
    dropped = client.stats.dropped_verdicts
    started = time.monotonic()
    again = await session.check("exec", {"command": "make build"}, timeout=30)
    assert again.action == "block" and again.message == verdicts[-1].message
    assert time.monotonic() - started < 5  # answered from the local cache, not waited for
    # ... but still reported, so loopfuse records the attempt (run endings count it)
    assert [(e["type"], e["call_id"]) for e in published] == [("tool_call", again.call_id)]
    other = await session.check("exec", {"command": "make clean"})
    assert other.action == "allow" and len(published) == 2
    assert client.stats.sticky_blocks == 1
    assert client.stats.dropped_verdicts == dropped  # the reported call's verdict is expected


async def _compaction_loop(session: Any) -> Verdict:
    """A compaction, then the same failing command three times (the guard's window)."""
    await session.compaction("context_overflow")
    args = {"command": "cargo test"}
    failing = {"details": {"status": "failed", "exitCode": 101, "aggregated": "1 failed"}}
    for _ in range(3):
        verdict: Verdict = await session.check("exec", args)
        await session.result("exec", args, call_id=verdict.call_id, result=failing)
    return verdict


async def test_abort_callback_fires_on_a_compaction_loop(client: GatewayClient) -> None:
    session = client.session(f"compact-{uuid.uuid4().hex}", run_id="run-1")
    aborted: asyncio.Future[Verdict] = asyncio.get_running_loop().create_future()
    client.on_abort(session.session_key, "run-1", aborted.set_result)
    verdict = await _compaction_loop(session)
    abort = await asyncio.wait_for(aborted, 30)
    assert abort.action == "abort"
    assert abort.detector == "compaction_loop_persisted"
    assert abort.call_id == verdict.call_id
    assert abort.message is not None and "after auto-compaction" in abort.message


@pytest.mark.parametrize("sticky", [True, False])
async def test_abort_callback_fires_when_a_run_ending_rule_ends_the_run(
    kafka_bootstrap: str, worker: tuple[WorkerProcess, Topics], sticky: bool
) -> None:
    # The blocked call is asked again: answered by the sticky-block cache (and still
    # reported) or not, loopfuse sees the run's second critical and ends the run (the
    # agent's loopfuse.rules.runEnding).
    async with GatewayClient(
        kafka_bootstrap, topics=worker[1], timeout=30, sticky_blocks=sticky
    ) as gateway:
        session = gateway.session(f"ender-{uuid.uuid4().hex}", run_id="run-1", agent_id="run-ender")
        aborted: asyncio.Future[Verdict] = asyncio.get_running_loop().create_future()
        gateway.on_abort(session.session_key, "run-1", aborted.set_result)
        verdicts = await _loop(session, 7)
        abort = await asyncio.wait_for(aborted, 30)
    assert [v.action for v in verdicts][-2:] == ["block", "block"]  # the calls get blocks
    assert gateway.stats.sticky_blocks == (1 if sticky else 0)
    assert (abort.action, abort.detector, abort.count) == ("abort", "tool_loop_run_ended", 2)
    assert abort.call_id == verdicts[-1].call_id
    assert (
        abort.message == f"{verdicts[-1].message} Ending this run: the model kept "
        "repeating a blocked tool call and made no progress."
    )


async def test_local_hashing_gives_the_same_verdicts_as_raw_payloads(
    kafka_bootstrap: str, worker: tuple[WorkerProcess, Topics]
) -> None:
    outcomes = []
    for hash_locally in (False, True):
        async with GatewayClient(
            kafka_bootstrap, topics=worker[1], timeout=30, hash_locally=hash_locally
        ) as gateway:
            session = gateway.session(f"hash-{hash_locally}-{uuid.uuid4().hex}", run_id="r")
            poll = {"action": "poll", "sessionId": "job-1"}
            running = {"details": {"status": "running", "aggregated": "..."}, "content": []}
            verdicts = []
            for _ in range(6):  # a known poll: needs args.action even when hashed
                verdict = await session.check("process", poll)
                verdicts.append((verdict.action, verdict.detector, verdict.count, verdict.message))
                await session.result("process", poll, call_id=verdict.call_id, result=running)
            outcomes.append(verdicts)
    assert outcomes[0] == outcomes[1]
    assert outcomes[0][-1][:3] == ("block", "known_poll_no_progress", 5)


@pytest.mark.parametrize(("policy", "action"), [("open", "allow"), ("closed", "block")])
async def test_timeout_follows_the_fail_policy(
    kafka_bootstrap: str, policy: str, action: str
) -> None:
    topics = await _unread_topics(kafka_bootstrap)  # the verdict never comes
    async with GatewayClient(
        kafka_bootstrap, topics=topics, timeout=0.5, fail_policy=policy
    ) as gateway:  # type: ignore[arg-type]
        verdict = await gateway.session("s", run_id="r").check("exec", {"command": "ls"})
    assert verdict.action == action
    assert verdict.message is not None and f"fail-{policy} policy" in verdict.message
    assert gateway.timeouts == 1


def _descendants(pid: int) -> set[int]:
    found: set[int] = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                child = int(entry.name)
                found |= {child} | _descendants(child)
    return found


def test_demo_runs_end_to_end_without_mismatches_or_leftovers() -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "loopfuse.streams.cli",
            "demo",
            "--duration",
            "15",
            "--no-tui",
            "--sessions",
            "24",
        ],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    children: set[int] = set()
    try:
        while proc.poll() is None and len(children) < 2:
            children |= _descendants(proc.pid)  # the broker and the worker, while they run
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(0.5)
        output, _ = proc.communicate(timeout=150)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
    lines = output.decode().strip().splitlines()
    assert proc.returncode == 0, output.decode()[-3000:]
    last = lines[-1]
    assert last.startswith("demo: sessions=") and last.endswith(" mismatches=0"), last
    fields = dict(part.split("=") for part in last.removeprefix("demo: ").split())
    assert int(fields["tool_calls"]) > 100
    assert all(int(fields[a]) > 0 for a in ("allow", "warn", "block", "abort"))
    assert len(children) >= 2, "demo should have started a broker and a worker"
    leftovers = {pid for pid in children if Path(f"/proc/{pid}").exists()}
    assert not leftovers, f"processes left behind: {leftovers}"


# -- restart-safe gateways ------------------------------------------------------------


def _shape(verdicts: list[Verdict]) -> list[tuple[str, str | None, int, str | None]]:
    return [(v.action, v.detector, v.count, v.message) for v in verdicts]


@pytest.mark.parametrize("new_run", [False, True], ids=["same-run", "new-run"])
async def test_a_restarted_gateway_gets_the_verdicts_of_an_uninterrupted_one(
    kafka_bootstrap: str, worker: tuple[WorkerProcess, Topics], new_run: bool
) -> None:
    topics = worker[1]
    async with GatewayClient(kafka_bootstrap, topics=topics, timeout=30) as gateway:
        session = gateway.session(f"steady-{uuid.uuid4().hex}", run_id="run-1")
        uninterrupted = await _loop(session, 3)
        if new_run:
            session.new_run("run-2")
        uninterrupted += await _loop(session, 5)
    key = f"restarted-{uuid.uuid4().hex}"
    async with GatewayClient(kafka_bootstrap, topics=topics, timeout=30) as before:
        restarted = await _loop(before.session(key, run_id="run-1"), 3)
    async with GatewayClient(kafka_bootstrap, topics=topics, timeout=30) as after:
        assert after.incarnation != before.incarnation
        session = after.session(key, run_id="run-2" if new_run else "run-1")
        restarted += await _loop(session, 5)
    assert _shape(restarted) == _shape(uninterrupted)
    # the same run continues into blocks; a new run starts with clean counts
    assert restarted[-1].action == ("warn" if new_run else "block")
    # verdict ids stay unique although the new client counts call ids from 0 again
    assert len({v.verdict_id for v in restarted}) == len(restarted)


async def test_two_session_objects_for_one_key_share_its_seq_space(
    client: GatewayClient,
) -> None:
    key = f"twins-{uuid.uuid4().hex}"
    one, two = client.session(key, run_id="run-1"), client.session(key, run_id="run-1")
    verdicts = []
    for i in range(6):
        verdicts += await _loop(one if i % 2 else two, 1)
    assert [v.action for v in verdicts] == ["allow", "allow", "allow", "warn", "warn", "block"]
    assert sorted(v.seq or 0 for v in verdicts) == [0, 2, 4, 6, 8, 10]


# -- a reader that survives -----------------------------------------------------------


async def test_the_reader_survives_a_raising_abort_callback(client: GatewayClient) -> None:
    session = client.session(f"cb-{uuid.uuid4().hex}", run_id="run-1")
    fired: asyncio.Future[Verdict] = asyncio.get_running_loop().create_future()

    def broken(verdict: Verdict) -> None:
        raise RuntimeError("the gateway's own bug")

    client.on_abort(session.session_key, "run-1", broken)
    client.on_abort(session.session_key, "run-1", fired.set_result)
    await _compaction_loop(session)
    assert (await asyncio.wait_for(fired, 30)).action == "abort"
    assert client.stats.callback_errors == 1
    after = await session.check("read", {"path": "/still/alive"})  # the reader goes on
    assert after.action == "allow" and client.stats.reader_restarts == 0


async def test_the_reader_survives_garbage_and_consumer_errors(
    kafka_bootstrap: str, client: GatewayClient
) -> None:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    replies, partition = client.topics.replies, client.reply_partition
    assert replies is not None and partition is not None
    try:
        # garbage keyed as this gateway's replies (parsed, refused) and as another's
        # (skipped by its key, never parsed)
        await producer.send_and_wait(
            replies, b"\xff not a verdict", key=client.incarnation.encode(), partition=partition
        )
        await producer.send_and_wait(replies, b"\xff another's", key=b"x", partition=partition)
    finally:
        await producer.stop()
    consumer = client._consumer
    assert consumer is not None
    real_getmany = consumer.getmany
    failures = iter([OSError("connection reset")])

    async def flaky_getmany(*args: Any, **kwargs: Any) -> Any:
        failure = next(failures, None)
        if failure is not None:
            raise failure
        return await real_getmany(*args, **kwargs)

    consumer.getmany = flaky_getmany  # type: ignore[method-assign]
    session = client.session(f"garbage-{uuid.uuid4().hex}", run_id="run-1")
    verdicts = await _loop(session, 4)
    assert [v.action for v in verdicts] == ["allow", "allow", "allow", "warn"]
    assert client.stats.reader_errors == 1
    assert client.stats.undecodable_records == 1
    assert client.stats.foreign_records >= 1
    assert client.stats.timeouts == 0


async def test_a_verdict_that_does_not_match_the_pending_call_is_dropped(
    kafka_bootstrap: str,
) -> None:
    """Call ids are predictable: a forged verdict for the next one must not count."""
    import orjson
    from aiokafka import AIOKafkaProducer

    topics = await _unread_topics(kafka_bootstrap)  # only the forged verdict will come
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    async with (
        Collector(kafka_bootstrap, [topics.tool_calls]) as calls,
        GatewayClient(kafka_bootstrap, topics=topics, timeout=5.0, fail_policy="closed") as gateway,
    ):
        session = gateway.session("s-forged", run_id="r")
        call_id = "c-1"
        forged = {
            "type": "verdict",
            "verdict_id": "x",
            "session_key": "s-forged",
            "run_id": "r",
            "agent_id": None,
            "call_id": call_id,
            "seq": 0,
            "incarnation": gateway.incarnation,
            "tool_name": "exec",
            "action": "allow",
            "level": "none",
            "detector": None,
            "count": 0,
            "message": None,
            "args_hash": "not-the-args",
            "event_ts": 1,
            "decided_ts": 1,
        }
        checking = asyncio.ensure_future(
            session.check("exec", {"command": "rm -rf /"}, call_id=call_id)
        )
        # Forged while the call waits: published, so its verdict is pending.
        await calls.wait_for("the call published", lambda: calls.of(topics.tool_calls), 4)
        assert not checking.done()
        assert topics.replies is not None and gateway.reply_partition is not None
        await producer.send_and_wait(
            topics.replies,
            orjson.dumps(forged),
            key=gateway.incarnation.encode(),
            partition=gateway.reply_partition,
        )
        verdict = await checking
    await producer.stop()
    assert verdict.action == "block"  # fail-closed: the forged allow was not taken
    assert gateway.stats.dropped_verdicts == 1 and gateway.stats.timeouts == 1
