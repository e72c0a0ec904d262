"""``from loopfuse import GatewayClient``: the documented import, loaded only when used."""

from __future__ import annotations

import subprocess
import sys

import pytest

import loopfuse


def test_the_public_names_are_the_gateway_clients_own() -> None:
    from loopfuse import GatewayClient, GatewaySession, Topics, Verdict, blocked_tool_result
    from loopfuse.schemas import events
    from loopfuse.streams.gateway import client

    assert (GatewayClient, GatewaySession, Topics, blocked_tool_result) == (
        client.GatewayClient,
        client.GatewaySession,
        client.Topics,
        client.blocked_tool_result,
    )
    assert Verdict is events.Verdict
    assert all(hasattr(loopfuse, name) for name in loopfuse.__all__)
    assert set(loopfuse.__all__) <= set(dir(loopfuse))


def test_a_name_that_is_not_public_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Gateway'"):
        loopfuse.Gateway  # noqa: B018
    with pytest.raises(ImportError):
        from loopfuse import Gateway  # noqa: F401


def test_import_loopfuse_alone_loads_no_kafka_client() -> None:
    # Every `loopfuse` command imports the package first: the client's dependencies
    # load only when a public name is used.
    probe = (
        "import sys, loopfuse; "
        "print(sorted(m for m in ('aiokafka', 'pydantic', 'orjson', 'xxhash') if m in sys.modules)); "
        "loopfuse.GatewayClient; "
        "print('aiokafka' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert out == ["[]", "True"]
