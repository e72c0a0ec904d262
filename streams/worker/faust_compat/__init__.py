"""Every Faust, aiokafka and rocksdict internal the worker touches, in one place.

loopfuse keeps Faust as its stream framework (consumer group, assignment, the
session table and its changelog, recovery, standbys, commits). Where Faust is slow
or wrong, the workaround lives here, one module per hole, each verified against the
versions below and pinned by a test that fails if an upgrade moves what it relies on.
The worker checks the installed versions at start-up (:func:`check_versions`) and
refuses to run on others. The last column is from disabling each one in turn and running
its tests on Apache Kafka 4.4.0: most holes are Faust's and exist whatever the
broker; one workaround is for the embedded broker alone.

| where | what it patches or reads | upstream cause | pinned by | needed on Apache Kafka |
|---|---|---|---|---|
| ``recovery.keep_queues_on_redundant_resume`` | ``app.flow_control.resume`` | a restart onto a backlog resumed flow twice and the second resume cleared queued input (``Recovery.on_recovery_completed``) | tests/unit/test_faust_fixes.py, tests/reliability/test_restart_backlog.py | **yes**: with it disabled, test_restart_backlog timed out with the backlog unjudged (2 of 2 runs on Kafka 4.4.0) |
| ``recovery.give_back_fetches_across_rebalances`` | ``AIOKafkaConsumerThread._fetch_records`` (per consumer thread); aiokafka ``Consumer.seek`` | a fetch waiting through a rebalance returned changelog records the main thread dropped (flow stopped), past which aiokafka had moved: recovery waited forever; an emptied live partition set made aiokafka return every partition | tests/integration/test_fetch_give_back.py, chaos (two workers) | **yes**: test_fetch_give_back fails without it on Kafka, and its pin of Faust's own fetch losing the records passes there (the hole is Faust's, not the broker's) |
| ``recovery.keep_commits_on_seek`` | ``Consumer.seek_to_committed`` (per consumer), read by ``perform_seek``; ``Consumer._committed_offset`` | a commit of ours during ``perform_seek``'s lookup was overwritten by the stale answer, and ``_new_offset`` then never committed that partition again | tests/unit/test_faust_compat.py, tests/reliability/test_restart_backlog.py | kept: a race in Faust's ``perform_seek``, broker-independent; no test reproduces it on Kafka (test_restart_backlog passed 2 of 2 without it), the unit test pins the fix |
| ``recovery.ChangelogRestore`` (via ``FetchBatches``) | ``Recovery.in_recovery``, ``.active_tps``, ``.active_highwaters``, ``.active_offsets``, ``._active_events_received_at``; ``Table.apply_changelog_batch``; ``faust.Event`` | recovery went record by record through the conductor, a queue and a task per record: ~3k records/s, 100k sessions took a minute | tests/integration/test_worker.py (restart onto a written changelog, memory and RocksDB), bench/recovery.py, chaos | speed only (the same restore without it; bench/recovery.py on 20k sessions: 4.6 s beyond an empty start-up without it, 0 with it) |
| ``delivery.FetchBatches`` | ``Consumer._wait_next_records`` (per consumer), ``.callback``; ``Consumer._read_offset``, ``._add_gap``, ``._acked``, ``._acked_index``, ``._n_acked``, ``._committed_offset``, ``._unacked_messages``, ``._waiting_for_ack``, ``._buffered_partitions``; ``Consumer.highwater`` (``TopicAlignment``) | Faust delivers message by message (a ``ConsumerMessage``, sensors, ``wait_first``, the conductor, a queue, stream iteration) and ``take_events`` waits to fill a batch the fetch already brought; the input topics' records are taken from each fetch whole, Faust's per-message bookkeeping done once per partition (a gap never starts before the last offset delivered: ``perform_seek`` reset read offsets below delivered messages, whose offsets then counted as a gap and were committed unjudged), and released across input topics in timestamp order (on a backlog, calls fetched ahead of their results were parked) | tests/unit/test_fetch_batches.py, tests/unit/test_faust_compat.py, tests/integration/test_worker.py, chaos | the delivery path, not separable; its phantom-gap rule alone: no test fails without it on Kafka while ``keep_queues_on_redundant_resume`` is in place |
| ``delivery.install_fast_delivery`` | ``Consumer.wait_first`` | mode's ``wait_first`` made four tasks per message delivered | tests/unit/test_faust_compat.py | speed only (no test needs it; no gain measured on a loaded machine: input now bypasses ``wait_first`` through ``FetchBatches``) |
| ``producer.idempotent_producer`` | ``Producer._settings_extra`` (per producer) | Faust sets ``enable_idempotence`` only inside exactly-once transactions: a batch resent after a partition leader's crash could be written twice or out of order | tests/unit/test_producer_settings.py | yes, on a replicated cluster (tests/reliability/test_cluster_faults.py); never on the embedded broker, which has no idempotent producer |
| ``producer.append_record`` (via ``_hand_over``) | aiokafka ``AIOKafkaProducer._message_accumulator.add_message``, ``._metadata``, ``._partitioner``, ``._key_serializer``/``._value_serializer``, ``._txn_manager``, ``._max_request_size``, ``._request_timeout_ms``; Faust ``Producer._producer``, ``.allow_headers`` | Faust's ``send`` and aiokafka's (a signal, the metadata wait, murmur2 in Python over a copied partition list) were a fifth of the busy main thread once the judge was native: 11.3 µs of CPU a record against 6.2 (bench/hand_over.py); records go to the accumulator with the partition ``send`` would pick (a key's cached), anything unusual through ``send`` | tests/integration/test_record_hand_over.py, tests/unit/test_faust_compat.py | speed only, broker-independent |
| ``producer.unreachable_leaders`` | ``app.producer._producer.client`` (aiokafka ``ready``), ``ClusterMetadata.leader_for_partition`` | no public probe of a partition leader's reachability: with two of three nodes down the survivor still answers metadata (its last image), so the broker probe alone said ready while nothing could be written | tests/reliability/test_cluster_faults.py (quorum loss) | yes, on a cluster only |
| ``producer.broker_metadata`` | ``app.producer._producer.client`` (aiokafka) | no public metadata probe (broker reachable, topics lost) | tests/reliability/test_broker_trouble.py | yes, broker-independent: it is the readiness probe (test_broker_trouble on Kafka) |
| ``consumer.FaustInputOffsets`` | ``Consumer.highwater``, ``Consumer._committed_offset``, aiokafka ``last_poll_timestamp`` via ``Consumer._thread._consumer`` | Faust exposes no read position, committed offset or fetch time per partition (watermarks, event clock, lag) | tests/unit/test_faust_compat.py, tests/integration/test_worker.py | yes, broker-independent: no upstream API |
| ``consumer.tune_fetch_wait`` | aiokafka ``Fetcher._fetch_max_wait_ms`` | Faust hard-codes a 1500 ms fetch long-poll, which Tansu always waits out | tests/unit/test_faust_compat.py | no: Kafka answers a fetch at its first record, so Faust's 1500 ms costs no latency; the worker still sets the wait, 500 ms on Kafka (a shorter one only polls: 14-18% of a core idle at 5 ms, bench/idle.py) and 5 ms on the embedded broker (``Settings.fetch_wait_ms``) |
| ``consumer.refresh_consumer_metadata`` | aiokafka ``client.force_metadata_update`` on Faust's consumer thread (``AIOKafkaConsumerThread._ensure_consumer``, ``call_thread``) | a group that joined while its topics were gone (a broker back empty) held no partitions until aiokafka's 5-minute metadata refresh: ready, judging nothing | tests/reliability/test_broker_trouble.py (``[empty]``) | yes: it failed 3 of 4 runs on Kafka 4.4.0 without it |
| ``tables.FaustSessionStore``, ``tables.session_table``, ``producer.send_table_writes`` | ``faust.streams._current_event``; rocksdict ``Store._dbs``; ``Table.key_serializer``/``value_serializer``; ``Table.send_changelog`` (per table), ``Store.set_persisted_offset`` | a table write outside stream iteration needs a current event for its partition; keys on disk per partition; Faust falls back to JSON unless raw serializers are set before registration; changelog records went through ``ProducerBuffer`` (a queue, a task and a ``FutureMessage`` per write, and a size that hid the record in hand-off, so a batch was once acked before its last changelog record): they are queued by the store and sent with the batch's messages | tests/integration, tests/unit/test_faust_compat.py | the store, not separable; the bypass of ``ProducerBuffer``: no test failed without it on Kafka (one run each), but the race it closed is broker-independent |
| ``assignment.prepare_consumer`` | (calls the consumer-side patches above in order) | the fetch loop binds its delivery callback once: everything must be in place before the fetcher starts | chaos, tests/reliability/test_restart_backlog.py | yes (installs the delivery path: without it no verdict came in 60 s on Kafka) |
| ``web.operators_only_web`` | ``faust.web.drivers.DRIVERS``, ``Web.*_blueprints`` | Faust serves ``/table`` (session state), ``/router`` and an index, the index with no setting | tests/integration/test_worker.py | yes, broker-independent: without it Faust serves ``/table`` on Kafka too (test_worker fails) |
| ``embedded_recovery`` | aiokafka ``FetchRequest``, ``AIOKafkaConsumerThread._highwaters`` | Tansu answers ``ListOffsets(latest)`` wrongly after multi-record batches, so recovery stopped early | tests/integration/test_end_offsets.py | **no: embedded broker only** (Kafka's ``ListOffsets`` is right, asserted by test_end_offsets; the worker installs it only with ``LOOPFUSE_EMBEDDED_BROKER``) |
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

#: The versions every workaround here was verified with (pyproject pins them).
SUPPORTED = {
    "faust-streaming": ("0.15.3",),
    "aiokafka": ("0.14.0",),
}


class UnsupportedVersion(RuntimeError):
    """An installed Faust or aiokafka that loopfuse's workarounds were not verified with."""


def check_versions() -> None:
    """Refuse to run on versions the workarounds here were not verified with."""
    wrong = []
    for package, supported in SUPPORTED.items():
        try:
            installed = version(package)
        except PackageNotFoundError:
            installed = "none"
        if installed not in supported:
            wrong.append(f"{package} {installed} (verified: {', '.join(supported)})")
    if wrong:
        raise UnsupportedVersion(
            "the worker's Faust/aiokafka workarounds (streams/worker/faust_compat) were not "
            f"verified with {'; '.join(wrong)}: install the verified versions "
            "(pip install -e .) or verify the workarounds and add the versions"
        )
