/** Kafka I/O of the plugin: one producer for events, one group-less verdict reader (@platformatic/kafka). */
import { createHash } from "node:crypto";
import {
  compatibilityPartitioner,
  Consumer,
  Producer,
  ProduceAcks,
  stringSerializers,
  type ClusterMetadata,
  type SASLOptions,
} from "@platformatic/kafka";
import { readTlsFiles, type LoopfuseConfig, type TlsFiles } from "./config.js";
import { VerdictVerifier } from "./signature.js";
import type { PluginLogger } from "./types.js";

/** What the guard needs from Kafka; tests substitute an in-memory one. */
export interface Transport {
  /** Connect; resolves once verdicts published from now on will be delivered to `onVerdict`. */
  start(onVerdict: (raw: string) => void): Promise<void>;
  /** Publish one event (JSON text) with its Kafka key. */
  send(topic: string, key: string, value: string): Promise<void>;
  stop(): Promise<void>;
  /** What the verdict reader read: every record, and other gateways' among them (reply routing). */
  readonly counts?: ReadCounts;
}

export interface ReadCounts {
  /** Records the reader took from Kafka. */
  recordsRead: number;
  /** Of those, other gateways' replies on a shared partition (skipped unparsed). */
  foreignRecords: number;
  /** With `verdictKey`: records of ours without a `loopfuse-sig` header (dropped unparsed). */
  unsignedVerdicts: number;
  /** With `verdictKey`: records of ours whose signature does not verify (dropped unparsed). */
  badSignatures: number;
}

/** How often, at most, the reader logs verdicts it dropped for their signature (all are counted). */
const SIGNATURE_LOG_INTERVAL_MS = 10_000;

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

const SASL_MECHANISMS = { plain: "PLAIN", "scram-sha-256": "SCRAM-SHA-256", "scram-sha-512": "SCRAM-SHA-512" } as const;

/** How long one verdict fetch may wait on the broker for new records (ms). */
const FETCH_WAIT_MS = 200;

interface PartitionCursor {
  partition: number;
  leader: number;
  leaderEpoch: number;
  offset: bigint;
}

/**
 * @platformatic/kafka transport.
 *
 * The verdict reader joins no consumer group: it reads every partition of the verdict
 * topic by manual assignment (Kafka Fetch requests to each partition's leader),
 * starting at the end offsets read when it starts, so no verdict of a call published
 * after `start()` resolved is missed, and nothing is committed. Without a group there
 * is no join to wait for (a join takes seconds; a first tool call would wait for it)
 * and nothing to rebalance when gateways come and go.
 *
 * Reply routing (loopfuse's docs/wire-format.md, Reply routing): with `topics.replies`
 * set (the default), the reader reads one partition of the reply topic, and every
 * event sent names it as `reply_to`, keyed by this process's incarnation; a record
 * with another key (a gateway that chose the same partition) is skipped unparsed.
 * The partition is `replyPartition`, or the incarnation's hash modulo the topic's
 * partition count. `topics.replies: ""` reads every partition of the verdict topic (v1).
 */
export class KafkaTransport implements Transport {
  private producer: Producer<string, string, string, string> | null = null;
  private reader: Consumer | null = null;
  private producerReady: Promise<void> | null = null;
  private markConnected: () => void = () => {};
  private stopped = false;
  private reading: Promise<void> | null = null;
  /** What `send` puts before an event's other fields: its `reply_to` (empty: none). */
  private replyPrefix = "";
  private requesterKey: Buffer | null = null;
  /** The reply partition read (null: no reply routing, or not connected yet). */
  replyPartition: number | null = null;
  /** Records the reader took from Kafka; of those, others' and (with a key) dropped ones. */
  readonly counts: ReadCounts = { recordsRead: 0, foreignRecords: 0, unsignedVerdicts: 0, badSignatures: 0 };
  /** With `verdictKey`: what a record of ours must be signed by (null: not checked). */
  private readonly verifier: VerdictVerifier | null;
  private signatureLoggedAt = -Infinity;
  private signatureUnlogged = 0;
  /** The PEM contents of `ssl`'s files, read once by start(). */
  private tls: TlsFiles | null = null;
  /** The refusal last logged, so a retried one is not logged again. */
  private lastRefusal: string | null = null;

