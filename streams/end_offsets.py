"""End offsets taken from a Fetch response: right on every Kafka-protocol broker.

Tansu 0.6 (the embedded broker, see :mod:`loopfuse.streams.local.broker`) answers
``ListOffsets(latest)`` with *the last batch's base offset + 1* instead of the
high watermark. Measured with aiokafka 0.14: after one producer batch of 100
records to an empty partition ``end_offsets()`` says 1, after a further batch
of 50 it says 101 (truth: 150); it is only right when the last batch held a
single record. The high watermark carried by every Fetch response is correct.
:func:`fetch_end_offsets` reads it; the worker's table recovery uses it on the
embedded broker (:mod:`loopfuse.streams.worker.faust_compat.embedded_recovery`), and so do
the readers of the output topics. It leans on aiokafka internals (named in comments),
pinned by pyproject; tests/integration/test_end_offsets.py fails loudly if an upgrade
moves them.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka import errors as kafka_errors
from aiokafka.protocol.fetch import FetchRequest

# aiokafka.consumer.fetcher.READ_COMMITTED (isolation level on the wire).
_READ_COMMITTED = 1

# Tansu answers a Fetch with max_wait_time=0 with *no topics at all*, and with
# no data available it sleeps for the whole max_wait. So ask for 1 ms and
# back off to larger waits only if a response came back without our partition.
_FIRST_MAX_WAIT_MS = 1
_MAX_MAX_WAIT_MS = 100
# One byte: brokers still return the first batch at the fetch position (both
# Kafka, KIP-74, and Tansu do), so this caps the payload we fetch and drop at
# one batch per partition.
_FETCH_MAX_BYTES = 1


async def fetch_end_offsets(
    consumer: AIOKafkaConsumer,
    partitions: Iterable[TopicPartition],
    *,
    timeout: float | None = None,
) -> dict[TopicPartition, int]:
    """End offsets (high watermarks; LSOs for read_committed) taken from Fetch responses.

    ``consumer`` must be started. Its positions, assignment, buffered records
    and fetch state are untouched: this sends its own one-off Fetch requests
    through the consumer's client (its connections and metadata), so it is safe
    on Faust's consumer while Faust is using it. Keys of the result are the
    objects passed in (Faust's ``TP`` and aiokafka's ``TopicPartition`` are
    interchangeable namedtuples). Raises ``TimeoutError`` after ``timeout``
    seconds (default: the consumer's request timeout).

    Usually one round trip per partition leader: a Fetch from offset 0 (no
    ListOffsets at all). Only a partition whose log no longer starts at 0 on a
    broker that enforces it (Apache Kafka after retention: OFFSET_OUT_OF_RANGE)
    costs a ListOffsets(earliest) and a second Fetch from the log start.
    """
    requested = list(dict.fromkeys(partitions))
    if not requested:
        return {}
    if timeout is None:
        timeout = consumer._request_timeout_ms / 1000
    async with asyncio.timeout(timeout):
        return await _fetch_end_offsets(consumer, requested)


async def _fetch_end_offsets(
    consumer: AIOKafkaConsumer, requested: list[TopicPartition]
) -> dict[TopicPartition, int]:
    from aiokafka.client import ConnectionGroup

    client = consumer._client  # aiokafka.client.AIOKafkaClient
    read_committed = consumer._fetcher._isolation_level == _READ_COMMITTED
    backoff: float = client._retry_backoff
    for topic in {tp.topic for tp in requested}:
        await client._wait_on_metadata(topic)  # leaders; raises for unknown topics

    # Match response entries on plain (topic, partition) keys.
    wanted = {TopicPartition(tp.topic, tp.partition): tp for tp in requested}
    positions = dict.fromkeys(wanted, 0)  # partition -> offset to fetch from
    found: dict[TopicPartition, int] = {}
    max_wait_ms = _FIRST_MAX_WAIT_MS

    while positions:
        by_node: dict[int, dict[str, list[tuple[int, int, int]]]] = defaultdict(
            lambda: defaultdict(list)
        )
        refresh_metadata = False
        for tp, position in positions.items():
            node_id = client.cluster.leader_for_partition(tp)
            if node_id is None or node_id < 0:
                refresh_metadata = True
                continue
            by_node[node_id][tp.topic].append((tp.partition, position, _FETCH_MAX_BYTES))

        requests = [
            (
                node_id,
                FetchRequest(
                    max_wait_ms,
                    1,  # min_bytes
                    _FETCH_MAX_BYTES,
                    # Same isolation as the consumer, so the answer means what
                    # its end_offsets() means (HW, or LSO for read_committed).
                    _READ_COMMITTED if read_committed else 0,
                    list(topics.items()),
                ),
            )
            for node_id, topics in by_node.items()
        ]
        # Sent on the client's COORDINATION connection to the leader, not the
        # DEFAULT one: brokers (Kafka and Tansu) answer one request at a time
        # per connection, and the consumer's own fetcher keeps a long-poll Fetch
        # on DEFAULT (Faust: 1.5 s), so a request there waits behind it. The
        # coordination connection carries only short group requests once the
        # group is joined. No fetch session is used (aiokafka sends session id 0,
        # final epoch), so this leaves the consumer's fetch state alone.
        results = await asyncio.gather(
            *(
                client.send(node_id, request, group=ConnectionGroup.COORDINATION)
                for node_id, request in requests
            ),
            return_exceptions=True,
        )
        out_of_range: list[TopicPartition] = []
        for result in results:
            if isinstance(result, kafka_errors.KafkaError) and result.retriable:
                refresh_metadata |= bool(result.invalid_metadata)
                continue
            if isinstance(result, BaseException):
                raise result
            refresh_metadata |= _read_fetch_response(
                result, positions, found, out_of_range, read_committed
            )

        if out_of_range:
            # Rare: retention moved the log start. Fetch again from there.
            positions.update(await consumer.beginning_offsets(out_of_range))
        elif positions:
            # Partitions missing from the response (or retriable errors).
            if refresh_metadata:
                await client.force_metadata_update()
            await asyncio.sleep(backoff)
            max_wait_ms = min(max_wait_ms * 4, _MAX_MAX_WAIT_MS)

    return {orig: found[key] for key, orig in wanted.items()}


def _read_fetch_response(
    response: Any,
    positions: dict[TopicPartition, int],
    found: dict[TopicPartition, int],
    out_of_range: list[TopicPartition],
    read_committed: bool,
) -> bool:
    """Move answered partitions from ``positions`` to ``found``.

    Returns True when an error asks for a metadata refresh. OFFSET_OUT_OF_RANGE
    partitions are appended to ``out_of_range``; other non-retriable errors are
    raised; partitions missing from the response stay pending.
    """
    refresh = False
    for topic, partitions in response.topics:
        for partition, error_code, highwater, *rest in partitions:
            tp = TopicPartition(topic, partition)
            if tp not in positions:
                continue
            error_type = kafka_errors.for_code(error_code)
            if error_type is kafka_errors.NoError:
                # FetchResponse v4+: rest[0] is last_stable_offset.
                if read_committed and response.API_VERSION >= 4:
                    found[tp] = int(rest[0])
                else:
                    found[tp] = int(highwater)
                del positions[tp]
            elif error_type is kafka_errors.OffsetOutOfRangeError:
                out_of_range.append(tp)
            elif error_type.retriable:
                refresh |= bool(error_type.invalid_metadata)
            else:
                raise error_type(f"fetching the end offset of {tp}")
    return refresh
