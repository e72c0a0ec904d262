"""Apache Kafka on this machine: one KRaft node from Maven Central's jars.

An *edge* module like :mod:`loopfuse.streams.local.broker`: it starts and stops a broker process for
tests, benchmarks, the demo and ``loopfuse broker --kafka``, and knows nothing about
detection.

The node is a combined broker + controller (KRaft, no ZooKeeper) on two free
loopback ports, its storage formatted with a fresh cluster id in a data folder
(temporary unless one is given). Its jars are resolved once with Maven from
``infra/kafka/pom.xml`` (the one place the Kafka version is pinned) into a cache
outside the work tree, ``~/.cache/loopfuse/kafka/VERSION`` or
``$LOOPFUSE_KAFKA_CACHE/VERSION``, and reused by every later start. Its settings are
``infra/kafka/broker.properties`` (shared with docker-compose.yml) plus the node's own
identity, listeners and folders; its logging is ``infra/kafka/log4j2.yaml`` (warnings
only).

A restart (:meth:`ApacheKafka.stop` then :meth:`~loopfuse.streams.local.broker.BrokerProcess.start`)
keeps the node's data and ports, as a real broker restart does; the temporary folder
goes when the object is closed (context-manager exit, :meth:`ApacheKafka.close`, or the
interpreter's exit).
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from loopfuse.streams.local.broker import (
    DEFAULT_HOST,
    BrokerError,
    BrokerProcess,
    BrokerStartError,
    _run_coroutine_blocking,
    free_port,
)
from loopfuse.streams.local.kafka_security import KafkaSecurity

__all__ = [
    "INFRA",
    "ApacheKafka",
    "KafkaCluster",
    "KafkaClusterNode",
    "KafkaUnavailableError",
    "kafka_unavailable_reason",
    "kafka_version",
    "resolve_kafka",
]

#: infra/kafka of the source tree: the Maven descriptor, broker settings and logging.
# infra/kafka (the pom that pins Kafka, the broker's settings, its log config), linked in
# as package data so an installed copy has it too
INFRA = Path(__file__).parent / "kafka"

#: Java the Kafka 4 broker needs at least.
MIN_JAVA = 17

#: Heap of a node: Kafka's own start script gives 1 GiB; one node of a test broker
#: on a 2-core machine shared with the tests stays well inside 512 MiB (see
#: docs/operations.md, Apache Kafka), and a three-node cluster must fit beside the workers too.
_HEAP_FLAGS = ("-Xms256m", "-Xmx512m")

#: Kafka's start script's GC flags (kafka-run-class.sh), bar the heap.
_JVM_FLAGS = (
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-Djava.awt.headless=true",
)

_RESOLVE_LOCK = threading.Lock()


class KafkaUnavailableError(BrokerError):
    """Apache Kafka cannot run here: no Java 17+, no Maven, or its jars did not resolve."""


def kafka_version() -> str:
    """The pinned Kafka version: ``<kafka.version>`` of infra/kafka/pom.xml."""
    match = re.search(r"<kafka\.version>([^<]+)</kafka\.version>", _pom().read_text("utf-8"))
    if match is None:
        raise KafkaUnavailableError(f"{_pom()} names no <kafka.version>")
    return match.group(1).strip()


def _pom() -> Path:
    pom = INFRA / "pom.xml"
    if not pom.is_file():
        raise KafkaUnavailableError(
            f"Apache Kafka's Maven descriptor is not at {pom} (infra/kafka, which the "
            "package ships): reinstall loopfuse"
        )
    return pom


def _cache_root() -> Path:
    configured = os.environ.get("LOOPFUSE_KAFKA_CACHE")
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "loopfuse" / "kafka"


def find_java() -> tuple[Path, int]:
    """The ``java`` to run (``$JAVA_HOME/bin/java``, else the one on PATH) and its
    feature version; :class:`KafkaUnavailableError` when there is none or it is older
    than 17."""
    home = os.environ.get("JAVA_HOME")
    candidate = Path(home) / "bin" / "java" if home else None
    if candidate is None or not os.access(candidate, os.X_OK):
        found = shutil.which("java")
        if found is None:
            raise KafkaUnavailableError(f"Apache Kafka needs Java {MIN_JAVA}+: no java found")
        candidate = Path(found)
    try:
        out = subprocess.run(
            [str(candidate), "-version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise KafkaUnavailableError(f"{candidate} -version failed: {exc}") from exc
    # 'openjdk version "17.0.15" 2025-04-15', or "1.8.0_392" for Java 8.
    match = re.search(r'version "(?:1\.)?(\d+)', out.stderr + out.stdout)
    feature = int(match.group(1)) if match else 0
    if feature < MIN_JAVA:
        raise KafkaUnavailableError(
            f"Apache Kafka needs Java {MIN_JAVA}+: {candidate} is Java {feature or '?'} "
            "(set JAVA_HOME to a newer JDK)"
        )
    return candidate, feature


def kafka_unavailable_reason() -> str | None:
    """None when Apache Kafka can run here (Java 17+, and Maven or resolved jars);
    otherwise why not, in one line. Cheap: resolves nothing."""
    try:
        find_java()
        version = kafka_version()
    except KafkaUnavailableError as exc:
        return str(exc)
    if _complete(_libs_folder(version)):
        return None
    if shutil.which("mvn") is None:
        return f"Apache Kafka {version}'s jars are not cached and there is no mvn to resolve them"
    return None


def _stamp() -> str:
    """What a complete cache was resolved from: the descriptor's digest."""
    return hashlib.sha256(_pom().read_bytes()).hexdigest()


