/** Kafka I/O of the plugin: one producer for events, one verdict reader (kafkajs). */
import { Kafka, Partitioners, logLevel, type Admin, type Consumer, type Producer, type SASLOptions } from "kafkajs";
import type { LoopfuseConfig } from "./config.js";
import type { PluginLogger } from "./types.js";

/** What the guard needs from Kafka; tests substitute an in-memory one. */
export interface Transport {
  /** Connect; resolves once verdicts published from now on will be delivered to `onVerdict`. */
  start(onVerdict: (raw: string) => void): Promise<void>;
  /** Publish one event (JSON text) with its Kafka key. */
  send(topic: string, key: string, value: string): Promise<void>;
  stop(): Promise<void>;
}

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
export class KafkaTransport implements Transport {
  private readonly kafka: Kafka;
  private producer: Producer | null = null;
  private consumer: Consumer | null = null;
  private admin: Admin | null = null;
  private producerReady: Promise<void> | null = null;
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

  async start(onVerdict: (raw: string) => void): Promise<void> {
    const topic = this.config.topics.verdicts;
    this.producer = this.kafka.producer({
      createPartitioner: Partitioners.DefaultPartitioner, // murmur2, as Java clients and aiokafka
      allowAutoTopicCreation: false, // the loopfuse worker creates topics with the right partition count
    });
    this.producerReady = this.producer.connect();
    this.admin = this.kafka.admin();
    await this.admin.connect();
    let ends: { partition: number; offset: string }[] = [];
    for (let attempt = 0; !this.stopped; attempt++) {
      try {
        ends = await this.admin.fetchTopicOffsets(topic);
        if (ends.length) break;
      } catch (err) {
        if (attempt % 20 === 0) {
          this.logger.warn(`loopfuse: verdict topic ${topic} not readable yet (${String(err)}); is the worker running?`);
        }
      }
      await sleep(250);
    }
    await this.admin.disconnect();
    this.admin = null;
    const session = this.config.groupSessionTimeoutMs;
    this.consumer = this.kafka.consumer({
      groupId: `${this.config.clientId}-verdicts-${this.incarnation}`,
      sessionTimeout: session,
      rebalanceTimeout: session,
      heartbeatInterval: Math.max(500, Math.min(3000, Math.floor(session / 6))),
      maxWaitTimeInMs: 20,
      allowAutoTopicCreation: false,
    });
    const joined = new Promise<void>((resolve) => {
      this.consumer?.on(this.consumer.events.GROUP_JOIN, () => resolve());
    });
    await this.consumer.connect();
    await this.consumer.subscribe({ topic, fromBeginning: false });
    await this.consumer.run({
      autoCommit: false,
      eachMessage: async ({ message }) => {
        if (message.value) onVerdict(message.value.toString("utf8"));
      },
    });
    for (const { partition, offset } of ends) {
      this.consumer.seek({ topic, partition, offset });
    }
    await this.producerReady;
    await joined;
  }

  async send(topic: string, key: string, value: string): Promise<void> {
    if (!this.producer || !this.producerReady) throw new Error("loopfuse transport not started");
    await this.producerReady;
    await this.producer.send({ topic, acks: -1, messages: [{ key, value }] });
  }

  async stop(): Promise<void> {
    this.stopped = true;
    const closing = [this.consumer?.disconnect(), this.producer?.disconnect(), this.admin?.disconnect()];
    await Promise.allSettled(closing);
  }
}
