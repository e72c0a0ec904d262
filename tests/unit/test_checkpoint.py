"""The worker's checkpoint (faust_compat.producer.Publisher): the order at-least-once
rests on. A batch is acknowledged (its offsets may be committed) only once the broker
has every output sent before it and the state writes it made are with the producer;
the writes go after the outputs, never before."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from aiokafka.errors import KafkaTimeoutError

from loopfuse.streams.worker.faust_compat.producer import Publisher


class _Producer:
    """Hands back a future per record that the test resolves (the broker's answer)."""

    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.futures: dict[bytes, list[asyncio.Future[Any]]] = {}

    async def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        partition: int | None,
        timestamp: None,
        headers: Any,
    ) -> Any:
        assert key is not None
        self.log.append(f"send {topic} {key.decode()}")
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.futures.setdefault(key, []).append(future)
        return future

    def answer(self, key: bytes, error: BaseException | None = None) -> None:
        future = self.futures[key][-1]
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(SimpleNamespace(topic="t", partition=0, offset=1))


class _Store:
    """Holds writes as FaustSessionStore does; ``take_writes`` gives their records."""

    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.held: dict[bytes, bytes] = {}

    @property
    def holding(self) -> bool:
        return bool(self.held)

    def take_writes(self) -> list[tuple[int, bytes, bytes | None]]:
        held, self.held = self.held, {}
        return [(0, key, value) for key, value in held.items()]


def _publisher(interval: float = 0.5) -> tuple[Publisher, _Producer, _Store, list[str]]:
    log: list[str] = []
    producer, store = _Producer(log), _Store(log)
    table = SimpleNamespace(
        changelog_topic=SimpleNamespace(get_topic_name=lambda: "changelog"),
        data=SimpleNamespace(set_persisted_offset=lambda tp, offset: None),
    )
    app = SimpleNamespace(producer=producer)

    def ack(batch: list[Any]) -> None:
        log.append(f"ack {batch[0]}")

    publisher = Publisher(app, table, store, ack, interval=interval)  # type: ignore[arg-type]
    return publisher, producer, store, log


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_batch_is_acked_after_its_outputs_are_on_the_broker_and_its_writes_sent() -> None:
    publisher, producer, store, log = _publisher()
    await publisher.send([("verdicts", b"v1", b"{}", None)], ["batch-1"])
    store.held[b"s1"] = b"state-1"
    await publisher.send([("loop_events", b"e2", b"{}", None)], ["batch-2"])
    store.held[b"s1"] = b"state-2"  # the same session again: one record, the newest
    assert log == ["send verdicts v1", "send loop_events e2"]  # nothing acked yet

    checkpoint = asyncio.ensure_future(publisher.checkpoint())
    await _settle()
    producer.answer(b"v1")
    await _settle()
    assert not checkpoint.done()
    assert log[-1] == "send loop_events e2"  # no write while an output is unanswered
    producer.answer(b"e2")
    await checkpoint
    assert log == [
        "send verdicts v1",
        "send loop_events e2",
        "send changelog s1",
        "ack batch-1",
        "ack batch-2",
    ]


async def test_an_output_the_broker_refused_is_sent_again_before_anything_is_acked() -> None:
    publisher, producer, store, log = _publisher()
    await publisher.send([("verdicts", b"v1", b"{}", None)], ["batch-1"])
    store.held[b"s1"] = b"state-1"
    checkpoint = asyncio.ensure_future(publisher.checkpoint())
    await _settle()
    producer.answer(b"v1", KafkaTimeoutError())
    for _ in range(50):  # the retry waits 0.1 s
        await asyncio.sleep(0.01)
        if len(producer.futures[b"v1"]) == 2:
            break
    assert log == ["send verdicts v1", "send verdicts v1"]
    producer.answer(b"v1")
    await checkpoint
    assert log[2:] == ["send changelog s1", "ack batch-1"]


async def test_a_checkpoint_is_due_once_something_waited_for_the_interval() -> None:
    publisher, _, store, _ = _publisher(interval=0.05)
    await publisher.checkpoint()
    assert not publisher.due  # nothing waits
    await publisher.send([], ["batch-1"])
    assert not publisher.due  # not for long enough
    await asyncio.sleep(0.06)
    assert publisher.due
    await publisher.checkpoint()
    assert not publisher.due
    store.held[b"s1"] = b"a timer's write"
    await asyncio.sleep(0.06)
    assert publisher.due


async def test_a_timers_messages_are_checkpointed_at_once_with_the_batches_before_them() -> None:
    publisher, producer, store, log = _publisher(interval=60)
    await publisher.send([("verdicts", b"v1", b"{}", None)], ["batch-1"])
    store.held[b"s1"] = b"released"
    call = asyncio.ensure_future(publisher([("verdicts", b"v2", b"{}", None)]))
    await _settle()
    producer.answer(b"v1")
    producer.answer(b"v2")
    await call
    assert log == ["send verdicts v1", "send verdicts v2", "send changelog s1", "ack batch-1"]
