"""How long one Apache Kafka node takes to start, and the memory it holds once up.

    python bench/kafka_start.py [--runs 5]

Each run starts a fresh node (loopfuse.streams.local.kafka_broker.ApacheKafka: storage formatted,
JVM start, until a Kafka client gets metadata from it) with the jars already resolved
(the first run resolves them if needed, outside the timing), prints the seconds and the
node's resident memory, and closes it. The last line is machine-readable:
``kafka_start runs=N median_s=... min_s=... max_s=... rss_mib=MIN-MAX``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from loopfuse.streams.local.kafka_broker import ApacheKafka, resolve_kafka  # noqa: E402
from tests.support.harness import rss_kb  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    resolve_kafka(lambda line: print(line, file=sys.stderr, flush=True))
    seconds, rss = [], []
    for _ in range(args.runs):
        kafka = ApacheKafka()
        try:
            started = time.monotonic()
            kafka.start()
            seconds.append(time.monotonic() - started)
            assert kafka.pid is not None
            rss.append(rss_kb(kafka.pid) / 1024)
        finally:
            kafka.close()
        print(f"kafka start: {seconds[-1]:.2f} s to answering, RSS {rss[-1]:.0f} MiB", flush=True)
    print(
        f"kafka_start runs={args.runs} median_s={statistics.median(seconds):.2f} "
        f"min_s={min(seconds):.2f} max_s={max(seconds):.2f} "
        f"rss_mib={min(rss):.0f}-{max(rss):.0f}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
