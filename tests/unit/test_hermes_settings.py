"""The Hermes plugin's settings and result wording, without Hermes or a broker."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from loopfuse.integrations.hermes.plugin import with_warning
from loopfuse.integrations.hermes.settings import PluginSettings, load


def test_defaults_are_the_gateway_clients() -> None:
    config = load(None)
    assert (config.plugin.gateway_timeout, config.plugin.fail_policy) == (5.0, "open")
    assert not config.plugin.shadow and not config.plugin.hash_locally
    assert config.kafka.bootstrap_servers == "127.0.0.1:9092"


def test_the_hermes_entry_wins_over_loopfuse_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOPFUSE_FAIL_POLICY", "closed")
    monkeypatch.setenv("LOOPFUSE_BOOTSTRAP_SERVERS", "env-kafka:9092")
    monkeypatch.setenv("LOOPFUSE_SHADOW", "true")
    config = load(
        {
            "bootstrap_servers": "kafka:9092",
            "topic_verdicts": "v",
            "enabled": True,
            "allow_tool_override": False,
        }
    )
    assert config.plugin.fail_policy == "closed" and config.plugin.shadow
    assert config.kafka.bootstrap_servers == "kafka:9092"
    assert config.kafka.topic_verdicts == "v"


@pytest.mark.parametrize(
    ("entry", "named"),
    [
        ({"fail_policy": "sometimes"}, "fail_policy"),
        ({"bootstrap": "k:9092"}, "bootstrap"),
        ({"gateway_timeout": 0}, "gateway_timeout"),
    ],
)
def test_a_bad_entry_is_refused_naming_the_key(entry: dict[str, object], named: str) -> None:
    with pytest.raises(ValidationError, match=named):
        load(entry)


def test_a_warning_stays_inside_a_json_result() -> None:
    shown = with_warning(json.dumps({"output": "ok"}), "WARNING: stop")
    assert json.loads(shown) == {"output": "ok", "loopfuse_warning": "WARNING: stop"}
    assert with_warning("plain text", "WARNING: stop") == "plain text\n\n[loopfuse] WARNING: stop"
    assert with_warning("[1, 2]", "W").endswith("\n\n[loopfuse] W")


def test_every_plugin_setting_is_documented() -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "gateway-integration.md").read_text()
    missing = [
        n
        for n in PluginSettings.model_fields
        if f"LOOPFUSE_{n.upper()}" not in docs or f"{n}:" not in docs
    ]
    assert missing == []


def test_the_verdict_key_comes_from_the_entry_or_the_variable_and_reaches_the_client(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import asyncio
    import base64

    from loopfuse.integrations.hermes import plugin as hermes_plugin

    secret = base64.b64encode(b"s" * 32).decode()
    monkeypatch.setenv("LOOPFUSE_VERDICT_KEY", f"env:{secret}")
    assert [k.key_id for k in load(None).kafka.verdict_keys()] == ["env"]
    config = load({"verdict_key": f"new:{secret},old:{secret}"})
    made: dict[str, object] = {}

    class Client:  # what the plugin hands GatewayClient, without a broker
        def __init__(self, *args: object, **kwargs: object) -> None:
            made.update(kwargs)

        async def start(self) -> None:
            pass

    monkeypatch.setattr(hermes_plugin, "GatewayClient", Client)
    asyncio.run(hermes_plugin.HermesPlugin(config)._start())
    assert [k.key_id for k in made["verdict_key"]] == ["new", "old"]  # type: ignore[attr-defined]
    short = base64.b64encode(b"hunter2-hunter2!").decode()
    with pytest.raises(ValidationError, match="verdict_key") as refused:
        load({"verdict_key": f"k1:{short}"})
    assert short not in str(refused.value)  # what Hermes shows when the plugin fails to load