def _libs_folder(version: str) -> Path:
    """Where the jars of this descriptor go. One folder per descriptor: checkouts whose
    poms differ (another branch's, say) each keep theirs instead of resolving over one
    another in turn."""
    return _cache_root() / version / f"libs-{_stamp()[:12]}"


def _complete(libs: Path) -> bool:
    try:
        return (libs / ".resolved").read_text() == _stamp()
    except OSError:
        return False


def resolve_kafka(say: Callable[[str], None] | None = None) -> Path:
    """The folder of the pinned Kafka's jars, resolved with Maven the first time.

    ``say`` gets one line before a resolution (the first run's only notice). A file
    lock keeps two processes (a test session and a benchmark, say) from resolving
    into the same folder at once; Maven writes into a fresh folder that is renamed
    into place whole, so a killed resolution leaves nothing half-done behind.
    """
    version = kafka_version()
    root = _cache_root() / version
    libs = _libs_folder(version)
    if _complete(libs):
        return libs
    mvn = shutil.which("mvn")
    if mvn is None:
        raise KafkaUnavailableError(
            f"Apache Kafka {version} is not resolved yet and there is no mvn (Maven 3) "
            "to resolve it"
        )
    root.mkdir(parents=True, exist_ok=True)
    with _RESOLVE_LOCK, open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _complete(libs):  # another process did it while we waited
            return libs
        if say is not None:
            say(f"resolving Apache Kafka {version} from Maven Central into {root} (first run only)")
        staging = Path(tempfile.mkdtemp(prefix="libs.", dir=root))
        try:
            result = subprocess.run(
                [
                    mvn,
                    "-q",
                    "-B",
                    "-f",
                    str(_pom()),
                    "dependency:copy-dependencies",
                    f"-DoutputDirectory={staging}",
                ],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                check=False,
            )
            if result.returncode != 0:
                tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-15:])
                raise KafkaUnavailableError(
                    f"mvn could not resolve Apache Kafka {version} (exit "
                    f"{result.returncode}):\n{tail}"
                )
            (staging / ".resolved").write_text(_stamp())
            if libs.exists():
                shutil.rmtree(libs)
            staging.rename(libs)
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
    return libs


