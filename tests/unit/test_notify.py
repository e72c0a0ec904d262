"""``loopfuse notify``'s delivery, against a real HTTP server on 127.0.0.1 (no broker).

The server (``tests.support.webhook``) runs in a thread and records what it was
sent; some answer with errors first, to exercise the retries. Records come from a
list (:class:`Records`), which also records what was committed.
"""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest
from prometheus_client import start_http_server

from loopfuse.streams.cli import main
from loopfuse.streams.ops.notify import (
    ID_CHARS,
    LEFT_OUT,
    MAX_POST_BYTES,
    MESSAGE_CHARS,
    DeadLetterFile,
    Delivery,
    Notifier,
    Shaping,
    TokenBucket,
)
from loopfuse.streams.ops.topic_reader import TopicRecord
from tests.support.kafka import fixture_records
from tests.support.webhook import Webhook, critical_loop_events

CRITICAL = next(e for e in fixture_records() if e["level"] == "critical" and e["action"] == "block")
WARNING = next(e for e in fixture_records() if e["level"] == "warning")
#: The loop-event fields a post carries: everything but ``config`` and ``args``.
POSTED = [k for k in CRITICAL if k not in ("config", "args")]


class Records:
    """Records of partition 0 in order, ``batch`` at a time; None once all are read."""

    def __init__(self, *values: bytes | dict[str, Any], batch: int = 100) -> None:
        self.values = [v if isinstance(v, bytes) else orjson.dumps(v) for v in values]
        self.read = 0
        self.batch = batch
        self.committed: dict[int, int] = {}
        self.paused = False
        self.pauses = 0
        self.end = True  # False: the input never ends (stop with the stop event)

    def add(self, *values: dict[str, Any]) -> None:
        self.values += [orjson.dumps(v) for v in values]

    async def records(self, timeout: float) -> Sequence[TopicRecord] | None:
        await asyncio.sleep(0)  # like a consumer: others run while it reads
        if self.paused or self.read == len(self.values):
            if self.read == len(self.values) and self.end and not self.paused:
                return None
            await asyncio.sleep(timeout)
            return []
        start, self.read = self.read, min(len(self.values), self.read + self.batch)
        return [TopicRecord(0, o, self.values[o]) for o in range(start, self.read)]

    def pause(self) -> None:
        self.pauses += not self.paused
        self.paused = True

    def resume(self) -> None:
        self.paused = False

    async def commit(self, offsets: Mapping[int, int]) -> bool:
        self.committed.update(offsets)
        return True


@pytest.fixture
def webhook() -> Iterator[Webhook]:
    with Webhook() as hook:
        yield hook


def _notifier(
    url: str, retries: int | None = 3, tmp: Path | None = None, **shaping: Any
) -> Notifier:
    return Notifier(
        url,
        Delivery(retries=retries, backoff=0.05, timeout=2.0),
        Shaping(**{"rate": 0, "coalesce_seconds": 0.5, **shaping}),
        dead_letters=DeadLetterFile(tmp / "dead.jsonl") if tmp else None,
        topic="loops",
        poll_seconds=0.02,
    )


async def test_critical_loop_events_are_posted_with_the_allowed_fields_only(
    webhook: Webhook,
) -> None:
    with_args = {**CRITICAL, "args": {"command": "deploy", "api_key": "sk-live-SECRET"}}
    records = Records(WARNING, with_args)
    notifier = _notifier(webhook.url)
    await notifier.run(records)

    (posted,) = webhook.received  # the warning is not notified
    assert list(posted) == ["text", "loop_event"]
    assert posted["loop_event"] == {k: CRITICAL[k] for k in POSTED}  # no args, no config
    assert b"SECRET" not in webhook.bodies[0] and b"api_key" not in webhook.bodies[0]
    text = posted["text"]
    assert "BLOCK" in text and CRITICAL["detector"] in text
    assert f"session {CRITICAL['session_key']}" in text and f"agent {CRITICAL['agent_id']}" in text
    assert CRITICAL["message"] in text
    assert notifier.metrics.value("loopfuse_notify_sent_total") == 1
    assert records.committed == {0: 2}


async def test_args_are_posted_only_when_asked_for(webhook: Webhook) -> None:
    with_args = {**CRITICAL, "args": {"command": "deploy"}}
    await _notifier(webhook.url, include_args=True).run(Records(with_args))
    assert webhook.received[0]["loop_event"]["args"] == {"command": "deploy"}


