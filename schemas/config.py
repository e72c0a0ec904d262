"""The loopDetection configuration in OpenClaw's shape, validated strictly.

A whole OpenClaw config file is accepted: only ``tools.loopDetection``,
``agents.list[].tools.loopDetection`` and loopfuse's own ``loopfuse`` block are read;
everything else in the file is ignored. Inside those blocks unknown keys are errors
that name their key path.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, model_validator
from pydantic import ValidationError as _PydanticValidationError

from loopfuse.schemas.rules import (
    NUMBER_FIELDS,
    AgentEntryLoopfuse,
    RulesConfig,
    threshold_order_error,
)

PositiveInt = Annotated[StrictInt, Field(gt=0)]

_STRICT = ConfigDict(extra="forbid", frozen=True)
_LENIENT = ConfigDict(extra="allow", frozen=True)


class ConfigError(ValueError):
    """A config file that cannot be used; the message names the key path."""


class DetectorToggles(BaseModel):
    model_config = _STRICT
    genericRepeat: StrictBool | None = None
    knownPollNoProgress: StrictBool | None = None
    pingPong: StrictBool | None = None


class PostCompactionGuardConfig(BaseModel):
    model_config = _STRICT
    windowSize: PositiveInt | None = None


class LoopDetectionConfig(BaseModel):
    """One ``loopDetection`` block (global or per agent); unset fields are None."""

    model_config = _STRICT
    enabled: StrictBool | None = None
    historySize: PositiveInt | None = None
    warningThreshold: PositiveInt | None = None
    criticalThreshold: PositiveInt | None = None
    unknownToolThreshold: PositiveInt | None = None
    globalCircuitBreakerThreshold: PositiveInt | None = None
    detectors: DetectorToggles | None = None
    postCompactionGuard: PostCompactionGuardConfig | None = None

    @model_validator(mode="after")
    def _ordered_thresholds(self) -> LoopDetectionConfig:
        error = threshold_order_error(
            self.warningThreshold, self.criticalThreshold, self.globalCircuitBreakerThreshold
        )
        if error is not None:
            raise ValueError(f"tools.loopDetection.{error}.")
        return self


class ToolsSection(BaseModel):
    model_config = _LENIENT
    loopDetection: LoopDetectionConfig | None = None


class AgentEntry(BaseModel):
    model_config = _LENIENT
    id: StrictStr
    tools: ToolsSection | None = None
    loopfuse: AgentEntryLoopfuse | None = None


class AgentsSection(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True, populate_by_name=True)
    entries: list[AgentEntry] = Field(default_factory=list, alias="list")


class LoopfuseSection(BaseModel):
    """loopfuse's own settings that travel with the detection config."""

    model_config = _STRICT
    enforce: StrictBool = Field(
        default=True,
        description="false = shadow mode: every verdict is allow, loop events say enforced=false",
    )
    providerSendTools: list[StrictStr] = Field(
        default_factory=list,
        description="extra tool names whose results are outbound message sends (spec 3.6)",
    )
    includePayloadsInLoopEvents: StrictBool = Field(
        default=False, description="copy raw tool args into loop events (off: hashes only)"
    )
    rules: RulesConfig | None = Field(
        default=None,
        description="opt-in rules beyond OpenClaw's detector (docs/configuration.md: Rules)",
    )


class DetectionConfigFile(BaseModel):
    """An OpenClaw-shaped config file (JSON or JSON5)."""

    model_config = _LENIENT
    tools: ToolsSection | None = None
    agents: AgentsSection | None = None
    loopfuse: LoopfuseSection = Field(default_factory=LoopfuseSection)

    def agent_entry(self, agent_id: str | None) -> AgentEntry | None:
        if agent_id is None or self.agents is None:
            return None
        for agent in self.agents.entries:
            if agent.id == agent_id:
                return agent
        return None

    def agent_block(self, agent_id: str | None) -> LoopDetectionConfig | None:
        agent = self.agent_entry(agent_id)
        return agent.tools.loopDetection if agent is not None and agent.tools else None

    def agent_rules(self, agent_id: str | None) -> RulesConfig | None:
        agent = self.agent_entry(agent_id)
        return agent.loopfuse.rules if agent is not None and agent.loopfuse else None

    @property
    def global_block(self) -> LoopDetectionConfig | None:
        return self.tools.loopDetection if self.tools else None


