"""A gateway client with no broker-specific option on the quickstart's embedded broker.

The embedded broker answers metadata but refuses an idempotent producer: the client
tells that apart from an unreachable broker, says in one line what it gives up, and
publishes without idempotence, so it gets a worker's verdicts as on Apache Kafka.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import uuid
from pathlib import Path

import pytest
from aiokafka.errors import KafkaConnectionError

from loopfuse import GatewayClient, Topics, blocked_tool_result
from loopfuse.streams.local.worker_process import WorkerProcess
from tests.support.harness import new_topics, unique, worker_settings

pytestmark = pytest.mark.timeout(300)

ARGS = {"command": "make build"}
SAME = {"content": [{"type": "text", "text": "error: still broken"}]}


async def test_a_default_client_gets_verdicts_from_a_worker_on_the_embedded_broker(
    embedded_bootstrap: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    roles, replies = new_topics(), unique("rel-replies")
    settings = worker_settings(
        embedded_bootstrap, "tansu", roles, unique("embedded"), tmp_path, reply_topics=replies
    )
    worker = WorkerProcess(settings, log_path=tmp_path / "worker.log").start()
    try:
        await asyncio.to_thread(worker.wait_ready, 120)
        topics = Topics(
            roles["tool_calls"],
            roles["tool_results"],
            roles["compactions"],
            roles["verdicts"],
            replies,
        )
        actions = []
        with caplog.at_level(logging.WARNING, "loopfuse.gateway"):
            async with GatewayClient(embedded_bootstrap, topics=topics, timeout=30) as client:
                session = client.session(f"tansu-{uuid.uuid4().hex}", run_id="run-1")
                for _ in range(6):
                    verdict = await session.check("exec", ARGS)
                    actions.append(verdict.action)
                    outcome = blocked_tool_result(verdict) if verdict.action == "block" else SAME
                    await session.result(
                        "exec", ARGS, call_id=verdict.call_id or "", result=outcome
                    )
    finally:
        worker.stop()
    assert actions == ["allow", "allow", "allow", "warn", "warn", "block"]
    assert client.stats.timeouts == 0 and client.stats.verdicts == 6
    (line,) = [r.getMessage() for r in caplog.records if r.name == "loopfuse.gateway"]
    assert line == (
        f"loopfuse gateway client: the broker at {embedded_bootstrap} answers but refuses an "
        "idempotent producer (InitProducerId: UnknownError); publishing without idempotence: "
        "a batch resent after a lost acknowledgement may be written twice (loopfuse drops "
        "the copy by its seq)"
    )


async def test_a_broker_that_does_not_answer_is_no_refusal_of_idempotence(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with socket.socket() as held:  # a port nothing answers on while the test runs
        held.bind(("127.0.0.1", 0))
        bootstrap = f"127.0.0.1:{held.getsockname()[1]}"
        with (
            caplog.at_level(logging.WARNING, "loopfuse.gateway"),
            pytest.raises(KafkaConnectionError),
        ):
            await GatewayClient(bootstrap, request_timeout_ms=2000).start()
    assert not [r for r in caplog.records if "idempoten" in r.getMessage()]
