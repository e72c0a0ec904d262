"""The input watermark: how far every input topic of a partition has been judged."""

from __future__ import annotations

from streams.progress import NOTHING_READ, InputProgress

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


def test_lag_counts_records_not_judged_yet_on_every_input_topic() -> None:
    progress = InputProgress(TOPICS)
    progress.judged("calls", 0, 9, event_ts=1_000)  # next: 10
    ends = {("calls", 0): 15, ("results", 0): 7, ("compactions", 0): 0}
    committed = {("results", 0): 4}
    assert progress.lag(0, lookup(ends), lookup(committed)) == 5 + 3 + 0
    del ends[("compactions", 0)]  # no fetch answer yet: unknown, not zero
    assert progress.lag(0, lookup(ends), lookup(committed)) is None
