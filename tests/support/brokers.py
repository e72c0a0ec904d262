"""Which broker the tests run on: one choice, for pytest, the chaos harness and the benches.

``LOOPFUSE_TEST_BROKER`` (pytest) or ``--broker`` (chaos, ``bench/*.py``):

- ``kafka`` (the default): Apache Kafka, one KRaft node started from Maven Central's
  jars (:class:`loopfuse.streams.local.kafka_broker.ApacheKafka`), wherever Java 17+ and Maven (or
  jars already resolved) are present. Where they are not, the default falls back to
  the embedded broker and :func:`describe` says so in one line; an explicit
  ``kafka`` fails instead.
- ``embedded``: the embedded Tansu (:class:`loopfuse.streams.local.broker.EmbeddedBroker`).
- ``docker``: testcontainers' Kafka (a Docker engine must answer); also taken by
  default where one answers and Kafka cannot run locally.
- ``HOST:PORT[,HOST:PORT]``: a broker that is already running (nothing is started or
  stopped); ``LOOPFUSE_TEST_BROKER_KIND`` says what it is (``kafka``, the default,
  or ``tansu``).

A :class:`StartedBroker` has the bootstrap, the *kind* the workers' settings need
(``kafka`` or ``tansu``: Tansu turns on the end-offset workaround) and, for a broker
started here, the process, so fault tests can stop, kill and restart it.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from loopfuse.streams.local.broker import BrokerProcess

_T = TypeVar("_T")

#: The image of testcontainers' Kafka: the version the local launcher pins.
_KAFKA_IMAGE = "apache/kafka:{version}"

#: The kind of the broker this process's tests run on, set by :func:`started`: the
#: harness reads end offsets from ``ListOffsets`` on Kafka and from a Fetch answer on
#: the embedded broker (whose ``ListOffsets(latest)`` is wrong).
_in_use: list[str] = []


def embedded_in_use() -> bool:
    """True when the broker started (or named) last in this process is the embedded one."""
    return bool(_in_use) and _in_use[-1] == "tansu"


@dataclass(frozen=True)
class BrokerChoice:
    """What to start: ``kind`` is ``kafka``, ``embedded``, ``docker`` or ``external``."""

    kind: str
    bootstrap: str | None = None  # external only
    fallback_reason: str | None = None  # the default fell back to the embedded broker


@dataclass
class StartedBroker:
    bootstrap: str
    kind: str  # what the workers are told: "kafka" or "tansu"
    process: BrokerProcess | None = None  # a broker started here (None: external, docker)
    description: str = ""


def _docker_engine_reachable(timeout: float = 2.0) -> bool:
    """True when a Docker engine answers a ping; cheap when there is none."""
    if not os.environ.get("DOCKER_HOST") and not Path("/var/run/docker.sock").exists():
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


def choose(value: str | None = None) -> BrokerChoice:
    """The broker ``value`` (else ``$LOOPFUSE_TEST_BROKER``) names, defaults applied."""
    from loopfuse.streams.local.kafka_broker import kafka_unavailable_reason

    raw = (value if value is not None else os.environ.get("LOOPFUSE_TEST_BROKER", "")).strip()
    choice = raw.lower()
    if choice in ("embedded", "tansu"):
        return BrokerChoice("embedded")
    if choice == "docker":
        return BrokerChoice("docker")
    if choice == "kafka":
        reason = kafka_unavailable_reason()
        if reason is not None:
            raise SystemExit(f"--broker kafka / LOOPFUSE_TEST_BROKER=kafka: {reason}")
        return BrokerChoice("kafka")
    if ":" in raw:
        return BrokerChoice("external", bootstrap=raw)
    if choice:
        raise SystemExit(f"unknown broker {raw!r}: kafka, embedded, docker or HOST:PORT")
    reason = kafka_unavailable_reason()
    if reason is None:
        return BrokerChoice("kafka")
    if _docker_engine_reachable():
        return BrokerChoice("docker")
    return BrokerChoice("embedded", fallback_reason=reason)


def describe(choice: BrokerChoice) -> str:
    """One line for a report header."""
    from loopfuse.streams.local.kafka_broker import kafka_version

    if choice.kind == "kafka":
        return f"broker: Apache Kafka {kafka_version()} (one local KRaft node)"
    if choice.kind == "docker":
        return f"broker: Apache Kafka {kafka_version()} in testcontainers"
    if choice.kind == "external":
        return f"broker: external {choice.bootstrap}"
    if choice.fallback_reason:
        return (
            f"broker: the embedded Tansu, NOT Apache Kafka ({choice.fallback_reason}); "
            "the broker-backed tests run on the embedded broker"
        )
    return "broker: the embedded Tansu (LOOPFUSE_TEST_BROKER=embedded)"


@contextmanager
def started(choice: BrokerChoice, workdir: Path, **kafka_options: Any) -> Iterator[StartedBroker]:
    """Start the chosen broker (logs in ``workdir``) and stop it afterwards."""
    workdir.mkdir(parents=True, exist_ok=True)
    with _using(_kind_of(choice)), _started(choice, workdir, **kafka_options) as broker:
        yield broker


def _kind_of(choice: BrokerChoice) -> str:
    if choice.kind == "external":
        return os.environ.get("LOOPFUSE_TEST_BROKER_KIND", "kafka").lower()
    return "tansu" if choice.kind == "embedded" else "kafka"


@contextmanager
def _using(kind: str) -> Iterator[None]:
    _in_use.append(kind)
    try:
        yield
    finally:
        _in_use.pop()


@contextmanager
def _started(choice: BrokerChoice, workdir: Path, **kafka_options: Any) -> Iterator[StartedBroker]:
    if choice.kind == "external":
        assert choice.bootstrap is not None
        yield StartedBroker(
            choice.bootstrap, _kind_of(choice), None, f"external {choice.bootstrap}"
        )
        return
    if choice.kind == "docker":
        from loopfuse.streams.local.kafka_broker import kafka_version

        try:
            from testcontainers.kafka import KafkaContainer
        except ImportError:  # pragma: no cover - older testcontainers layout
            from testcontainers.community.kafka import KafkaContainer
        container = KafkaContainer(_KAFKA_IMAGE.format(version=kafka_version())).with_kraft()
        container.start()
        try:
            yield StartedBroker(container.get_bootstrap_server(), "kafka", None, "testcontainers")
        finally:
            container.stop()
        return
    if choice.kind == "kafka":
        from loopfuse.streams.local.kafka_broker import ApacheKafka, kafka_version

        kafka = ApacheKafka(
            log_path=workdir / "kafka.log",
            data_dir=kafka_options.pop("data_dir", None),
            say=lambda line: print(f"loopfuse: {line}", file=sys.stderr, flush=True),
            **kafka_options,
        )
        try:
            kafka.start()
            yield StartedBroker(kafka.bootstrap, "kafka", kafka, f"Apache Kafka {kafka_version()}")
        finally:
            kafka.close()
        return
    from loopfuse.streams.local.broker import EmbeddedBroker

    broker = EmbeddedBroker(log_path=workdir / "tansu.log")
    broker.start(timeout=30)
    try:
        yield StartedBroker(broker.bootstrap, "tansu", broker, "embedded Tansu")
    finally:
        broker.stop()


def own_broker(workdir: Path, port: int | None = None) -> BrokerProcess:
    """A broker for one test to stop, kill, wipe and restart: Apache Kafka (data in
    ``workdir/kafka``) unless the session runs on the embedded broker or Kafka cannot
    run here. Not started."""
    from loopfuse.streams.local.kafka_broker import ApacheKafka, kafka_unavailable_reason

    workdir.mkdir(parents=True, exist_ok=True)
    if embedded_in_use() or kafka_unavailable_reason() is not None:
        from loopfuse.streams.local.broker import EmbeddedBroker

        return EmbeddedBroker(port, log_path=workdir / "tansu.log")
    return ApacheKafka(port, log_path=workdir / "kafka.log", data_dir=workdir / "kafka")


def kind_of(broker: BrokerProcess) -> str:
    """What a worker on ``broker`` is told it is: ``tansu`` or ``kafka``."""
    from loopfuse.streams.local.broker import EmbeddedBroker

    return "tansu" if isinstance(broker, EmbeddedBroker) else "kafka"


def restart_empty(broker: BrokerProcess) -> None:
    """Stop ``broker`` and start it on the same port with nothing: every topic, record
    and group offset gone (a total loss; the embedded broker's only kind of restart)."""
    from loopfuse.streams.local.kafka_broker import ApacheKafka

    broker.stop()
    if isinstance(broker, ApacheKafka):
        broker.wipe()
    broker.start()


def run_on(value: str | None, run: Callable[[str, bool], Coroutine[Any, Any, _T]]) -> _T:
    """``asyncio.run(run(bootstrap, embedded))`` on the broker ``value`` names
    (``--broker`` of the benchmarks: kafka, embedded, HOST:PORT), started for it and
    stopped after. The benchmarks run beside their baselines on whatever it is."""
    choice = choose(value)
    print(describe(choice), file=sys.stderr, flush=True)
    with (
        tempfile.TemporaryDirectory(prefix="loopfuse-bench-broker-") as workdir,
        started(choice, Path(workdir)) as broker,
    ):
        return asyncio.run(run(broker.bootstrap, broker.kind == "tansu"))
