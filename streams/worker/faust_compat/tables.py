"""The session table as a :class:`loopfuse.streams.worker.processor.SessionStore`."""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import faust
from faust.streams import _current_event


@dataclass(frozen=True, slots=True)
class _Message:
    topic: str
    partition: int


class _PartitionOnly:
    """Stands in for a Faust event where only the partition matters (table writes)."""

    __slots__ = ("__weakref__", "message")

    def __init__(self, topic: str, partition: int) -> None:
        self.message = _Message(topic, partition)


def session_table(
    app: faust.App, name: str, partitions: int, on_changelog: Any
) -> faust.Table[bytes, bytes]:
    """The session table: raw bytes in, raw bytes out, registered with the app.

    Faust derives a table's serializers from its key and value types and falls back
    to JSON, so the raw serializers are set before the table is registered (which
    creates its changelog topic). ``on_changelog`` is awaited for every changelog
    record read during recovery and by standbys.
    """
    table_class: Any = app.conf.Table
    table: faust.Table[bytes, bytes] = table_class(
        app,
        name=name,
        default=None,
        partitions=partitions,
        beacon=app.tables.beacon,
        on_changelog_event=on_changelog,
    )
    table.key_serializer = table.value_serializer = "raw"
    app.tables.add(table)
    return table


@dataclass(frozen=True, slots=True)
class _Queued:
    """What ``Table.on_key_set``/``on_key_del`` read of ``send_changelog``'s answer."""

    message: _Message


#: (partition, key, value) of a changelog record to send; value None: a tombstone.
ChangelogWrite = tuple[int, bytes, bytes | None]


class FaustSessionStore:
    """Session states in a Faust table, written to the right changelog partition.

    A plain Table picks the store and the changelog partition of a write from the
    *current event*, a context variable Faust sets while iterating a stream
    (``faust.streams._current_event``). The processor writes outside of Faust's
    stream iteration, so each write runs with a stand-in event of the key's own
    partition (all of a session's messages share one partition number), which is
    exactly what Faust would have used.

    Writes are held here, the newest per key, until :meth:`take_writes` (the
    worker's checkpoint, ``producer.Publisher``): with a thousand sessions most
    appear once in a batch, and a record per session per batch was the larger part
    of what the worker produced. ``get`` answers from the held writes first, so the
    processor reads its own writes.

    The changelog records are queued here (the table's ``send_changelog``) rather
    than sent through Faust's ``ProducerBuffer`` - a queue, a background task and a
    ``FutureMessage`` per write, which the worker then had to drain before
    acknowledging a batch. The worker sends :meth:`take_writes` itself
    (``producer.send_table_writes``), which also records each write's offset in the
    store as Faust's ``_on_changelog_sent`` does (RocksDB recovery starts after it).
    """

    def __init__(self, table: faust.Table[bytes, bytes], source_topic: str) -> None:
        self.table = table
        self.source_topic = source_topic
        self._stand_ins: dict[int, _PartitionOnly] = {}
        self._writes: list[ChangelogWrite] = []
        # key -> (partition, value) written since the last take_writes; None: deleted
        self._held: dict[bytes, tuple[int, bytes | None]] = {}
        changelog = table.changelog_topic.get_topic_name()

        def send_changelog(
            partition: int | None,
            key: Any,
            value: Any,
            key_serializer: Any = None,
            value_serializer: Any = None,
        ) -> _Queued:
            assert partition is not None  # partition_for_key: the stand-in event's
            self._writes.append((partition, key, value))
            return _Queued(_Message(changelog, partition))

        table.send_changelog = send_changelog  # type: ignore[method-assign,assignment]

    @property
    def holding(self) -> bool:
        """Whether writes wait for :meth:`take_writes`."""
        return bool(self._held)

    def take_writes(self) -> list[ChangelogWrite]:
        """Apply the held writes to the table; their changelog records, one per key."""
        held, self._held = self._held, {}
        table = self.table
        for key, (partition, value) in held.items():
            self._as_partition(partition)
            if value is not None:
                table[key] = value  # Faust persists (changelog) only on assignment
            elif key in table:  # a tombstone in the changelog
                del table[key]
            # else: written and deleted since the last take; the table never had it
        _current_event.set(None)
        writes, self._writes = self._writes, []
        return writes

    def _as_partition(self, partition: int) -> None:
        stand_in = self._stand_ins.get(partition)
        if stand_in is None:
            stand_in = self._stand_ins[partition] = _PartitionOnly(self.source_topic, partition)
        _current_event.set(weakref.ref(stand_in))  # type: ignore[arg-type]

    def get(self, key: bytes) -> bytes | None:
        held = self._held.get(key)
        if held is not None:
            return held[1]
        return self.table.get(key)

    def put(self, key: bytes, value: bytes, partition: int) -> None:
        self._held[key] = (partition, value)

    def delete(self, key: bytes, partition: int) -> None:
        self._held[key] = (partition, None)

    def keys_of(self, partition: int) -> Iterable[bytes]:
        """Keys kept for ``partition`` by a RocksDB store (``Store._dbs``, one db per
        partition); the memory store is rebuilt from the changelog, whose records the
        processor sees (``on_changelog``), so it has nothing to add."""
        dbs: Any = getattr(self.table.data, "_dbs", None)
        db = dbs.get(partition) if dbs else None
        if db is None:
            return []
        return [bytes(key) for key in db.keys()]  # noqa: SIM118 - rocksdict Rdict
