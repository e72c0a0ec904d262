"""The Hermes plugin's settings: Hermes' ``plugins.entries.loopfuse`` block over ``LOOPFUSE_*``.

The only reader of the plugin's environment. Kafka options (bootstrap servers, topics,
TLS/SASL) are the worker's own settings model, so a gateway host and a worker read the
same variables the same way; the plugin adds what only a gateway has.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from loopfuse.streams.settings import Settings

#: Keys of ``plugins.entries.loopfuse`` that Hermes itself owns (not ours to validate).
HERMES_ENTRY_KEYS = frozenset({"enabled", "allow_tool_override", "llm"})


class PluginSettings(BaseSettings):
    """What the plugin does with verdicts; ``LOOPFUSE_<FIELD>`` or the config block."""

    model_config = SettingsConfigDict(
        env_prefix="LOOPFUSE_", frozen=True, extra="ignore", validate_default=True
    )

    gateway_timeout: float = Field(
        default=5.0, gt=0, le=120, description="seconds a tool call waits for its verdict"
    )
    fail_policy: Literal["open", "closed"] = Field(
        default="open", description="no verdict in time: open runs the tool, closed blocks it"
    )
    hash_locally: bool = Field(
        default=False, description="send args_hash / result_hash instead of raw payloads"
    )
    shadow: bool = Field(
        default=False, description="report only: never block a call or append a warning"
    )
    agent_id: str | None = Field(
        default=None, description="loopfuse agent id (per-agent config); default: Hermes profile"
    )


@dataclass(frozen=True, slots=True)
class HermesConfig:
    plugin: PluginSettings
    kafka: Settings


def load(entry: Mapping[str, Any] | None) -> HermesConfig:
    """Split Hermes' plugin entry into plugin and Kafka settings; the entry wins over env.

    An unknown key or a bad value raises, naming it: Hermes then reports the plugin as
    failed to load (``hermes plugins list``) rather than running it half-configured.
    """
    entry = {k: v for k, v in (entry or {}).items() if k not in HERMES_ENTRY_KEYS}
    ours = {k: v for k, v in entry.items() if k in PluginSettings.model_fields}
    kafka = {k: v for k, v in entry.items() if k not in ours}
    return HermesConfig(plugin=PluginSettings(**ours), kafka=Settings(**kafka))
