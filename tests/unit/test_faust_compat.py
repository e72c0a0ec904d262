"""The Faust / aiokafka internals streams/worker/faust_compat relies on are still there.

Each workaround names what it patches or reads (see the table in
streams/worker/faust_compat/__init__.py); an upgrade that moves one fails here, by name,
rather than silently in production. The behaviour of each is pinned by the tests
the table lists.
"""

from __future__ import annotations

import inspect

import pytest

from loopfuse.streams.worker import faust_compat
from loopfuse.streams.worker.faust_compat import UnsupportedVersion, check_versions


def test_the_installed_versions_are_the_verified_ones() -> None:
    check_versions()


def test_other_versions_are_refused_with_a_clear_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(faust_compat.SUPPORTED, "faust-streaming", ("9.9.9",))
    with pytest.raises(UnsupportedVersion, match=r"faust-streaming 0\.15\.3 \(verified: 9\.9\.9\)"):
        check_versions()


def test_the_internals_the_workarounds_touch_exist() -> None:
    from aiokafka.consumer.consumer import AIOKafkaConsumer
    from aiokafka.consumer.fetcher import Fetcher
    from faust.streams import _current_event
    from faust.tables.base import Collection
    from faust.tables.table import Table
    from faust.transport.consumer import Consumer
    from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread
    from faust.web.base import Web
    from faust.web.drivers import DRIVERS
    from mode.utils.queues import FlowControlEvent

    # tables: changelog records go through send_changelog (queued by the store), and
    # a sent record's offset is kept in the store as _on_changelog_sent keeps it
    assert "self.send_changelog(" in inspect.getsource(Table.on_key_set)
    assert "self.send_changelog(" in inspect.getsource(Table.on_key_del)
    assert "fut.message.partition" in inspect.getsource(Table.on_key_set)
    assert "self.data.set_persisted_offset(" in inspect.getsource(Collection._on_changelog_sent)
    # recovery: flow control resume, the gap bookkeeping and the delivery callback
    assert callable(FlowControlEvent.resume) and callable(FlowControlEvent.is_active)
    assert inspect.iscoroutinefunction(Consumer._add_gap)
    assert "callback(message)" in inspect.getsource(Consumer._drain_messages)
    assert "self.wait_first(" in inspect.getsource(Consumer._drain_messages)
    # recovery: the consumer thread's fetch (flow checked before the wait only) and
    # aiokafka reading a falsy partition set as "all partitions"
    assert inspect.iscoroutinefunction(AIOKafkaConsumerThread._fetch_records)
    assert "if partitions and tp not in partitions" in inspect.getsource(Fetcher.fetched_records)
    # recovery at fetch speed: Faust's bookkeeping ChangelogRestore keeps, and the
    # rule it shares with _slurp_changelogs (an offset is applied once, in order)
    from faust.tables.recovery import Recovery

    assert "self.in_recovery = True" in inspect.getsource(Recovery._set_recovery_started)
    recovery_init = inspect.getsource(Recovery.__init__)
    for attribute in (
        "active_tps",
        "active_highwaters",
        "active_offsets",
        "_active_events_received_at",
    ):
        assert f"self.{attribute} =" in recovery_init, attribute
    assert "offset > seen_offset" in inspect.getsource(Recovery)  # in _slurp_changelogs
    assert "value - 1" in inspect.getsource(Recovery._build_highwaters)  # the last offset
    # delivery: whole fetches taken from _wait_next_records before Faust's loop,
    # with the per-partition bookkeeping Faust's loop and ack keep per message
    assert "await self._wait_next_records(timeout)" in inspect.getsource(Consumer.getmany)
    consumer_init = inspect.getsource(Consumer.__init__)
    for attribute in (
        "_read_offset",
        "_acked",
        "_acked_index",
        "_unacked_messages",
        "_waiting_for_ack",
        "_buffered_partitions",
    ):
        assert f"self.{attribute} =" in consumer_init, attribute
    assert Consumer._n_acked == 0
    assert "message.acked" in inspect.getsource(Consumer._clean_unacked_messages)
    ack = inspect.getsource(Consumer.ack)
    assert "acked_index.add(offset)" in ack and "acked_for_tp.append(offset)" in ack
    assert "offset >= r_offset" in inspect.getsource(Consumer._drain_messages)
    # consumer: committed offsets kept per partition, the consumer thread's aiokafka
    # consumer, its fetch wait and last fetch answer time
    assert "_committed_offset" in inspect.getsource(Consumer.__init__)
    assert "_consumer" in inspect.getsource(AIOKafkaConsumerThread)
    assert "self._fetch_max_wait_ms" in inspect.getsource(Fetcher.__init__)
    assert callable(AIOKafkaConsumer.last_poll_timestamp)
    assert inspect.iscoroutinefunction(AIOKafkaConsumerThread._highwaters)
    # tables: the current event a write takes its partition from
    assert _current_event.get(None) is None
    # producer: what append_record reads of aiokafka's producer, the partitioner call
    # its send makes, and the accumulator's append it skips to
    from aiokafka.producer.message_accumulator import MessageAccumulator
    from aiokafka.producer.producer import AIOKafkaProducer

    producer_init = inspect.getsource(AIOKafkaProducer.__init__)
    for attribute in (
        "_metadata",
        "_message_accumulator",
        "_partitioner",
        "_key_serializer",
        "_value_serializer",
        "_txn_manager",
        "_max_request_size",
        "_request_timeout_ms",
    ):
        assert f"self.{attribute} =" in producer_init, attribute
    assert "self._partitioner(serialized_key, all_partitions, available)" in inspect.getsource(
        AIOKafkaProducer._partition
    )
    assert "self._message_accumulator.add_message(" in inspect.getsource(AIOKafkaProducer.send)
    assert list(inspect.signature(MessageAccumulator.add_message).parameters) == [
        "self",
        "tp",
        "key",
        "value",
        "timeout",
        "timestamp_ms",
        "headers",
    ]
    # web: the driver registry and the blueprint lists a driver may empty
    assert isinstance(DRIVERS.data, dict)
    assert {
        "default_blueprints",
        "production_blueprints",
        "debug_blueprints",
        "optional_blueprints",
    } <= set(dir(Web))


