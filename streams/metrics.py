"""The worker's Prometheus metrics; labels never carry session or run ids."""

from __future__ import annotations

from typing import Any

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
            "loopfuse_tool_strikes", "Strikes sent to the fleet breaker (loops on a tool)",
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

        # Labelled children by (metric, labels): ``Counter.labels`` takes a lock and
        # builds a key per call, a visible cost once per event. Label values are
        # enumerations (event types, actions, detectors, reasons), so this stays small.
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}

    def inc(self, counter: Counter, *labels: str) -> None:
        """``counter.labels(*labels).inc()``, with the child looked up once."""
        key = (id(counter), labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = counter.labels(*labels)
        child.inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
