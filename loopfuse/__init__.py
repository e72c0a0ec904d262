"""loopfuse: fleet-wide tool-call loop detection for AI agents, as a Kafka stream processor.

The one import package of the distribution. Its parts live at the repository's top
level and are linked in here (``loopfuse/streams -> ../streams`` and so on), so a
checkout imports exactly the names an installed wheel does:

* ``loopfuse.schemas``      wire-format and configuration models, JSON Schema (the contract)
* ``loopfuse.streams``      the engine, the worker, the gateway client, operator commands
* ``loopfuse.integrations`` the gateway plugins (Hermes in Python; OpenClaw's TypeScript
  sits beside it and is not a Python package)
"""

__version__ = "0.1.0"
