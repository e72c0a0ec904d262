"""The demo's live view adds up: every session-kind row counts what the ``all`` row counts.

The fleet simulator runs against the real gateway client, whose broker round trip is
replaced by the engine in-process (a "loopback" client), so verdicts and aborts take
the same paths as in ``loopfuse demo``.
"""

from __future__ import annotations

import re
from collections import Counter

from rich.console import Console

from loopfuse.schemas.config import parse_config
from loopfuse.streams.local.demo import LatestLoopEvents, render
from loopfuse.streams.local.simulator import DEMO_CONFIG, KINDS, FleetStats, run_fleet
from tests.support.loopback_gateway import LoopbackClient

ACTIONS = ("allow", "warn", "block", "abort")


async def _fleet(seconds: float) -> FleetStats:
    client = LoopbackClient()
    config = parse_config(DEMO_CONFIG)
    return await run_fleet(
        client, sessions=2 * len(KINDS), duration=seconds, seed=3, config=config, pace=0.001
    )


async def test_every_kind_row_adds_up_to_the_total() -> None:
    stats = await _fleet(2.0)

    assert stats.mismatches == 0, stats.mismatch_examples
    assert stats.by_kind["compaction_loop"]["abort"] > 0  # was always 0: aborts went uncounted
    for action in ACTIONS:
        assert sum(counts[action] for counts in stats.by_kind.values()) == stats.actions[action]


async def test_live_view_table_shows_the_aborts_per_kind() -> None:
    stats = await _fleet(1.0)
    console = Console(record=True, width=140, color_system=None)
    console.print(render(stats, LatestLoopEvents(), 1.0, 1.0, "loopback"))
    rows: dict[str, list[int]] = {}
    for line in console.export_text().splitlines():
        cells = [c.strip() for c in re.split(r"[│┃|]", line) if c.strip()]
        if len(cells) == 5 and cells[0] in (*KINDS, "all") and all(c.isdigit() for c in cells[1:]):
            rows[cells[0]] = [int(c) for c in cells[1:]]

    assert set(rows) == {*KINDS, "all"}
    totals = Counter[int]()
    for kind in KINDS:
        for i, value in enumerate(rows[kind]):
            totals[i] += value
    assert [totals[i] for i in range(4)] == rows["all"]
    assert rows["compaction_loop"][ACTIONS.index("abort")] > 0
