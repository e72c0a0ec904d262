"""Chaos run: SIGKILL the stream worker at random moments while events flow.

    python -m tests.reliability.chaos --kills 5 --events 20000

* a generator makes ``--events`` events over ``--sessions`` sessions (healthy,
  generic repeat, polling, ping-pong, unknown tool, compaction loop; runs that end
  with ``run_ended``), each with ``seq`` per session and keyed by session;
* the verifier folds them offline with ``Engine(config).replay`` (the same config
  file the worker reads) for the expected verdicts;
* a producer sends them at a steady pace in the background, while a killer
  SIGKILLs the worker ``--kills`` times at random moments and restarts it each
  time (it recovers the session table from the changelog); with ``--workers N``
  N workers share the consumer group and each kill hits a random one, so the
  others take its partitions over (rebalance, changelog recovery) while events
  flow, and get some back when it returns;
* at the end it waits (up to ``--deadline`` s) until every expected verdict has
  arrived, then compares: each delivered verdict must equal the engine's (all
  fields but ``decided_ts``); duplicates are fine only with the same verdict_id
  and identical content.

With ``--nodes 3`` the broker is a three-node Apache Kafka cluster
(:class:`loopfuse.streams.local.kafka_broker.KafkaCluster`; topics with replication 3 and
``min.insync.replicas`` 2, the producer ``acks=all`` and idempotent, as the gateway
client), and ``--broker-kills N`` adds N broker faults at random moments: kill -9 of the
node leading a judged partition (an input's, hence its changelog's and verdicts'
partition too, when they share a leader), then its restart on the same ports and data.
Worker and broker faults then run together. It reports the longest time without a new
verdict while events were due, and that time around each broker kill.

The last line is ``chaos: expected=N delivered=N missing=N wrong=N duplicates=N``
and the exit code is 0 only if missing == wrong == 0. ``--broker`` chooses the broker
as the test suites do (``tests.support.brokers``): Apache Kafka, one local KRaft node,
by default; ``embedded`` for the embedded Tansu; ``HOST:PORT`` for a running one.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import random
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from loopfuse.streams.engine import state_codec
from loopfuse.streams.local.kafka_broker import KafkaCluster
from loopfuse.streams.local.worker_process import WorkerProcess
from tests.support.brokers import choose, describe, started
from tests.support.harness import (
    CONFIG,
    Collector,
    Comparison,
    compare,
    encode,
    expected_verdicts,
    generate,
    input_lag,
    new_topics,
    produce_paced,
    read_all,
    settle,
    unique,
    verdict_key,
    worker_settings,
)


@dataclass
class ChaosOptions:
    kills: int = 5
    events: int = 20_000
    sessions: int = 200
    rate: float | None = None  # events/s; default: spread over ~15 s per kill
    seed: int = 7
    bootstrap: str | None = None  # a broker already running (pytest's session broker)
    broker_kind: str = "kafka"  # with bootstrap: what it is ("kafka" or "tansu")
    broker: str | None = None  # else: tests.support.brokers' choice (kafka, embedded, HOST:PORT)
    deadline: float = 300.0
    workdir: Path | None = None
    single_topic: bool = False  # every event on the tool-calls topic (no cross-topic skew)
    workers: int = 1  # in one consumer group
    nodes: int = 1  # 3: a three-node Kafka cluster (started here, unless cluster is given)
    broker_kills: int = 0  # kill -9 of a partition leader, then its restart (needs a cluster)
    cluster: KafkaCluster | None = None  # a running cluster (pytest's), with bootstrap unset
    config: Path = CONFIG  # the workers' and the verifier's detection config
    lead_node: int | None = None  # this node leads every partition of every topic (created here)
    rolling_restart: bool = False  # stop and start each node in turn, once, under load


@dataclass
class ChaosResult:
    comparison: Comparison
    kills: int
    restart_seconds: list[float]
    produce_seconds: float
    total_seconds: float
    loop_events: Counter[str]
    log_path: Path
    broker_kills: int = 0  # broker faults: kills, and nodes restarted in a rolling restart
    #: per broker kill: seconds from the kill to the first verdict after it (the gap the
    #: gateways saw), and how long the killed node took to be back
    broker_gaps: list[float] = field(default_factory=list)
    broker_restart_seconds: list[float] = field(default_factory=list)
    longest_gap: float = 0.0  # the longest time without a new verdict while events were due

    @property
    def line(self) -> str:
        return self.comparison.line("chaos")


def say(text: str) -> None:
    print(f"[chaos] {text}", flush=True)


async def run_chaos(opts: ChaosOptions) -> ChaosResult:
    workdir = opts.workdir or Path(tempfile.mkdtemp(prefix="loopfuse-chaos-"))
    workdir.mkdir(parents=True, exist_ok=True)
    if opts.cluster is not None:
        return await _run(opts, opts.cluster.bootstrap, "kafka", workdir)
    if opts.bootstrap is not None:
        return await _run(opts, opts.bootstrap, opts.broker_kind, workdir)
    if opts.nodes > 1:
        say(f"broker: a {opts.nodes}-node Apache Kafka cluster (KRaft), logs in {workdir}")
        cluster = KafkaCluster(opts.nodes, data_dir=workdir / "cluster", log_dir=workdir)
        await asyncio.to_thread(cluster.start)
        opts.cluster = cluster
        try:
            return await _run(opts, cluster.bootstrap, "kafka", workdir)
        finally:
            opts.cluster = None
            await asyncio.to_thread(cluster.close)
    choice = choose(opts.broker)
    say(describe(choice))
    with started(choice, workdir / "broker") as broker:
        return await _run(opts, broker.bootstrap, broker.kind, workdir)


async def _run(opts: ChaosOptions, bootstrap: str, kind: str, workdir: Path) -> ChaosResult:
    started = time.monotonic()
    rng = random.Random(opts.seed)
    events = generate(opts.events, opts.sessions, seed=opts.seed, prefix=unique("chaos") + "-")
    expected = expected_verdicts(events, opts.config)
    topics = new_topics()
    cluster = opts.cluster
    if opts.broker_kills and cluster is None:
        raise SystemExit("--broker-kills needs a cluster: --nodes 3")
    replicated = {"replication_factor": 3, "min_insync_replicas": 2} if cluster else {}
    settings = worker_settings(
        bootstrap,
        kind,
        topics,
        unique("loopfuse-chaos"),
        workdir / "data",
        config_file=opts.config,
        **replicated,
    )
    log_paths = [
        workdir / ("worker.log" if n == 0 else f"worker-{n + 1}.log") for n in range(opts.workers)
    ]
    log_path = log_paths[0]
    messages = encode(topics, events)
    if opts.single_topic:
        messages = [(topics["tool_calls"], k, v) for _, k, v in messages]
    # A broker kill costs a leader election and a JVM's restart (~15 s here).
    rate = opts.rate or opts.events / max(20.0, 15.0 * opts.kills + 20.0 * opts.broker_kills)
    duration = len(messages) / rate
    say(
        f"{len(events)} events, {opts.sessions} sessions, {len(expected)} expected verdicts; "
        f"{opts.kills} kills of {opts.workers} worker(s), {opts.broker_kills} broker kills; producing at {rate:.0f} ev/s for "
        f"~{duration:.0f} s; broker {bootstrap} ({kind}); worker logs in {workdir}"
    )

    if opts.lead_node is not None:
        await create_led_topics(bootstrap, settings, opts.lead_node)
    workers = [WorkerProcess(settings, log_path=path).start() for path in log_paths]
    restarts: list[float] = []
    broker_restarts: list[float] = []
    producer: asyncio.Task[None] | None = None
    watcher: asyncio.Task[None] | None = None
    watch: VerdictWatch | None = None
    produced = [0]
    try:
        for worker in workers:
            await asyncio.to_thread(worker.wait_ready, 120)
        async with Collector(bootstrap, [topics["verdicts"], topics["loop_events"]]) as out:
            t0 = time.monotonic()
            producer = asyncio.create_task(
                produce_paced(
                    bootstrap,
                    messages,
                    rate,
                    progress=lambda n: produced.__setitem__(0, n),
                    acks_all=cluster is not None,
                )
            )
            watch = VerdictWatch(
                lambda: {p: n for (t, p), n in out.per_partition.items() if t == topics["verdicts"]}
            )
            watcher = asyncio.create_task(watch.run())
            # Kill moments: random, spread over the production window; worker kills
            # and broker kills in one timeline.
            faults = sorted(
                [(rng.uniform(0.05, 0.9) * duration, "worker") for _ in range(opts.kills)]
                + [(rng.uniform(0.05, 0.9) * duration, "broker") for _ in range(opts.broker_kills)]
                + ([(0.15 * duration, "rolling")] if opts.rolling_restart else [])
            )
            i = 0
            for at, fault in faults:
                delay = at - (time.monotonic() - t0)
                # Never closer than a random 0.3-3 s to the previous restart.
                await asyncio.sleep(max(delay, rng.uniform(0.3, 3.0)))
                if fault == "rolling":
                    assert cluster is not None
                    broker_restarts.extend(await rolling_restart(cluster, watch, t0))
                    continue
                if fault == "broker":
                    assert cluster is not None
                    back = await kill_partition_leader(
                        cluster, bootstrap, settings, rng, watch, t0, produced[0]
                    )
                    broker_restarts.append(back)
                    continue
                i += 1
                victim = rng.randrange(len(workers))
                workers[victim].kill()
                workers[victim].stop()  # reaps, closes the log
                killed = time.monotonic()
                verdicts, sent = len(out.of(topics["verdicts"])), produced[0]
                workers[victim] = WorkerProcess(
                    settings, log_path=log_paths[victim], web_port=workers[victim].web_port
                ).start()
                for worker in workers:
                    await asyncio.to_thread(worker.wait_ready, 120)
                restarts.append(time.monotonic() - killed)
                say(
                    f"kill {i}/{opts.kills} (worker {victim + 1}) at t={killed - t0:.1f} s "
                    f"(produced {sent}, verdicts so far {verdicts}); all ready again after "
                    f"{restarts[-1]:.1f} s"
                )
            await producer
            produce_seconds = time.monotonic() - t0
            say(f"all {len(messages)} events produced in {produce_seconds:.1f} s")
            want = {(v["session_key"], v["seq"]) for v in expected}

            def complete() -> bool:
                got = {(v["session_key"], v["seq"]) for v in out.of(topics["verdicts"])}
                return want <= got

            deadline = time.monotonic() + opts.deadline
            while not complete() and time.monotonic() < deadline:
                await asyncio.sleep(0.5)
            waited = time.monotonic() - t0 - produce_seconds
            say(f"waited {waited:.1f} s after the last event (complete={complete()})")
            watch.stop(when_complete=True)
            await settle(out, bootstrap, settings)  # anything extra (duplicates, wrong ones)
            delivered = out.of(topics["verdicts"])
            loop_events = out.of(topics["loop_events"])
            loops = Counter(e["detector"] for e in loop_events)
        comparison = compare(expected, delivered)
        inputs = sorted({topic for topic, _, _ in messages})
        on_broker = 0
        for topic in inputs:
            on_broker += len(await read_all(bootstrap, topic, int(settings.get("partitions", "4"))))
        say(f"input records on the broker: {on_broker} (produced {len(messages)})")
        if comparison.missing:
            await _diagnose(bootstrap, settings, expected, delivered)
    finally:
        for task in (producer, watcher):
            if task is not None and not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        for worker in workers:
            worker.stop()
    _dump(workdir / "events.jsonl", events)
    _dump(workdir / "expected.jsonl", expected)
    _dump(workdir / "delivered.jsonl", delivered)
    _dump(workdir / "loop_events.jsonl", loop_events)
    for example in comparison.examples:
        say(f"  {example[:400]}")
    say(f"loop events by detector: {dict(loops)}")
    if restarts:
        say(
            f"restart-to-ready seconds: {[round(r, 1) for r in restarts]} (max {max(restarts):.1f})"
        )
    assert watch is not None
    gaps = watch.gaps_after_kills()
    if broker_restarts:
        say(
            f"broker kills: node back after {[round(r, 1) for r in broker_restarts]} s; "
            f"seconds from each kill to the next verdict: {[round(g, 1) for g in gaps]}"
        )
    say(f"longest time without a new verdict: {watch.longest_gap:.1f} s")
    return ChaosResult(
        comparison,
        len(restarts),
        restarts,
        produce_seconds,
        time.monotonic() - started,
        loops,
        log_path,
        broker_kills=len(broker_restarts),
        broker_gaps=gaps,
        broker_restart_seconds=broker_restarts,
        longest_gap=watch.longest_gap,
    )


class VerdictWatch:
    """When verdicts arrived, per partition of the verdicts topic (a gateway waits on
    its session's partition): the longest stretch any partition went without a new
    verdict, and for each broker kill the longest any partition waited from the kill
    to its next verdict. Sampled every 50 ms from the collector's counts, from a
    partition's first verdict until every expected one has arrived (the quiet end of a
    run is not counted)."""

    def __init__(self, counts: Callable[[], dict[int, int]]) -> None:
        self._counts = counts
        self._last: dict[int, tuple[float, int]] = {}  # partition: (when it last moved, count)
        self.longest_gap = 0.0
        self._kills: list[float] = []
        self._waited: list[dict[int, float]] = []  # per kill: partition -> kill to next verdict
        self._stopped = False

    async def run(self) -> None:
        while not self._stopped:
            self.sample()
            await asyncio.sleep(0.05)

    def sample(self) -> None:
        now = time.monotonic()
        for partition, n in self._counts().items():
            last = self._last.get(partition)
            if last is not None and n == last[1]:
                continue
            if last is not None:
                self.longest_gap = max(self.longest_gap, now - last[0])
            self._last[partition] = (now, n)
            for at, waited in zip(self._kills, self._waited, strict=True):
                waited.setdefault(partition, now - at)

    def killed(self) -> None:
        self.sample()
        self._kills.append(time.monotonic())
        self._waited.append({})

    def stop(self, when_complete: bool) -> None:
        self.sample()
        self._stopped = True

    def gaps_after_kills(self) -> list[float]:
        """Per broker kill: the longest any partition waited for its next verdict."""
        return [max(waited.values(), default=float("nan")) for waited in self._waited]


async def partition_leaders(bootstrap: str, topic: str) -> dict[int, int]:
    """partition -> the node id leading it."""
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    await admin.start()
    try:
        (described,) = await admin.describe_topics([topic])
        return {p["partition"]: p["leader"] for p in described["partitions"]}
    finally:
        await admin.close()


async def create_led_topics(bootstrap: str, settings: dict[str, str], lead: int) -> None:
    """Create the worker's topics (inputs, changelog, outputs) as it would, replication 3
    and min.insync.replicas 2, but with node ``lead`` the first replica, hence the
    leader, of every partition: killing it hits the inputs, the changelog and the
    verdicts being judged at once."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    parts = int(settings.get("partitions", "4"))
    others = [n for n in (1, 2, 3) if n != lead]
    changelog = f"{settings['app_id']}-sessions-changelog"
    names = [
        settings[f"topic_{t}"]
        for t in (
            "tool_calls",
            "tool_results",
            "compactions",
            "verdicts",
            "loop_events",
            "dead_letters",
        )
    ] + [changelog]
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30_000)
    await admin.start()
    try:
        await admin.create_topics(
            [
                NewTopic(
                    name,
                    -1,
                    -1,
                    replica_assignments={p: [lead, *others] for p in range(parts)},
                    topic_configs={
                        "min.insync.replicas": "2",
                        **({"cleanup.policy": "compact"} if name == changelog else {}),
                    },
                )
                for name in names
            ]
        )
    finally:
        await admin.close()


