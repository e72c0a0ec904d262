"""Least privilege on a secured three-node Apache Kafka: every role works with exactly the
ACLs ``infra/kafka/kafka-acls.sh`` grants it, and nothing more.

The cluster (``KafkaCluster(3, secure=True)``) has TLS on every listener (a CA made for
this module), SASL_SSL with SCRAM-SHA-512 for clients, the standard authorizer with
``allow.everyone.if.no.acl.found=false``, and one user per role; the shipped script
grants the roles (README: Running in production). One worker runs as ``worker``; the
gateways are ``gateway`` (the default tenant: reply topic ``loopfuse.replies``) and
``gateway-b`` (tenant ``b``, with topics of its own: docs/wire-format.md, Tenants); the
auditor is ``auditor``. The Hermes plugin over
SASL_SSL is in tests/integration/test_hermes_plugin.py (it runs in a gateway's install),
the OpenClaw plugin's in its own tests.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka import errors as kafka_errors
from aiokafka.helpers import create_ssl_context

from loopfuse.streams.broker_access import BrokerAccessError
from loopfuse.streams.gateway.client import GatewayClient, Topics
from loopfuse.streams.local.kafka_broker import KafkaCluster, kafka_unavailable_reason
from loopfuse.streams.local.kafka_security import TENANTS, KafkaSecurity
from loopfuse.streams.local.worker_process import WorkerProcess
from loopfuse.streams.settings import Settings
from tests.integration.test_notify_cli import Notify, until
from tests.integration.test_verdict_signing import _attack
from tests.support.harness import worker_settings
from tests.support.webhook import Webhook

pytestmark = [pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
VERDICTS, LOOP_EVENTS, DEAD_LETTERS = (
    "loopfuse.verdicts",
    "loopfuse.loop-events",
    "loopfuse.dead-letters",
)
REPLIES, REPLIES_B, CALLS = "loopfuse.replies", "loopfuse.replies.b", "agent.tool-calls"
RESULTS, COMPACTIONS = "agent.tool-results", "agent.compactions"
CALLS_B, RESULTS_B, VERDICTS_B = "agent.tool-calls.b", "agent.tool-results.b", "loopfuse.verdicts.b"


@dataclass
class Secured:
    bootstrap: str
    security: KafkaSecurity
    worker: WorkerProcess
    worker_settings: dict[str, str]
    tmp: Path

    def env(self, user: str, **changes: str) -> dict[str, str]:
        """A process's environment as ``user`` (LOOPFUSE_* variables), with ``changes``."""
        return {
            **os.environ,
            **self.security.client_env(user),
            "LOOPFUSE_BOOTSTRAP_SERVERS": self.bootstrap,
            **changes,
        }

    def client(self, user: str, replies: str | None = None, **options: Any) -> GatewayClient:
        """A gateway client as ``user``, on its tenant's topics (:data:`TENANTS`)."""
        return GatewayClient(
            self.bootstrap,
            topics=Topics.from_settings(Settings(tenant=TENANTS[user]), replies),
            timeout=20,
            **{**self.security.client_kwargs(user), **options},
        )


def _settings(bootstrap: str, security: KafkaSecurity, tmp: Path) -> dict[str, str]:
    """The worker's settings: the default topic names and app id the ACLs name."""
    variables = {
        key.removeprefix("LOOPFUSE_").lower(): value
        for key, value in security.client_env("worker").items()
    }
    return worker_settings(
        bootstrap,
        "kafka",
        {},
        "loopfuse",
        tmp / "data",
        replication_factor=3,
        min_insync_replicas=2,
        **variables,
    )


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    why = kafka_unavailable_reason()
    if why is not None or os.environ.get("LOOPFUSE_TEST_BROKER") == "embedded":
        pytest.fail(f"least privilege needs Apache Kafka: {why or 'LOOPFUSE_TEST_BROKER=embedded'}")
    tmp = tmp_path_factory.mktemp("secured")
    with KafkaCluster(3, secure=True, data_dir=tmp / "cluster", log_dir=tmp) as cluster:
        security = cluster.security
        assert security is not None
        security.grant_roles(cluster.bootstrap)
        settings = _settings(cluster.bootstrap, security, tmp)
        worker = WorkerProcess(settings, log_path=tmp / "worker.log").start()
        try:
            worker.wait_ready(150)
            yield Secured(cluster.bootstrap, security, worker, settings, tmp)
        finally:
            worker.stop()


