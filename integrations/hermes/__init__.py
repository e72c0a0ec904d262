"""loopfuse's Hermes Agent plugin: fleet-wide tool-loop verdicts in front of Hermes' tools.

Installed with ``pip install "loopfuse[hermes]"``; Hermes finds it through the
``hermes_agent.plugins`` entry point ``loopfuse`` and loads it once it is listed in
``plugins.enabled``. Settings: ``plugins.entries.loopfuse`` in Hermes' config.yaml,
over ``LOOPFUSE_*`` variables (see ``loopfuse.integrations.hermes.settings``).
"""

from __future__ import annotations

import atexit
import inspect
import logging
from typing import Any

from loopfuse.integrations.hermes.plugin import HermesPlugin
from loopfuse.integrations.hermes.settings import load

__all__ = ["HermesPlugin", "active", "register"]

PLUGIN_ID = "loopfuse"
HOOKS = (
    "pre_tool_call",
    "post_tool_call",
    "transform_tool_result",
    "pre_api_request",
    "on_session_end",
    "on_session_finalize",
    "on_session_reset",
)

log = logging.getLogger("loopfuse.hermes")
_active: HermesPlugin | None = None


def active() -> HermesPlugin | None:
    """The plugin Hermes loaded last in this process (one gateway client per process)."""
    return _active


def register(ctx: Any) -> None:
    """Hermes' plugin entry point: read the config, register the hooks."""
    global _active
    plugin_id = getattr(ctx.manifest, "key", "") or getattr(ctx.manifest, "name", "") or PLUGIN_ID
    config = load(_plugin_entry(plugin_id))
    plugin = HermesPlugin(config, agent_id=getattr(ctx, "profile_name", None))
    if _active is not None:  # Hermes re-ran discovery: keep one client per process
        _active.close()
    else:
        atexit.register(lambda: _active.close() if _active is not None else None)
    _active = plugin
    # Hermes 0.19 catches a hook's exception and runs the tool; the hooks apply the
    # fail policy themselves. Hosts whose register_hook takes fail_closed get it too.
    takes_fail_closed = "fail_closed" in inspect.signature(ctx.register_hook).parameters
    for name in HOOKS:
        hook = getattr(plugin, name)
        if takes_fail_closed and name == "pre_tool_call":
            ctx.register_hook(name, hook, fail_closed=config.plugin.fail_policy == "closed")
        else:
            ctx.register_hook(name, hook)
    log.info(
        "loopfuse: plugin loaded (bootstrap %s, timeout %ss, fail-%s%s)",
        config.kafka.bootstrap_servers,
        config.plugin.gateway_timeout,
        config.plugin.fail_policy,
        ", shadow" if config.plugin.shadow else "",
    )


def _plugin_entry(plugin_id: str) -> dict[str, Any]:
    """``plugins.entries.<plugin_id>`` of Hermes' config.yaml ({} outside Hermes)."""
    try:
        from hermes_cli.config import load_config
    except ImportError:
        return {}
    plugins = load_config().get("plugins")
    entries = plugins.get("entries") if isinstance(plugins, dict) else None
    entry = entries.get(plugin_id) if isinstance(entries, dict) else None
    return dict(entry) if isinstance(entry, dict) else {}
