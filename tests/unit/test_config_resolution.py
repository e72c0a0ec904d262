"""Spec section 1: per-agent merge, fallback to defaults, clamping, and the strict validator."""

from __future__ import annotations

import re
from typing import Any

import pytest

from loopfuse.schemas import ConfigError, parse_config
from loopfuse.streams.engine import Engine
from loopfuse.streams.engine.config import resolve_config

NUMERIC_DEFAULTS = {
    "historySize": ("history_size", 30),
    "warningThreshold": ("warning_threshold", 10),
    "criticalThreshold": ("critical_threshold", 20),
    "unknownToolThreshold": ("unknown_tool_threshold", 10),
    "globalCircuitBreakerThreshold": ("global_circuit_breaker_threshold", 30),
}


def thresholds(resolved: Any) -> tuple[int, int, int]:
    return (
        resolved.warning_threshold,
        resolved.critical_threshold,
        resolved.global_circuit_breaker_threshold,
    )


def engine_for(doc: dict[str, Any]) -> Engine:
    return Engine(parse_config(doc))


def with_agent(global_block: dict[str, Any] | None, agent_block: dict[str, Any]) -> Engine:
    agent = {"id": "a1", "tools": {"loopDetection": agent_block}}
    doc: dict[str, Any] = {"agents": {"list": [agent]}}
    if global_block is not None:
        doc["tools"] = {"loopDetection": global_block}
    return engine_for(doc)


# --- defaults ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "resolved",
    [
        pytest.param(lambda: resolve_config(None, None), id="resolve_config"),
        pytest.param(lambda: Engine().resolve("anyone"), id="no-config-file"),
        pytest.param(
            lambda: engine_for({"tools": {"loopDetection": {}}}).resolve(None), id="empty"
        ),
    ],
)
def test_defaults(resolved: Any) -> None:
    r = resolved()
    assert r.enabled is None
    assert (r.history_size, r.unknown_tool_threshold) == (30, 10)
    assert thresholds(r) == (10, 20, 30)
    assert (r.generic_repeat, r.known_poll_no_progress, r.ping_pong) == (True, True, True)
    assert r.guard_window_size == 3


def test_enabled_is_taken_as_written() -> None:
    assert resolve_config({"enabled": True}, None).enabled is True
    assert resolve_config({"enabled": False}, None).enabled is False


# --- per-agent merge -----------------------------------------------------------------------------


def test_agent_overlays_fields_and_keeps_the_rest_of_the_global_block() -> None:
    engine = with_agent(
        {"enabled": False, "historySize": 12, "warningThreshold": 4},
        {"enabled": True, "warningThreshold": 8},
    )
    r = engine.resolve("a1")
    assert (r.enabled, r.history_size, r.warning_threshold) == (True, 12, 8)
    other = engine.resolve("someone-else")
    assert (other.enabled, other.history_size, other.warning_threshold) == (False, 12, 4)


def test_detectors_merge_one_level_deeper() -> None:
    engine = with_agent(
        {"detectors": {"genericRepeat": False, "pingPong": False}},
        {"detectors": {"pingPong": True}},
    )
    r = engine.resolve("a1")
    assert (r.generic_repeat, r.known_poll_no_progress, r.ping_pong) == (False, True, True)


def test_post_compaction_guard_merges_one_level_deeper() -> None:
    engine = with_agent(
        {"postCompactionGuard": {"windowSize": 5}},
        {"postCompactionGuard": {}, "warningThreshold": 2},
    )
    assert engine.resolve("a1").guard_window_size == 5
    engine = with_agent(
        {"postCompactionGuard": {"windowSize": 5}}, {"postCompactionGuard": {"windowSize": 1}}
    )
    assert engine.resolve("a1").guard_window_size == 1


def test_agent_block_without_global_block() -> None:
    r = with_agent(None, {"enabled": True, "detectors": {"genericRepeat": False}}).resolve("a1")
    assert r.enabled is True
    assert (r.generic_repeat, r.known_poll_no_progress, r.ping_pong) == (False, True, True)
    assert thresholds(r) == (10, 20, 30)


def test_resolve_config_merges_raw_blocks() -> None:
    r = resolve_config(
        {"warningThreshold": 5, "detectors": {"genericRepeat": False}},
        {"criticalThreshold": 9, "detectors": {"pingPong": False}},
    )
    assert thresholds(r) == (5, 9, 30)
    assert (r.generic_repeat, r.known_poll_no_progress, r.ping_pong) == (False, True, False)


