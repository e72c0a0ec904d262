"""``loopfuse config check``: the loopDetection config each agent actually gets.

A config file says little on its own: an agent's block is merged over the global one,
values fall back to defaults and thresholds are clamped into order at run time
(``loopfuse.streams.engine.config``). This prints the outcome per agent, with where each value
came from, so an operator sees what the worker will do before it does it.

Agent ids and tool names in a config file may come from anywhere (generated configs,
an agent that writes its own): each is printed through ``ops/plain``, never as rich
markup.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from typing import Any, TextIO

from rich.console import Console
from rich.table import Table
from rich.text import Text

from loopfuse.schemas.config import ConfigError, DetectionConfigFile, load_config
from loopfuse.streams.engine.config import ConfigResolver, ResolvedConfig, merge_blocks
from loopfuse.streams.engine.rule_config import ResolvedRules, RulesResolver
from loopfuse.streams.ops.plain import shown

#: ResolvedConfig field -> its key path inside a loopDetection block.
KEYS: dict[str, tuple[str, ...]] = {
    "enabled": ("enabled",),
    "history_size": ("historySize",),
    "warning_threshold": ("warningThreshold",),
    "critical_threshold": ("criticalThreshold",),
    "unknown_tool_threshold": ("unknownToolThreshold",),
    "global_circuit_breaker_threshold": ("globalCircuitBreakerThreshold",),
    "generic_repeat": ("detectors", "genericRepeat"),
    "known_poll_no_progress": ("detectors", "knownPollNoProgress"),
    "ping_pong": ("detectors", "pingPong"),
    "guard_window_size": ("postCompactionGuard", "windowSize"),
}


def _lookup(block: dict[str, Any] | None, path: tuple[str, ...]) -> Any:
    node: Any = block or {}
    for part in path:
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _block(config: DetectionConfigFile, agent_id: str | None) -> dict[str, Any] | None:
    block = config.global_block if agent_id is None else config.agent_block(agent_id)
    return None if block is None else block.model_dump(exclude_none=True)


def explain(config: DetectionConfigFile, agent_id: str | None) -> list[tuple[str, Any, str]]:
    """(key path, resolved value, source) for one agent; None = agents not in the list.

    The source is ``default``, ``global``, ``agent``, or ``clamped (set: N)`` when the
    merged value was moved to keep warning < critical < global circuit breaker, or
    ``fallback (set: X)`` when a set value was unusable.
    """
    resolved: ResolvedConfig = ConfigResolver(config).resolve(agent_id)
    global_block = _block(config, None)
    agent_block = _block(config, agent_id) if agent_id is not None else None
    merged = merge_blocks(global_block, agent_block)
    rows = []
    for field, path in KEYS.items():
        value = getattr(resolved, field)
        raw = _lookup(merged, path)
        if _lookup(agent_block, path) is not None:
            source = "agent"
        elif _lookup(global_block, path) is not None:
            source = "global"
        else:
            source = "default"
        if raw is not None and raw != value:
            kind = "clamped" if field.endswith("threshold") else "fallback"
            source = f"{kind} (set: {raw})"
        rows.append((".".join(path), value, source))
    return rows


def _show(value: Any) -> str:
    if value is None:
        return "unset (detection off; calls recorded, guard on)"
    if isinstance(value, bool):
        return "true" if value else "false"
    return shown(value)


def describe_rules(rules: ResolvedRules | None) -> list[str]:
    """One line per rule in force (loopfuse.rules after the agent's merge), for people."""
    if rules is None:
        return []
    lines = []
    for name, rule in (
        ("runEnding", rules.run_ending),
        ("cycle", rules.cycle),
        ("repeatedFailure", rules.repeated_failure),
        ("argumentChurn", rules.argument_churn),
        ("runCaps", rules.run_caps),
        ("fleetBreaker", rules.fleet_breaker),
        ("identicalCalls", rules.identical_calls),
    ):
        if rule is None:
            continue
        settings = ", ".join(
            f"{key}={shown(value)}"
            for key, value in vars_of(rule).items()
            if key != "enforced" and value is not None
        )
        mode = "enforced" if rule.enforced else "shadow"
        lines.append(f"{name}: {mode}" + (f" ({settings})" if settings else ""))
    volatile = rules.volatile_results
    if volatile is not None:  # masking has no shadow mode
        tools = (
            "every tool"
            if volatile.tools is None
            else ", ".join(map(shown, sorted(volatile.tools)))
        )
        extra = f", {len(volatile.patterns)} pattern(s) of its own" if volatile.patterns else ""
        lines.append(f"volatileResults: masking results of {tools}{extra}")
    if rules.exempt:
        lines.append(f"exempt tools: {', '.join(shown(t) for t in sorted(rules.exempt))}")
    for tool, own in rules.thresholds:
        settings = ", ".join(
            f"{key}={shown(value)}" for key, value in vars_of(own).items() if value is not None
        )
        lines.append(f"tool {shown(tool)}: {settings}")
    return lines


def vars_of(rule: Any) -> dict[str, Any]:
    """A resolved rule's settings under their config key names (criticalsPerRun)."""
    return {
        re.sub(r"_(\w)", lambda m: m.group(1).upper(), name): value
        for name, value in dataclasses.asdict(rule).items()
    }


def agent_ids(config: DetectionConfigFile) -> list[str]:
    return [agent.id for agent in config.agents.entries] if config.agents else []


def render_check(config: DetectionConfigFile, path: str, agent: str | None, out: TextIO) -> None:
    console = Console(file=out, width=100, highlight=False, soft_wrap=False)

    def say(line: str = "") -> None:
        console.print(Text(line))  # its data went through shown(); a Text is never markup

    known = agent_ids(config)
    targets: list[str | None] = [agent] if agent is not None else [None, *known]
    say(f"config {shown(path)}: valid")
    section = config.loopfuse
    say("loopfuse block:")
    shadow = "" if section.enforce else " (shadow mode: every verdict is allow)"
    say(f"  enforce: {_show(section.enforce)}{shadow}")
    say(f"  providerSendTools: [{', '.join(shown(t) for t in section.providerSendTools)}]")
    say(f"  includePayloadsInLoopEvents: {_show(section.includePayloadsInLoopEvents)}")
    rules = RulesResolver(config)
    for target in targets:
        if target is None:
            title = "global: tools.loopDetection (every agent not in agents.list)"
        elif target in known:
            title = f"agent {shown(target)}"
        else:
            title = f"agent {shown(target)} (not in agents.list: gets the global config)"
        say()
        say(title)
        table = Table(expand=False)
        table.add_column("key")
        table.add_column("value", justify="right")
        table.add_column("from")
        for key, value, source in explain(config, target if target in known else None):
            table.add_row(Text(key), Text(_show(value)), Text(shown(source)))
        console.print(table)
        for line in describe_rules(rules.resolve(target if target in known else None)):
            say(f"  rule {line}")


def run_config_check(path: str, agent: str | None, out: TextIO | None = None) -> int:
    try:
        config = load_config(path)
    except ConfigError as exc:
        # the message quotes key paths, which can hold the file's own strings
        print(f"loopfuse config check: invalid config: {shown(exc, None)}", file=sys.stderr)
        return 2
    render_check(config, path, agent, out or sys.stdout)
    return 0
