"""Two workers in one consumer group: started, and which partitions each owns.

Which worker owns what is read from their logs: aiokafka logs the full assignment
after every rebalance ("Setting newly assigned partitions" and Faust's table of
topic -> partition set).
"""

from __future__ import annotations

import asyncio
import re
import time

from streams.worker_process import WorkerProcess
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
        pa, pb = assignment(a.tail(10**7), topic), assignment(b.tail(10**7), topic)
        ready = (
            http_get(a.web_port, "/ready")[0] == 200 and http_get(b.web_port, "/ready")[0] == 200
        )
        if ready and pa and pb and not pa & pb and pa | pb == set(range(partitions)):
            return pa, pb
        await asyncio.sleep(0.5)
    raise AssertionError(f"partitions never split: {pa} / {pb}")