  constructor(
    private readonly config: LoopfuseConfig,
    private readonly incarnation: string,
    private readonly logger: PluginLogger,
  ) {
    this.verifier = config.verdictKeys ? new VerdictVerifier(config.verdictKeys) : null;
  }

  private connection() {
    return { ...connectionOptions(this.config, this.tls), autocreateTopics: false }; // the loopfuse worker creates topics with the right partition count
  }

  /**
   * Connect, retrying with back-off until connected or stopped (a gateway may start
   * before Kafka or the loopfuse worker). Events sent meanwhile wait for the producer;
   * their calls are decided by the fail policy when their verdict does not come in time.
   *
   * A refusal only the operator can fix (credentials, an untrusted certificate, an ACL)
   * is logged once, as one line naming the setting, and retried quietly: the broker's
   * side may be what gets fixed. TLS files that cannot be read reject at once (no retry).
   */
  async start(onVerdict: (raw: string) => void): Promise<void> {
    if (this.config.ssl) this.tls = readTlsFiles(this.config.ssl);
    this.producerReady = new Promise<void>((resolve) => (this.markConnected = resolve));
    for (let attempt = 0; !this.stopped; attempt++) {
      try {
        const cursors = await this.connect();
        this.markConnected();
        this.reading = this.read(cursors, onVerdict);
        return;
      } catch (err) {
        if (!this.reportRefusal(err, this.config.topics.toolCalls) && attempt % 10 === 0)
          this.logger.warn(`loopfuse: Kafka not ready (${this.redact(err)}); retrying`);
        await this.closeAll();
        await sleep(Math.min(5000, 250 * 2 ** Math.min(attempt, 5)));
      }
    }
    throw new Error("loopfuse transport stopped before it connected");
  }

  /** Log a refusal the operator must fix, the first time it is seen; false: not one. */
  private reportRefusal(err: unknown, topic: string): boolean {
    const refusal = describeRefusal(err, this.config, topic);
    if (refusal === null) return false;
    if (refusal !== this.lastRefusal) {
      this.lastRefusal = refusal;
      this.logger.error(
        `loopfuse: ${refusal}; every call falls to the fail-${this.config.failPolicy} policy until it is fixed`,
      );
    }
    return true;
  }

  /** An error as text without the SASL password (should a library ever echo it). */
  private redact(err: unknown): string {
    const text = String(err);
    const password = this.config.sasl?.password;
    return password ? text.split(password).join("***") : text;
  }

  /** The topic the reader reads: the reply topic, or (v1) the verdict topic. */
  private get readTopic(): string {
    return this.config.topics.replies || this.config.topics.verdicts;
  }

  private async connect(): Promise<PartitionCursor[]> {
    const topic = this.readTopic;
    this.producer = new Producer({
      ...this.connection(),
      serializers: stringSerializers,
      partitioner: compatibilityPartitioner, // murmur2 as Java clients and aiokafka: same key, same partition
      acks: ProduceAcks.ALL,
    });
    // A group id is required by the constructor; the reader never joins it.
    this.reader = new Consumer({
      ...this.connection(),
      groupId: `${this.config.clientId}-verdicts-${this.incarnation}`,
    });
    await this.producer.metadata({ topics: [this.config.topics.toolCalls] });
    for (let attempt = 0; !this.stopped; attempt++) {
      try {
        const metadata = await this.reader.metadata({ topics: [topic], forceUpdate: true });
        const ends = await this.reader.listOffsets({ topics: [topic] });
        return this.cursors(metadata, ends.get(topic) ?? []);
      } catch (err) {
        if (this.reportRefusal(err, topic)) {
          // denied, not missing: waits quietly for the ACL, as a missing topic does
        } else if (attempt % 40 === 0) {
          const hint = this.config.topics.replies
            ? "the worker creates the topics of its LOOPFUSE_REPLY_TOPICS: is it running, and is this one of them?"
            : "is the worker running?";
          this.logger.warn(`loopfuse: verdict topic ${topic} not readable yet (${this.redact(err)}); ${hint}`);
        }
        await sleep(250);
      }
    }
    throw new Error("loopfuse transport stopped");
  }

