"""Session-wide test fixtures: one broker for the whole test session.

Which broker is :mod:`tests.support.brokers`' choice (``LOOPFUSE_TEST_BROKER``):
Apache Kafka by default (one local KRaft node from Maven Central's jars) wherever
Java 17+ and Maven are present, the embedded Tansu with ``embedded``, testcontainers'
Kafka with ``docker``, a running broker with ``HOST:PORT``. The choice is the first
line of pytest's header; a fallback to the embedded broker says why there.

The embedded broker also has a fixture of its own, ``embedded_bootstrap``, for the
smoke set that proves the quickstart and the demo work on it whatever the session
broker is.

The broker is shared by the session, so tests must use unique topic and group
names (uuid suffix). Every test that uses a broker is marked ``integration``
automatically (``-m "not integration"`` runs the rest without starting one).
Nothing heavy (faust, aiokafka, docker) is imported at conftest import time.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache

import pytest

from tests.support.brokers import BrokerChoice, choose, describe, started

#: Fixtures that need a broker; a test requesting any of them is an integration test.
_BROKER_FIXTURES = frozenset(
    {"kafka_bootstrap", "kafka_broker", "kafka_broker_kind", "embedded_bootstrap"}
)


@dataclass(frozen=True)
class KafkaBroker:
    """The session broker: where it is, and what it is.

    ``kind`` is ``"kafka"`` (Apache Kafka, local, in a container or external) or
    ``"tansu"`` (the embedded broker, whose known gaps turn on
    ``loopfuse.streams.worker.faust_compat.embedded_recovery`` in the workers).
    """

    bootstrap: str
    kind: str


# The Hermes plugin's tests run inside hermes-agent, which the development venv does not
# have (hermes-agent pins croniter 6, Faust's mode needs croniter < 6):
# tests/integration/test_gateway_install.py runs them in a gateway's base install.
collect_ignore = (
    []
    if importlib.util.find_spec("model_tools")
    else ["integration/test_hermes_plugin.py", "e2e/test_hermes_agent_loop.py"]
)


@cache
def _choice() -> BrokerChoice:
    return choose()


def pytest_report_header(config: pytest.Config) -> str:
    return describe(_choice())


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """Start (or find) the session's broker; stop it at session end."""
    # Its log is in pytest's tmp dir: if the broker dies, the reason is there.
    with started(_choice(), tmp_path_factory.mktemp("broker")) as broker:
        yield KafkaBroker(broker.bootstrap, broker.kind)
        if broker.process is not None and broker.process.pid is not None:
            from tests.support.harness import rss_kb

            _SUMMARY.append(
                f"{broker.description}: resident memory "
                f"{rss_kb(broker.process.pid) / 1024:.0f} MiB "
                "at the end of the session"
            )


#: Lines for the end of pytest's report.
_SUMMARY: list[str] = []


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for line in _SUMMARY:
        terminalreporter.write_line(f"broker: {line}")


@pytest.fixture(scope="session")
def embedded_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Bootstrap of an embedded Tansu broker (the smoke set's), whatever the session's."""
    from loopfuse.streams.local.broker import EmbeddedBroker

    broker = EmbeddedBroker(log_path=tmp_path_factory.mktemp("embedded") / "tansu.log")
    broker.start(timeout=30)
    try:
        yield broker.bootstrap
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def kafka_bootstrap(kafka_broker: KafkaBroker) -> str:
    """Bootstrap address ``host:port`` of the session broker."""
    return kafka_broker.bootstrap


@pytest.fixture(scope="session")
def kafka_broker_kind(kafka_broker: KafkaBroker) -> str:
    """``"kafka"`` or ``"tansu"``."""
    return kafka_broker.kind


@pytest.hookimpl(tryfirst=True)  # before pytest's own -m deselection sees the items
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The whole three-node suite does not fit CI's time next to the rest: the default
    # run keeps its cheap subset, ``-m cluster`` (any -m naming it) runs it all.
    full_cluster = "cluster" in (config.getoption("markexpr", "") or "")
    skip_heavy = pytest.mark.skip(
        reason="a heavy cluster fault test: run the whole cluster suite with -m cluster"
    )
    for item in items:
        if _BROKER_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)
        if not full_cluster and item.get_closest_marker("cluster_full") is not None:
            item.add_marker(skip_heavy)