async def test_a_hostile_tool_name_pings_nobody_and_links_nowhere(webhook: Webhook) -> None:
    hostile = {
        **CRITICAL,
        "tool_name": "<!channel> <@U123> <http://evil.example|click>",
        "agent_id": "ops\x1b]0;owned\x07bot",
        "message": "see <https://evil.example|the docs> & <!here>\nnow",
    }
    await _notifier(webhook.url).run(Records(hostile))

    tool = "&lt;!channel&gt; &lt;\\x40U123&gt; &lt;http://evil.example|click&gt;"
    message = "see &lt;https://evil.example|the docs&gt; &amp; &lt;!here&gt;\\x0anow"
    text = (
        ":rotating_light: loopfuse BLOCK: unknown_tool_repeat (count 10) - "
        f"agent ops\\x1b]0;owned\\x07bot, session sim:7:4:unknown_tool, run run-0, tool {tool}\n"
        f"{message}"
    )
    shown = {"tool_name": tool, "agent_id": "ops\\x1b]0;owned\\x07bot", "message": message}
    assert webhook.bodies == [
        orjson.dumps({"text": text, "loop_event": {k: shown.get(k, hostile[k]) for k in POSTED}})
    ]


async def test_markdown_links_images_autolinks_and_mentions_are_inert_everywhere(
    webhook: Webhook,
) -> None:
    # what Mattermost and Rocket.Chat render as a disguised link, an image or a ping
    hostile = {
        **CRITICAL,
        "tool_name": "[click me](https://evil.example)",
        "agent_id": "![x](https://evil.example/pixel.png)",
        "run_id": "<https://evil.example> <me@evil.example>",
        "message": "[docs][1] @channel @all \\[escaped](https://evil.example)\n"
        "[1]: https://evil.example",
        "args": {"[k](https://evil.example)": ["@here"]},
    }
    await _notifier(webhook.url, include_args=True).run(Records(hostile))

    (post,) = webhook.received
    strings = [post["text"], *_strings(post["loop_event"])]
    for text in strings:
        assert "[" not in text and "@" not in text and "<" not in text, text
        assert "\\\\" not in text  # Markdown would read "\\\\" as one backslash
    assert "\\x5bclick me](https://evil.example)" in post["text"]
    assert "\\x40channel \\x40all \\x5c\\x5bescaped]" in post["text"]
    assert post["loop_event"]["args"] == {"\\x5bk](https://evil.example)": ["\\x40here"]}


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (k, *_strings(v))]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


async def test_every_string_and_the_post_are_capped(webhook: Webhook) -> None:
    huge = "\u2066" * 100_000  # 6 characters shown for each, 3 bytes on the wire
    hostile = {
        **CRITICAL,
        **{k: huge + "x" for k in ("tool_name", "agent_id", "run_id", "message", "call_id")},
        **{k: huge for k in ("paired_tool_name", "args_hash", "warning_key", "incarnation")},
        "session_key": "big",
        "event_id": "big-1",
        "fleet": {f"tool-{i}": huge[:1000] for i in range(2_000)},
        "args": {"payload": huge, "nested": "NESTED", "many": ["é" * 200] * 5_000},
    }
    # nested deeper than any JSON writer takes (orjson: 255), which a reader takes
    record = orjson.dumps(hostile).replace(b'"NESTED"', b"[" * 300 + b"1" + b"]" * 300)
    assert len(record) > 900_000
    await _notifier(webhook.url, include_args=True).run(Records(record, CRITICAL))

    posts = {
        post["loop_event"]["session_key"]: body
        for post, body in zip(webhook.received, webhook.bodies, strict=True)
    }
    assert len(posts["big"]) <= MAX_POST_BYTES
    post = orjson.loads(posts["big"])
    for name in ("tool_name", "agent_id", "run_id", "call_id"):
        value = post["loop_event"][name]
        assert value == LEFT_OUT or (len(value) <= ID_CHARS and value.endswith("…")), name
    assert len(post["loop_event"]["message"]) <= MESSAGE_CHARS
    assert all(len(line) <= MESSAGE_CHARS for line in post["text"].split("\n"))
    assert post["loop_event"]["fleet"] == LEFT_OUT and post["loop_event"]["args"] == LEFT_OUT
    # an ordinary post is left whole
    assert orjson.loads(posts[CRITICAL["session_key"]])["loop_event"] == {
        k: CRITICAL[k] for k in POSTED
    }