  private cursors(metadata: ClusterMetadata, ends: bigint[]): PartitionCursor[] {
    const topic = this.readTopic;
    const info = metadata.topics.get(topic);
    if (!info || info.partitions.length === 0) throw new Error(`no partitions for ${topic}`);
    const all = info.partitions.map((p, partition) => ({
      partition,
      leader: p.leader,
      leaderEpoch: p.leaderEpoch,
      offset: ends[partition] ?? 0n,
    }));
    if (!this.config.topics.replies) return all;
    const count = all.length;
    const asked = this.config.replyPartition;
    if (asked !== null && asked >= count) {
      // Not retried into a loop of warnings: a config error the operator must fix.
      this.stopped = true;
      throw new Error(`replyPartition ${asked} is not a partition of ${topic} (it has ${count})`);
    }
    const partition = asked ?? replyPartitionOf(this.incarnation, count);
    this.replyPartition = partition;
    this.requesterKey = Buffer.from(this.incarnation, "utf8");
    const replyTo = { topic, partition, requester: this.incarnation };
    this.replyPrefix = `{"reply_to":${JSON.stringify(replyTo)},`;
    return [all[partition]!];
  }

  /** Fetch from each leader in turn, forever (until stopped); a failed fetch refreshes the leaders. */
  private async read(cursors: PartitionCursor[], onVerdict: (raw: string) => void): Promise<void> {
    const topic = this.readTopic;
    let topicId = "";
    const leaders = () => [...new Set(cursors.map((c) => c.leader))];
    const refresh = async () => {
      const metadata = await this.reader!.metadata({ topics: [topic], forceUpdate: true });
      const info = metadata.topics.get(topic);
      topicId = info?.id ?? "";
      for (const c of cursors) {
        const p = info?.partitions[c.partition];
        if (p) {
          c.leader = p.leader;
          c.leaderEpoch = p.leaderEpoch;
        }
      }
    };
    while (!this.stopped) {
      try {
        if (!topicId) await refresh();
        // One leader in practice; with several, their fetches wait side by side.
        await Promise.all(
          leaders().map((node) =>
            this.fetchFrom(
              node,
              topicId,
              cursors.filter((c) => c.leader === node),
              onVerdict,
            ),
          ),
        );
      } catch (err) {
        if (this.stopped) return;
        this.logger.warn(`loopfuse: verdict fetch failed (${this.redact(err)}); refreshing leaders`);
        topicId = "";
        await sleep(250);
      }
    }
  }

