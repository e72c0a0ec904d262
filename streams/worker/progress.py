"""How far the worker has read each input: the watermark that lets a ``seq`` gap go.

A session's events arrive on three topics (tool calls, tool results, compactions)
that share a partition number but are read independently. Normally they are
interleaved within milliseconds; while a worker works through a backlog (after a
restart, a rebalance or an outage) one topic can be read thousands of events
ahead of another. The engine parks a session's early events until the missing
one arrives, and gives a gap up only when the input has moved on without it (see
``Engine._release_gaps``): "moved on" has to mean *every* topic the missing event
could come from, or a backlog read unevenly gives up gaps that are merely late
and verdicts stop being a function of the session's events in ``seq`` order.

The watermark of a partition number is therefore the lowest event time reached
over its input topics, where a topic-partition with nothing left to read (judged
up to its high watermark) does not hold it back: an idle topic - compactions are
rare - must not stop gaps from ever being given up.

The same bookkeeping gives idle expiry its *event clock* (:meth:`InputProgress.event_clock`):
how far in time every input of a partition is judged, so that a worker reading one
topic late does not take a live session for an idle one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

#: Returns the next offset to read of (topic, partition), or None when unknown.
OffsetLookup = Callable[[str, int], "int | None"]

#: Watermark while a lagging topic-partition has not yielded an event yet: no event
#: time has been reached there, so no gap can be given up on by time.
NOTHING_READ = 0


class InputProgress:
    """Per input topic-partition: the next offset to judge and the latest event time judged."""

    def __init__(self, topics: Iterable[str]) -> None:
        self.topics = tuple(topics)
        self._next_offset: dict[tuple[str, int], int] = {}
        self._event_time: dict[tuple[str, int], int] = {}
        # wall time of the latest fetch answer whose end offset was seen judged
        self._caught_up_at: dict[tuple[str, int], int] = {}

    def judged(self, topic: str, partition: int, offset: int, event_ts: int | None) -> None:
        """Record a message handed to the engine (``event_ts`` None: it was not an event)."""
        key = (topic, partition)
        if offset + 1 > self._next_offset.get(key, 0):
            self._next_offset[key] = offset + 1
        if event_ts is not None and event_ts > self._event_time.get(key, NOTHING_READ):
            self._event_time[key] = event_ts

    def _position(self, topic: str, partition: int, committed: OffsetLookup) -> int:
        """The next offset to judge: past what we judged, and at least where judging began."""
        return max(self._next_offset.get((topic, partition), 0), committed(topic, partition) or 0)

    def lag(
        self, topic: str, partition: int, highwater: OffsetLookup, committed: OffsetLookup
    ) -> int | None:
        """Records of an input partition not judged yet, as of the consumer's last fetch."""
        end = highwater(topic, partition)
        if end is None:
            return None
        return max(0, end - self._position(topic, partition, committed))

    def forget(self, partitions: Iterable[int]) -> None:
        """Drop what we know of these partition numbers (revoked, or assigned afresh)."""
        gone = set(partitions)
        for table in (self._next_offset, self._event_time, self._caught_up_at):
            for key in [key for key in table if key[1] in gone]:
                del table[key]

    def watermark(
        self,
        partition: int,
        highwater: OffsetLookup,
        committed: OffsetLookup,
        answered_at: OffsetLookup | None = None,
    ) -> int | None:
        """Event time every input topic of ``partition`` has been judged up to.

        ``highwater`` gives a topic-partition's end offset as last seen by the
        consumer, ``committed`` the consumer group's position at assignment (where
        judging starts). None means no topic-partition has anything left to read,
        so nothing can be behind: the session's own events decide. With
        ``answered_at`` (see :meth:`event_clock`) a caught-up topic-partition is
        noted for the event clock too.
        """
        mark: int | None = None
        for topic in self.topics:
            key = (topic, partition)
            end = highwater(topic, partition)
            if end is not None and self._position(topic, partition, committed) >= end:
                if answered_at is not None:
                    self._caught_up(key, answered_at(topic, partition))
                continue  # caught up: anything missing is not waiting on this topic
            reached = self._event_time.get(key, NOTHING_READ)
            mark = reached if mark is None else min(mark, reached)
        return mark

    def _caught_up(self, key: tuple[str, int], answered: int | None) -> None:
        if answered is not None and answered > self._caught_up_at.get(key, NOTHING_READ):
            self._caught_up_at[key] = answered

    def event_clock(
        self,
        partition: int,
        highwater: OffsetLookup,
        committed: OffsetLookup,
        answered_at: OffsetLookup,
    ) -> int | None:
        """Event time up to which every input of ``partition`` is judged (idle expiry).

        Per input topic-partition: judged up to the end offset of a fetch answer,
        it has reached the wall time of that answer (everything appended before
        the broker answered is judged), and stays there at least; it has also
        reached the latest event time judged on it. The partition's clock is the
        lowest of them, so one topic read late holds it back whatever the reason,
        and a consumer that stops fetching stops it. A sparse topic (compactions)
        with a record just fetched is not held back to its previous record's time
        of hours ago: it was caught up moments before. ``answered_at`` gives the
        wall time (ms) of a topic-partition's last fetch answer. None: not known
        yet for some input (nothing fetched, or a topic behind since assignment
        with nothing judged on it).
        """
        clock: int | None = None
        for topic in self.topics:
            key = (topic, partition)
            end = highwater(topic, partition)
            answered = answered_at(topic, partition)
            if end is None or answered is None:
                return None
            if self._position(topic, partition, committed) >= end:
                self._caught_up(key, answered)
                reached = answered
            else:
                reached = max(
                    self._event_time.get(key, NOTHING_READ),
                    self._caught_up_at.get(key, NOTHING_READ),
                )
                if reached == NOTHING_READ:
                    return None
            clock = reached if clock is None else min(clock, reached)
        return clock
