"""``loopfuse tail`` against the session broker: from the end, filtered, one line each."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import sys
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from loopfuse.streams.gateway.client import GatewayClient, Topics
from loopfuse.streams.local.worker_process import WorkerProcess
from loopfuse.streams.settings import Settings
from tests.fixtures.hostile_strings import as_json, hostile_loop_events
from tests.support.harness import new_topics, unique, worker_settings
from tests.support.kafka import fixture_records, new_topic, produce
from tests.support.terminal import foreign_bytes

ROOT = Path(__file__).resolve().parents[2]


async def _start_tail(*args: str, env: dict[str, str] | None = None) -> asyncio.subprocess.Process:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "loopfuse.streams.cli",
        "tail",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=ROOT,
        env=None if env is None else {**os.environ, **env},
    )
    assert process.stderr is not None
    line = await asyncio.wait_for(process.stderr.readline(), 60)
    assert b"from the end" in line, line
    return process


async def _finish(process: asyncio.subprocess.Process) -> tuple[list[str], str]:
    try:
        out, err = await asyncio.wait_for(process.communicate(), 60)
    finally:
        if process.returncode is None:
            process.kill()
    assert process.returncode == 0, err
    return out.decode().splitlines(), err.decode()


async def test_tail_follows_loop_events_from_the_end(kafka_bootstrap: str) -> None:
    topic = await new_topic(kafka_bootstrap)
    events = fixture_records("loop_event")
    old, fresh = events[0], [e for e in events if e["action"] == "block"][:6]
    await produce(
        kafka_bootstrap, topic, [{**old, "agent_id": "ops-bot"}]
    )  # before tail: not shown
    wanted = {**fresh[0], "agent_id": "ops-bot", "message": "line one\nline two " + "x" * 300}
    other = {**fresh[1], "agent_id": "someone-else"}
    shadow = {**fresh[2], "agent_id": "ops-bot", "enforced": False}
    # fields holding objects and arrays match no filter, and the stream goes on
    odd = {**fresh[3], "agent_id": {"name": "ops-bot"}, "session_key": ["s"], "detector": {}}

    process = await _start_tail(
        "--bootstrap", kafka_bootstrap, "--topic", topic, "--agent", "ops-bot", "--count", "2"
    )
    await produce(kafka_bootstrap, topic, [other, b"not json", odd, wanted, shadow])
    lines, err = await _finish(process)

    assert len(lines) == 2
    first = lines[0].split()
    assert first[2:7] == [
        wanted["session_key"],
        wanted["run_id"],
        "ops-bot",
        wanted["tool_name"],
        "BLOCK",
    ]
    assert first[7] == wanted["detector"] and first[8] == f"count={wanted['count']}"
    assert "line one line two xxx" in lines[0] and lines[0].endswith("…")
    assert len(lines[0]) < 300  # message trimmed, one line
    assert "BLOCK (shadow)" in lines[1]
    assert "skipped a record" in err


async def test_tail_verdicts_by_session_and_detector(kafka_bootstrap: str) -> None:
    topic = await new_topic(kafka_bootstrap, partitions=1)
    verdicts = fixture_records("verdict")
    warned = [v for v in verdicts if v["action"] == "warn"]
    target = warned[0]["session_key"]
    same_session = [v for v in verdicts if v["session_key"] == target]

    process = await _start_tail(
        "--bootstrap",
        kafka_bootstrap,
        "--topic",
        topic,
        "--verdicts",
        "--session",
        target,
        "--detector",
        warned[0]["detector"],
        "--count",
        "1",
    )
    await produce(kafka_bootstrap, topic, [*same_session[:5], warned[1], warned[0]])
    lines, _ = await _finish(process)

    expected = next(
        v for v in [*same_session[:5], warned[0]] if v["detector"] == warned[0]["detector"]
    )
    assert len(lines) == 1
    assert f" {target} " in lines[0] and f" {expected['action'].upper()} " in lines[0]
    assert f"count={expected['count']}" in lines[0]


async def test_tail_prints_each_record_once_on_one_plain_line(kafka_bootstrap: str) -> None:
    # The payload corpus in every string field, each record delivered twice (as after a
    # worker crash), one from before ts was bounded (year 287396), then a last one.
    topic = await new_topic(kafka_bootstrap, partitions=1)
    base = fixture_records("loop_event")[0]
    hostile = hostile_loop_events(base)
    readable = [e for e in hostile if "\ud800" not in e["event_id"]]  # no JSON reader takes those
    far = {**base, "event_id": "far-future", "event_ts": 2**53 - 1}
    last = {**base, "event_id": "the-last-one", "tool_name": "last_tool"}
    records = [as_json(e) for e in hostile for _ in range(2)] + [as_json(far), as_json(last)]
    expected = len(readable) + 2

    process = await _start_tail(
        "--bootstrap", kafka_bootstrap, "--topic", topic, "--count", str(expected)
    )
    await _produce_raw(kafka_bootstrap, topic, records)
    out, err = await asyncio.wait_for(process.communicate(), 60)

    assert process.returncode == 0, err
    assert foreign_bytes(out) == []
    lines = out.decode().split("\n")
    assert lines[-1] == "" and len(lines) - 1 == expected  # one line per record, none twice
    assert lines[-2].split()[5] == "last_tool"
    assert any(line.startswith("9007199254740991 ms ") for line in lines)
    assert "[link=https://evil.example]click[/link]" in out.decode()
    assert err.decode().count("skipped a record") == 2 * (len(hostile) - len(readable))


async def _produce_raw(bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    try:
        await asyncio.gather(*[await producer.send(topic, value, key=b"s") for value in values])
    finally:
        await producer.stop()


@pytest.mark.timeout(300)
async def test_tail_verdicts_follows_the_reply_topics_and_the_verdicts_topic(
    kafka_bootstrap: str, kafka_broker_kind: str, tmp_path: Path
) -> None:
    """A worker with the default reply routing answers a routing gateway on the reply
    topic and a v1 gateway on the verdicts topic: ``tail --verdicts`` shows both."""
    roles = new_topics()
    settings = worker_settings(
        kafka_bootstrap, kafka_broker_kind, roles, unique("tail-test"), tmp_path / "data"
    )
    (replies,) = Settings().reply_topic_names  # the default: loopfuse.replies
    routed = Topics(
        roles["tool_calls"], roles["tool_results"], roles["compactions"], roles["verdicts"], replies
    )
    v1 = dataclasses.replace(routed, replies=None)
    routed_key, v1_key = unique("routed"), unique("v1")
    worker = WorkerProcess(settings, log_path=tmp_path / "worker.log").start()
    try:
        worker.wait_ready(90)
        process = await _start_tail(
            "--bootstrap",
            kafka_bootstrap,
            "--verdicts",
            "--session",
            routed_key,
            "--session",
            v1_key,
            "--count",
            "2",
            env={"LOOPFUSE_TOPIC_VERDICTS": roles["verdicts"]},
        )
        async with (
            GatewayClient(kafka_bootstrap, topics=routed, timeout=60) as gateway,
            GatewayClient(kafka_bootstrap, topics=v1, timeout=60) as old,
        ):
            first = await gateway.session(routed_key, run_id="run-1").check("read", {"p": 1})
            second = await old.session(v1_key, run_id="run-1").check("read", {"p": 2})
        lines, _ = await _finish(process)
    finally:
        worker.stop()

    assert (first.action, second.action) == ("allow", "allow")
    # the routing gateway reads only its reply topic: its verdict was routed there
    assert sorted(line.split()[2] for line in lines) == sorted([routed_key, v1_key])
    assert all(line.split()[6] == "ALLOW" for line in lines)