async def _loop(client: GatewayClient, session_key: str, calls: int = 7) -> list[str]:
    session = client.session(session_key, run_id="run-1")
    actions, args = [], {"command": "make build"}
    for _ in range(calls):
        call_id = session.new_call_id()
        actions.append((await session.check("exec", args, call_id=call_id)).action)
        await session.result(
            "exec", args, call_id=call_id, result={"output": "error: still broken", "exit_code": 1}
        )
    return actions


async def _readable(secured: Secured, user: str, topic: str) -> bool:
    """Whether the broker lets ``user`` fetch ``topic``: it refuses either the metadata
    (no Describe: the topic is not even shown) or the fetch itself (no Read)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=secured.bootstrap,
        auto_offset_reset="earliest",
        **secured.security.client_kwargs(user),
    )
    await consumer.start()
    try:
        consumer.assign([TopicPartition(topic, 0)])
        try:
            await consumer.getmany(timeout_ms=3_000)
        except kafka_errors.TopicAuthorizationFailedError:
            return False
        return topic not in consumer._client.cluster.unauthorized_topics
    finally:
        await consumer.stop()


def _cli(*args: str, env: dict[str, str], timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "loopfuse.streams.cli", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


async def test_each_role_works_with_exactly_its_acls(secured: Secured) -> None:
    """The worker judges, each tenant's gateway gets its verdicts on its own reply
    topic, and the auditor's tail, audit and notify read the loop events: all over
    SASL_SSL, each as its own user with the script's ACLs."""
    session = f"secure-{uuid.uuid4().hex[:8]}"
    tail = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "loopfuse.streams.cli",
            "tail",
            "--session",
            session,
            "--count",
            "1",
        ],
        env=secured.env("auditor"),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    with Webhook() as hook:
        notify = Notify(secured.bootstrap, LOOP_EVENTS, hook, "loopfuse-notify")
        notify.env.update(secured.security.client_env("auditor"))
        try:
            await notify.start()
            await asyncio.sleep(3)  # tail has found the end of the loop events
            async with (
                secured.client("gateway") as a,
                secured.client("gateway-b") as b,
            ):
                # one session key in both tenants: two sessions
                ours, theirs = await asyncio.gather(_loop(a, session), _loop(b, session))
                assert a.stats.timeouts == b.stats.timeouts == 0
                assert a.stats.foreign_records == b.stats.foreign_records == 0
            await until(lambda: len(hook.received) >= 1, 60, lambda: f"notify: {notify.lines}")
        finally:
            assert await notify.stop() == 0
    expected = ["allow", "allow", "allow", "warn", "warn", "block", "block"]
    assert ours == theirs == expected
    out, err = tail.communicate(timeout=60)
    assert tail.returncode == 0, err
    (line,) = out.splitlines()
    assert f" {session} " in line and " BLOCK " in line
    assert {post["loop_event"]["session_key"] for post in hook.received} == {session}

    audited = _cli(
        "audit", "--bootstrap", secured.bootstrap, "--top", "50", env=secured.env("auditor")
    )
    assert audited.returncode == 0, audited.stderr
    assert session in audited.stdout