def new_cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, URL-safe base64 without padding (the form
    ``kafka-storage random-uuid`` prints), never starting with ``-``, which a command
    line would read as an option (Kafka's own ``Uuid.randomUuid`` draws again too)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cluster_id.startswith("-"):
            return cluster_id


def broker_settings() -> dict[str, str]:
    """infra/kafka/broker.properties as a mapping (comments and blanks dropped)."""
    settings: dict[str, str] = {}
    for raw in (INFRA / "broker.properties").read_text("utf-8").splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            settings[key.strip()] = value.strip()
    return settings


class ApacheKafka(BrokerProcess):
    """One Apache Kafka KRaft node (broker and controller) on loopback::

        with ApacheKafka() as kafka:
            run_things(bootstrap_servers=kafka.bootstrap)

    ``port`` is the client listener's (free when None); the controller listener
    takes another free port. ``data_dir`` keeps the node's logs there (kept after
    close); by default a temporary folder is used and removed on close (also the
    context managers' and the interpreter's exit: :meth:`close`). ``say`` gets
    the first run's one-line notice that the jars are being resolved.
    """

    _NAME = "Apache Kafka"
    # A controlled shutdown of a one-node KRaft cluster takes 1-3 s here.
    _STOP_TIMEOUT = 20.0
    # The JVM starts in 5-7 s on this machine when idle; a loaded one is slower.
    _START_TIMEOUT = 90.0

    def __init__(
        self,
        port: int | None = None,
        *,
        host: str = DEFAULT_HOST,
        data_dir: str | os.PathLike[str] | None = None,
        log_path: str | os.PathLike[str] | None = None,
        overrides: dict[str, str] | None = None,
        say: Callable[[str], None] | None = None,
        secure: bool = False,
    ) -> None:
        super().__init__(port, host=host, log_path=log_path)
        self._given_data_dir = Path(data_dir) if data_dir is not None else None
        self._tmp_dir: Path | None = None
        self._overrides = dict(overrides or {})
        self._say = say
        self._secure = secure
        #: TLS files and users when ``secure`` (made by the first start)
        self.security: KafkaSecurity | None = None
        self._controller_port: int | None = None
        self._internal_port: int | None = None
        self._java: Path | None = None
        self._libs: Path | None = None

    @property
    def data_dir(self) -> Path:
        """The node's folder: its server.properties and, in ``logs/``, its data."""
        if self._given_data_dir is not None:
            return self._given_data_dir
        if self._tmp_dir is None:
            self._tmp_dir = Path(tempfile.mkdtemp(prefix="loopfuse-kafka-"))
        return self._tmp_dir

    def _properties(self) -> dict[str, str]:
        assert self._controller_port is not None
        host, port, controller = self._host, self.port, self._controller_port
        listeners = {
            "controller.listener.names": "CONTROLLER",
            "listeners": f"PLAINTEXT://{host}:{port},CONTROLLER://{host}:{controller}",
            "advertised.listeners": f"PLAINTEXT://{host}:{port}",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "inter.broker.listener.name": "PLAINTEXT",
        }
        if self.security is not None:
            assert self._internal_port is not None
            listeners = self.security.broker_properties(
                f"{host}:{port}", f"{host}:{self._internal_port}", f"{host}:{controller}"
            )
        return {
            **broker_settings(),
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.bootstrap.servers": f"{host}:{controller}",
            **listeners,
            "log.dirs": str(self.data_dir / "logs"),
            **self._overrides,
        }

    def _probe_options(self) -> dict[str, Any]:
        return self.security.client_kwargs("admin") if self.security is not None else {}

    def _prepare(self) -> None:
        if self._java is None:
            self._java, _ = find_java()
        if self._libs is None:
            self._libs = resolve_kafka(self._say)
        if self._controller_port is None:
            self._controller_port = free_port(self._host)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self._secure:
            if self._internal_port is None:
                self._internal_port = free_port(self._host)
            if self.security is None:
                self.security = self._make_security()
            self.security.write_tools(self._java_command())
        properties = self.data_dir / "server.properties"
        properties.write_text(
            "".join(f"{key}={value}\n" for key, value in self._properties().items())
        )
        if not (self.data_dir / "logs" / "meta.properties").exists():
            self._format(properties)

    def _make_security(self) -> KafkaSecurity:
        return KafkaSecurity.create(self.data_dir, self._host)

    def _scram_arguments(self) -> list[str]:
        """The users a secured node's storage is formatted with."""
        return self.security.scram_arguments() if self.security is not None else []

    def _format(self, properties: Path) -> None:
        """``kafka-storage format --standalone``: a fresh cluster whose one voter is
        this node."""
        result = subprocess.run(
            [
                *self._java_command(),
                "kafka.tools.StorageTool",
                "format",
                "--standalone",
                f"--cluster-id={new_cluster_id()}",
                "-c",
                str(properties),
                *self._scram_arguments(),
            ],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-10:])
            raise KafkaUnavailableError(f"formatting Kafka's storage failed:\n{tail}")

    def _java_command(self) -> list[str]:
        assert self._java is not None and self._libs is not None
        return [
            str(self._java),
            *_HEAP_FLAGS,
            *_JVM_FLAGS,
            f"-Dlog4j2.configurationFile={INFRA / 'log4j2.yaml'}",
            "-cp",
            f"{self._libs}/*",
        ]

    def _command(self) -> list[str]:
        return [*self._java_command(), "kafka.Kafka", str(self.data_dir / "server.properties")]

    def _after_failed_attempt(self, exc: BrokerStartError, attempt: int, deadline: float) -> None:
        # A retry on fresh ports needs a fresh controller port and storage that knows
        # no voter at the old one.
        self._controller_port = None
        self._internal_port = None
        self.security = None
        if self._given_data_dir is None and self._tmp_dir is not None:
            shutil.rmtree(self._tmp_dir, ignore_errors=True)
            self._tmp_dir = None
        super()._after_failed_attempt(exc, attempt, deadline)

    def wipe(self) -> None:
        """Delete the stopped node's data: the next start formats a new, empty cluster
        (the same ports). For tests of a total loss."""
        if self.running:
            raise BrokerError("wipe() needs a stopped node: stop() it first")
        shutil.rmtree(self.data_dir / "logs", ignore_errors=True)

    def close(self) -> None:
        """Stop the node and remove its temporary folder (a given one is kept)."""
        self.stop()
        if self._tmp_dir is not None:
            shutil.rmtree(self._tmp_dir, ignore_errors=True)
            self._tmp_dir = None


