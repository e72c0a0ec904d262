"""The input watermark: how far every input topic of a partition has been judged."""

from __future__ import annotations

from loopfuse.streams.worker.progress import NOTHING_READ, InputProgress

TOPICS = ("calls", "results", "compactions")


def lookup(table: dict[tuple[str, int], int]):  # type: ignore[no-untyped-def]
    return lambda topic, partition: table.get((topic, partition))


def test_the_slowest_topic_with_records_left_sets_the_watermark() -> None:
    progress = InputProgress(TOPICS)
    progress.judged("calls", 0, 9, event_ts=1_000)
    progress.judged("results", 0, 499, event_ts=60_000)  # read far ahead
    ends = {("calls", 0): 500, ("results", 0): 900, ("compactions", 0): 0}
    assert progress.watermark(0, lookup(ends), lookup({})) == 1_000


def test_a_caught_up_topic_does_not_hold_the_watermark_back() -> None:
    progress = InputProgress(TOPICS)
    progress.judged("calls", 0, 9, event_ts=1_000)
    progress.judged("results", 0, 499, event_ts=60_000)
    # calls judged to its end; compactions never had a record (end 0): only results lag
    ends = {("calls", 0): 10, ("results", 0): 900, ("compactions", 0): 0}
    assert progress.watermark(0, lookup(ends), lookup({})) == 60_000
    ends[("results", 0)] = 500
    assert progress.watermark(0, lookup(ends), lookup({})) is None  # nothing left anywhere


def test_judging_starts_at_the_committed_offset() -> None:
    progress = InputProgress(TOPICS)
    ends = {("calls", 1): 40, ("results", 1): 40, ("compactions", 1): 7}
    committed = {("calls", 1): 40, ("results", 1): 40, ("compactions", 1): 7}
    assert progress.watermark(1, lookup(ends), lookup(committed)) is None
    # records arrived on results since: it lags and has not yielded an event yet
    ends[("results", 1)] = 45
    assert progress.watermark(1, lookup(ends), lookup(committed)) == NOTHING_READ


def test_an_unknown_end_offset_counts_as_behind() -> None:
    progress = InputProgress(TOPICS)
    progress.judged("calls", 2, 0, event_ts=5)
    ends = {("results", 2): 0, ("compactions", 2): 0}  # no fetch answer for calls yet
    assert progress.watermark(2, lookup(ends), lookup({})) == 5


def test_dead_lettered_messages_advance_the_offset_not_the_event_time() -> None:
    progress = InputProgress(TOPICS)
    progress.judged("calls", 0, 0, event_ts=100)
    progress.judged("calls", 0, 1, event_ts=None)  # garbage
    ends = {("calls", 0): 2, ("results", 0): 3, ("compactions", 0): 0}
    progress.judged("results", 0, 0, event_ts=50)
    assert progress.watermark(0, lookup(ends), lookup({})) == 50
    ends[("calls", 0)] = 3
    assert progress.watermark(0, lookup(ends), lookup({})) == 50  # calls: 100 (offset 2 unread)


def test_forget_drops_a_partitions_progress() -> None:
    progress = InputProgress(TOPICS)
    progress.judged("calls", 0, 9, event_ts=1_000)
    progress.judged("calls", 1, 9, event_ts=2_000)
    progress.forget([0])
    ends = {(topic, partition): 0 for topic in TOPICS for partition in (0, 1)}
    ends[("calls", 0)] = ends[("calls", 1)] = 20
    assert progress.watermark(0, lookup(ends), lookup({})) == NOTHING_READ
    assert progress.watermark(1, lookup(ends), lookup({})) == 2_000


def test_event_clock_is_the_slowest_input_in_event_time() -> None:
    progress = InputProgress(TOPICS)
    progress.judged("calls", 0, 9, event_ts=1_000)  # 5 records left: behind, at 1 s
    progress.judged("results", 0, 6, event_ts=4_000)  # read to its end
    ends = {("calls", 0): 15, ("results", 0): 7, ("compactions", 0): 0}
    answered = {("calls", 0): 9_000, ("results", 0): 9_500, ("compactions", 0): 8_000}
    clock = progress.event_clock(0, lookup(ends), lookup({}), lookup(answered))
    assert clock == 1_000  # a topic read late holds the clock back, however fresh the others
    progress.judged("calls", 0, 14, event_ts=2_000)  # now read to its end as well
    clock = progress.event_clock(0, lookup(ends), lookup({}), lookup(answered))
    # every input read to the end of its last answer: the oldest answer's wall time
    assert clock == 8_000


def test_event_clock_is_unknown_until_every_input_was_fetched_and_a_late_one_judged() -> None:
    progress = InputProgress(TOPICS)
    ends = {("calls", 0): 15, ("results", 0): 0, ("compactions", 0): 0}
    answered = {("calls", 0): 9_000, ("results", 0): 9_000}
    # compactions never answered: unknown, not "caught up"
    assert progress.event_clock(0, lookup(ends), lookup({}), lookup(answered)) is None
    answered[("compactions", 0)] = 9_000
    # calls is behind and nothing was judged on it yet (a backlog after a restart)
    assert progress.event_clock(0, lookup(ends), lookup({}), lookup(answered)) is None
    # judging starts at the group's committed offset: caught up there already
    committed = {("calls", 0): 15}
    assert progress.event_clock(0, lookup(ends), lookup(committed), lookup(answered)) == 9_000


def test_event_clock_stops_when_the_consumer_stops_fetching() -> None:
    progress = InputProgress(TOPICS)
    progress.judged("calls", 0, 14, event_ts=5_000)
    ends = {("calls", 0): 15, ("results", 0): 0, ("compactions", 0): 0}
    answered = {topic_partition: 6_000 for topic_partition in ends}
    before = progress.event_clock(0, lookup(ends), lookup({}), lookup(answered))
    # no new answers (a stalled process): the clock stays where the answers left it
    assert progress.event_clock(0, lookup(ends), lookup({}), lookup(answered)) == before == 6_000


def test_a_sparse_topic_with_a_record_in_flight_holds_the_clock_at_its_last_catch_up() -> None:
    progress = InputProgress(TOPICS)
    progress.judged("compactions", 0, 0, event_ts=1_000)  # the last compaction, long ago
    ends = {("calls", 0): 0, ("results", 0): 0, ("compactions", 0): 1}
    answered = {topic_partition: 50_000 for topic_partition in ends}
    assert progress.event_clock(0, lookup(ends), lookup({}), lookup(answered)) == 50_000
    # a new compaction is fetched (end 2) but not judged yet: the topic was caught up
    # at 50 s, so everything before that is judged, not just what came before 1 s
    ends[("compactions", 0)] = 2
    answered = {topic_partition: 51_000 for topic_partition in ends}
    assert progress.event_clock(0, lookup(ends), lookup({}), lookup(answered)) == 50_000
    # the per-batch watermark notes catching up too
    progress.judged("compactions", 0, 1, event_ts=50_500)
    ends[("compactions", 0)] = 2
    assert progress.watermark(0, lookup(ends), lookup({}), lookup(answered)) is None
    ends[("compactions", 0)] = 3  # another one in flight
    answered = {topic_partition: 52_000 for topic_partition in ends}
    assert progress.event_clock(0, lookup(ends), lookup({}), lookup(answered)) == 51_000