def test_the_operators_only_web_driver_mounts_no_faust_view() -> None:
    from faust.web.drivers import by_url

    from loopfuse.streams.worker.faust_compat.web import operators_only_web

    driver = by_url(operators_only_web())
    assert driver.__name__ == "OperatorsOnlyWeb"
    assert not (
        driver.default_blueprints
        or driver.production_blueprints
        or driver.debug_blueprints
        or driver.optional_blueprints
    )


async def test_a_seek_to_the_committed_offsets_never_goes_back_past_our_own_commit() -> None:
    from faust.types import TP

    from loopfuse.streams.worker.faust_compat.recovery import latest_commits

    ours: dict[TP, int | None] = {TP("in", 0): 40}

    async def broker_lookup() -> dict[TP, int | None]:
        # the lookup is on its way while the commit timer commits offset 52 of ours
        ours[TP("in", 1)] = 52
        return {TP("in", 0): 45, TP("in", 1): 30, TP("in", 2): None}

    found = await latest_commits(broker_lookup, ours)()
    # partition 0: the broker is ahead (another worker's commit, say); partition 1: our
    # commit landed during the lookup; partition 2: nothing committed anywhere
    assert found == {TP("in", 0): 45, TP("in", 1): 52, TP("in", 2): None}


def test_perform_seek_takes_committed_offsets_from_seek_to_committed() -> None:
    from faust.transport.consumer import Consumer

    source = inspect.getsource(Consumer.perform_seek)
    assert "await self.seek_to_committed()" in source
    assert "self._committed_offset.update(" in source
