/**
 * The Kafka client choice of the OpenClaw plugin, measured: loopfuse verdict latency per
 * tool call through the plugin's own guard (LoopfuseGuard.beforeToolCall, as OpenClaw
 * calls it) against one running `loopfuse worker`, with
 *   - kafkajs 2.2.4: the plugin's previous transport (copied below as it was: a consumer
 *     group of its own per process for the verdict reader), and
 *   - @platformatic/kafka: the plugin's transport now (src/transport.ts: a group-less
 *     reader, manual assignment of the verdict partitions).
 * Also measured: the time from start() to reading verdicts (what a first tool call waits
 * for when the client starts lazily), and the process warnings each client causes.
 *
 *   node --experimental-transform-types kafka-clients.bench.ts --bootstrap HOST:PORT \
 *        --topics PREFIX [--calls 200]
 *
 * PREFIX.tool-calls / .tool-results / .compactions / .verdicts are the worker's topics
 * (LOOPFUSE_TOPIC_*). Each call has new arguments, so every verdict is `allow`.
 * Prints one JSON line per client.
 */
import { randomUUID } from "node:crypto";
import { parseArgs } from "node:util";
import { Kafka, Partitioners, logLevel, type Admin, type Consumer, type Producer, type SASLOptions } from "kafkajs";
import { KafkaTransport, LoopfuseGuard, resolveConfig, type LoopfuseConfig, type PluginLogger, type Transport } from "../../../integrations/openclaw/dist/src/index.js";

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/**
 * kafkajs transport.
 *
 * kafkajs has no group-less consumer, so the verdict reader joins a consumer group of
 * its own, `<clientId>-verdicts-<incarnation>` (unique per process: every gateway
 * process reads every verdict partition), commits nothing, and starts at the end of
 * the verdict topic as it was *before* it joined (end offsets are read first and
 * sought to), so no verdict of a call published after `start()` began is missed,
 * however long the group join takes.
 */
class KafkajsTransport implements Transport {
  private readonly kafka: Kafka;
  private producer: Producer | null = null;
  private consumer: Consumer | null = null;
  private admin: Admin | null = null;
  private producerReady: Promise<void> | null = null;
  private markConnected: () => void = () => {};
  private stopped = false;

  constructor(
    private readonly config: LoopfuseConfig,
    private readonly incarnation: string,
    private readonly logger: PluginLogger,
  ) {
    const log = logger;
    this.kafka = new Kafka({
      clientId: config.clientId,
      brokers: config.bootstrap,
      ssl: config.ssl,
      sasl: (config.sasl ?? undefined) as SASLOptions | undefined,
      retry: { retries: 5, initialRetryTime: 100, maxRetryTime: 2000 },
      logLevel: logLevel.WARN,
      logCreator: () => (entry) => {
        const text = `kafkajs ${entry.namespace}: ${entry.log.message}`;
        if (entry.level <= logLevel.ERROR) log.error(text);
        else log.warn(text);
      },
    });
  }

  /**
   * Connect, retrying with back-off until connected or stopped (a gateway may start
   * before Kafka or the loopfuse worker). Events sent meanwhile wait for the producer;
   * their calls are decided by the fail policy when their verdict does not come in time.
   */
  async start(onVerdict: (raw: string) => void): Promise<void> {
    this.producerReady = new Promise<void>((resolve) => (this.markConnected = resolve));
    for (let attempt = 0; !this.stopped; attempt++) {
      try {
        await this.connect(onVerdict);
        this.markConnected();
        return;
      } catch (err) {
        if (attempt % 10 === 0) {
          this.logger.warn(`loopfuse: Kafka not ready (${String(err)}); retrying`);
        }
        await this.disconnectAll();
        await sleep(Math.min(5000, 250 * 2 ** Math.min(attempt, 5)));
      }
    }
    throw new Error("loopfuse transport stopped before it connected");
  }

