"""Tenants apart in the session processor: a record's tenant is its topic's.

docs/wire-format.md: Tenants. The broker's ACLs give each tenant's gateways its own
input topics and its own verdict and reply topics, so what an event says (its session
key, run id, ``reply_to``) can neither judge nor answer another tenant's sessions.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from loopfuse.schemas.config import parse_config
from loopfuse.streams.engine import Engine
from loopfuse.streams.settings import Settings, TenantTopics
from loopfuse.streams.worker.processor import (
    DictStore,
    Message,
    OutputTopics,
    SessionProcessor,
    split_table_key,
    table_key,
)
from tests.unit.test_processor import CONFIG, INPUTS, Clock, Feed, Offsets, calls

ACME = TenantTopics(
    "acme",
    "calls.acme",
    "results.acme",
    "compactions.acme",
    "verdicts.acme",
    ("replies.acme",),
)
REPLIES = {"replies": 4, "replies.acme": 4}


def make(store: DictStore | None = None) -> SessionProcessor:
    return SessionProcessor(
        Engine(parse_config(CONFIG)),
        INPUTS,
        OutputTopics("verdicts", "loops", "dead", replies=REPLIES),
        store if store is not None else DictStore(),
        Offsets(),
        clock=Clock(),
        tenants=[ACME],
    )


def on(tenant: str, events: list[dict[str, Any]], feed: Feed) -> list[Any]:
    """The events as records on ``tenant``'s input topics ("" the default tenant's)."""
    suffix = f".{tenant}" if tenant else ""
    return [
        feed.record(e, topic=("results" if e["type"] == "tool_result" else "calls") + suffix)
        for e in events
    ]


def verdicts(messages: list[Message]) -> list[tuple[str, str, str]]:
    """(topic, call id, action) of every verdict, wherever it went."""
    found = []
    for topic, _, value, _ in messages:
        data = orjson.loads(value)
        if data.get("type") == "verdict":
            found.append((topic, data["call_id"], data["action"]))
    return found


def dead_letters(messages: list[Message]) -> list[dict[str, Any]]:
    return [orjson.loads(value) for topic, _, value, _ in messages if topic == "dead"]


def with_reply(events: list[dict[str, Any]], topic: str) -> list[dict[str, Any]]:
    where = {"topic": topic, "partition": 1, "requester": "gw"}
    return [{**event, "reply_to": where} for event in events]


@pytest.mark.parametrize("victim", ["", "acme"])
def test_another_tenants_events_under_the_victims_session_key_change_nothing(
    victim: str,
) -> None:
    attacker = "acme" if not victim else ""
    feed, proc = Feed(), make()
    # six identical call/result pairs under the victim's session key and run id
    proc.process(on(attacker, calls("agent:main:victim", 6), feed))
    first = proc.process(on(victim, calls("agent:main:victim", 1), feed))
    assert [action for _, _, action in verdicts(first)] == ["allow"]


def test_two_tenants_with_one_session_key_are_judged_apart() -> None:
    events = calls("s", 5)
    alone = [action for _, _, action in verdicts(make().process(on("acme", events, Feed())))]
    assert alone == ["allow", "allow", "allow", "warn", "warn"]
    feed, proc = Feed(), make()
    both = proc.process([*on("", events[:6], feed), *on("acme", events, feed)])
    assert verdicts(both) == [
        ("verdicts", "c0", "allow"),
        ("verdicts", "c2", "allow"),
        ("verdicts", "c4", "allow"),
        *(("verdicts.acme", f"c{2 * i}", action) for i, action in enumerate(alone)),
    ]


def test_a_reply_into_another_tenants_topic_is_a_dead_letter_and_never_written() -> None:
    feed, proc = Feed(), make()
    stolen = proc.process(on("", with_reply(calls("s", 1), "replies.acme"), feed))
    assert verdicts(stolen) == []
    assert not any(topic == "replies.acme" for topic, _, _, _ in stolen)
    [letter] = dead_letters(stolen)
    assert letter["error_code"] == "reply_refused"
    assert "'replies.acme'" in letter["reason"] and "default tenant" in letter["reason"]
    # and the other way round: a named tenant names the default tenant's reply topic
    into_default = proc.process(on("acme", with_reply(calls("t", 1), "replies"), feed))
    assert verdicts(into_default) == []
    assert dead_letters(into_default)[0]["error_code"] == "reply_refused"
    # each tenant's own reply topic is where its verdicts go
    own = proc.process(on("acme", with_reply(calls("u", 1), "replies.acme"), feed))
    assert verdicts(own) == [("replies.acme", "c0", "allow")]


def test_a_named_tenant_never_falls_back_to_a_topic_it_does_not_own() -> None:
    feed, proc = Feed(), make()
    # a reply topic nobody has: the default tenant's verdict goes to its verdicts topic
    # (as before tenants); a named tenant's is refused
    unknown = proc.process(on("", with_reply(calls("s", 1), "replies.nobody"), feed))
    assert verdicts(unknown) == [("verdicts", "c0", "allow")]
    refused = proc.process(on("acme", with_reply(calls("s", 1), "replies.nobody"), feed))
    assert verdicts(refused) == []
    assert dead_letters(refused)[0]["error_code"] == "reply_refused"


def test_the_default_tenants_state_keeps_its_key_and_a_tenants_is_apart() -> None:
    store = DictStore()
    feed, proc = Feed(), make(store)
    proc.process([*on("", calls("s", 1), feed), *on("acme", calls("s", 1), feed)])
    keys = set(store.data)
    assert keys == {b"s", table_key("acme", b"s")}
    assert split_table_key(table_key("acme", b"s")) == ("acme", b"s")
    # a default-tenant session key can never look like a tenant's table key
    assert split_table_key("\udcff".encode("utf-8", "surrogatepass")) == ("", b"\xed\xb3\xbf")


def test_settings_name_each_tenants_topics_and_keep_the_single_tenant_ones() -> None:
    single = Settings()
    assert single.served_tenants == (single.tenant_topics(""),)
    assert single.input_topics == ("agent.tool-calls", "agent.tool-results", "agent.compactions")
    two = Settings(tenants="acme, globex")
    assert [t.name for t in two.served_tenants] == ["", "acme", "globex"]
    acme = two.tenant_topics("acme")
    assert acme.inputs == (
        "agent.tool-calls.acme",
        "agent.tool-results.acme",
        "agent.compactions.acme",
    )
    assert acme.outputs == ("loopfuse.verdicts.acme", "loopfuse.replies.acme")
    assert "loopfuse.replies.globex" in two.reply_topic_names
    with pytest.raises(ValueError, match="tenants must be names"):
        Settings(tenants="a.b")


def test_tail_follows_every_tenants_verdict_and_reply_topics() -> None:
    from loopfuse.streams.ops.topic_reader import verdict_topics

    assert set(verdict_topics(Settings(tenants="acme"))) == {
        "loopfuse.replies",
        "loopfuse.replies.acme",
        "loopfuse.verdicts",
        "loopfuse.verdicts.acme",
    }
