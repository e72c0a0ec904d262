"""Malformed input: thousands of bad messages interleaved with good events.

Through the worker: it never crashes or stalls, every bad message lands in the
dead-letter topic with a reason (matched one to one by source topic, partition and
offset), and every good event gets the engine's verdict. The same corpus through
``loopfuse replay``: one ``dead_letter`` line per bad line, the good lines' verdicts
equal the engine's.

Kinds of bad input: invalid JSON, invalid UTF-8, JSON that is not an object, wrong
field types, missing fields, unknown ``type``, negative ``seq``, payloads over the
1 MiB event limit, JSON nested deeper than the limit (and deeper than the parser's),
empty messages, null values (tombstones), null or wrong message keys, and results
for calls never seen (``orphan_result``). Empty messages, null values and message
keys have no JSONL form (replay skips blank lines by design), so the replay corpus
has the others.

Message size: Apache Kafka refuses a record over ``max.message.bytes`` (1 MiB and 12
bytes by default) at produce time, so the gateway hears of it and the worker never
sees it; a topic of bigger records (8 MiB here, created before the worker) lets the
> 1 MiB cases through to the worker, which must dead-letter them as ``too_large``.
The embedded broker accepts records of several MB (5 MB measured) on any topic.
"""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from loopfuse.streams.local.worker_process import WorkerProcess
from tests.support.harness import (
    CONFIG,
    LONG,
    ROOT,
    Collector,
    compare,
    create_topics,
    encode,
    expected_verdicts,
    generate,
    http_get,
    new_topics,
    produce,
    settle,
    topic_of,
    unique,
    worker_settings,
)

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(900 if LONG else 240)]

N_BAD = 20_000 if LONG else 10_000
N_GOOD = 6_000 if LONG else 3_000
MIB = 1_048_576


def _good_template(rng: random.Random, key: str, i: int) -> dict[str, Any]:
    return {
        "type": "tool_call",
        "event_id": f"{key}-bad{i}",
        "session_key": key,
        "run_id": "r",
        "call_id": f"b{i}",
        "tool_name": "exec",
        "args": {"command": f"ls {rng.randrange(100)}"},
        "ts": 1_790_000_000_000 + i,
    }


