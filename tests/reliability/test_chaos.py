"""CI-sized chaos runs: SIGKILL a worker twice while events flow; no verdict lost or wrong.

Once with one worker (it recovers its whole table from the changelog) and once
with two in one consumer group (each kill moves partitions between them twice:
to the survivor, and back when the killed one returns).

The full runs are ``python -m tests.reliability.chaos --kills 5 --events 20000``
(``--workers 2`` for the second), or these tests with ``LOOPFUSE_LONG=1``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.reliability.chaos import ChaosOptions, run_chaos
from tests.support.harness import LONG

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(1800 if LONG else 240)]


@pytest.mark.parametrize("workers", [1, 2])
async def test_sigkill_chaos_loses_no_verdict_and_changes_none(
    kafka_bootstrap: str, kafka_broker_kind: str, tmp_path: Path, workers: int
) -> None:
    opts = (
        ChaosOptions(kills=5, events=20_000, sessions=200, workers=workers)
        if LONG
        else ChaosOptions(kills=2, events=3_000, sessions=60, workers=workers)
    )
    opts.bootstrap, opts.broker_kind, opts.workdir = kafka_bootstrap, kafka_broker_kind, tmp_path
    opts.deadline = 180.0
    result = await run_chaos(opts)
    print(result.line)
    c = result.comparison
    assert result.kills == opts.kills, result.line
    assert c.missing == 0 and c.wrong == 0, f"{result.line}\n" + "\n".join(c.examples)
    assert c.delivered >= c.expected, result.line