async def rolling_restart(cluster: KafkaCluster, watch: VerdictWatch, t0: float) -> list[float]:
    """Stop (SIGTERM: a controlled shutdown moves its leaderships first) and start each
    node in turn, as an upgrade does; seconds each took to be back."""
    took = []
    for node in cluster.nodes:
        watch.killed()
        began = time.monotonic()
        say(f"rolling restart: node {node.node_id} at t={began - t0:.1f} s")
        await asyncio.to_thread(node.stop)
        await asyncio.to_thread(node.start)
        took.append(time.monotonic() - began)
        say(f"rolling restart: node {node.node_id} back after {took[-1]:.1f} s")
    return took


async def kill_partition_leader(
    cluster: KafkaCluster,
    bootstrap: str,
    settings: dict[str, str],
    rng: random.Random,
    watch: VerdictWatch,
    t0: float,
    sent: int,
) -> float:
    """kill -9 the node leading a random partition of the tool-calls topic, and start it
    again on its ports and data; seconds until it answers again."""
    topic = settings["topic_tool_calls"]
    leaders = await partition_leaders(bootstrap, topic)
    partition = rng.choice(sorted(leaders))
    node = cluster.node_at(leaders[partition])
    changelog = f"{settings['app_id']}-sessions-changelog"
    also = [
        name
        for name in (changelog, settings["topic_verdicts"])
        if (await partition_leaders(bootstrap, name)).get(partition) == node.node_id
    ]
    node.kill()
    watch.killed()
    killed = time.monotonic()
    say(
        f"broker kill: node {node.node_id} (leader of {topic}[{partition}]"
        f"{', and of that partition of ' + ', '.join(also) if also else ''}) "
        f"at t={killed - t0:.1f} s (produced {sent})"
    )
    await asyncio.to_thread(node.start)
    back = time.monotonic() - killed
    say(f"broker node {node.node_id} back after {back:.1f} s")
    return back