  private async fetchFrom(
    node: number,
    topicId: string,
    cursors: PartitionCursor[],
    onVerdict: (raw: string) => void,
  ): Promise<void> {
    const response = await this.reader!.fetch({
      node,
      maxWaitTime: FETCH_WAIT_MS,
      minBytes: 1,
      maxBytes: 10 * 1024 * 1024,
      topics: [
        {
          topicId,
          partitions: cursors.map((c) => ({
            partition: c.partition,
            currentLeaderEpoch: c.leaderEpoch,
            fetchOffset: c.offset,
            lastFetchedEpoch: -1,
            partitionMaxBytes: 1024 * 1024,
          })),
        },
      ],
    });
    for (const topicResponse of response.responses) {
      for (const part of topicResponse.partitions) {
        const cursor = cursors.find((c) => c.partition === part.partitionIndex);
        if (!cursor) continue;
        if (part.errorCode !== 0) throw new Error(`fetch error ${part.errorCode} on partition ${part.partitionIndex}`);
        const mine = this.requesterKey;
        for (const batch of part.records ?? []) {
          for (const record of batch.records) {
            const offset = batch.firstOffset + BigInt(record.offsetDelta);
            if (offset < cursor.offset) continue; // a batch may start before the offset asked for
            cursor.offset = offset + 1n;
            this.counts.recordsRead++;
            // Another gateway's reply on a shared partition: its key is not ours.
            if (mine && !(record.key && mine.equals(record.key))) {
              this.counts.foreignRecords++;
              continue;
            }
            if (this.verifier && !this.signed(this.verifier, record.key, record.value, record.headers)) continue;
            if (record.value) onVerdict(record.value.toString("utf8"));
          }
        }
      }
    }
  }

  /**
   * Whether a record of ours is signed by one of our keys; if not it is counted, logged at
   * most every 10 s, and never parsed: its call waits on, and the fail policy decides if
   * no genuine verdict comes.
   */
  private signed(
    verifier: VerdictVerifier,
    key: Buffer | null,
    value: Buffer | null,
    headers: [Buffer | null, Buffer | null][],
  ): boolean {
    const check = verifier.check(key, value, headers);
    if (check === "ok") return true;
    if (check === "unsigned") this.counts.unsignedVerdicts++;
    else this.counts.badSignatures++;
    const now = Date.now();
    if (now - this.signatureLoggedAt < SIGNATURE_LOG_INTERVAL_MS) {
      this.signatureUnlogged++;
      return false;
    }
    this.signatureLoggedAt = now;
    this.logger.warn(
      `loopfuse: dropping a verdict record that is ${check === "unsigned" ? "unsigned" : "not signed by a key of this gateway"} ` +
        `(${this.counts.unsignedVerdicts} unsigned, ${this.counts.badSignatures} badly signed so far; ${this.signatureUnlogged} more since the last such line): ` +
        "forged, or the worker's LOOPFUSE_VERDICT_KEY is not one of this gateway's verdictKey keys",
    );
    this.signatureUnlogged = 0;
    return false;
  }

  async send(topic: string, key: string, value: string): Promise<void> {
    if (!this.producerReady) throw new Error("loopfuse transport not started");
    await this.producerReady;
    if (!this.producer || this.stopped) throw new Error("loopfuse transport stopped");
    // Known once connected, so added here: the guard builds events before that.
    if (this.replyPrefix && value.startsWith("{") && value.length > 2) value = this.replyPrefix + value.slice(1);
    await this.producer.send({ messages: [{ topic, key, value }] });
  }

  async stop(): Promise<void> {
    this.stopped = true;
    this.markConnected(); // sends still waiting for a connection fail now
    await this.closeAll();
    await this.reading?.catch(() => {});
  }

  private async closeAll(): Promise<void> {
    const closing = [this.reader?.close(true), this.producer?.close(true)];
    this.reader = null;
    this.producer = null;
    await Promise.allSettled(closing);
  }
}

/** The reply partition of a gateway that names none: its incarnation's hash, spread evenly. */
export function replyPartitionOf(incarnation: string, partitions: number): number {
  return createHash("sha256").update(incarnation).digest().readUInt32BE(0) % partitions;
}

/** The client options of the producer and the reader: bootstrap, TLS (`tls`: the PEM contents of `ssl`'s files), SASL. */
export function connectionOptions(config: LoopfuseConfig, tls: TlsFiles | null) {
  const sasl: SASLOptions | undefined = config.sasl
    ? {
        mechanism: SASL_MECHANISMS[config.sasl.mechanism],
        username: config.sasl.username,
        password: config.sasl.password,
      }
    : undefined;
  return {
    clientId: config.clientId,
    bootstrapBrokers: config.bootstrap,
    // Node's TLS: without `ca` its default CA store, with it that CA only.
    ...(config.ssl ? { tls: { ...tls } } : {}),
    ...(sasl ? { sasl } : {}),
    connectTimeout: 5_000,
    retries: 3,
    retryDelay: 250,
  };
}