async def test_a_gateway_cannot_forge_a_verdict_nor_read_what_is_not_its_own(
    secured: Secured,
) -> None:
    """The broker refuses the gateway user every write but events, and every read but its
    tenant's reply topic: a forged ``allow`` never reaches a reply partition."""
    forged = json.dumps({"type": "verdict", "action": "allow"}).encode()
    producer = AIOKafkaProducer(
        bootstrap_servers=secured.bootstrap, **secured.security.client_kwargs("gateway")
    )
    await producer.start()
    try:
        await producer.send_and_wait(CALLS, b"{}", key=b"s")  # its own job: allowed
        for topic in (VERDICTS, REPLIES, REPLIES_B, VERDICTS_B, CALLS_B, LOOP_EVENTS, DEAD_LETTERS):
            with pytest.raises(kafka_errors.TopicAuthorizationFailedError):
                await producer.send_and_wait(topic, forged, key=b"s", partition=0)
    finally:
        await producer.stop()

    assert await _readable(secured, "gateway", REPLIES)
    for topic in (LOOP_EVENTS, DEAD_LETTERS, VERDICTS, REPLIES_B, VERDICTS_B, CALLS):
        assert not await _readable(secured, "gateway", topic), topic
    # tenant b's gateway: its own topics and nothing of the default tenant's
    producer = AIOKafkaProducer(
        bootstrap_servers=secured.bootstrap, **secured.security.client_kwargs("gateway-b")
    )
    await producer.start()
    try:
        await producer.send_and_wait(CALLS_B, b"{}", key=b"s")
        for topic in (CALLS, VERDICTS, REPLIES, VERDICTS_B, REPLIES_B):
            with pytest.raises(kafka_errors.TopicAuthorizationFailedError):
                await producer.send_and_wait(topic, forged, key=b"s", partition=0)
    finally:
        await producer.stop()
    assert await _readable(secured, "gateway-b", REPLIES_B)
    assert await _readable(secured, "gateway-b", VERDICTS_B)
    for topic in (REPLIES, VERDICTS, CALLS_B, LOOP_EVENTS):
        assert not await _readable(secured, "gateway-b", topic), topic

    # Another tenant's reply topic: a start that says which ACL is missing
    with pytest.raises(
        BrokerAccessError,
        match=re.escape("do not let user 'gateway' read reply topic 'loopfuse.replies.b'"),
    ):
        async with secured.client("gateway", replies=REPLIES_B):
            pass
    denied = _cli("tail", env=secured.env("gateway"))
    assert denied.returncode == 2
    assert denied.stderr.strip().splitlines() == [
        "loopfuse tail: the broker's ACLs do not let this principal read topic "
        "'loopfuse.loop-events' (each role's ACLs: infra/kafka/kafka-acls.sh; README: Running "
        "in production)"
    ]


def _pairs(session: str, run: str, n: int, **extra: Any) -> list[tuple[str, dict[str, Any]]]:
    """n identical ``exec ls`` call/result pairs: (which input, event)."""
    events: list[tuple[str, dict[str, Any]]] = []
    now = int(time.time() * 1000)
    for i in range(n):
        base = {
            "session_key": session,
            "run_id": run,
            "call_id": f"forged-{i}",
            "tool_name": "exec",
            "args": {"command": "ls"},
            "ts": now + i,
            **extra,
        }
        events.append(("calls", {**base, "type": "tool_call", "event_id": f"f{i}c", "seq": 2 * i}))
        result = {"type": "tool_result", "event_id": f"f{i}r", "seq": 2 * i + 1, "result": "a b"}
        events.append(("results", {**base, **result}))
    return events


async def _publish(secured: Secured, user: str, topics: dict[str, str], events: Any) -> None:
    producer = AIOKafkaProducer(
        bootstrap_servers=secured.bootstrap, **secured.security.client_kwargs(user)
    )
    await producer.start()
    try:
        for which, event in events:
            key = event["session_key"].encode()
            await producer.send_and_wait(topics[which], json.dumps(event).encode(), key=key)
    finally:
        await producer.stop()