#: What a replicated cluster changes in infra/kafka/broker.properties: internal topics
#: on every node, and a write acknowledged by all in-sync replicas only while at least
#: two hold it (``acks=all``), so that one node's crash loses nothing acknowledged.
CLUSTER_SETTINGS = {
    "offsets.topic.replication.factor": "3",
    "transaction.state.log.replication.factor": "3",
    "transaction.state.log.min.isr": "2",
    "share.coordinator.state.topic.replication.factor": "3",
    "share.coordinator.state.topic.min.isr": "2",
    "default.replication.factor": "3",
    "min.insync.replicas": "2",
}


class KafkaClusterNode(ApacheKafka):
    """One node of a :class:`KafkaCluster`: a combined broker + controller whose
    controller is one of a static quorum of voters (``controller.quorum.voters``).

    Its ports and data folder are fixed by the cluster, so :meth:`kill` and
    :meth:`start` bring the same node back, with its data, where the others expect it.
    A node answers metadata only once the quorum has a leader, so the first start of
    a cluster spawns all nodes before waiting for any (:meth:`KafkaCluster.start`).
    """

    _NAME = "Apache Kafka cluster node"

    def __init__(
        self,
        node_id: int,
        port: int,
        controller_port: int,
        voters: str,
        cluster_id: str,
        *,
        host: str,
        data_dir: Path,
        log_path: str | os.PathLike[str] | None,
        say: Callable[[str], None] | None,
        security: KafkaSecurity | None = None,
        internal_port: int | None = None,
    ) -> None:
        super().__init__(
            port,
            host=host,
            data_dir=data_dir,
            log_path=log_path,
            overrides=CLUSTER_SETTINGS,
            say=say,
            secure=security is not None,
        )
        self.node_id = node_id
        self._controller_port = controller_port
        self._internal_port = internal_port
        self._voters = voters
        self._cluster_id = cluster_id
        self.security = security  # the cluster's: one CA and one set of users

    def _properties(self) -> dict[str, str]:
        properties = super()._properties()
        properties["node.id"] = str(self.node_id)
        del properties["controller.quorum.bootstrap.servers"]
        properties["controller.quorum.voters"] = self._voters
        return properties

    def _format(self, properties: Path) -> None:
        """``kafka-storage format`` with the cluster's id; the static voters come from
        the properties, so every node agrees on the quorum from the start."""
        result = subprocess.run(
            [
                *self._java_command(),
                "kafka.tools.StorageTool",
                "format",
                f"--cluster-id={self._cluster_id}",
                "-c",
                str(properties),
                *self._scram_arguments(),
            ],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-10:])
            raise KafkaUnavailableError(f"formatting Kafka's storage failed:\n{tail}")

    def _after_failed_attempt(self, exc: BrokerStartError, attempt: int, deadline: float) -> None:
        # Fixed ports (the other nodes know them): no retry on fresh ones, keep the data.
        self.stop()
        raise exc


