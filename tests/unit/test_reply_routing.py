"""Reply routing in the session processor: a call's verdict goes where the call asked.

docs/wire-format.md: Reply routing. The verdict's bytes are the same wherever it goes;
only its topic, partition and key change. Verdicts that come out of a later step
(a parked call drained by its missing predecessor, a restarted gateway's pending
call released by the timer, a redelivered call answered again, a fleet breaker's
raised verdict) go where their own call asked, across a worker restart too.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from loopfuse.schemas.config import parse_config
from loopfuse.streams.engine import Engine
from loopfuse.streams.engine.fleet import ToolBreaker
from loopfuse.streams.worker.processor import (
    DictStore,
    Message,
    OutputTopics,
    SessionProcessor,
)
from tests.unit.test_processor import CONFIG, INPUTS, Clock, Feed, Offsets, calls

REPLIES = {"loopfuse.replies": 8, "loopfuse.replies.acme": 2}
OUT = OutputTopics("verdicts", "loops", "dead", replies=REPLIES)


def routed(
    processor_out: list[Message],
) -> list[tuple[str, bytes | None, int | None, str, str]]:
    """(topic, key, partition, action, call id) of every verdict, wherever it went."""
    found = []
    for topic, key, value, partition in processor_out:
        data = orjson.loads(value)
        if data.get("type") == "verdict":
            found.append((topic, key, partition, data["action"], data["call_id"]))
    return found


def reply(
    partition: int = 3, topic: str = "loopfuse.replies", requester: str = "gw-a"
) -> dict[str, Any]:
    return {"topic": topic, "partition": partition, "requester": requester}


def asking(events: list[dict[str, Any]], **where: Any) -> list[dict[str, Any]]:
    return [{**event, "reply_to": reply(**where)} for event in events]


def make(engine: Engine | None = None, **kwargs: Any) -> SessionProcessor:
    return SessionProcessor(
        engine or Engine(parse_config(CONFIG)),
        INPUTS,
        kwargs.pop("outputs", OUT),
        kwargs.pop("store", DictStore()),
        kwargs.pop("offsets", Offsets()),
        clock=kwargs.pop("clock", Clock()),
        **kwargs,
    )


def test_a_calls_verdict_goes_to_the_partition_it_named_keyed_by_its_requester() -> None:
    events = calls("s1", 6)
    plain = make().process([Feed().record(e) for e in events])
    routed_out = make().process([Feed().record(e) for e in asking(events)])
    verdicts = routed(routed_out)
    assert [(t, k, p) for t, k, p, _, _ in verdicts] == [("loopfuse.replies", b"gw-a", 3)] * 6
    # the same verdicts, byte for byte, as on the verdicts topic without reply_to
    assert [v for t, _, v, _ in routed_out if t == "loopfuse.replies"] == [
        v for t, _, v, _ in plain if t == "verdicts"
    ]
    # loop events and the rest stay where they were
    assert [m for m in routed_out if m[0] != "loopfuse.replies"] == [
        m for m in plain if m[0] != "verdicts"
    ]
    assert any(t == "loops" for t, _, _, _ in routed_out)


def test_a_call_that_names_no_reply_gets_its_verdict_on_the_verdicts_topic() -> None:
    out = make().process([Feed().record(e) for e in calls("s1", 2)])
    assert [(t, k, p) for t, k, p, _, _ in routed(out)] == [("verdicts", b"s1", None)] * 2


@pytest.mark.parametrize(
    ("where", "outcome"),
    [
        ({"topic": "loopfuse.replies.globex"}, "unknown_topic"),  # not a reply topic here
        ({"topic": "agent.tool-calls"}, "unknown_topic"),  # an input topic: never written
        ({"topic": "loops"}, "unknown_topic"),  # an output topic: no forged loop events
        ({"topic": "loopfuse.replies.acme", "partition": 2}, "no_such_partition"),
        ({"partition": 2**31 - 1}, "no_such_partition"),
    ],
)
def test_a_reply_the_worker_cannot_send_to_goes_to_the_verdicts_topic_counted(
    where: dict[str, Any], outcome: str, caplog: pytest.LogCaptureFixture
) -> None:
    proc = make()
    out = proc.process([Feed().record(e) for e in asking(calls("s1", 2), **where)])
    assert [(t, k, p) for t, k, p, _, _ in routed(out)] == [("verdicts", b"s1", None)] * 2
    metrics = proc.metrics.render().decode()
    assert f'loopfuse_verdict_replies_total{{outcome="{outcome}"}} 2.0' in metrics
    (line,) = [r.getMessage() for r in caplog.records if "asked for its verdict" in r.getMessage()]
    assert "sent to the verdicts topic instead" in line  # once, not per verdict


def test_tenants_replies_go_to_their_own_topics() -> None:
    feed = Feed()
    out = make().process(
        [
            *(feed.record(e) for e in asking(calls("s1", 1), requester="gw-a")),
            *(
                feed.record(e)
                for e in asking(
                    calls("s2", 1), topic="loopfuse.replies.acme", partition=1, requester="gw-b"
                )
            ),
        ]
    )
    assert [(t, k, p) for t, k, p, _, _ in routed(out)] == [
        ("loopfuse.replies", b"gw-a", 3),
        ("loopfuse.replies.acme", b"gw-b", 1),
    ]


def test_a_parked_call_is_answered_where_it_asked_even_after_a_worker_restart() -> None:
    """seq 1 arrives before seq 0 and waits (parked, in the state's bytes); a new worker
    on the same table gets seq 0 from another gateway process of the same session key
    and answers both, each on its own reply."""
    store, feed = DictStore(), Feed()
    events = calls("s1", 1)  # seq 0 call, seq 1 result
    call0 = {**events[0], "reply_to": reply(1, requester="gw-a")}
    call2 = {**calls("s1", 1, start=2)[0], "reply_to": reply(5, requester="gw-b")}
    first = make(store=store)
    assert routed(first.process([feed.record(call2)])) == []  # seq 2 waits for 0 and 1
    restarted = make(store=store)  # the state read back from its bytes
    out = restarted.process([feed.record(call0), feed.record(events[1])])
    assert [(t, k, p, c) for t, k, p, _, c in routed(out)] == [
        ("loopfuse.replies", b"gw-a", 1, "c0"),
        ("loopfuse.replies", b"gw-b", 5, "c2"),
    ]


def test_a_restarted_gateways_pending_call_is_released_to_its_reply() -> None:
    feed, offsets = Feed(), Offsets()
    proc = make(offsets=offsets)
    proc.process([feed.record(e) for e in asking(calls("s1", 2), requester="gw-1")])
    restarted = {
        **calls("s1", 1, ts=5_000)[0],
        "incarnation": "gw-2",
        "event_id": "gw-2:0",
        "reply_to": reply(6, requester="gw-2"),
    }
    offsets.ends = {**feed.offsets, ("results", 0): 99}  # unread records: the call waits
    assert routed(proc.process([feed.record(restarted)])) == []
    offsets.ends = dict(feed.offsets)
    assert [(t, k, p) for t, k, p, _, _ in routed(proc.release_waiting())] == [
        ("loopfuse.replies", b"gw-2", 6)
    ]


def test_a_redelivered_call_is_answered_again_on_its_reply() -> None:
    store, events = DictStore(), asking(calls("s1", 3))
    proc = make(store=store)
    first = routed(proc.process([Feed().record(e) for e in events]))
    again = routed(make(store=store).process([Feed().record(e) for e in events]))
    assert again == first and {t for t, _, _, _, _ in again} == {"loopfuse.replies"}


def test_a_fleet_breakers_raised_verdict_goes_to_the_reply() -> None:
    engine = Engine(
        parse_config(
            {
                **CONFIG,
                "loopfuse": {"rules": {"fleetBreaker": {"sessions": 3, "windowSeconds": 60}}},
            }
        )
    )
    now = 1_700_000_000_000
    board = {"exec": ToolBreaker("exec", 3, 60, now, now + 60_000)}
    proc = make(engine, breakers=board, clock=Clock(now))
    call = {**calls("s1", 1, ts=now)[0], "reply_to": reply(2)}
    [(topic, key, partition, action, _)] = routed(proc.process([Feed().record(call)]))
    assert (topic, key, partition, action) == ("loopfuse.replies", b"gw-a", 2, "warn")


@pytest.mark.parametrize(
    ("reply_to", "reason"),
    [
        ({"topic": "bad topic", "partition": 0, "requester": "x"}, "reply_to.topic"),
        ({"topic": "t\n", "partition": 0, "requester": "x"}, "reply_to.topic"),
        ({"topic": "t" * 250, "partition": 0, "requester": "x"}, "reply_to.topic"),
        ({"topic": "t", "partition": -1, "requester": "x"}, "reply_to.partition"),
        ({"topic": "t", "partition": 2**31, "requester": "x"}, "reply_to.partition"),
        ({"topic": "t", "partition": "3", "requester": "x"}, "reply_to.partition"),
        ({"topic": "t", "partition": 0, "requester": ""}, "reply_to.requester"),
        ({"topic": "t", "partition": 0, "requester": "x" * 256}, "reply_to.requester"),
        ({"topic": "t", "partition": 0}, "reply_to.requester"),
        ("loopfuse.replies", "reply_to"),
    ],
)
def test_a_malformed_reply_to_is_a_dead_letter_with_its_reason(reply_to: Any, reason: str) -> None:
    call = {**calls("s1", 1)[0], "reply_to": reply_to}
    out = make().process([Feed().record(call)])
    assert routed(out) == []
    [letter] = [orjson.loads(v) for t, _, v, _ in out if t == "dead"]
    assert letter["error_code"] == "invalid_event"
    assert letter["reason"].startswith(reason), letter["reason"]
