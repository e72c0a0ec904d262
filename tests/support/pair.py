"""Two workers in one consumer group: started, and which partitions each owns.

Which worker owns what (:func:`owned`) is what the group coordinator says: the
group's ``DescribeGroups`` answer, each member's assignment, the member told apart by
the web URL Faust puts in its subscription. The embedded broker answers
``DescribeGroups`` with empty assignments, so there it is read from the worker's log
instead: aiokafka logs the full assignment after every rebalance ("Setting newly
assigned partitions" and Faust's table of topic -> partition set).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)

from loopfuse.streams.local.worker_process import WorkerProcess
from tests.support.harness import http_get


def _parse_set(text: str) -> set[int]:
    out: set[int] = set()
    for piece in text.strip().strip("{}").split(","):
        piece = piece.strip()
        if not piece:
            continue
        if "-" in piece:
            a, b = piece.split("-")
            out.update(range(int(a), int(b) + 1))
        else:
            out.add(int(piece))
    return out


def assignment(log: str, topic: str) -> set[int] | None:
    """The partitions of ``topic`` in the last assignment logged, or None if none yet."""
    blocks = log.split("Setting newly assigned partitions")
    if len(blocks) < 2:
        return None
    last = blocks[-1].split("for group")[0]
    m = re.search(rf"\|\s*{re.escape(topic)}\s*\|\s*([^|]*)\|", last)
    return _parse_set(m.group(1)) if m else set()


async def group_assignment(bootstrap: str, group: str, topic: str) -> dict[int, set[int]] | None:
    """``topic``'s partitions per member of ``group``, keyed by the member's web port,
    from the coordinator's ``DescribeGroups`` answer; None unless the group is Stable
    (a rebalance under way has no assignment to read)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        [response] = await admin.describe_consumer_groups([group])
    finally:
        await admin.close()
    [described] = response.groups
    error_code, _, state, _, _, members = described[:6]
    if error_code != 0 or state != "Stable":
        return None
    out: dict[int, set[int]] = {}
    for member in members:
        metadata, assignment = member[3], member[4]
        # Faust's subscription carries the member's ClientMetadata as JSON: its url is
        # the worker's canonical URL, http://HOST:WEB_PORT.
        client: Any = json.loads(ConsumerProtocolMemberMetadata.decode(metadata).user_data)
        port = int(str(client["url"]).rstrip("/").rsplit(":", 1)[1])
        decoded = ConsumerProtocolMemberAssignment.decode(assignment)
        out[port] = {p for name, parts in decoded.assignment for p in parts if name == topic}
    return out


async def owned(worker: WorkerProcess, topic: str) -> set[int] | None:
    """The partitions of ``topic`` the worker owns now (None: not known yet)."""
    if worker.env.get("LOOPFUSE_EMBEDDED_BROKER") == "true":
        return assignment(worker.tail(10**7), topic)
    members = await group_assignment(
        worker.env["LOOPFUSE_BOOTSTRAP_SERVERS"], worker.env["LOOPFUSE_APP_ID"], topic
    )
    return None if members is None else members.get(worker.web_port, set())


async def start_pair(
    a: WorkerProcess, b: WorkerProcess, topic: str, partitions: int, timeout: float = 90
) -> tuple[set[int], set[int]]:
    """Start ``a``, then ``b`` (each ready), and wait until they split ``topic``'s
    partitions between them; the partitions of each."""
    a.start()
    await asyncio.to_thread(a.wait_ready, 120)
    b.start()
    await asyncio.to_thread(b.wait_ready, 120)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pa, pb = await owned(a, topic), await owned(b, topic)
        ready = (
            http_get(a.web_port, "/ready")[0] == 200 and http_get(b.web_port, "/ready")[0] == 200
        )
        if ready and pa and pb and not pa & pb and pa | pb == set(range(partitions)):
            return pa, pb
        await asyncio.sleep(0.5)
    raise AssertionError(f"partitions never split: {pa} / {pb}")
