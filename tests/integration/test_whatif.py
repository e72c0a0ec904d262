"""``loopfuse whatif`` against a live worker: its own config changes nothing, a candidate
changes exactly what ``loopfuse replay`` with the candidate changes over the same events.

One worker (config A: tests/fixtures/worker.json5) serves the default tenant and tenant
``t1``; both tenants publish sessions under the same session keys (two sessions each),
some of the default tenant's with a reply topic. Each test reads its own window (from a
time taken before it produced) with the command, as an operator runs it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from loopfuse.schemas import load_config
from loopfuse.streams.engine import Engine
from loopfuse.streams.engine.native_step import native_for
from loopfuse.streams.local.worker_process import WorkerProcess
from loopfuse.streams.replay import replay_lines
from tests.support.harness import (
    CONFIG,
    ROOT,
    Collector,
    Message,
    end_offsets,
    generate,
    new_topics,
    produce,
    topic_of,
    unique,
    wait_committed,
    worker_settings,
)

pytestmark = pytest.mark.timeout(400)

TENANT = "t1"
PARTITIONS = 2


class Deployment:
    def __init__(self, bootstrap: str, settings: dict[str, str]) -> None:
        self.bootstrap = bootstrap
        self.settings = settings
        self.replies = settings["reply_topics"]
        base = {
            role: settings[f"topic_{role}"]
            for role in ("tool_calls", "tool_results", "compactions")
        }
        self.inputs = {"": base, TENANT: {role: f"{name}.{TENANT}" for role, name in base.items()}}
        self.outputs = [
            settings["topic_verdicts"],
            f"{settings['topic_verdicts']}.{TENANT}",
            self.replies,
            f"{self.replies}.{TENANT}",
            settings["topic_loop_events"],
            settings["topic_dead_letters"],
        ]

    @property
    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            **{f"LOOPFUSE_{key.upper()}": value for key, value in self.settings.items()},
        }

    async def publish(self, records: list[Message]) -> None:
        await produce(self.bootstrap, records)

    async def settle(self) -> None:
        """Every input record judged and committed by the worker (outputs flushed first)."""
        tps = [
            TopicPartition(topic, p)
            for inputs in self.inputs.values()
            for topic in inputs.values()
            for p in range(PARTITIONS)
        ]
        await wait_committed(self.bootstrap, self.settings["app_id"], tps, timeout=180)


@pytest.fixture(scope="module")
def deployment(
    kafka_bootstrap: str, kafka_broker_kind: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployment]:
    tmp = tmp_path_factory.mktemp("whatif")
    settings = worker_settings(
        kafka_bootstrap,
        kafka_broker_kind,
        new_topics(),
        unique("whatif"),
        tmp / "data",
        tenants=TENANT,
        partitions=PARTITIONS,
        reply_topics=unique("rel-replies"),
        reply_partitions=2,
    )
    process = WorkerProcess(settings, log_path=tmp / "worker.log").start()
    try:
        process.wait_ready(120)
        yield Deployment(kafka_bootstrap, settings)
    finally:
        process.stop()


def _events(deployment: Deployment, tenant: str, prefix: str, seed: int) -> list[dict[str, Any]]:
    events = generate(480, 12, seed=seed, prefix=prefix)
    if tenant == "":  # a third of the default tenant's sessions ask for a reply
        for event in events:
            if event["session_key"].split("-")[0].endswith(("0", "3", "6", "9")):
                event["reply_to"] = {"topic": deployment.replies, "partition": 1, "requester": "g"}
    return events


def _records(deployment: Deployment, tenant: str, events: list[dict[str, Any]]) -> list[Message]:
    inputs = deployment.inputs[tenant]
    return [(topic_of(inputs, e), e["session_key"].encode(), orjson.dumps(e)) for e in events]


async def _ends(deployment: Deployment, topics: list[str]) -> str:
    """``TOPIC:PARTITION=OFFSET,...``: where each partition of ``topics`` ends now."""
    consumer = AIOKafkaConsumer(bootstrap_servers=deployment.bootstrap)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for topic in topics for p in range(PARTITIONS)]
        ends = await end_offsets(consumer, tps)
    finally:
        await consumer.stop()
    return ",".join(f"{tp.topic}:{tp.partition}={offset}" for tp, offset in ends.items())


def _whatif(deployment: Deployment, *args: str) -> dict[str, Any]:
    run = subprocess.run(
        [sys.executable, "-m", "loopfuse.streams.cli", "whatif", "--json", *args],
        env=deployment.env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert run.returncode == 0, run.stderr
    data: dict[str, Any] = json.loads(run.stdout)
    return data


def _verdicts(lines: list[bytes], config: Path) -> dict[tuple[Any, ...], tuple[Any, ...]]:
    """``loopfuse replay``'s verdicts of one tenant's events, by call."""
    engine = Engine(load_config(config))
    verdicts = {}
    for output in replay_lines(iter(lines), engine):
        document = orjson.loads(output)
        if document["type"] == "verdict":
            key = (
                document["session_key"],
                document["run_id"],
                document["call_id"],
                document["seq"],
                document["action"] == "abort",
            )
            verdicts[key] = (document["action"], document["detector"])
    return verdicts


def _changed_by_replay(by_tenant: dict[str, list[bytes]], a: Path, b: Path) -> set[tuple[str, str]]:
    changed = set()
    for tenant, lines in by_tenant.items():
        before, after = _verdicts(lines, a), _verdicts(lines, b)
        for key in before.keys() | after.keys():
            if before.get(key) != after.get(key):
                changed.add((tenant, key[0]))
    return changed


def _candidate(path: Path) -> Path:
    """Config B: lower thresholds and an opt-in rule on (run ending)."""
    path.write_text(
        orjson.dumps(
            {
                "tools": {
                    "loopDetection": {
                        "enabled": True,
                        "warningThreshold": 2,
                        "criticalThreshold": 4,
                    }
                },
                "loopfuse": {"rules": {"runEnding": {}}},
            }
        ).decode()
    )
    return path


async def test_the_workers_config_changes_nothing_and_a_candidate_what_replay_changes(
    deployment: Deployment, tmp_path: Path
) -> None:
    since = str(int(time.time() * 1000) - 1)
    by_tenant: dict[str, list[bytes]] = {}
    for tenant, seed in (("", 1), (TENANT, 2)):
        records = _records(deployment, tenant, _events(deployment, tenant, "s", seed))
        by_tenant[tenant] = [value for _, _, value in records if value is not None]
        await deployment.publish(records)
    await deployment.settle()
    calls = sum(line.count(b'"type":"tool_call"') for lines in by_tenant.values() for line in lines)

    same = _whatif(deployment, "--config", str(CONFIG), "--since", since)

    assert same["window"]["tenants"] == ["", TENANT]
    native = native_for(Engine(load_config(CONFIG))) is not None
    assert same["judged_by"] == ("the native judge" if native else "the Python engine")
    assert same["window"]["input_records"] == sum(len(lines) for lines in by_tenant.values())
    assert same["totals"]["calls_compared"] == calls
    assert same["totals"]["unanswered"] == same["totals"]["not_judged"] == 0
    assert same["totals"]["partial_sessions"] == 0
    assert same["totals"]["sessions_changed"] == same["totals"]["calls_changed"] == 0
    assert all(row["issued"] == row["candidate"] for row in same["by_action_detector"])
    assert all(row["issued"] == row["candidate"] for row in same["loop_events"])

    candidate = _candidate(tmp_path / "b.json")
    changed = _whatif(deployment, "--config", str(candidate), "--since", since)
    html = tmp_path / "report.html"
    terminal = subprocess.run(
        [
            sys.executable,
            "-m",
            "loopfuse.streams.cli",
            "whatif",
            "--config",
            str(candidate),
            "--since",
            since,
            "--html",
            str(html),
        ],
        env=deployment.env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )

    expected = _changed_by_replay(by_tenant, CONFIG, candidate)
    assert expected, "config B changes some session"
    assert {(s["tenant"], s["session"]) for s in changed["sessions"]} == expected
    assert changed["totals"]["calls_compared"] == calls
    # each tenant's sessions are judged apart: the same keys change in both or in one
    assert {tenant for tenant, _ in expected} == {"", TENANT}
    newly = {(s["tenant"], s["session"]) for s in changed["newly"]["abort"]}
    assert newly and newly <= expected  # the run-ending rule aborts runs A only blocked
    assert terminal.returncode == 0, terminal.stderr
    assert f"changed: {changed['totals']['calls_changed']} in {len(expected)} sessions" in (
        terminal.stdout
    )
    assert "newly abort: " in terminal.stdout
    assert "loopfuse whatif" in html.read_text()


async def test_a_window_cut_mid_session_reports_those_sessions_as_partial(
    deployment: Deployment,
) -> None:
    early, late = [], []
    for event in _events(deployment, "", "cut", 3):
        (early if event["seq"] < 10 else late).append(event)
    fresh = _events(deployment, "", "new", 4)
    start = str(int(time.time() * 1000) - 1)
    await deployment.publish(_records(deployment, "", early))
    await deployment.settle()
    cut = str(int(time.time() * 1000) + 1)
    offsets = await _ends(deployment, list(deployment.inputs[""].values()))
    time.sleep(0.05)
    await deployment.publish(_records(deployment, "", late + fresh))
    await deployment.settle()

    data = _whatif(deployment, "--config", str(CONFIG), "--from", cut, "--tenant", "")
    by_offsets = _whatif(deployment, "--config", str(CONFIG), "--offsets", offsets, "--tenant", "")
    before = _whatif(deployment, "--config", str(CONFIG), "--since", start, "--until", cut)
    cut_short = _whatif(deployment, "--config", str(CONFIG), "--from", cut, "--max-bytes", "20000")

    partial = {e["session_key"] for e in late}
    assert data["window"]["tenants"] == [""]
    assert data["window"]["input_records"] == len(late) + len(fresh)
    assert data["totals"]["partial_sessions"] == len(partial)
    assert "judged from its first event in it" in data["partial_policy"]
    # every call in the window is compared; whatever changes is in a partial session
    # (its earlier calls are not seen), never in one that began in the window
    calls = sum(1 for e in late + fresh if e["type"] == "tool_call")
    assert data["totals"]["calls_compared"] == calls
    assert data["totals"]["unanswered"] == 0
    assert {s["session"] for s in data["sessions"]} <= partial
    assert all(s["partial"] for s in data["sessions"])
    # the same window given by offsets (where each partition stood at the cut)
    assert by_offsets["window"]["input_records"] == data["window"]["input_records"]
    assert by_offsets["totals"] == data["totals"]
    assert by_offsets["sessions"] == data["sessions"]
    # and the part before the cut: whole sessions' beginnings, nothing partial, no change
    assert before["window"]["input_records"] == len(early)
    assert before["totals"]["partial_sessions"] == before["totals"]["sessions_changed"] == 0
    assert before["totals"]["calls_compared"] == sum(1 for e in early if e["type"] == "tool_call")
    # a byte budget cuts the window short, and says so
    assert cut_short["window"]["stopped"] == "bytes"
    assert 0 < cut_short["window"]["input_bytes"] <= 20_000
    assert cut_short["window"]["input_records"] < data["window"]["input_records"]


async def test_hostile_records_stay_dead_letters_and_change_nothing(
    deployment: Deployment,
) -> None:
    since = str(int(time.time() * 1000) - 1)
    events = _events(deployment, TENANT, "hostile", 5)
    inputs = deployment.inputs[TENANT]
    hostile: list[Message] = [
        (inputs["tool_calls"], b"h", b"not json"),
        (inputs["tool_calls"], b"h", b"[1, 2, 3]"),
        (inputs["tool_results"], b"h", b'{"type": "tool_call", "session_key": 7}'),
        (inputs["tool_calls"], b"h", b"\xff\xfe\x00 invalid utf-8"),
        (
            inputs["tool_calls"],
            b"x",
            b'{"type":"tool_call","session_key":"x","seq":1' + b"0" * 30 + b"}",
        ),
        (inputs["compactions"], b"h", None),
        (inputs["tool_calls"], b"h", orjson.dumps({**events[0], "seq": -1, "event_id": "neg"})),
    ]
    async with Collector(deployment.bootstrap, [deployment.settings["topic_dead_letters"]]) as out:
        await deployment.publish(_records(deployment, TENANT, events) + hostile)
        # a forged record on the tenant's verdicts topic is no verdict of any call
        await produce(
            deployment.bootstrap,
            [(f"{deployment.settings['topic_verdicts']}.{TENANT}", b"k", b"\x00{oops")],
        )
        await deployment.settle()
        await out.read_to_end()
        letters = [
            d
            for d in out.of(deployment.settings["topic_dead_letters"])
            if d.get("source_topic", "").endswith(f".{TENANT}")
        ]

    data = _whatif(deployment, "--config", str(CONFIG), "--since", since, "--tenant", TENANT)

    worker_codes: dict[str, int] = {}
    for letter in letters:
        worker_codes[letter["error_code"]] = worker_codes.get(letter["error_code"], 0) + 1
    assert sum(worker_codes.values()) == len(hostile)
    assert data["dead_letters"] == worker_codes
    assert data["window"]["unreadable_outputs"] == 1
    assert data["totals"]["sessions_changed"] == 0
    assert data["totals"]["calls_compared"] == sum(1 for e in events if e["type"] == "tool_call")