def _key_path(loc: tuple[int | str, ...]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
    return path


def _first_error(exc: _PydanticValidationError) -> str:
    err = exc.errors()[0]
    loc = tuple(err["loc"])
    path = _key_path(loc)
    if err["type"] == "extra_forbidden":
        return f"{path}: unknown key"
    message = str(err["msg"]).removeprefix("Value error, ")
    if message.startswith("tools.loopDetection."):
        # Cross-field errors carry OpenClaw's exact text; prefix it for agent blocks.
        prefix = path.removesuffix(".tools.loopDetection").removesuffix("tools.loopDetection")
        return f"{prefix}.{message}" if prefix else message
    if loc and loc[-1] in NUMBER_FIELDS and err["type"] != "extra_forbidden":
        return f"{path}: {NUMBER_FIELDS[str(loc[-1])]} (got {err.get('input')!r})"
    if err["type"] in {"greater_than", "int_type", "int_parsing", "int_from_float"}:
        return f"{path}: must be a positive integer (got {err.get('input')!r})"
    return f"{path}: {message}"


def parse_config(data: Any) -> DetectionConfigFile:
    """Validate an already-parsed config document."""
    if not isinstance(data, dict):
        raise ConfigError("config: the top level must be an object")
    try:
        return DetectionConfigFile.model_validate(data)
    except _PydanticValidationError as exc:
        raise ConfigError(_first_error(exc)) from None


def load_config(path: str | Path) -> DetectionConfigFile:
    """Read a JSON or JSON5 config file; raises ConfigError with a one-line reason."""
    import json5

    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config file ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: config file is not UTF-8 text") from None
    try:
        data = json5.loads(text, object_pairs_hook=_KeyedObject.from_pairs)
        duplicate = _first_duplicate(data)
        if duplicate is not None:
            raise ConfigError(f"{path}: {duplicate}: duplicate key")
        return parse_config(data)
    except RecursionError:
        raise ConfigError(f"{path}: config nested too deeply") from None
    except ValueError as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"{path}: not valid JSON/JSON5 ({str(exc)[:200]})") from None


class _KeyedObject(dict[str, Any]):
    """A parsed JSON object that remembers keys it saw more than once.

    JSON5 (like JSON) keeps the last of duplicate keys, so ``enabled: true,
    enabled: false`` would silently turn detection off: they are an error instead.
    """

    duplicates: tuple[str, ...] = ()

    @classmethod
    def from_pairs(cls, items: Iterable[tuple[str, Any]]) -> _KeyedObject:
        pairs = list(items)
        obj = cls(pairs)
        if len(obj) != len(pairs):
            seen: set[str] = set()
            repeated = []
            for key, _ in pairs:
                if key in seen:
                    repeated.append(key)
                seen.add(key)
            obj.duplicates = tuple(repeated)
        return obj


def _first_duplicate(value: Any, path: str = "") -> str | None:
    """The key path of the first duplicate key in a parsed document (iterative)."""
    stack: list[tuple[Any, str]] = [(value, path)]
    while stack:
        node, where = stack.pop()
        if isinstance(node, _KeyedObject) and node.duplicates:
            key = node.duplicates[0]
            return f"{where}.{key}" if where else key
        if isinstance(node, dict):
            stack.extend((child, f"{where}.{key}" if where else key) for key, child in node.items())
        elif isinstance(node, list):
            stack.extend((child, f"{where}[{i}]") for i, child in enumerate(node))
    return None
