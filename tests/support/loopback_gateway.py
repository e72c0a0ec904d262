"""The gateway client with the broker and worker replaced by one in-process engine.

Verdicts and aborts reach the client through its own delivery path (``_deliver``),
so code driven by it (the fleet simulator) behaves as against a real worker, minus
Kafka. Every published event is kept in ``published``, in publish order.
"""

from __future__ import annotations

from typing import Any

from loopfuse.schemas import validate_event
from loopfuse.schemas.config import DetectionConfigFile, parse_config
from loopfuse.streams.engine import Engine, SessionState
from loopfuse.streams.engine.outputs import Verdict as EngineVerdict
from loopfuse.streams.gateway.client import GatewayClient
from loopfuse.streams.local.simulator import DEMO_CONFIG


class LoopbackClient(GatewayClient):
    def __init__(self, config: DetectionConfigFile | None = None) -> None:
        super().__init__("unused:0")
        self._engine = Engine(config or parse_config(DEMO_CONFIG))
        self._states: dict[str, SessionState | None] = {}
        self.published: list[dict[str, Any]] = []

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def _publish(self, topic: str, key: str, event: dict[str, Any]) -> None:
        self.published.append(event)
        validated = validate_event(event)
        self._states[key], outputs = self._engine.step(
            self._states.get(key), validated, validated.ts
        )
        for output in outputs:
            if isinstance(output, EngineVerdict):
                self._deliver(output.to_json())
