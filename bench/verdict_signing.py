"""What verdict signatures cost per verdict (docs/benchmarks.md: Verdict signatures).

    python bench/verdict_signing.py [--verdicts 20000] [--rounds 7]

No broker: CPU per verdict on this machine, medians over ``--rounds``, each signed
path measured in the same run as its unsigned baseline.

* worker: the session processor judging tool calls (what a verdict costs the worker
  before it is sent), then signing those verdicts (``VerdictSigning.headers``, what
  ``LOOPFUSE_VERDICT_KEY`` adds at hand-over to the producer);
* gateway: the ``GatewayClient`` verdict reader's work for N records of its own and N
  waiting calls (key compared, signature checked, parsed, matched, call resolved),
  without a key and with one.

The OpenClaw plugin's side: bench/verdict_signing.mjs.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import orjson  # noqa: E402

from loopfuse.schemas.config import parse_config  # noqa: E402
from loopfuse.schemas.verdict_signature import HEADER, VerdictSigner, parse_verdict_keys  # noqa: E402
from loopfuse.streams.engine import Engine  # noqa: E402
from loopfuse.streams.gateway.client import GatewayClient, Topics, _Pending  # noqa: E402
from loopfuse.streams.worker.faust_compat.producer import VerdictSigning  # noqa: E402
from loopfuse.streams.worker.processor import DictStore, OutputTopics, SessionProcessor  # noqa: E402

KEY = f"k1:{base64.b64encode(bytes(range(32))).decode()}"
CONFIG = {"tools": {"loopDetection": {"enabled": True}}}
REPLIES = "loopfuse.replies"


class _Offsets:
    def highwater(self, topic: str, partition: int) -> int | None:
        return None

    def committed(self, topic: str, partition: int) -> int | None:
        return None

    def answered_at(self, topic: str, partition: int) -> int | None:
        return None


@dataclass
class _Record:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]] = field(default_factory=list)
    serialized_key_size: int = 0
    serialized_value_size: int = 0


def _calls(n: int, incarnation: str) -> list[_Record]:
    """n tool calls of 100 sessions (distinct args: every one allowed), asking for a reply."""
    records = []
    for i in range(n):
        session = f"agent:main:{i % 100}"
        event = {
            "type": "tool_call",
            "event_id": f"{incarnation}:{i}",
            "session_key": session,
            "run_id": "run-1",
            "agent_id": "main",
            "incarnation": incarnation,
            "seq": i // 100,
            "ts": 1_780_000_000_000 + i,
            "call_id": f"call-{i}",
            "tool_name": "read",
            "args": {"path": f"/src/module_{i}.py"},
            "reply_to": {"topic": REPLIES, "partition": 3, "requester": incarnation},
        }
        records.append(_Record("agent.tool-calls", 0, i, session.encode(), orjson.dumps(event)))
    return records


def _us(n: int, run: Callable[[], object]) -> float:
    started = time.perf_counter()
    run()
    return (time.perf_counter() - started) / n * 1e6


def worker(n: int, rounds: int) -> tuple[float, float, int]:
    """(µs per event judged, µs per verdict signed, bytes of header per verdict)."""
    calls = _calls(n, "bench-incarnation")

    def judge() -> list[Any]:
        processor = SessionProcessor(
            Engine(parse_config(CONFIG)),
            ("agent.tool-calls", "agent.tool-results", "agent.compactions"),
            OutputTopics(
                "loopfuse.verdicts",
                "loopfuse.loop-events",
                "loopfuse.dead-letters",
                replies={REPLIES: 8},
            ),
            DictStore(),
            _Offsets(),
            clock=lambda: 1_780_000_100_000,
        )
        return processor.process(calls)

    messages = judge()
    assert sum(1 for m in messages if m[0] == REPLIES) == n, "every call answered on its reply"
    signing = VerdictSigning(
        VerdictSigner(parse_verdict_keys(KEY)[0]), ("loopfuse.verdicts", REPLIES)
    )

    def sign() -> None:
        headers = signing.headers
        for topic, key, value, _ in messages:
            headers(topic, key, value)

    # Rounds interleaved, so a neighbour's load on a shared machine hits both alike.
    judged, signed = [], []
    for _ in range(rounds):
        judged.append(_us(n, judge))
        signed.append(_us(n, sign))
    name, value = signing.signer.header(messages[0][1], messages[0][2])
    return statistics.median(judged), statistics.median(signed), len(name) + len(value)


def gateway(n: int, rounds: int) -> tuple[float, float]:
    """µs per verdict for the client's reader (record in, waiting call resolved), without
    a key and with one, rounds interleaved."""
    plain, keyed = [], []
    for _ in range(rounds):
        plain.append(asyncio.run(_read_once(n, None)))
        keyed.append(asyncio.run(_read_once(n, KEY)))
    return statistics.median(plain), statistics.median(keyed)


async def _read_once(n: int, key: str | None) -> float:
    client = GatewayClient("127.0.0.1:1", topics=Topics(), verdict_key=key)
    signer = VerdictSigner(parse_verdict_keys(KEY)[0])
    mine = client.incarnation.encode()
    loop = asyncio.get_running_loop()
    records = []
    waiting = []
    for i in range(n):
        value = orjson.dumps(
            {
                "type": "verdict",
                "verdict_id": f"v{i}",
                "session_key": f"s{i % 100}",
                "run_id": "run-1",
                "agent_id": "main",
                "call_id": f"call-{i}",
                "seq": i,
                "incarnation": client.incarnation,
                "tool_name": "read",
                "action": "allow",
                "level": "none",
                "detector": None,
                "count": 0,
                "message": None,
                "args_hash": "3f2a9c1e5b7d4f60",
                "event_ts": 1,
                "decided_ts": 2,
            }
        )
        headers = [signer.header(mine, value)] if key else []
        records.append(_Record(REPLIES, 3, i, mine, value, headers))
        future: asyncio.Future[Any] = loop.create_future()
        client._pending[(f"s{i % 100}", f"call-{i}")] = _Pending(
            future, i, client.incarnation, "3f2a9c1e5b7d4f60"
        )
        waiting.append(future)

    # The reader's per-record work, as _read_verdicts does it (its key compared, the
    # signature checked when there is a key, parsed and matched to its waiting call),
    # without the consumer's fetch and the event loop's wake-ups around it.
    verifier = client._verifier
    started = time.perf_counter()
    for record in records:
        if record.key != mine:
            continue
        if verifier is not None and not client._signed(verifier, record):
            continue
        client._deliver(record.value)
    elapsed = time.perf_counter() - started
    assert all(f.done() for f in waiting)
    assert client.stats.verdicts == n and client.stats.bad_signatures == 0
    return elapsed / n * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--verdicts", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    n, rounds = args.verdicts, args.rounds
    judged, signed, header_bytes = worker(n, rounds)
    print(
        f"worker:  judging {judged:.2f} µs/event; signing +{signed:.2f} µs/verdict "
        f"(+{signed / judged:.1%}); header {HEADER}: +{header_bytes} bytes/record"
    )
    plain, keyed = gateway(n, rounds)
    print(
        f"gateway: reader without a key {plain:.2f} µs/verdict; with a key {keyed:.2f} "
        f"µs/verdict (+{keyed - plain:.2f} µs, +{(keyed - plain) / plain:.1%})"
    )
    print(f"({n} verdicts, median of {rounds} rounds, Python {sys.version.split()[0]})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
