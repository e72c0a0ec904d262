"""/livez fails when table recovery stops moving (loopfuse.streams.worker.topics.RecoveryStall)."""

from __future__ import annotations

from loopfuse.streams.worker.topics import RecoveryStall


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def test_a_recovery_without_progress_past_the_limit_is_stalled() -> None:
    clock = Clock()
    stall = RecoveryStall(300, clock)
    for _ in range(150):  # a probe every 2 s for 298 s, the offsets never move
        stall.observe(4_211, broker_ok=True)
        assert stall.stalled_for is None
        clock.now += 2
    stall.observe(4_211, broker_ok=True)  # 300 s without progress
    assert stall.stalled_for == 300


def test_progress_of_any_size_restarts_the_clock() -> None:
    clock = Clock()
    stall = RecoveryStall(300, clock)
    progress = 0
    for _ in range(1_000):  # 2,000 s of slow but moving recovery
        stall.observe(progress, broker_ok=True)
        clock.now += 2
        progress += 1 if clock.now % 200 == 0 else 0
    assert stall.stalled_for is None


def test_a_broker_outage_is_not_a_stall_and_a_finished_recovery_clears_it() -> None:
    clock = Clock()
    stall = RecoveryStall(60, clock)
    for _ in range(100):  # the broker is down: a restart would not help
        stall.observe(10, broker_ok=False)
        clock.now += 2
    assert stall.stalled_for is None
    for _ in range(40):
        stall.observe(10, broker_ok=True)
        clock.now += 2
    assert stall.stalled_for is not None
    stall.observe(None, broker_ok=True)  # recovery ended
    assert stall.stalled_for is None
