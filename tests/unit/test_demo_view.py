"""The demo's live view adds up: every session-kind row counts what the ``all`` row counts.

The fleet simulator runs against the real gateway client, whose broker round trip is
replaced by the engine in-process (a "loopback" client), so verdicts and aborts take
the same paths as in ``loopfuse demo``.
"""

from __future__ import annotations

import re
from collections import Counter
from types import SimpleNamespace
from typing import Any

from rich.console import Console

from schemas.config import parse_config
from schemas.events import input_event_adapter
from streams.demo import render
from streams.engine import Engine, SessionState
from streams.engine.outputs import Verdict as EngineVerdict
from streams.gateway import GatewayClient
from streams.simulator import DEMO_CONFIG, KINDS, FleetStats, run_fleet

ACTIONS = ("allow", "warn", "block", "abort")


class LoopbackClient(GatewayClient):
    """The gateway client with the broker and worker replaced by one in-process engine."""

    def __init__(self) -> None:
        super().__init__("unused:0")
        self._engine = Engine(parse_config(DEMO_CONFIG))
        self._states: dict[str, SessionState | None] = {}

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def _publish(self, topic: str, key: str, event: dict[str, Any]) -> None:
        validated = input_event_adapter.validate_python(event)
        self._states[key], outputs = self._engine.step(
            self._states.get(key), validated, validated.ts
        )
        for output in outputs:
            if isinstance(output, EngineVerdict):
                self._deliver(output.to_json())


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
    feed = SimpleNamespace(latest=[], total=0)
    console = Console(record=True, width=140, color_system=None)
    console.print(render(stats, feed, 1.0, 1.0, "loopback"))  # type: ignore[arg-type]
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