async def _read_all(
    secured: Secured, user: str, topic: str, until_found: Any, seconds: float
) -> list[dict[str, Any]]:
    """Every record of ``topic`` (as ``user``) until ``until_found(records)`` or the time."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=secured.bootstrap,
        auto_offset_reset="earliest",
        **secured.security.client_kwargs(user),
    )
    await consumer.start()
    found: list[dict[str, Any]] = []
    try:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not until_found(found):
            batches = await consumer.getmany(timeout_ms=500)
            found += [json.loads(r.value) for rs in batches.values() for r in rs]
    finally:
        await consumer.stop()
    return found


async def test_another_tenants_events_under_a_session_key_change_nothing_there(
    secured: Secured,
) -> None:
    """Tenant b loops under the default tenant's session key and run id, on the only
    topics its ACLs let it write: the default tenant's first call there is allowed."""
    session, run = f"agent:main:{uuid.uuid4().hex[:8]}", "run-V"
    await _publish(
        secured, "gateway-b", {"calls": CALLS_B, "results": RESULTS_B}, _pairs(session, run, 6)
    )
    theirs = await _read_all(
        secured,
        "gateway-b",
        VERDICTS_B,
        lambda got: any(v.get("session_key") == session and v["action"] == "block" for v in got),
        60,
    )
    assert [v["action"] for v in theirs if v.get("session_key") == session][-1] == "block"
    async with secured.client("gateway") as victim:
        first = await victim.session(session, run_id=run).check("exec", {"command": "ls"})
    assert (first.action, first.detector) == ("allow", None)


async def test_a_reply_into_another_tenants_topic_is_refused(secured: Secured) -> None:
    """A default-tenant call names tenant b's reply topic: nothing reaches it, and the
    dead letters say why."""
    session = f"steer-{uuid.uuid4().hex[:8]}"
    steer = {"topic": REPLIES_B, "partition": 0, "requester": "from-tenant-A"}
    calls = [e for e in _pairs(session, "r", 1, reply_to=steer) if e[0] == "calls"]
    await _publish(secured, "gateway", {"calls": CALLS}, calls)
    letters = await _read_all(
        secured,
        "auditor",
        DEAD_LETTERS,
        lambda got: any(session in (d.get("original") or "") for d in got),
        60,
    )
    [letter] = [d for d in letters if session in (d.get("original") or "")]
    assert letter["error_code"] == "reply_refused"
    assert "'loopfuse.replies.b'" in letter["reason"]
    stolen = await _read_all(secured, "gateway-b", REPLIES_B, lambda got: False, 3)
    assert not [v for v in stolen if v.get("session_key") == session]


async def test_a_forged_path_abort_never_reaches_another_gateways_on_abort(
    secured: Secured,
) -> None:
    """Attack 3 of both kinds: tenant b, and another gateway of the victim's own tenant,
    publish a compaction and three identical call/result pairs under the victim's
    session key, run id and reply_to (read off the input topic). Tenant b's verdicts
    are refused (dead letters); the same tenant's reach the victim and are dropped."""
    async with secured.client("gateway") as victim:
        aborted: list[Any] = []
        session = victim.session(f"victim-{uuid.uuid4().hex[:8]}", run_id="run-V")
        victim.on_abort(session.session_key, "run-V", aborted.append)
        published: list[dict[str, Any]] = []
        session.observer = published.append  # what an open input topic would show
        assert (await session.check("read", {"path": "/etc/motd"})).action == "allow"
        b_topics = {
            "compaction": "agent.compactions.b",
            "tool_call": CALLS_B,
            "tool_result": RESULTS_B,
        }
        other_tenant = [(e["type"], e) for e in _attack(published[0], uuid.uuid4().hex)]
        await _publish(secured, "gateway-b", b_topics, other_tenant)
        letters = await _read_all(
            secured,
            "auditor",
            DEAD_LETTERS,
            lambda got: sum(session.session_key in (d.get("original") or "") for d in got) >= 4,
            60,
        )
        refused = [d for d in letters if session.session_key in (d.get("original") or "")]
        assert {d["error_code"] for d in refused} == {"reply_refused"}
        assert any('"action":"abort"' in d["original"] for d in refused)
        own_tenant = {"compaction": COMPACTIONS, "tool_call": CALLS, "tool_result": RESULTS}
        same_tenant = [(e["type"], e) for e in _attack(published[0], uuid.uuid4().hex)]
        await _publish(secured, "gateway", own_tenant, same_tenant)
        deadline = time.monotonic() + 60
        while victim.stats.foreign_aborts < 1 and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        assert victim.stats.foreign_aborts == 1
    assert aborted == []