async def test_a_webhook_failing_twice_then_answering_gets_the_event_once() -> None:
    with Webhook(statuses=[500, 503]) as hook:
        notifier = _notifier(hook.url)
        await notifier.run(Records(CRITICAL))

    assert hook.attempts == 3 and len(hook.received) == 1
    gaps = [b - a for a, b in zip(hook.times, hook.times[1:], strict=False)]
    assert gaps[0] >= 0.05 and gaps[1] >= 0.1  # backoff doubles
    assert notifier.metrics.value("loopfuse_notify_retries_total") == 2
    assert notifier.metrics.value("loopfuse_notify_sent_total") == 1


async def test_a_given_up_event_goes_to_the_dead_letter_file_and_is_committed(
    tmp_path: Path,
) -> None:
    with Webhook(statuses=[502] * 10) as hook:
        records = Records(CRITICAL, {**CRITICAL, "args": {"api_key": "SECRET"}, "event_id": "b"})
        notifier = _notifier(hook.url, retries=2, tmp=tmp_path)
        started = time.monotonic()
        await notifier.run(records)
        elapsed = time.monotonic() - started

    assert hook.attempts == 3 and hook.received == []  # one coalesced post, tried 3 times
    assert elapsed < 2
    letters = [orjson.loads(line) for line in (tmp_path / "dead.jsonl").read_bytes().splitlines()]
    assert [(d["reason"], d["attempts"], d["topic"], d["offset"]) for d in letters] == [
        ("http_502", 3, "loops", 0),
        ("http_502", 3, "loops", 1),
    ]
    assert letters[0]["loop_event"] == {k: CRITICAL[k] for k in POSTED}
    assert "args" not in letters[1]["loop_event"]
    assert notifier.metrics.value("loopfuse_notify_failures_total", reason="http_502") == 1
    assert notifier.metrics.value("loopfuse_notify_dead_letters_total") == 2
    assert records.committed == {0: 2}


async def test_a_client_error_is_not_retried_and_unreachable_is(tmp_path: Path) -> None:
    with Webhook(statuses=[404]) as hook:
        notifier = _notifier(hook.url, tmp=tmp_path)
        await notifier.run(Records(CRITICAL))
    assert hook.attempts == 1
    assert notifier.metrics.value("loopfuse_notify_failures_total", reason="http_404") == 1

    down = _notifier(hook.url, retries=1)  # the server is gone: connection refused
    await down.run(Records(CRITICAL))
    assert down.metrics.value("loopfuse_notify_failures_total", reason="connection") == 1
    assert down.metrics.value("loopfuse_notify_retries_total") == 1


async def test_bad_records_never_stop_it(webhook: Webhook) -> None:
    bad: list[bytes | dict[str, Any]] = [
        b"",
        b"not json",
        b"[1, 2]",
        b"\xff\xfe",
        {"type": "verdict", "level": "critical"},
        {"type": "loop_event", "level": "critical"},  # no detector, no session
        {
            **CRITICAL,
            "count": "many",
            "message": None,
            "agent_id": None,
            "run_id": 7,
            "session_key": "odd",
            "event_id": 3,
        },
    ]
    records = Records(*bad, CRITICAL)
    notifier = _notifier(webhook.url)
    await notifier.run(records)

    assert len(webhook.received) == 2  # the odd but usable one, and the good one
    # posts run concurrently: either may arrive first
    by_session = {post["loop_event"]["session_key"]: post for post in webhook.received}
    assert by_session["odd"]["loop_event"]["count"] == "many"
    assert by_session[CRITICAL["session_key"]]["loop_event"] == {k: CRITICAL[k] for k in POSTED}
    assert notifier.metrics.value("loopfuse_notify_skipped_records_total") == 6
    assert records.committed == {0: 8}


async def test_a_redelivered_loop_event_is_posted_once(webhook: Webhook) -> None:
    first, second = critical_loop_events(2)
    records = Records(first, second, first, batch=1)  # the worker published `first` twice
    notifier = _notifier(webhook.url)
    await notifier.run(records)
    records.add(second)  # ... even long after it was posted
    records.end = True
    await notifier.run(records)

    # posts run concurrently: either may arrive first
    assert sorted(webhook.event_ids()) == [first["event_id"], second["event_id"]]
    assert notifier.metrics.value("loopfuse_notify_duplicates_total") == 2
    assert records.committed == {0: 4}


