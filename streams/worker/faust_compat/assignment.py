"""What the worker's consumer needs in place before its fetcher starts, on every assignment."""

from __future__ import annotations

import faust

from loopfuse.streams.worker.faust_compat.consumer import tune_fetch_wait
from loopfuse.streams.worker.faust_compat.delivery import FetchBatches, install_fast_delivery
from loopfuse.streams.worker.faust_compat.recovery import (
    give_back_fetches_across_rebalances,
    keep_commits_on_seek,
    keep_queues_on_redundant_resume,
)


def prepare_consumer(
    app: faust.App,
    fetches: FetchBatches,
    *,
    fetch_max_wait_ms: int,
) -> None:
    """Install every consumer-side workaround (each idempotent), in the order they need.

    Called from ``on_partitions_assigned``, i.e. before the fetcher starts (recovery
    starts it after this signal): the fetch loop binds its delivery callback once.
    Without the recovery fixes a restart onto a backlog skipped input and committed
    it unjudged.
    """
    tune_fetch_wait(app, fetch_max_wait_ms)
    install_fast_delivery(app)
    fetches.install()
    keep_queues_on_redundant_resume(app)
    give_back_fetches_across_rebalances(app)
    keep_commits_on_seek(app)