class KafkaCluster:
    """Apache Kafka, ``nodes`` KRaft nodes on loopback, each broker and controller::

        with KafkaCluster(3) as cluster:
            run_things(bootstrap_servers=cluster.bootstrap)
            cluster.nodes[0].kill(); cluster.nodes[0].start()   # one node crashes, returns

    Every node's ports are chosen before the first starts (they are each other's
    voters), its data lives in ``data_dir/node-N`` (temporary unless given, removed
    on close), and its log in ``log_dir/node-N.log`` when ``log_dir`` is given.
    Topics made by loopfuse on it get ``replication_factor`` 3 and
    ``min.insync.replicas`` 2 from the worker's settings (``LOOPFUSE_REPLICATION_FACTOR``,
    ``LOOPFUSE_MIN_INSYNC_REPLICAS``); the broker's defaults are the same
    (:data:`CLUSTER_SETTINGS`).
    """

    def __init__(
        self,
        nodes: int = 3,
        *,
        host: str = DEFAULT_HOST,
        data_dir: str | os.PathLike[str] | None = None,
        log_dir: str | os.PathLike[str] | None = None,
        say: Callable[[str], None] | None = None,
        secure: bool = False,
    ) -> None:
        if nodes < 3:
            # min.insync.replicas=2 with replication 3 is what a node's loss is measured
            # against; a smaller cluster would need other settings
            raise BrokerError("a KafkaCluster has at least 3 nodes (one node: ApacheKafka)")
        self._host = host
        self._tmp_dir = (
            None
            if data_dir is not None
            else Path(tempfile.mkdtemp(prefix="loopfuse-kafka-cluster-"))
        )
        root = Path(data_dir) if data_dir is not None else self._tmp_dir
        assert root is not None
        self.data_dir = root
        ports = [(free_port(host), free_port(host), free_port(host)) for _ in range(nodes)]
        voters = ",".join(f"{n + 1}@{host}:{c}" for n, (_, c, _) in enumerate(ports))
        cluster_id = self._cluster_id(root)
        #: TLS files and users when ``secure``, shared by the nodes
        self.security = KafkaSecurity.create(root, host) if secure else None
        self.nodes = [
            KafkaClusterNode(
                n + 1,
                port,
                controller,
                voters,
                cluster_id,
                host=host,
                data_dir=root / f"node-{n + 1}",
                log_path=Path(log_dir) / f"node-{n + 1}.log" if log_dir is not None else None,
                say=say if n == 0 else None,
                security=self.security,
                internal_port=internal if secure else None,
            )
            for n, (port, controller, internal) in enumerate(ports)
        ]

    @staticmethod
    def _cluster_id(root: Path) -> str:
        """The id the nodes were formatted with (kept beside them), else a new one."""
        root.mkdir(parents=True, exist_ok=True)
        stored = root / "cluster.id"
        if stored.exists():
            return stored.read_text().strip()
        cluster_id = new_cluster_id()
        stored.write_text(cluster_id)
        return cluster_id

    @property
    def bootstrap(self) -> str:
        """Every node's client address: ``HOST:PORT,HOST:PORT,HOST:PORT``."""
        return ",".join(node.bootstrap for node in self.nodes)

    @property
    def running(self) -> bool:
        """True while every node is alive."""
        return all(node.running for node in self.nodes)

    def start(self, timeout: float = 180.0) -> Self:
        """Start the stopped nodes together and wait until each answers as a broker."""
        stopped = [node for node in self.nodes if not node.running]
        if not stopped:
            return self
        deadline = time.monotonic() + timeout
        try:
            for node in stopped:
                node._spawn()
            _run_coroutine_blocking(self._all_ready(stopped, deadline))
        except BaseException:
            for node in stopped:  # the nodes that were up stay up
                node.stop()
            raise
        return self

    @staticmethod
    async def _all_ready(nodes: list[KafkaClusterNode], deadline: float) -> None:
        await asyncio.gather(*(node._wait_ready(deadline) for node in nodes))

    def node_at(self, node_id: int) -> KafkaClusterNode:
        """The node whose ``node.id`` (a partition's leader, say) is ``node_id``."""
        return next(node for node in self.nodes if node.node_id == node_id)

    def stop(self) -> None:
        """Stop every node at once (data kept). One after another, the last node's
        controlled shutdown would wait for a quorum that has already stopped, until
        its stop timeout's SIGKILL."""
        with concurrent.futures.ThreadPoolExecutor(len(self.nodes)) as pool:
            for done in [pool.submit(node.stop) for node in self.nodes]:
                done.result()

    def close(self) -> None:
        """Stop every node and remove the temporary folder (a given one is kept)."""
        self.stop()
        if self._tmp_dir is not None:
            shutil.rmtree(self._tmp_dir, ignore_errors=True)
            self._tmp_dir = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
