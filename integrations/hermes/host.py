"""What the plugin reads of Hermes' own agent loop, beyond its plugin API (hermes-agent 0.19).

Hermes' hooks give a plugin no handle on the run: a ``pre_tool_call`` can veto one
call, never end the run, so after an abort the model kept getting turns until
``max_turns`` (82 more with ``hermes -z``, which ignores it). Hermes' own tool-call
guardrail ends a run with ``hard_stop_enabled``: it records a halting
``ToolGuardrailDecision`` on the agent (``AIAgent._set_tool_guardrail_halt``), the
loop finishes the tool batch in hand, appends its "I stopped retrying ..." answer and
breaks out with ``guardrail_halt``. :func:`halt` does exactly that for a loopfuse
abort. The agent is found on the stack of ``pre_api_request``, which Hermes calls
synchronously from ``agent.conversation_loop.run_conversation(agent, ...)``.

Everything here is pinned by tests/e2e/test_hermes_agent_loop.py (real ``hermes chat``
against a scripted model): if a Hermes upgrade moves it, the abort test fails, and
the plugin falls back to blocking every later call of the run (it never raises).
"""

from __future__ import annotations

import logging
import sys
from types import FrameType
from typing import Any

log = logging.getLogger("loopfuse.hermes")

#: Marker Hermes' context compressor puts in the history when it compacts in place.
COMPACTION_MARKER = "[CONTEXT COMPACTION"
#: How far up the stack the agent loop's frame is looked for (it is 2-4 frames up).
_MAX_FRAMES = 12


def running_agent() -> Any | None:
    """The ``AIAgent`` whose loop called the current hook, or None."""
    frame: FrameType | None = sys._getframe(1)
    for _ in range(_MAX_FRAMES):
        if frame is None:
            return None
        candidate = frame.f_locals.get("agent")
        if candidate is not None and hasattr(candidate, "_set_tool_guardrail_halt"):
            return candidate
        frame = frame.f_back
    return None


def halt(agent: Any, *, tool: str, count: int, message: str) -> bool:
    """End ``agent``'s run after the tool batch in hand, as Hermes' hard stop does.
    False if this Hermes has no such stop (the caller keeps blocking instead)."""
    try:
        from agent.tool_guardrails import ToolGuardrailDecision

        decision = ToolGuardrailDecision(
            action="halt", code="loopfuse_abort", message=message, tool_name=tool, count=count
        )
        agent._set_tool_guardrail_halt(decision)
    except Exception:
        log.warning("loopfuse: this Hermes cannot end a run from a plugin", exc_info=True)
        return False
    return True
