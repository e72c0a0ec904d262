"""Session-wide test fixtures: one Kafka-protocol broker for the whole test session.

Which broker, in order:

1. ``LOOPFUSE_TEST_BOOTSTRAP=host:port`` - an already running broker (nothing
   is started or stopped). ``LOOPFUSE_TEST_BROKER_KIND`` may say what it is
   (``kafka`` / ``tansu``); default ``external``.
2. Apache Kafka in a container via testcontainers, when a Docker engine answers
   (``LOOPFUSE_TEST_KAFKA_IMAGE`` overrides the image).
3. The embedded Tansu broker (:class:`streams.broker.EmbeddedBroker`).

``LOOPFUSE_TEST_BROKER=embedded`` (or ``docker``) forces 3 (or 2).

The broker is shared by the session, so tests must use unique topic and group
names (uuid suffix). Every test that uses the broker is marked ``integration``
automatically (``-m "not integration"`` runs the rest without starting one).
Nothing heavy (faust, aiokafka, docker) is imported at conftest import time.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

#: Fixtures that need the broker; a test requesting any of them is an integration test.
_BROKER_FIXTURES = frozenset({"kafka_bootstrap", "kafka_broker", "kafka_broker_kind"})

_DEFAULT_KAFKA_IMAGE = "confluentinc/cp-kafka:7.6.0"


@dataclass(frozen=True)
class KafkaBroker:
    """The session broker: where it is, and what it is.

    ``kind`` is ``"tansu"``, ``"kafka"`` or ``"external"``. Tansu has known gaps
    (see docs: end offsets, no idempotence/transactions, slow group joins), so
    tests and workers may need ``streams.faust_compat.end_offsets`` when it is ``tansu``.
    """

    bootstrap: str
    kind: str


def _docker_engine_reachable(timeout: float = 2.0) -> bool:
    """True when a Docker engine answers a ping; cheap when there is none."""
    docker_host = os.environ.get("DOCKER_HOST", "")
    if not docker_host and not Path("/var/run/docker.sock").exists():
        return False  # the common case here: skip importing the docker SDK at all
    try:
        import docker

        client = docker.from_env(timeout=int(max(timeout, 1)))
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:
        return False


def _kafka_container() -> object:
    try:
        from testcontainers.community.kafka import KafkaContainer
    except ImportError:  # testcontainers < 4.10
        from testcontainers.kafka import KafkaContainer
    image = os.environ.get("LOOPFUSE_TEST_KAFKA_IMAGE", _DEFAULT_KAFKA_IMAGE)
    return KafkaContainer(image).with_kraft()


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """Start (or find) the session's Kafka-protocol broker; stop it at session end."""
    existing = os.environ.get("LOOPFUSE_TEST_BOOTSTRAP")
    if existing:
        yield KafkaBroker(existing, os.environ.get("LOOPFUSE_TEST_BROKER_KIND", "external"))
        return

    choice = os.environ.get("LOOPFUSE_TEST_BROKER", "").lower()
    if choice == "docker" or (choice != "embedded" and _docker_engine_reachable()):
        container = _kafka_container()
        container.start()  # type: ignore[attr-defined]
        try:
            yield KafkaBroker(container.get_bootstrap_server(), "kafka")  # type: ignore[attr-defined]
        finally:
            container.stop()  # type: ignore[attr-defined]
        return

    from streams.broker import EmbeddedBroker

    # A log file per session: if the broker dies, its output is in pytest's tmp dir.
    log_path = tmp_path_factory.mktemp("broker") / "tansu.log"
    broker = EmbeddedBroker(log_path=log_path)
    broker.start(timeout=30)
    try:
        yield KafkaBroker(broker.bootstrap, "tansu")
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def kafka_bootstrap(kafka_broker: KafkaBroker) -> str:
    """Bootstrap address ``host:port`` of the session broker."""
    return kafka_broker.bootstrap


@pytest.fixture(scope="session")
def kafka_broker_kind(kafka_broker: KafkaBroker) -> str:
    """``"tansu"``, ``"kafka"`` or ``"external"``."""
    return kafka_broker.kind


@pytest.hookimpl(tryfirst=True)  # before pytest's own -m deselection sees the items
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _BROKER_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)