async def _diagnose(
    bootstrap: str,
    settings: dict[str, str],
    expected: list[dict[str, Any]],
    delivered: list[dict[str, Any]],
) -> None:
    """Where missing verdicts are stuck: the sessions' states as the changelog has them."""
    got = {verdict_key(v) for v in delivered}
    missing = [v for v in expected if verdict_key(v) not in got]
    sessions = Counter(v["session_key"] for v in missing)
    changelog = f"{settings['app_id']}-sessions-changelog"
    records = await read_all(bootstrap, changelog, int(settings.get("partitions", "4")))
    last: dict[bytes, bytes | None] = {}
    for _, _, key, value in sorted(records, key=lambda r: (r[0], r[1])):
        if key is not None:
            last[key] = value
    parts = int(settings.get("partitions", "4"))
    inputs = [settings[f"topic_{t}"] for t in ("tool_calls", "tool_results", "compactions")]
    lag = {
        f"{tp.topic}[{tp.partition}]": behind
        for tp, behind in sorted((await input_lag(bootstrap, settings)).items())
        if behind
    }
    say(f"consumer lag at the end (end offset - committed): {lag or 'none'}")
    # Did a session's state ever go backwards in the changelog? A regression means
    # a worker started from an older state than the changelog held (recovery lost
    # records); none means the newer state was never written at all.
    history: dict[bytes, list[tuple[int, int, int]]] = {}
    for partition, offset, key, value in sorted(records, key=lambda r: (r[0], r[1])):
        if key is not None and value is not None:
            seq = state_codec.decode(value).next_seq
            history.setdefault(key, []).append((partition, offset, -1 if seq is None else seq))
    regressions = [
        (key, prev, cur)
        for key, rows in history.items()
        for prev, cur in itertools.pairwise(rows)
        if cur[2] < prev[2]
    ]
    say(
        f"changelog: {len(records)} records, {len(history)} sessions, "
        f"{len(regressions)} state regressions (next_seq going backwards) in "
        f"{len({key for key, _, _ in regressions})} sessions"
    )
    for key, prev, cur in regressions[:8]:
        say(f"  {key[-24:]!r}: next_seq {prev[2]} at {prev[:2]} -> {cur[2]} at {cur[:2]}")
    # Where the lost events sit in the input topics (to match against worker logs).
    located: dict[tuple[str, int], tuple[str, int, int]] = {}
    for topic in inputs:
        for partition, offset, _, value in await read_all(bootstrap, topic, parts):
            if value:
                event = orjson.loads(value)
                located[(event["session_key"], event.get("seq", -1))] = (topic, partition, offset)
    for v in missing[:12]:
        where = located.get((v["session_key"], v["seq"]))
        say(
            f"  missing {v['session_key']} seq {v['seq']}: input (topic, partition, offset) {where}"
        )
    say(f"missing verdicts in {len(sessions)} sessions; their states in the changelog:")
    for key, n in sessions.most_common(8):
        raw = last.get(key.encode())
        seqs = sorted(v["seq"] for v in missing if v["session_key"] == key)
        if raw is None:
            say(f"  {key}: {n} missing (seqs {seqs[:12]}), no state")
            continue
        st = state_codec.decode(raw)
        say(
            f"  {key}: {n} missing (seqs {seqs[:12]}); state next_seq={st.next_seq} "
            f"parked={sorted(st.parked)[:12]} skipped={st.skipped}"
        )


