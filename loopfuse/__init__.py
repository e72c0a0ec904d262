"""loopfuse: fleet-wide tool-call loop detection for AI agents, as a Kafka stream processor.

The one import package of the distribution. Its parts live at the repository's top
level and are linked in here (``loopfuse/streams -> ../streams`` and so on), so a
checkout imports exactly the names an installed wheel does:

* ``loopfuse.schemas``      wire-format and configuration models, JSON Schema (the contract)
* ``loopfuse.streams``      the engine, the worker, the gateway client, operator commands
* ``loopfuse.integrations`` the gateway plugins (Hermes in Python; OpenClaw's TypeScript
  sits beside it and is not a Python package)

The gateway's public names are importable from here (docs/gateway-integration.md)::

    from loopfuse import GatewayClient, blocked_tool_result

They load on first use: every ``loopfuse`` command imports this package, and most never
need aiokafka or pydantic.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from loopfuse.schemas.events import Verdict
    from loopfuse.streams.gateway.client import (
        GatewayClient,
        GatewaySession,
        Topics,
        blocked_tool_result,
    )

__version__ = "0.1.0"

#: Each public name and the module it is defined in.
_PUBLIC = {
    "GatewayClient": "loopfuse.streams.gateway.client",
    "GatewaySession": "loopfuse.streams.gateway.client",
    "Topics": "loopfuse.streams.gateway.client",
    "blocked_tool_result": "loopfuse.streams.gateway.client",
    "Verdict": "loopfuse.schemas.events",
}

__all__ = [
    "GatewayClient",
    "GatewaySession",
    "Topics",
    "Verdict",
    "__version__",
    "blocked_tool_result",
]


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'loopfuse' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})