# --- invalid numbers fall back to the default ----------------------------------------------------

BAD_NUMBERS = [0, -1, -10, 2.5, "10", True, False, None, [], {}]


@pytest.mark.parametrize("field", NUMERIC_DEFAULTS)
@pytest.mark.parametrize("bad", BAD_NUMBERS, ids=repr)
def test_invalid_numeric_value_falls_back_to_default(field: str, bad: Any) -> None:
    attr, default = NUMERIC_DEFAULTS[field]
    assert getattr(resolve_config({field: bad}, None), attr) == default


@pytest.mark.parametrize("bad", BAD_NUMBERS, ids=repr)
def test_invalid_window_size_falls_back_to_default(bad: Any) -> None:
    assert resolve_config({"postCompactionGuard": {"windowSize": bad}}, None).guard_window_size == 3


def test_invalid_agent_value_falls_back_to_default_not_to_global() -> None:
    # spec reading: step 1 merges field by field, step 2 then validates the merged value.
    r = resolve_config({"warningThreshold": 5}, {"warningThreshold": 0})
    assert r.warning_threshold == 10


def test_valid_positive_integers_are_kept() -> None:
    r = resolve_config(
        {
            "historySize": 1,
            "unknownToolThreshold": 1,
            "warningThreshold": 1,
            "criticalThreshold": 2,
            "globalCircuitBreakerThreshold": 3,
            "postCompactionGuard": {"windowSize": 1},
        },
        None,
    )
    assert (r.history_size, r.unknown_tool_threshold, r.guard_window_size) == (1, 1, 1)
    assert thresholds(r) == (1, 2, 3)


# --- clamping ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("block", "expected"),
    [
        (
            {"warningThreshold": 10, "criticalThreshold": 5, "globalCircuitBreakerThreshold": 3},
            (10, 11, 12),
        ),
        ({"warningThreshold": 2}, (2, 20, 30)),
        ({"warningThreshold": 25}, (25, 26, 30)),
        ({"warningThreshold": 40}, (40, 41, 42)),
        ({"criticalThreshold": 30}, (10, 30, 31)),
        (
            {"warningThreshold": 5, "criticalThreshold": 5, "globalCircuitBreakerThreshold": 5},
            (5, 6, 7),
        ),
        ({"globalCircuitBreakerThreshold": 1}, (10, 20, 21)),
        (
            {"warningThreshold": 7, "criticalThreshold": 0, "globalCircuitBreakerThreshold": 8},
            (7, 20, 21),
        ),  # invalid critical -> default 20 first, then global 8 <= 20 -> 21
    ],
)
def test_clamping(block: dict[str, Any], expected: tuple[int, int, int]) -> None:
    assert thresholds(resolve_config(block, None)) == expected


def test_history_size_and_unknown_tool_threshold_are_not_clamped() -> None:
    r = resolve_config({"historySize": 2, "unknownToolThreshold": 99, "warningThreshold": 50}, None)
    assert (r.history_size, r.unknown_tool_threshold) == (2, 99)


def test_merged_config_is_clamped_not_revalidated() -> None:
    # Each block is valid alone; the merge is (10, 5, 30) and is clamped at run time.
    engine = with_agent({"criticalThreshold": 5}, {"warningThreshold": 10})
    assert thresholds(engine.resolve("a1")) == (10, 11, 30)
    engine = with_agent({"globalCircuitBreakerThreshold": 12}, {"warningThreshold": 15})
    assert thresholds(engine.resolve("a1")) == (15, 20, 21)


# --- the strict validator ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("doc", "path"),
    [
        ({"tools": {"loopDetection": {"historySze": 3}}}, "tools.loopDetection.historySze"),
        (
            {"tools": {"loopDetection": {"detectors": {"bogus": True}}}},
            "tools.loopDetection.detectors.bogus",
        ),
        (
            {"tools": {"loopDetection": {"postCompactionGuard": {"size": 3}}}},
            "tools.loopDetection.postCompactionGuard.size",
        ),
        (
            {
                "agents": {
                    "list": [{"id": "x"}, {"id": "y", "tools": {"loopDetection": {"nope": 1}}}]
                }
            },
            "agents.list[1].tools.loopDetection.nope",
        ),
    ],
)
def test_unknown_keys_are_rejected_naming_the_key_path(doc: dict[str, Any], path: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(path)):
        parse_config(doc)


