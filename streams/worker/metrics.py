"""The worker's Prometheus metrics; labels never carry session or run ids."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest


class Metrics:
    """Prometheus counters of one worker; labels never carry session or run ids."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.events = Counter("loopfuse_events", "Input events judged", ["type"], registry=r)
        self.verdicts = Counter(
            "loopfuse_verdicts", "Verdicts published", ["action", "detector"], registry=r
        )
        self.replies = Counter(
            "loopfuse_verdict_replies",
            "Verdicts of calls that named a reply (reply_to): routed there, or sent to the "
            "verdicts topic because the worker has no such reply topic or partition",
            ["outcome"],
            registry=r,
        )
        self.loop_events = Counter(
            "loopfuse_loop_events", "Loop events published", ["detector"], registry=r
        )
        self.dead_letters = Counter(
            "loopfuse_dead_letters", "Inputs dead-lettered", ["reason"], registry=r
        )
        self.expired = Counter(
            "loopfuse_sessions_expired", "Idle sessions deleted from the table", registry=r
        )
        self.tool_strikes = Counter(
            "loopfuse_tool_strikes",
            "Strikes sent to the fleet breaker (loops on a tool)",
            registry=r,
        )
        self.tools_broken = Gauge(
            "loopfuse_fleet_tools_broken",
            "Tools on this worker's fleet breaker board (read from the breakers topic; "
            "a breaker clears by the calls' event time)",
            registry=r,
        )
        self.batches = Counter("loopfuse_batches", "Batches processed", registry=r)
        self.consumer_lag = Gauge(
            "loopfuse_consumer_lag",
            "Records of an input partition not judged yet (end offset as of the last fetch "
            "minus the next offset to judge)",
            ["topic", "partition"],
            registry=r,
        )
        self.shed = Counter(
            "loopfuse_state_shed",
            "Times a session's state was over its byte cap and its oldest evidence shed",
            registry=r,
        )
        self.input_behind = Gauge(
            "loopfuse_input_behind_seconds",
            "Wall clock minus the event time every input topic of the partition is judged "
            "up to, as of the last idle scan (-1: not known yet)",
            ["partition"],
            registry=r,
        )

        # Counts by (metric, labels) since the last render: ``Counter.labels`` takes a
        # lock and builds a key per call, and ``inc`` takes another lock - a visible
        # cost once per event. Label values are enumerations (event types, actions,
        # detectors, reasons), so this stays small; a scrape adds them up.
        self._pending: dict[tuple[Counter, tuple[str, ...]], int] = {}

    def inc(self, counter: Counter, *labels: str) -> None:
        """``counter.labels(*labels).inc()``, added to the counter at the next render."""
        key = (counter, labels)
        pending = self._pending
        pending[key] = pending.get(key, 0) + 1

    def flush(self) -> None:
        """Add the counts of :meth:`inc` to their counters."""
        pending, self._pending = self._pending, {}
        for (counter, labels), count in pending.items():
            counter.labels(*labels).inc(count)

    def render(self) -> bytes:
        self.flush()
        return generate_latest(self.registry)