async def test_fifty_retries_of_one_blocked_call_are_two_posts_with_the_count(
    webhook: Webhook,
) -> None:
    flood = critical_loop_events(50, session_key="sim:1", warning_key="run-0:unknown-tool:x")
    other = critical_loop_events(1, tag="other")[0]
    records = Records(flood[0], other, *flood[1:], batch=1)
    records.end = False
    notifier = _notifier(webhook.url, coalesce_seconds=0.5)
    stop = asyncio.Event()
    started = time.monotonic()
    task = asyncio.create_task(notifier.run(records, stop))
    while len(webhook.received) < 3 and time.monotonic() - started < 5:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.5)  # nothing more comes
    stop.set()
    await task

    # three posts; the first two are sent concurrently, so either may arrive first
    assert len(webhook.received) == 3
    by_id = {post["loop_event"]["event_id"]: index for index, post in enumerate(webhook.received)}
    assert set(by_id) == {flood[0]["event_id"], other["event_id"], flood[-1]["event_id"]}
    first = webhook.received[by_id[flood[0]["event_id"]]]
    repeats = webhook.received[by_id[flood[-1]["event_id"]]]
    assert "coalesced" not in first and by_id[flood[-1]["event_id"]] == 2
    assert repeats["coalesced"] == {
        "events": 49,
        "first_event_id": flood[1]["event_id"],
        "first_event_ts": flood[1]["event_ts"],
    }
    assert "\n49 loop events like this in 0.0 s (this is the last)\n" in repeats["text"]
    # the repeats waited for the window
    assert webhook.times[2] - webhook.times[by_id[flood[0]["event_id"]]] >= 0.45
    assert notifier.metrics.value("loopfuse_notify_coalesced_total") == 48
    assert records.committed == {0: 51}


async def test_an_event_the_webhook_keeps_failing_does_not_hold_up_the_others() -> None:
    events = critical_loop_events(20)
    poison = events[0]["event_id"]
    with Webhook(answer=lambda p: 500 if p["loop_event"]["event_id"] == poison else 200) as hook:
        notifier = Notifier(
            hook.url,
            Delivery(backoff=0.5, concurrency=2),
            Shaping(rate=0),
            poll_seconds=0.02,
        )
        records = Records(*events)
        records.end = False
        stop = asyncio.Event()
        task = asyncio.create_task(notifier.run(records, stop, drain_seconds=0))
        started = time.monotonic()
        while len(hook.received) < 19 and time.monotonic() - started < 10:
            await asyncio.sleep(0.01)
        others = time.monotonic() - started
        hook.answer = None  # the webhook takes it after all
        while len(hook.received) < 20 and time.monotonic() - started < 20:
            await asyncio.sleep(0.05)
        stop.set()
        await task

    assert others < 0.5  # all 19 went while the first was being retried
    assert sorted(hook.event_ids()) == sorted(e["event_id"] for e in events)
    assert hook.event_ids()[-1] == poison
    assert records.committed == {0: 20}


async def test_an_outage_holds_records_uncommitted_and_pauses_reading_then_delivers_all() -> None:
    events = critical_loop_events(30)
    with Webhook(answer=lambda p: 500) as hook:
        notifier = Notifier(
            hook.url, Delivery(backoff=0.02), Shaping(rate=0, max_pending=10), poll_seconds=0.02
        )
        records = Records(*events, batch=4)
        records.end = False
        stop = asyncio.Event()
        task = asyncio.create_task(notifier.run(records, stop))
        await asyncio.sleep(0.5)
        during = (records.read, dict(records.committed), records.paused)
        hook.answer = None  # the webhook is back
        started = time.monotonic()
        while len(hook.received) < 30 and time.monotonic() - started < 10:
            await asyncio.sleep(0.02)
        stop.set()
        await task

    # 10 held (+ the rest of a batch), reading paused, nothing committed past offset 0
    assert during == (12, {0: 0}, True)
    assert sorted(hook.event_ids()) == sorted(e["event_id"] for e in events)
    assert records.committed == {0: 30}


