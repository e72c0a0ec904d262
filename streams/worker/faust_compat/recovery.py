"""Two fixes to Faust's consumer that keep a restarting worker from skipping input.

Found by the chaos test (``tests/reliability/chaos.py``): after a SIGKILL, the
restarted worker silently skipped hundreds of input messages that were already
in the topics (a backlog), and committed their offsets, so no later restart
read them again. Sessions then waited on ``seq`` gaps that could never fill.
The mechanism, in faust-streaming 0.15.3 (``Recovery.on_recovery_completed``):

1. table recovery ends; the input partitions are *resumed* (fetching starts),
   then ``perform_seek()`` looks up the committed offset of each partition, one
   request at a time, and seeks to it;
2. meanwhile fetched input messages are delivered into the agent's channel
   queue (flow control is active: it was resumed for the changelog read);
3. ``perform_seek()`` resets the consumer's "read offset" of every partition to
   its committed offset, although messages past it are already queued;
4. ``flow_control.resume()`` is called again, and resuming *clears every
   channel queue* (``mode.utils.queues.FlowControlEvent.clear``): the queued
   messages are dropped, but the consumer's position is already past them, so
   nothing fetches them again;
5. the next message delivered is far past the reset read offset, and Faust
   records the offsets in between as a "gap" (``Consumer._add_gap``): gap
   offsets count as acknowledged, so the next commit moves past them.

:func:`keep_queues_on_redundant_resume` stops step 4 (a resume that resumes
nothing drops nothing) and the input's hand-off stops step 5 (only offsets it
really never delivered count as a gap: ``delivery.FetchBatches._admit``); with both,
a queued message is neither dropped nor committed before it is judged. On Apache
Kafka the gap rule alone is not enough: with the first one disabled,
tests/reliability/test_restart_backlog.py timed out with the backlog unjudged in 2 of
2 runs (the dropped messages were never fetched again), while with only the gap rule
disabled it passed.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

import faust

log = logging.getLogger("loopfuse.worker")

_PATCHED = "_loopfuse_faust_fixes"


def keep_queues_on_redundant_resume(app: faust.App) -> None:
    """``app.flow_control.resume()`` clears the queues only if flow was suspended.

    Faust clears its channel queues on resume because after a *suspension* (a
    rebalance) whatever they hold predates the new assignment and is fetched
    again from the committed offsets. A resume while flow is already active has
    no such messages to discard, only live ones.
    """
    flow_control: Any = app.flow_control
    if getattr(flow_control, _PATCHED, False):
        return
    original = flow_control.resume

    def resume() -> None:
        if flow_control.is_active():
            return  # already flowing: nothing stale to clear
        original()

    flow_control.resume = resume
    setattr(flow_control, _PATCHED, True)


def give_back_fetches_across_rebalances(app: faust.App) -> None:
    """Records a fetch returns after flow stopped go back to aiokafka, not to waste.

    Found by the two-worker chaos test: a worker that kept its partitions through a
    rebalance never finished recovering one of them ("No event received for active
    tp ... since recovery start", not ready for good). In faust-streaming 0.15.3 the
    consumer thread's ``_fetch_records`` checks that flow is active only *before* it
    waits; aiokafka's ``fetched_records`` then waits out the rebalance
    (``wait_for_assignment``) and returns what it has once recovery has sought the
    changelog partitions and started fetching them. The main thread finds flow
    stopped (recovery resumes it a moment later) and drops the batch
    (``Consumer.getmany``), but aiokafka's position has moved past those records:
    recovery waits for offsets that never come again. Input partitions survive the
    same drop only because Faust seeks them back to the committed offsets.

    Two changes, in the consumer thread (where aiokafka lives):

    - a fetch answered while flow is stopped seeks each partition it returned back
      to the first record returned and hands nothing on: the next fetch after the
      resume gets them again;
    - the partitions a fetch asks for never read as "none": Faust passes its live
      set of active partitions, which a pause can empty while the fetch waits, and
      aiokafka reads an empty set as *every* partition (records Faust then drops).
    """
    consumer: Any = app.consumer
    thread = consumer._thread
    if getattr(thread, _PATCHED, False):
        return
    thread._fetch_records = keep_undelivered_records(
        thread._fetch_records, lambda: bool(consumer.flow_active)
    )
    setattr(thread, _PATCHED, True)


class _Requested:
    """The live set of partitions a fetch asks for, never falsy (see above)."""

    __slots__ = ("partitions",)

    def __init__(self, partitions: Any) -> None:
        self.partitions = partitions

    def __contains__(self, tp: object) -> bool:
        return tp in self.partitions

    def __bool__(self) -> bool:
        return True


def keep_undelivered_records(fetch: Any, flow_active: Any) -> Any:
    """Wrap a consumer thread's ``_fetch_records(consumer, partitions, timeout, max_records)``."""

    async def _fetch_records(
        consumer: Any,
        active_partitions: Any,
        timeout: float | None = None,
        max_records: int | None = None,
    ) -> Any:
        records = await fetch(
            consumer, _Requested(active_partitions), timeout=timeout, max_records=max_records
        )
        if records and not flow_active():
            log.info(
                "flow stopped while a fetch waited: %d records of %d partitions go back "
                "to be fetched again",
                sum(map(len, records.values())),
                len(records),
            )
            for tp, batch in records.items():
                if batch:
                    # revoked meanwhile (IllegalStateError): its position is not ours
                    with contextlib.suppress(Exception):
                        consumer.seek(tp, batch[0].offset)
            return {}
        return records

    return _fetch_records


class ChangelogRestore:
    """Table recovery at fetch speed: changelog records applied as they are fetched.

    Faust 0.15.3 restores a table one record at a time through its conductor, a
    channel queue and ``Recovery._slurp_changelogs`` (a task per ``wait_for`` per
    record): ~3k records/s on a 2-core machine, where a plain consumer reads the same
    changelog at >150k/s (bench/recovery.py). During recovery, the delivery callback
    (:class:`loopfuse.streams.worker.faust_compat.delivery.FetchBatches`) hands each record of an
    *active* changelog partition here instead, and it is applied at once with
    Faust's own bookkeeping: ``active_offsets`` (which ``need_recovery`` and the
    progress log read), the last-event time, skipping offsets already applied, and
    ``Table.apply_changelog_batch`` (the store, and RocksDB's persisted offsets).

    The partition's last record (its highwater) still goes Faust's way, so Faust
    itself sees recovery complete and signals its end; standby partitions, and
    everything outside recovery, go Faust's way too. Records are applied in offset
    order and never buffered, so nothing applied here can land after a newer record
    Faust applied.
    """

    def __init__(self, app: faust.App, table: Any, on_changelog: Any) -> None:
        self.app = app
        self.table = table
        self.on_changelog = on_changelog  # (key, value, partition): the processor's hook
        self.applied = 0

    def take(self, message: Any) -> bool:
        """Apply ``message`` if it is a record recovery is waiting for; False: Faust's way."""
        tables: Any = self.app.tables
        recovery = tables.recovery
        if not recovery.in_recovery:
            return False
        tp = message.tp
        if tp not in recovery.active_tps:
            return False
        last = recovery.active_highwaters.get(tp)
        if last is None or message.offset >= last:
            return False  # Faust applies the last one and signals the end itself
        seen = recovery.active_offsets.get(tp)
        if seen is not None and message.offset <= seen:
            return True  # applied already (a fetch again after a seek)
        recovery.active_offsets[tp] = message.offset
        recovery._active_events_received_at[tp] = time.monotonic()
        self.table.apply_changelog_batch(
            [faust.Event(self.app, message.key, message.value, message.headers, message)]
        )
        self.on_changelog(message.key, message.value, message.partition)
        self.applied += 1
        return True


def recovery_progress(app: faust.App) -> int | None:
    """How far table recovery has read (the sum of its active offsets); None when the
    worker is not recovering. Read by the stall watch of ``/livez``."""
    tables: Any = app.tables
    recovery = tables.recovery
    if not recovery.in_recovery:
        return None
    return int(sum(offset for offset in recovery.active_offsets.values() if offset is not None))


def keep_commits_on_seek(app: faust.App) -> None:
    """A seek to the committed offsets never goes back past a commit of our own.

    Found by ``tests/reliability/test_restart_backlog.py`` (commits stopped for good
    after a restart). ``Consumer.perform_seek`` looks the committed offsets up from
    the broker, one partition at a time, while input already flows and the commit
    timer runs; when a commit of ours lands during the lookup, the stale answer then
    overwrites ``Consumer._committed_offset`` *below* it. The re-fetched records
    between the two are dropped as already read, so they are never acknowledged
    again, and ``_new_offset`` refuses to commit past a head that is more than one
    offset above ``_committed_offset``: no commit ever again, for that partition.
    Here the lookup's answer is the later of the broker's and our own: every offset
    below a commit of ours was judged and its outputs flushed before it was committed.
    """
    consumer: Any = app.consumer
    if getattr(consumer, _PATCHED_SEEK, False):
        return
    consumer.seek_to_committed = latest_commits(
        consumer.seek_to_committed, consumer._committed_offset
    )
    setattr(consumer, _PATCHED_SEEK, True)


_PATCHED_SEEK = "_loopfuse_commits_kept_on_seek"


def latest_commits(seek_to_committed: Any, ours: Any) -> Any:
    """Wrap ``seek_to_committed()``: each offset the later of its answer and ``ours``."""

    async def seek() -> Any:
        found = await seek_to_committed()
        return {
            tp: offset if offset is None or (ours.get(tp) or 0) <= offset else ours[tp]
            for tp, offset in found.items()
        }

    return seek