/** Node's codes of a certificate chain it does not trust. */
const UNTRUSTED_CERTIFICATE = new Set([
  "UNABLE_TO_VERIFY_LEAF_SIGNATURE",
  "UNABLE_TO_GET_ISSUER_CERT",
  "UNABLE_TO_GET_ISSUER_CERT_LOCALLY",
  "SELF_SIGNED_CERT_IN_CHAIN",
  "DEPTH_ZERO_SELF_SIGNED_CERT",
  "CERT_SIGNATURE_FAILURE",
  "CERT_UNTRUSTED",
  "CERT_REJECTED",
  "CERT_HAS_EXPIRED",
  "CERT_NOT_YET_VALID",
]);

/** The error and every error it wraps (@platformatic/kafka nests them in `errors` and `cause`). */
function* errorChain(err: unknown, depth = 0): Generator<Record<string, unknown>> {
  if (!err || typeof err !== "object" || depth > 8) return;
  const e = err as Record<string, unknown>;
  yield e;
  if (Array.isArray(e.errors)) for (const inner of e.errors) yield* errorChain(inner, depth + 1);
  yield* errorChain(e.cause, depth + 1);
}

/**
 * What a connection error means when only the operator can fix it, as one sentence
 * naming the setting (never the password); `topic` is the one being asked for. Null
 * for everything else (Kafka down,
 * starting, a leader moving), which the transport retries and reports as "not ready".
 */
export function describeRefusal(err: unknown, config: LoopfuseConfig, topic: string): string | null {
  for (const e of errorChain(err)) {
    const code = typeof e.code === "string" ? e.code : "";
    const apiId = typeof e.apiId === "string" ? e.apiId : "";
    const message = typeof e.message === "string" ? e.message : "";
    if (
      apiId === "SASL_AUTHENTICATION_FAILED" ||
      (code === "PLT_KFK_AUTHENTICATION" && message.startsWith("SASL authentication failed"))
    ) {
      return config.sasl
        ? `Kafka refused the SASL credentials of user ${JSON.stringify(config.sasl.username)} (sasl.username / sasl.password)`
        : "Kafka refused the SASL authentication (sasl)";
    }
    if (apiId === "UNSUPPORTED_SASL_MECHANISM" || message === "Cannot find a suitable SASL mechanism.") {
      return `Kafka does not offer SASL mechanism ${config.sasl ? SASL_MECHANISMS[config.sasl.mechanism] : "(none)"} (sasl.mechanism)`;
    }
    if (message === "Broker requires TLS." || message.startsWith("TLS handshake failed")) {
      return `the broker's listener and the plugin disagree on TLS / SASL (ssl, sasl): ${message || apiId}`;
    }
    if (UNTRUSTED_CERTIFICATE.has(code)) {
      const trust = config.ssl?.caFile
        ? `ssl.caFile ${JSON.stringify(config.ssl.caFile)} is not the CA that signed it`
        : "ssl.caFile is not set: only Node's default CAs are trusted";
      return `the broker's certificate is not trusted (${trust}; ${code})`;
    }
    if (code === "ERR_TLS_CERT_ALTNAME_INVALID") {
      return `the broker's certificate does not name the host connected to (bootstrap; ${message})`;
    }
    if (apiId === "TOPIC_AUTHORIZATION_FAILED") {
      const who = config.sasl ? `user ${JSON.stringify(config.sasl.username)}` : "this client";
      return (
        `Kafka's ACLs deny ${who} topic ${topic} (${apiId}; topics): a gateway's user may write the input topics ` +
        "and read its reply topic (infra/kafka/kafka-acls.sh gateway), not the verdicts topic"
      );
    }
  }
  return null;
}