async def test_a_stop_with_posts_undelivered_commits_only_the_delivered_ones() -> None:
    events = critical_loop_events(6)
    failing = {events[2]["event_id"], events[4]["event_id"]}
    with Webhook(answer=lambda p: 500 if p["loop_event"]["event_id"] in failing else 200) as hook:
        notifier = Notifier(hook.url, Delivery(backoff=0.05), Shaping(rate=0), poll_seconds=0.02)
        records = Records(*events)
        records.end = False
        stop = asyncio.Event()
        task = asyncio.create_task(notifier.run(records, stop, drain_seconds=0.3))
        while len(hook.received) < 4:
            await asyncio.sleep(0.01)
        stop.set()  # SIGTERM
        await task

    assert len(hook.received) == 4
    assert records.committed == {0: 2}  # offset 2 is read again at the next start
    assert notifier.pending == 2


async def test_a_429_pauses_every_post_for_its_retry_after() -> None:
    with Webhook() as hook:
        hook.answer = lambda p: (429, {"Retry-After": "1"}) if hook.attempts == 1 else 200
        notifier = Notifier(hook.url, Delivery(concurrency=1), Shaping(rate=0), poll_seconds=0.02)
        await notifier.run(Records(*critical_loop_events(3)))

    assert len(hook.received) == 3 and hook.attempts == 4
    assert min(hook.times[1:]) - hook.times[0] >= 1.0
    assert notifier.metrics.value("loopfuse_notify_rate_limited_total") == 1
    assert notifier.metrics.value("loopfuse_notify_retries_total") == 0


async def test_posts_are_rate_limited_with_a_burst(webhook: Webhook) -> None:
    notifier = _notifier(webhook.url, rate=20, burst=5)
    await notifier.run(Records(*critical_loop_events(15)))
    assert len(webhook.received) == 15
    assert webhook.times[4] - webhook.times[0] < 0.1  # the burst
    assert webhook.times[-1] - webhook.times[0] >= 0.45  # then 10 at 20 a second


def test_the_token_bucket_refills_at_its_rate() -> None:
    now = [0.0]
    bucket = TokenBucket(2.0, 2, lambda: now[0])
    assert [bucket.wait(), bucket.wait()] == [0.0, 0.0]
    assert bucket.wait() == pytest.approx(0.5)
    now[0] = 0.5
    assert bucket.wait() == 0.0
    bucket.hold(3.0)
    assert bucket.wait() == pytest.approx(3.0)


def test_metrics_are_served_with_the_failure_counter() -> None:
    notifier = _notifier("http://127.0.0.1:9/unused")
    notifier.metrics.failures.labels(reason="timeout").inc()
    server, thread = start_http_server(0, addr="127.0.0.1", registry=notifier.metrics.registry)
    try:
        port = server.server_address[1]
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
    assert b'loopfuse_notify_failures_total{reason="timeout"} 1.0' in text


SECRET_URL = "https://hooks.slack.example/services/T000/B000/sekrit-token"


def test_the_webhook_url_is_never_taken_from_the_command_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["notify", "--webhook", SECRET_URL]) == 2
    err = capsys.readouterr().err
    assert "LOOPFUSE_NOTIFY_WEBHOOK_URL" in err and "--webhook-file" in err
    assert "sekrit" not in err


def test_a_bad_webhook_url_or_file_is_one_line_without_the_url(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("LOOPFUSE_NOTIFY_WEBHOOK_FILE", raising=False)
    monkeypatch.setenv("LOOPFUSE_NOTIFY_WEBHOOK_URL", "ftp://sekrit-token@example")
    assert main(["notify"]) == 2
    assert capsys.readouterr().err == (
        "loopfuse notify: LOOPFUSE_NOTIFY_WEBHOOK_URL does not hold one http:// or https:// URL\n"
    )
    missing = tmp_path / "nope"
    assert main(["notify", "--webhook-file", str(missing)]) == 2
    assert capsys.readouterr().err == (
        f"loopfuse notify: cannot read the webhook file {missing}: No such file or directory\n"
    )
    monkeypatch.delenv("LOOPFUSE_NOTIFY_WEBHOOK_URL")
    assert main(["notify"]) == 2
    assert "no webhook: set LOOPFUSE_NOTIFY_WEBHOOK_URL" in capsys.readouterr().err