  private async connect(onVerdict: (raw: string) => void): Promise<void> {
    const topic = this.config.topics.verdicts;
    this.producer = this.kafka.producer({
      createPartitioner: Partitioners.DefaultPartitioner, // murmur2, as Java clients and aiokafka
      allowAutoTopicCreation: false, // the loopfuse worker creates topics with the right partition count
    });
    await this.producer.connect();
    this.admin = this.kafka.admin();
    await this.admin.connect();
    let ends: { partition: number; offset: string }[] = [];
    for (let attempt = 0; !this.stopped; attempt++) {
      try {
        ends = await this.admin.fetchTopicOffsets(topic);
        if (ends.length) break;
      } catch (err) {
        if (attempt % 40 === 0) {
          this.logger.warn(`loopfuse: verdict topic ${topic} not readable yet (${String(err)}); is the worker running?`);
        }
      }
      await sleep(250);
    }
    await this.admin.disconnect();
    this.admin = null;
    const session = this.config.groupSessionTimeoutMs;
    const consumer = this.kafka.consumer({
      groupId: `${this.config.clientId}-verdicts-${this.incarnation}`,
      sessionTimeout: session,
      rebalanceTimeout: session,
      heartbeatInterval: Math.max(500, Math.min(3000, Math.floor(session / 6))),
      maxWaitTimeInMs: 20,
      allowAutoTopicCreation: false,
    });
    this.consumer = consumer;
    const joined = new Promise<void>((resolve) => {
      consumer.on(consumer.events.GROUP_JOIN, () => resolve());
    });
    await consumer.connect();
    await consumer.subscribe({ topic, fromBeginning: false });
    await consumer.run({
      autoCommit: false,
      eachMessage: async ({ message }) => {
        if (message.value) onVerdict(message.value.toString("utf8"));
      },
    });
    for (const { partition, offset } of ends) {
      consumer.seek({ topic, partition, offset });
    }
    await joined;
  }

  async send(topic: string, key: string, value: string): Promise<void> {
    if (!this.producerReady) throw new Error("loopfuse transport not started");
    await this.producerReady;
    if (!this.producer || this.stopped) throw new Error("loopfuse transport stopped");
    await this.producer.send({ topic, acks: -1, messages: [{ key, value }] });
  }

  async stop(): Promise<void> {
    this.stopped = true;
    this.markConnected(); // sends still waiting for a connection fail now
    await this.disconnectAll();
  }

  private async disconnectAll(): Promise<void> {
    const closing = [this.consumer?.disconnect(), this.producer?.disconnect(), this.admin?.disconnect()];
    this.consumer = null;
    this.producer = null;
    this.admin = null;
    await Promise.allSettled(closing);
  }
}

const { values } = parseArgs({ options: { bootstrap: { type: "string" }, topics: { type: "string" }, calls: { type: "string", default: "200" } } });
const prefix = values.topics ?? "x";
const calls = Number(values.calls);
const warnings: string[] = [];
process.on("warning", (w) => warnings.push(w.name));
const quiet: PluginLogger = { info: () => {}, warn: () => {}, error: (m) => console.error(m) };

async function measure(client: string, make: (config: LoopfuseConfig, incarnation: string) => Transport) {
  const config = resolveConfig({
    bootstrap: values.bootstrap,
    clientId: `bench-${client}`,
    groupSessionTimeoutMs: 6000,
    timeoutMs: 10_000,
    topics: { toolCalls: `${prefix}.tool-calls`, toolResults: `${prefix}.tool-results`, compactions: `${prefix}.compactions`, verdicts: `${prefix}.verdicts` },
  });
  const incarnation = randomUUID();
  const guard = new LoopfuseGuard({ config, transport: make(config, incarnation), incarnation, logger: quiet });
  const before = warnings.length;
  let t = performance.now();
  await guard.start();
  const startMs = performance.now() - t;
  const latencies: number[] = [];
  const session = `bench:${client}:${incarnation}`;
  for (let i = 0; i < calls; i++) {
    t = performance.now();
    await guard.beforeToolCall({ toolName: "read", params: { path: `f${i}.txt` }, toolCallId: `c${i}`, runId: "r" }, { sessionKey: session, runId: "r", agentId: "main" });
    latencies.push(performance.now() - t);
  }
  const timeouts = guard.stats.timeouts;
  await guard.stop();
  latencies.sort((a, b) => a - b);
  const q = (p: number) => Number(latencies[Math.min(latencies.length - 1, Math.floor(p * latencies.length))]!.toFixed(1));
  console.log(JSON.stringify({
    client, node: process.version, calls, timeouts, start_ms: Number(startMs.toFixed(0)),
    p50_ms: q(0.5), p95_ms: q(0.95), p99_ms: q(0.99), max_ms: q(1), warnings: warnings.slice(before),
  }));
}

await measure("kafkajs@2.2.4", (c, i) => new KafkajsTransport(c, i, quiet));
await measure("@platformatic/kafka@2.12.1", (c, i) => new KafkaTransport(c, i, quiet));