def bad_inputs(n: int, seed: int = 5) -> list[tuple[str, bytes | None, bytes | None, bool]]:
    """``n`` bad messages: (kind, key, value, has_jsonl_form)."""
    rng = random.Random(seed)
    out: list[tuple[str, bytes | None, bytes | None, bool]] = []
    big_budget = 6 if not LONG else 12  # each > 1 MiB: keep the corpus a few MB

    def dumps(obj: Any) -> bytes:
        return orjson.dumps(obj)

    kinds = [
        "invalid_json",
        "invalid_utf8",
        "not_object",
        "wrong_type",
        "missing_field",
        "unknown_type",
        "negative_seq",
        "deep",
        "empty",
        "null_value",
        "null_key",
        "wrong_key",
        "orphan",
        "bad_ts",
        "both_args",
        # the edge-hardening cases: each once crashed the worker or switched a session off
        "huge_ts",
        "max_ts",
        "huge_seq",
        "type_list",
        "long_tool_name",
        "long_key_garbage",
        "long_incarnation",
    ]
    for i in range(n):
        kind = kinds[i % len(kinds)]
        if i % 997 == 0 and big_budget > 0:
            kind, big_budget = "too_large", big_budget - 1
        key = f"bad-{i % 64}"
        k = key.encode()
        ev = _good_template(rng, key, i)
        jsonl = True
        if kind == "invalid_json":
            value = rng.choice(
                [
                    b'{"type": "tool_call", "event_id": ',
                    b"{not json",
                    b'{"a": 1,}',
                    b"nul",
                    dumps(ev)[: rng.randrange(1, 60)],
                    b'{"type":"tool_call"' + b"\x00" * 3 + b"}",
                ]
            )
        elif kind == "invalid_utf8":
            value = dumps(ev).replace(b'"exec"', b'"ex\xff\xfe\xc3"')
        elif kind == "not_object":
            value = rng.choice([b"[1, 2, 3]", b"42", b'"tool_call"', b"null", b"true", b"[]"])
        elif kind == "wrong_type":
            field, bad = rng.choice(
                [
                    ("event_id", 7),
                    ("seq", "3"),
                    ("ts", True),
                    ("tool_name", 5),
                    ("call_id", ["x"]),
                    ("session_key", {"k": 1}),
                    ("seq", 1.5),
                ]
            )
            value = dumps(ev | {field: bad})
        elif kind == "missing_field":
            drop = rng.choice(["event_id", "call_id", "tool_name", "ts", "args", "session_key"])
            d = {f: v for f, v in ev.items() if f != drop}
            if drop == "session_key":
                d.pop("run_id")
                k = None  # no key in the event: no key on the message either
            value = dumps(d)
        elif kind == "unknown_type":
            value = dumps(ev | {"type": rng.choice(["tool_dance", "", "TOOL_CALL", None, 3])})
        elif kind == "negative_seq":
            value = dumps(ev | {"seq": -rng.randrange(1, 10**6)})
        elif kind == "deep":
            depth = rng.choice([65, 200, 2_000, 20_000])
            value = dumps(ev | {"args": 0})[:-1] + b',"x":' + b"[" * depth + b"]" * depth + b"}"
        elif kind == "empty":
            value, jsonl = b"", False
        elif kind == "null_value":
            value, jsonl = None, False
        elif kind == "null_key":
            value, k, jsonl = dumps(ev | {"event_id": f"nk{i}"}), None, False
        elif kind == "wrong_key":
            value, k, jsonl = dumps(ev), b"someone-else", False
        elif kind == "orphan":  # valid, but a result for a call never seen, without args
            res = {f: v for f, v in ev.items() if f != "args"}
            value = dumps(
                res
                | {"type": "tool_result", "result": {"content": "x"}, "session_key": f"orphan-{i}"}
            )
            k = f"orphan-{i}".encode()
        elif kind == "bad_ts":
            value = dumps(ev | {"ts": rng.choice(["yesterday", "2026-01-01T00:00:00", [1]])})
        elif kind == "both_args":
            value = dumps(ev | {"args_hash": "abc"})
        elif kind == "huge_ts":  # 1e300 (and any ts >= 2**64) once failed encoding a verdict
            value = dumps(ev)[:-1] + b',"ts":1e300}'
        elif kind == "max_ts":  # 2**64-1 once broke the session's state codec for good
            value = dumps(ev)[:-1] + b',"ts":18446744073709551615}'
        elif kind == "huge_seq":
            value = dumps(ev)[:-1] + b',"seq":9223372036854775808}'
        elif kind == "type_list":  # an unhashable type once raised in the decoder
            value = dumps(ev | {"type": []})
        elif kind == "long_tool_name":  # once made 600 KB verdicts and 900 KB loop events
            value = dumps(ev | {"tool_name": "t" * rng.choice([513, 300_000])})
        elif kind == "long_key_garbage":  # a 600 KB key once made a 1.2 MB dead letter
            value, k, jsonl = b"\x01", b"k" * 600_000, False
        elif kind == "long_incarnation":
            value = dumps(ev | {"incarnation": "i" * 1_000})
        else:  # too_large: valid JSON just over (or well over) the 1 MiB limit
            size = rng.choice([MIB + 1, MIB + 100_000, 3 * MIB])
            filler = "y" * (size - len(dumps(ev)) + 40)
            value = dumps(ev | {"args": {"blob": filler}})
            assert len(value) > MIB
        out.append((kind, k, value, jsonl))
    return out


