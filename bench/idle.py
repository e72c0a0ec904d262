"""What an idle worker costs: CPU of the worker and of its broker with nothing to judge.

    python bench/idle.py [--broker kafka|embedded|HOST:PORT] [--waits 5,500] [--seconds 30]

For each fetch wait (``LOOPFUSE_FETCH_MAX_WAIT_MS``), a worker on topics of its own
is started and made ready, then left idle for ``--seconds``; the CPU time the worker
and the broker process used meanwhile (``/proc/PID/stat`` utime + stime) is printed as
a share of one core, beside the broker alone (no worker) for as long afterwards. The
broker's share is only known for a broker started here (not ``HOST:PORT``).
The last line is machine-readable: ``idle_cpu wait=W worker=P% broker=P% alone=P% ...``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from loopfuse.streams.local.worker_process import WorkerProcess  # noqa: E402
from tests.support.brokers import choose, describe, started  # noqa: E402
from tests.support.harness import new_topics, unique, worker_settings  # noqa: E402


def cpu_seconds(pid: int | None) -> float:
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100.0  # utime, stime in clock ticks


def share(pid: int | None, seconds: float) -> float:
    """Percent of one core ``pid`` used over the next ``seconds``."""
    before, t0 = cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    return 100.0 * (cpu_seconds(pid) - before) / (time.monotonic() - t0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--broker", default=None, metavar="kafka|embedded|HOST:PORT")
    parser.add_argument("--waits", default="5,500", help="fetch waits to compare, in ms")
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args()
    choice = choose(args.broker)
    print(describe(choice), flush=True)
    results = []
    with (
        tempfile.TemporaryDirectory(prefix="loopfuse-bench-idle-") as tmp,
        started(choice, Path(tmp) / "broker") as broker,
    ):
        broker_pid = broker.process.pid if broker.process is not None else None
        for wait in args.waits.split(","):
            settings = worker_settings(
                broker.bootstrap,
                broker.kind,
                new_topics(),
                unique("idle"),
                Path(tmp) / f"data-{wait}",
                fetch_max_wait_ms=wait,
            )
            worker = WorkerProcess(settings, log_path=Path(tmp) / f"worker-{wait}.log").start()
            try:
                worker.wait_ready(120)
                time.sleep(5)  # past the start-up's own work
                before = {pid: cpu_seconds(pid) for pid in (worker.pid, broker_pid)}
                t0 = time.monotonic()
                time.sleep(args.seconds)
                elapsed = time.monotonic() - t0
                used = {pid: 100.0 * (cpu_seconds(pid) - before[pid]) / elapsed for pid in before}
            finally:
                worker.stop()
            time.sleep(3)
            alone = share(broker_pid, min(args.seconds, 10.0))
            line = (
                f"wait={wait} worker={used[worker.pid]:.1f}% "
                f"broker={used[broker_pid]:.1f}% alone={alone:.1f}%"
            )
            print(f"fetch wait {wait} ms, idle {args.seconds:.0f} s: {line}", flush=True)
            results.append(line)
    print("idle_cpu " + " ".join(results), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