@pytest.mark.parametrize("field", [*NUMERIC_DEFAULTS, "postCompactionGuard.windowSize"])
@pytest.mark.parametrize("bad", [0, -3, 2.5, "10", True], ids=repr)
def test_numeric_fields_must_be_positive_integers(field: str, bad: Any) -> None:
    block: dict[str, Any] = (
        {"postCompactionGuard": {"windowSize": bad}} if "." in field else {field: bad}
    )
    with pytest.raises(ConfigError, match=re.escape(f"tools.loopDetection.{field}")):
        parse_config({"tools": {"loopDetection": block}})


def test_enabled_must_be_a_boolean() -> None:
    with pytest.raises(ConfigError, match=re.escape("tools.loopDetection.enabled")):
        parse_config({"tools": {"loopDetection": {"enabled": "yes"}}})


@pytest.mark.parametrize(
    "block",
    [
        {"warningThreshold": 10, "criticalThreshold": 10},
        {"warningThreshold": 11, "criticalThreshold": 10},
    ],
)
def test_warning_must_be_lower_than_critical(block: dict[str, Any]) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({"tools": {"loopDetection": block}})
    assert (
        str(err.value)
        == "tools.loopDetection.warningThreshold must be lower than criticalThreshold."
    )


@pytest.mark.parametrize(
    "block",
    [
        {"criticalThreshold": 20, "globalCircuitBreakerThreshold": 20},
        {"criticalThreshold": 25, "globalCircuitBreakerThreshold": 20},
    ],
)
def test_critical_must_be_lower_than_global(block: dict[str, Any]) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({"tools": {"loopDetection": block}})
    assert (
        str(err.value)
        == "tools.loopDetection.criticalThreshold must be lower than globalCircuitBreakerThreshold."
    )


def test_cross_field_error_in_an_agent_block_carries_the_message() -> None:
    doc = {
        "agents": {
            "list": [
                {
                    "id": "a",
                    "tools": {"loopDetection": {"warningThreshold": 9, "criticalThreshold": 3}},
                }
            ]
        }
    }
    with pytest.raises(ConfigError, match="warningThreshold must be lower than criticalThreshold"):
        parse_config(doc)


def test_cross_field_checks_only_fields_set_in_the_same_block() -> None:
    # warning 25 alone is valid (critical unset) and is clamped at run time instead.
    engine = engine_for({"tools": {"loopDetection": {"warningThreshold": 25}}})
    assert thresholds(engine.resolve(None)) == (25, 26, 30)


def test_whole_openclaw_file_with_unrelated_sections_is_accepted() -> None:
    doc = {
        "$schema": "https://openclaw.ai/config.json",
        "gateway": {"port": 18789, "auth": {"mode": "token"}},
        "models": {"providers": {"openai": {"baseUrl": "https://api.openai.com/v1"}}},
        "channels": {"telegram": {"enabled": True}},
        "tools": {
            "profile": "coding",
            "exec": {"host": "sandbox", "timeoutSec": 120},
            "loopDetection": {
                "enabled": False,
                "historySize": 30,
                "warningThreshold": 10,
                "criticalThreshold": 20,
                "unknownToolThreshold": 10,
                "globalCircuitBreakerThreshold": 30,
                "detectors": {"genericRepeat": True, "knownPollNoProgress": True, "pingPong": True},
                "postCompactionGuard": {"windowSize": 3},
            },
        },
        "agents": {
            "defaults": {"model": "openai/gpt-5", "workspace": "~/work"},
            "list": [
                {"id": "main", "default": True, "name": "Main"},
                {
                    "id": "safe-runner",
                    "workspace": "~/safe",
                    "tools": {
                        "profile": "minimal",
                        "loopDetection": {"enabled": True, "warningThreshold": 8},
                    },
                },
            ],
        },
    }
    engine = engine_for(doc)
    safe = engine.resolve("safe-runner")
    assert (safe.enabled, safe.warning_threshold, safe.critical_threshold) == (True, 8, 20)
    main = engine.resolve("main")
    assert (main.enabled, main.warning_threshold) == (False, 10)