def good_events(n: int) -> list[dict[str, Any]]:
    events = generate(n, max(10, n // 100), seed=9, prefix=unique("good") + "-")
    # One good event close to the limit (~0.95 MiB): the worker must fetch and judge it.
    for e in events:
        if e["type"] == "tool_call" and e["tool_name"] == "read":
            e["args"] = {"path": "/big", "blob": "z" * (MIB - 60_000)}
            break
    return events


async def test_bad_inputs_are_dead_lettered_and_good_ones_judged(
    kafka_bootstrap: str, kafka_broker_kind: str, tmp_path: Path
) -> None:
    t0 = time.monotonic()
    bad = bad_inputs(N_BAD)
    good = good_events(N_GOOD)
    expected = expected_verdicts(good)
    topics = new_topics()
    settings = worker_settings(
        kafka_bootstrap,
        kafka_broker_kind,
        topics,
        unique("loopfuse-malformed"),
        tmp_path / "data",
    )
    await create_topics(
        kafka_bootstrap,
        (topics["tool_calls"], topics["tool_results"], topics["compactions"]),
        int(settings.get("partitions", "4")),
        {"max.message.bytes": str(8 * MIB)},
    )
    # Interleave: good events keep their order; bad ones go to random input topics.
    rng = random.Random(1)
    inputs = [topics["tool_calls"], topics["tool_results"], topics["compactions"]]
    stream: list[tuple[bool, str, bytes | None, bytes | None, str]] = [
        (
            False,
            topic_of(topics, e),
            e["session_key"].encode(),
            orjson.dumps(e),
            f"good {e['session_key']}#{e['seq']} {e['type']}",
        )
        for e in good
    ]
    for kind, key, value, _ in bad:
        what = f"bad {kind} ({len(value or b'')} B)"
        stream.insert(rng.randrange(len(stream) + 1), (True, rng.choice(inputs), key, value, what))
    canary = {
        "type": "tool_call",
        "event_id": "canary",
        "session_key": "canary",
        "call_id": "c",
        "tool_name": "read",
        "args": {"path": "/x"},
        "ts": 1,
    }

    worker = WorkerProcess(settings, log_path=tmp_path / "worker.log").start()
    try:
        await asyncio.to_thread(worker.wait_ready, 120)
        outputs = [topics["verdicts"], topics["dead_letters"], topics["loop_events"]]
        async with Collector(kafka_bootstrap, outputs) as out:
            producer = AIOKafkaProducer(
                bootstrap_servers=kafka_bootstrap, linger_ms=5, max_request_size=8 * MIB
            )
            await producer.start()
            try:
                futures = [
                    (is_bad, what, await producer.send(topic, value, key=key))
                    for is_bad, topic, key, value, what in stream
                ]
                await producer.flush()
                sent = [(is_bad, what, await f) for is_bad, what, f in futures]
            finally:
                await producer.stop()
            bad_offsets = {(m.topic, m.partition, m.offset) for is_bad, _, m in sent if is_bad}
            produced_s = time.monotonic() - t0
            want = {(v["session_key"], v["seq"]) for v in expected}

            def done() -> bool:
                got = {(v["session_key"], v["seq"]) for v in out.of(topics["verdicts"])}
                return want <= got and len(out.of(topics["dead_letters"])) >= len(bad)

            deadline = time.monotonic() + (600 if LONG else 150)
            readiness: list[int] = []
            while not done() and time.monotonic() < deadline:
                assert worker.running, f"worker died\n{worker.tail()}"
                readiness.append((await asyncio.to_thread(http_get, worker.web_port, "/ready"))[0])
                await asyncio.sleep(0.5)
            # Not stalled: a good event after all that still gets its verdict promptly.
            await produce(kafka_bootstrap, encode(topics, [canary]))
            await out.wait_for(
                "the canary's verdict",
                lambda: any(v["session_key"] == "canary" for v in out.of(topics["verdicts"])),
                30,
            )
            # Nothing is left unjudged or uncommitted: the group's committed offsets
            # reach the end of every input partition (else this fails with the lag);
            # then every output is read, so the counts below are final.
            await settle(out, kafka_bootstrap, settings)
            status, body = http_get(worker.web_port, "/ready")
            metrics = http_get(worker.web_port, "/metrics")[1]
            verdicts = [v for v in out.of(topics["verdicts"]) if v["session_key"] != "canary"]
            letters = out.of(topics["dead_letters"])
            gaps = [e for e in out.of(topics["loop_events"]) if e["detector"] == "sequence_gap"]
        assert worker.running, worker.tail()
    finally:
        worker.stop()

    elapsed = time.monotonic() - t0
    result = compare(expected, verdicts)
    letter_offsets = [(d["source_topic"], d["partition"], d["offset"]) for d in letters]
    by_code: dict[str, int] = {}
    for d in letters:
        by_code[d["error_code"]] = by_code.get(d["error_code"], 0) + 1
    print(
        f"malformed(worker): {len(bad)} bad + {len(good)} good messages produced in "
        f"{produced_s:.1f} s, all judged after {elapsed:.1f} s; dead letters "
        f"{len(letters)} by code {dict(sorted(by_code.items()))}; /ready {status}"
    )
    print(result.line("malformed(worker)"))
    if result.missing or gaps:
        print(
            f"malformed(worker): {len(gaps)} sequence_gap loop events: "
            f"{[(g['session_key'], g['seq'], g['message'][:70]) for g in gaps[:5]]}"
        )
        _explain_missing(expected, verdicts, sent)
    assert status == 200, body
    assert set(readiness) <= {200}, f"/ready answered {sorted(set(readiness))} while judging"
    assert len(letters) == len(bad), f"dead letters {len(letters)} != bad inputs {len(bad)}"
    assert set(letter_offsets) == bad_offsets, "dead letters are not exactly the bad inputs"
    assert all(d["reason"] and d["error_code"] for d in letters)
    assert by_code.get("too_large", 0) >= 1, by_code
    assert result.missing == 0 and result.wrong == 0, (
        result.line("malformed") + "\n" + "\n".join(result.examples)
    )
    assert "loopfuse_dead_letters_total" in metrics


def _explain_missing(
    expected: list[dict[str, Any]], verdicts: list[dict[str, Any]], sent: list[Any]
) -> None:
    """For each missing verdict: where its event was, and what came just before it."""
    got = {(v["session_key"], v["seq"]) for v in verdicts}
    where: dict[str, Any] = {}
    by_tp: dict[tuple[str, int], list[tuple[int, str]]] = {}
    for _, what, m in sent:
        where[what] = m
        by_tp.setdefault((m.topic, m.partition), []).append((m.offset, what))
    for v in expected:
        if (v["session_key"], v["seq"]) in got:
            continue
        what = f"good {v['session_key']}#{v['seq']} tool_call"
        m = where.get(what)
        if m is None:
            print(f"  missing {what}: not found among the sent messages")
            continue
        log = sorted(by_tp[(m.topic, m.partition)])
        i = log.index((m.offset, what))
        print(
            f"  missing {what} at {m.topic}[{m.partition}]@{m.offset}; before it: "
            f"{[w for _, w in log[max(0, i - 3) : i]]}"
        )


def test_the_same_corpus_through_replay(tmp_path: Path) -> None:
    t0 = time.monotonic()
    # Enough of the kinds that have a JSONL form to make N_BAD bad lines.
    bad = [(kind, value) for kind, _, value, jsonl in bad_inputs(N_BAD * 3 // 2) if jsonl]
    bad = bad[:N_BAD]
    assert len(bad) == N_BAD
    good = good_events(N_GOOD)
    expected = expected_verdicts(good)
    rng = random.Random(2)
    lines: list[tuple[bool, bytes]] = [(False, orjson.dumps(e)) for e in good]
    for _, value in bad:
        assert value is not None and b"\n" not in value and value.strip()
        lines.insert(rng.randrange(len(lines) + 1), (True, value))
    path = tmp_path / "corpus.jsonl"
    path.write_bytes(b"".join(v + b"\n" for _, v in lines))
    bad_lines = {n for n, (is_bad, _) in enumerate(lines, start=1) if is_bad}

    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "loopfuse.streams.cli",
            "replay",
            "--config",
            str(CONFIG),
            str(path),
        ],
        cwd=ROOT,
        capture_output=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    outputs = [orjson.loads(line) for line in proc.stdout.splitlines()]
    letters = [o for o in outputs if o["type"] == "dead_letter"]
    verdicts = [o for o in outputs if o["type"] == "verdict"]
    result = compare(expected, verdicts)
    by_code: dict[str, int] = {}
    for d in letters:
        by_code[d["error_code"]] = by_code.get(d["error_code"], 0) + 1
    print(
        f"malformed(replay): {len(lines)} lines ({len(bad_lines)} bad, "
        f"{path.stat().st_size / MIB:.1f} MiB) in {time.monotonic() - t0:.1f} s; "
        f"dead letters {len(letters)} by code {dict(sorted(by_code.items()))}"
    )
    print(result.line("malformed(replay)"))
    assert sorted(d["line"] for d in letters) == sorted(bad_lines)
    assert all(d["reason"] for d in letters)
    assert by_code.get("too_large", 0) >= 1 and by_code.get("too_deep", 0) >= 1, by_code
    assert result.missing == 0 and result.wrong == 0 and result.duplicates == 0, (
        result.line("malformed(replay)") + "\n" + "\n".join(result.examples)
    )