async def test_an_auditor_reads_and_writes_nothing_else(secured: Secured) -> None:
    producer = AIOKafkaProducer(
        bootstrap_servers=secured.bootstrap, **secured.security.client_kwargs("auditor")
    )
    await producer.start()
    try:
        for topic in (CALLS, VERDICTS, LOOP_EVENTS):
            with pytest.raises(kafka_errors.TopicAuthorizationFailedError):
                await producer.send_and_wait(topic, b"{}", key=b"s")
    finally:
        await producer.stop()
    assert await _readable(secured, "auditor", LOOP_EVENTS)
    assert await _readable(secured, "auditor", DEAD_LETTERS)
    for topic in (VERDICTS, REPLIES, REPLIES_B, CALLS):
        assert not await _readable(secured, "auditor", topic), topic


def test_a_worker_with_a_gateways_acls_says_which_role_it_lacks(secured: Secured) -> None:
    settings = {
        **secured.worker_settings,
        "sasl_username": "gateway",
        "sasl_password": secured.security.password("gateway"),
    }
    worker = WorkerProcess(settings, log_path=secured.tmp / "worker-as-gateway.log").start()
    try:
        assert worker.proc is not None
        code = worker.proc.wait(90)
    finally:
        worker.stop()
    assert code == 2
    lines = [line for line in worker.tail().splitlines() if line.startswith("loopfuse worker:")]
    assert lines == [
        "loopfuse worker: the broker's ACLs do not let user 'gateway' describe or create topic "
        "'agent.compactions.b', 'agent.tool-calls.b', 'agent.tool-results.b', "
        "'loopfuse-sessions-changelog', 'loopfuse.dead-letters', 'loopfuse.loop-events', "
        "'loopfuse.replies.b', 'loopfuse.verdicts', 'loopfuse.verdicts.b': grant the worker's role "
        "(infra/kafka/kafka-acls.sh worker User:gateway; README: Running in production)"
    ]


WRONG_PASSWORD = "hunter2-" + uuid.uuid4().hex  # must be named, never shown


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA that did not sign the brokers' certificate."""
    folder = tmp_path_factory.mktemp("other-ca")
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(folder / "key.pem"),
            "-out",
            str(folder / "ca.pem"),
            "-days",
            "2",
            "-subj",
            "/CN=not the loopfuse test CA",
        ],
        check=True,
        capture_output=True,
    )
    return folder / "ca.pem"


