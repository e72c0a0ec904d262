"""The worker's records into its producer: Faust's ``Producer.send`` (and aiokafka's
under it) against ``faust_compat.producer.append_record``, on the worker's own Faust
producer and a broker of this machine.

Each pass hands over ``--records`` records of ``--bytes`` bytes keyed by ``--keys``
session keys (as verdicts are), then waits for their delivery; the figures are the
process's CPU time per record (steadier than wall time on a shared machine) for the
hand-over alone and with the delivery, and records/s. The two ways alternate,
``--rounds`` passes each; the last line gives their medians.

    python bench/hand_over.py                 # a local Apache Kafka node (jars resolved once)
    python bench/hand_over.py --bootstrap HOST:PORT
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from loopfuse.streams.settings import Settings
from loopfuse.streams.worker.app import create_app
from loopfuse.streams.worker.faust_compat.producer import append_record

WAYS = ("send", "append_record")


async def measure(bootstrap: str, records: int, size: int, keys: int, rounds: int) -> None:
    topic = f"bench-hand-over-{uuid.uuid4().hex[:8]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 4, 1)])
    finally:
        await admin.close()
    with tempfile.TemporaryDirectory(prefix="loopfuse-bench-") as tmp:
        app = create_app(Settings(bootstrap_servers=bootstrap, data_dir=Path(tmp)))
        producer = app.producer
        await producer.start()
        try:
            await (await producer.send(topic, b"warm", b"up", None, None, None))
            batch = [(f"agent:1:session:{n % keys}".encode(), b"v" * size) for n in range(records)]
            figures: dict[str, list[tuple[float, float, float]]] = {way: [] for way in WAYS}
            for _ in range(rounds):
                for way in WAYS:
                    start_cpu, start = time.process_time(), time.perf_counter()
                    futures = []
                    for key, value in batch:
                        if way == "send":
                            future = await producer.send(topic, key, value, None, None, None)
                        else:
                            appended = await append_record(app, topic, key, value, None, None)
                            assert appended is not None, "append_record fell back to send"
                            future = appended
                        futures.append(future)
                    handed_cpu = time.process_time()
                    await asyncio.gather(*futures)
                    done_cpu, done = time.process_time(), time.perf_counter()
                    figure = (
                        (handed_cpu - start_cpu) / records * 1e6,
                        (done_cpu - start_cpu) / records * 1e6,
                        records / (done - start),
                    )
                    figures[way].append(figure)
                    print(
                        f"{way:14s} hand-over {figure[0]:5.2f} µs CPU/record, with delivery "
                        f"{figure[1]:5.2f} µs, {figure[2]:8,.0f} records/s",
                        flush=True,
                    )
        finally:
            await producer.stop()
    medians = {
        way: [statistics.median(f[i] for f in figures[way]) for i in range(3)] for way in WAYS
    }
    print(
        " ".join(
            f"{way}_handover_us={m[0]:.2f} {way}_delivered_us={m[1]:.2f} {way}_records_per_s={m[2]:.0f}"
            for way, m in medians.items()
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", help="a running broker; default: start a Kafka node")
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--bytes", type=int, default=480, help="each record's value")
    parser.add_argument("--keys", type=int, default=1_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.bootstrap:
        asyncio.run(measure(args.bootstrap, args.records, args.bytes, args.keys, args.rounds))
        return
    from loopfuse.streams.local.kafka_broker import ApacheKafka

    with ApacheKafka() as kafka:
        print(f"broker: Apache Kafka on {kafka.bootstrap}", flush=True)
        asyncio.run(measure(kafka.bootstrap, args.records, args.bytes, args.keys, args.rounds))


if __name__ == "__main__":
    main()