def _dump(path: Path, rows: list[dict[str, Any]]) -> None:
    with path.open("wb") as f:
        for row in rows:
            f.write(orjson.dumps(row) + b"\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.reliability.chaos", description=__doc__)
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--rate", type=float, default=None, help="events/s (default: auto)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--broker",
        default=None,
        help="kafka (default: Apache Kafka, one local KRaft node), embedded, or HOST:PORT "
        "of a running broker (LOOPFUSE_TEST_BROKER_KIND=tansu if it is the embedded one)",
    )
    parser.add_argument("--deadline", type=float, default=300.0, help="seconds to wait at end")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument(
        "--single-topic", action="store_true", help="send every event to the tool-calls topic"
    )
    parser.add_argument("--workers", type=int, default=1, help="workers in the consumer group")
    parser.add_argument(
        "--nodes", type=int, default=1, help="3: a three-node Apache Kafka cluster (--broker kafka)"
    )
    parser.add_argument(
        "--broker-kills",
        type=int,
        default=0,
        help="kill -9 of a partition leader, then its restart, N times (needs --nodes 3)",
    )
    parser.add_argument(
        "--config",
        type=Path,
        default=CONFIG,
        help="the detection config (default tests/fixtures/worker.json5; "
        "tests/fixtures/chaos_rules.json5 has every opt-in rule)",
    )
    args = parser.parse_args(argv)
    if args.broker_kills and args.nodes < 3:
        parser.error("--broker-kills needs --nodes 3")
    if args.nodes > 1 and args.broker not in (None, "kafka"):
        parser.error("--nodes 3 starts an Apache Kafka cluster: --broker kafka")
    opts = ChaosOptions(
        kills=args.kills,
        events=args.events,
        sessions=args.sessions,
        rate=args.rate,
        seed=args.seed,
        broker=args.broker,
        deadline=args.deadline,
        workdir=args.workdir,
        single_topic=args.single_topic,
        workers=args.workers,
        nodes=args.nodes,
        broker_kills=args.broker_kills,
        config=args.config,
    )
    result = asyncio.run(run_chaos(opts))
    say(f"total {result.total_seconds:.1f} s")
    print(result.line, flush=True)
    return 0 if result.comparison.ok else 1


if __name__ == "__main__":
    sys.exit(main())