def test_a_wrong_password_or_an_untrusted_certificate_is_one_line_naming_the_setting(
    secured: Secured,
    other_ca: Path,
) -> None:
    """The worker and the operator commands: exit 2, one line naming the variable, never
    the password."""
    password = {"LOOPFUSE_SASL_PASSWORD": WRONG_PASSWORD}
    refused = (
        "the broker refused the SASL credentials of user 'worker' "
        "(LOOPFUSE_SASL_USERNAME / LOOPFUSE_SASL_PASSWORD)"
    )
    untrusted = "presented a certificate that LOOPFUSE_SSL_CAFILE does not trust"
    cases = [
        (["worker"], password, f"loopfuse worker: {refused}"),
        (["tail"], password, f"loopfuse tail: {refused}"),
        (
            [
                "notify",
                "--metrics-port",
                "0",
                "--dead-letter-file",
                str(secured.tmp / "dead.jsonl"),
            ],
            password,
            f"loopfuse notify: {refused}",
        ),
        (
            ["audit", "--bootstrap", secured.bootstrap],
            password,
            "loopfuse audit: cannot read loopfuse.loop-events: " + refused,
        ),
        (["worker"], {"LOOPFUSE_SSL_CAFILE": str(other_ca)}, untrusted),
        (["tail"], {"LOOPFUSE_SSL_CAFILE": str(other_ca)}, untrusted),
    ]
    for args, changes, expected in cases:
        env = secured.env("worker", **changes, LOOPFUSE_NOTIFY_WEBHOOK_URL="http://127.0.0.1:9/x")
        if args[0] == "worker":
            env.update(
                {
                    f"LOOPFUSE_{k.upper()}": v
                    for k, v in secured.worker_settings.items()
                    if f"LOOPFUSE_{k.upper()}" not in changes
                }
            )
        done = _cli(*args, env=env)
        # the worker's own log is Faust's; the operator commands print that line only
        lines = [
            line
            for line in done.stderr.splitlines()
            if args[0] != "worker" or line.startswith("loopfuse worker:")
        ]
        assert done.returncode == 2, (args, done.stderr[-2000:])
        assert len(lines) == 1 and expected in lines[0], (args, done.stderr[-2000:])
        assert WRONG_PASSWORD not in done.stdout + done.stderr


async def test_the_gateway_client_names_its_argument_and_hides_the_password(
    secured: Secured,
    other_ca: Path,
) -> None:
    with pytest.raises(BrokerAccessError) as refused:
        async with secured.client("gateway", sasl_plain_password=WRONG_PASSWORD):
            pass
    assert str(refused.value) == (
        "loopfuse gateway client: the broker refused the SASL credentials of user 'gateway' "
        "(sasl_plain_username / sasl_plain_password)"
    )
    assert WRONG_PASSWORD not in repr(refused.value)
    with pytest.raises(BrokerAccessError, match="a certificate that ssl_context does not trust"):
        async with secured.client("gateway", ssl_context=create_ssl_context(cafile=str(other_ca))):
            pass


async def test_whatif_runs_with_its_read_only_role_and_not_without(secured: Secured) -> None:
    """The auditor cannot read the inputs whatif judges; the whatif user (the script's
    whatif role) compares both tenants' calls, and may write nothing."""
    since = str(int(time.time() * 1000) - 1)
    session = f"whatif-{uuid.uuid4().hex[:8]}"
    async with secured.client("gateway") as a, secured.client("gateway-b") as b:
        await asyncio.gather(_loop(a, session), _loop(b, session))
    whatif = ["whatif", "--config", str(ROOT / "tests" / "fixtures" / "worker.json5")]
    whatif += ["--since", since, "--json"]
    env = secured.env("auditor", LOOPFUSE_TENANTS="b")

    refused = _cli(*whatif, env=env)
    assert refused.returncode == 2
    assert refused.stderr.startswith(
        "loopfuse whatif: the broker's ACLs do not let this principal read topic"
    )

    granted = _cli(*whatif, env=secured.env("whatif"))
    assert granted.returncode == 0, granted.stderr
    data = json.loads(granted.stdout)
    assert data["window"]["tenants"] == ["", "b"]
    assert data["totals"]["calls_compared"] == 14  # 7 calls of each tenant's session
    assert data["totals"]["unanswered"] == data["totals"]["sessions_changed"] == 0
    issued = {(r["action"], r["issued"]) for r in data["by_action_detector"]}
    assert ("block", 4) in issued  # two blocks per session, as the gateways were told
    producer = AIOKafkaProducer(
        bootstrap_servers=secured.bootstrap, **secured.security.client_kwargs("whatif")
    )
    await producer.start()
    try:
        for topic in (CALLS, CALLS_B, VERDICTS, REPLIES, LOOP_EVENTS):
            with pytest.raises(kafka_errors.TopicAuthorizationFailedError):
                await producer.send_and_wait(topic, b"{}", key=b"s")
    finally:
        await producer.stop()
