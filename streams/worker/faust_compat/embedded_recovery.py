"""Faust's table recovery on the embedded broker: end offsets from Fetch, not ListOffsets.

Faust decides that table recovery is finished when the changelog position
reaches the end offsets. Tansu (the embedded broker) answers ``ListOffsets``
wrongly after multi-record batches (:mod:`loopfuse.streams.end_offsets`), so a
restarted worker stopped recovery early and silently lost the last table updates.
:func:`install_end_offset_workaround` makes Faust's recovery use
:func:`~loopfuse.streams.end_offsets.fetch_end_offsets`; the worker applies it only
against the embedded broker. Pinned by tests/integration/test_end_offsets.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from loopfuse.streams.end_offsets import fetch_end_offsets

if TYPE_CHECKING:
    import faust

__all__ = ["end_offset_workaround_installed", "install_end_offset_workaround"]

_APP_FLAG = "_loopfuse_end_offsets_via_fetch"
_PATCH_MARKER = "__loopfuse_end_offset_workaround__"


def install_end_offset_workaround(app: faust.App) -> None:
    """Make ``app``'s table recovery take end offsets from Fetch, not ListOffsets.

    Use only when the worker runs against the embedded (Tansu) broker: on
    Apache Kafka ListOffsets is already correct, and there is no reason to
    lean on aiokafka internals. (Harmless there, though: the tests pass on both.)

    Faust 0.15.3's recovery (``faust.tables.recovery.Recovery._build_highwaters``)
    calls ``app.consumer.highwaters(*tps)``, which the aiokafka driver runs as
    ``AIOKafkaConsumerThread._highwaters`` on the consumer's thread, and that
    calls aiokafka's ``end_offsets()`` (ListOffsets). Patching that one method
    is the narrowest change: nothing else in Faust calls it. The patch is on
    the class (the consumer thread does not exist yet when a worker is being
    configured, and creating it early would bind it to the wrong event loop),
    but it only changes behaviour for apps passed here: any other app in the
    process keeps ListOffsets. Idempotent; transactional consumers
    (exactly-once, which Tansu cannot run anyway) keep Faust's own path.
    """
    from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread

    setattr(app, _APP_FLAG, True)
    current = AIOKafkaConsumerThread._highwaters
    if getattr(current, _PATCH_MARKER, False):
        return
    original = current

    async def _highwaters(self: AIOKafkaConsumerThread, partitions: list[Any]) -> Mapping[Any, int]:
        if not getattr(self.app, _APP_FLAG, False) or self.consumer.in_transaction:
            return await original(self, partitions)
        # Runs on the consumer thread's loop, like the original, so the
        # aiokafka consumer is used from its own loop.
        return await fetch_end_offsets(self._ensure_consumer(), partitions)

    setattr(_highwaters, _PATCH_MARKER, True)
    _highwaters.__wrapped__ = original  # type: ignore[attr-defined]
    _highwaters.__qualname__ = original.__qualname__
    _highwaters.__doc__ = original.__doc__
    AIOKafkaConsumerThread._highwaters = _highwaters  # type: ignore[method-assign]


def end_offset_workaround_installed(app: faust.App) -> bool:
    """True when :func:`install_end_offset_workaround` is in effect for ``app``."""
    from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread

    return bool(getattr(app, _APP_FLAG, False)) and bool(
        getattr(AIOKafkaConsumerThread._highwaters, _PATCH_MARKER, False)
    )
