/** Plugin config: the manifest's configSchema, defaults, and a tolerant normaliser. */
import { X509Certificate } from "node:crypto";
import { readFileSync } from "node:fs";
import { createSecureContext } from "node:tls";
import { parseVerdictKeys, type VerdictKey } from "./signature.js";

export type FailPolicy = "open" | "closed";

export interface Topics {
  toolCalls: string;
  toolResults: string;
  compactions: string;
  verdicts: string;
  /** The reply topic this gateway reads (one of the worker's LOOPFUSE_REPLY_TOPICS); "" reads the whole verdicts topic (v1). */
  replies: string;
}

export interface SaslConfig {
  mechanism: "plain" | "scram-sha-256" | "scram-sha-512";
  username: string;
  password: string;
}

/**
 * TLS to Kafka. Each file is PEM, read once when the transport starts; a CA file
 * replaces Node's default CA store (a private CA: the brokers' certificates are signed
 * by it and nothing else is trusted); certFile and keyFile are a client certificate
 * for brokers that require mutual TLS.
 */
export interface SslConfig {
  caFile: string | null;
  certFile: string | null;
  keyFile: string | null;
}

export interface LoopfuseConfig {
  /** Kafka bootstrap servers, `host:port[,host:port]`. */
  bootstrap: string[];
  /** How long a tool call waits for its verdict (ms). Keep it below OpenClaw's 15 s hook budget. */
  timeoutMs: number;
  /** No verdict in time: `open` runs the tool, `closed` blocks it. */
  failPolicy: FailPolicy;
  topics: Topics;
  /** Report only: events are published and verdicts counted, but nothing is blocked or appended. */
  shadow: boolean;
  /** Kafka client id of the producer and the verdict reader. */
  clientId: string;
  /** null: plaintext; `ssl: true` is TLS trusting Node's default CAs (every file null). */
  ssl: SslConfig | null;
  sasl: SaslConfig | null;
  /** The reply partition to read; null: the incarnation's hash modulo the topic's partition count. */
  replyPartition: number | null;
  /** Unused (the verdict reader joins no group); kept so configs that set it stay valid. */
  groupSessionTimeoutMs: number;
  /**
   * `verdictKey` parsed (the worker's LOOPFUSE_VERDICT_KEY): verdicts must carry a valid
   * signature by one of these keys. null: signatures are not checked. Empty: a key was
   * configured but is malformed, so no verdict verifies (never silently unchecked).
   */
  verdictKeys: VerdictKey[] | null;
}

export const DEFAULT_TOPICS: Topics = {
  toolCalls: "agent.tool-calls",
  toolResults: "agent.tool-results",
  compactions: "agent.compactions",
  verdicts: "loopfuse.verdicts",
  replies: "loopfuse.replies",
};

/** OpenClaw's default before_tool_call budget; a longer wait would fail closed in the host. */
export const HOST_HOOK_TIMEOUT_MS = 15_000;

export const DEFAULTS: LoopfuseConfig = {
  bootstrap: ["127.0.0.1:9092"],
  timeoutMs: 5_000,
  failPolicy: "open",
  topics: DEFAULT_TOPICS,
  shadow: false,
  clientId: "openclaw-loopfuse",
  ssl: null,
  sasl: null,
  replyPartition: null,
  groupSessionTimeoutMs: 30_000,
  verdictKeys: null,
};

/** `id:base64[,id:base64...]` with each secret at least 32 bytes (43 base64 characters). */
const VERDICT_KEY_PATTERN =
  "^\\s*[A-Za-z0-9._-]{1,64}:[A-Za-z0-9+/_-]{43,}={0,2}\\s*(,\\s*[A-Za-z0-9._-]{1,64}:[A-Za-z0-9+/_-]{43,}={0,2}\\s*)*$";

/** The inline JSON Schema of `openclaw.plugin.json` (kept identical; a test checks). */
export const CONFIG_SCHEMA = {
  type: "object",
  additionalProperties: false,
  properties: {
    bootstrap: {
      description: 'Kafka bootstrap servers: "host:port[,host:port]" or a list',
      anyOf: [
        { type: "string", minLength: 1 },
        { type: "array", items: { type: "string", minLength: 1 }, minItems: 1 },
      ],
    },
    timeoutMs: {
      description: "How long a tool call waits for loopfuse's verdict (ms); below OpenClaw's 15000 ms hook budget",
      type: "integer",
      minimum: 1,
      maximum: 14000,
      default: 5000,
    },
    failPolicy: {
      description: "No verdict in time: open = run the tool, closed = block it",
      enum: ["open", "closed"],
      default: "open",
    },
    topics: {
      type: "object",
      additionalProperties: false,
      properties: {
        toolCalls: { type: "string", minLength: 1, default: "agent.tool-calls" },
        toolResults: { type: "string", minLength: 1, default: "agent.tool-results" },
        compactions: { type: "string", minLength: 1, default: "agent.compactions" },
        verdicts: { type: "string", minLength: 1, default: "loopfuse.verdicts" },
        replies: {
          description:
            "The reply topic to read (one of the worker's LOOPFUSE_REPLY_TOPICS); empty: read the whole verdicts topic",
          type: "string",
          default: "loopfuse.replies",
        },
      },
    },
    shadow: {
      description: "Report only: publish events and count verdicts, never block or append",
      type: "boolean",
      default: false,
    },
    clientId: { type: "string", minLength: 1, default: "openclaw-loopfuse" },
    ssl: {
      description:
        "TLS to Kafka: true trusts Node's default CAs; an object names PEM files (a private CA, a client certificate)",
      anyOf: [
        { type: "boolean" },
        {
          type: "object",
          additionalProperties: false,
          properties: {
            caFile: {
              description:
                "The CA certificate(s) that sign the brokers' certificates, trusted instead of Node's default CAs",
              type: "string",
              minLength: 1,
            },
            certFile: { description: "Client certificate for mutual TLS (with keyFile)", type: "string", minLength: 1 },
            keyFile: {
              description: "The client certificate's private key (with certFile)",
              type: "string",
              minLength: 1,
            },
          },
        },
      ],
      default: false,
    },
    sasl: {
      type: "object",
      additionalProperties: false,
      required: ["mechanism", "username", "password"],
      properties: {
        mechanism: { enum: ["plain", "scram-sha-256", "scram-sha-512"] },
        username: { type: "string" },
        password: { type: "string" },
      },
    },
    replyPartition: {
      description: "The reply partition to read (default: the incarnation's hash modulo the reply topic's partitions)",
      type: "integer",
      minimum: 0,
      maximum: 2147483647,
    },
    groupSessionTimeoutMs: {
      description: "Accepted for older configs and unused: the verdict reader joins no consumer group",
      type: "integer",
      minimum: 3000,
      default: 30000,
    },
    verdictKey: {
      description:
        "The worker's LOOPFUSE_VERDICT_KEY (id:base64[,id:base64...], each key >= 32 bytes): only verdicts signed by one of these keys are taken; a secret",
      type: "string",
      pattern: VERDICT_KEY_PATTERN,
    },
  },
} as const;

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

const SSL_FILES = ["caFile", "certFile", "keyFile"] as const;

/** `ssl: {...}`: TLS with the files named; a wrong entry is dropped (and reported). */
function resolveSsl(raw: Record<string, unknown>, bad: (key: string, why: string) => void): SslConfig {
  const ssl: SslConfig = { caFile: null, certFile: null, keyFile: null };
  for (const key of Object.keys(raw)) {
    if (!(SSL_FILES as readonly string[]).includes(key)) bad(`ssl.${key}`, "unknown key");
  }
  for (const key of SSL_FILES) {
    const value = raw[key];
    if (typeof value === "string" && value) ssl[key] = value;
    else if (value !== undefined) bad(`ssl.${key}`, "expected a file path");
  }
  if ((ssl.certFile === null) !== (ssl.keyFile === null)) {
    bad(
      ssl.certFile ? "ssl.keyFile" : "ssl.certFile",
      "ssl.certFile and ssl.keyFile go together (no client certificate used)",
    );
    ssl.certFile = ssl.keyFile = null;
  }
  return ssl;
}

/** The PEM contents of `ssl`'s files, as Node's TLS options `ca`, `cert`, `key`. */
export interface TlsFiles {
  ca?: string;
  cert?: string;
  key?: string;
}

/**
 * Read `ssl`'s files and check that Node accepts them (a CA that is PEM, a key that
 * matches its certificate). Throws `ConfigError` naming the setting: the operator must
 * fix the file, so the transport reports it once and does not retry.
 */
export function readTlsFiles(ssl: SslConfig): TlsFiles {
  const files: TlsFiles = {};
  const names = { caFile: "ca", certFile: "cert", keyFile: "key" } as const;
  for (const key of SSL_FILES) {
    const path = ssl[key];
    if (path === null) continue;
    try {
      files[names[key]] = readFileSync(path, "utf8");
    } catch (err) {
      throw new ConfigError(
        `ssl.${key}: cannot read "${path}" (${(err as NodeJS.ErrnoException).code ?? String(err)})`,
      );
    }
  }
  // Node ignores a CA that does not parse (and then trusts nothing): say so now.
  if (files.ca !== undefined) {
    try {
      new X509Certificate(files.ca);
    } catch {
      throw new ConfigError(`ssl.caFile: "${ssl.caFile}" holds no PEM certificate`);
    }
  }
  if (files.cert !== undefined) {
    try {
      createSecureContext({ cert: files.cert, key: files.key });
    } catch (err) {
      throw new ConfigError(`ssl.certFile / ssl.keyFile: not a certificate and its key (${(err as Error).message})`);
    }
  }
  return files;
}

/** A setting the operator must fix; its message starts with the setting's name. */
export class ConfigError extends Error {
  override name = "ConfigError";
}

/**
 * Defaults filled in; values of the wrong type are reported through `problems` and
 * replaced by their default (OpenClaw validates against the manifest schema before
 * the plugin loads, so this only matters for hosts that do not).
 */
export function resolveConfig(raw: unknown, problems: string[] = []): LoopfuseConfig {
  const cfg: LoopfuseConfig = { ...DEFAULTS, topics: { ...DEFAULT_TOPICS } };
  if (raw === undefined || raw === null) {
    return cfg;
  }
  if (!isRecord(raw)) {
    problems.push("config: not an object");
    return cfg;
  }
  const bad = (key: string, why: string) => problems.push(`${key}: ${why}`);
  for (const key of Object.keys(raw)) {
    if (!(key in CONFIG_SCHEMA.properties)) bad(key, "unknown key");
  }
  const {
    bootstrap,
    timeoutMs,
    failPolicy,
    topics,
    shadow,
    clientId,
    ssl,
    sasl,
    replyPartition,
    groupSessionTimeoutMs,
    verdictKey,
  } = raw;
  if (typeof bootstrap === "string" && bootstrap.trim()) {
    cfg.bootstrap = bootstrap
      .split(",")
      .map((s) => s.trim())
      .filter(Boolean);
  } else if (Array.isArray(bootstrap) && bootstrap.length && bootstrap.every((s) => typeof s === "string" && s)) {
    cfg.bootstrap = bootstrap as string[];
  } else if (bootstrap !== undefined) bad("bootstrap", "expected host:port[,host:port]");
  if (timeoutMs !== undefined) {
    if (Number.isInteger(timeoutMs) && (timeoutMs as number) >= 1) {
      cfg.timeoutMs = timeoutMs as number;
      if (cfg.timeoutMs >= HOST_HOOK_TIMEOUT_MS) {
        bad(
          "timeoutMs",
          `${cfg.timeoutMs} ms reaches OpenClaw's ${HOST_HOOK_TIMEOUT_MS} ms hook budget (the host would block first)`,
        );
      }
    } else bad("timeoutMs", "expected a positive integer");
  }
  if (failPolicy === "open" || failPolicy === "closed") cfg.failPolicy = failPolicy;
  else if (failPolicy !== undefined) bad("failPolicy", "expected open or closed");
  if (isRecord(topics)) {
    for (const name of Object.keys(DEFAULT_TOPICS) as (keyof Topics)[]) {
      const value = topics[name];
      if (typeof value === "string" && (value || name === "replies")) cfg.topics[name] = value;
      else if (value !== undefined) bad(`topics.${name}`, "expected a topic name");
    }
  } else if (topics !== undefined) bad("topics", "expected an object");
  if (typeof shadow === "boolean") cfg.shadow = shadow;
  else if (shadow !== undefined) bad("shadow", "expected a boolean");
  if (typeof clientId === "string" && clientId) cfg.clientId = clientId;
  else if (clientId !== undefined) bad("clientId", "expected a string");
  if (ssl === true) cfg.ssl = { caFile: null, certFile: null, keyFile: null };
  else if (isRecord(ssl)) cfg.ssl = resolveSsl(ssl, bad);
  else if (ssl !== undefined && ssl !== false) bad("ssl", "expected a boolean or {caFile, certFile, keyFile}");
  if (isRecord(sasl)) {
    const { mechanism, username, password } = sasl;
    if (
      (mechanism === "plain" || mechanism === "scram-sha-256" || mechanism === "scram-sha-512") &&
      typeof username === "string" &&
      typeof password === "string"
    ) {
      cfg.sasl = { mechanism, username, password };
    } else bad("sasl", "expected {mechanism, username, password}");
  } else if (sasl !== undefined) bad("sasl", "expected an object");
  if (replyPartition !== undefined && replyPartition !== null) {
    if (
      Number.isInteger(replyPartition) &&
      (replyPartition as number) >= 0 &&
      (replyPartition as number) <= 2147483647
    ) {
      cfg.replyPartition = replyPartition as number;
    } else bad("replyPartition", "expected a partition number (an integer >= 0)");
  }
  if (groupSessionTimeoutMs !== undefined) {
    if (Number.isInteger(groupSessionTimeoutMs) && (groupSessionTimeoutMs as number) >= 3000) {
      cfg.groupSessionTimeoutMs = groupSessionTimeoutMs as number;
    } else bad("groupSessionTimeoutMs", "expected an integer >= 3000");
  }
  if (verdictKey !== undefined && verdictKey !== null) {
    // Fails closed: a malformed key checks every verdict against no key at all (each is
    // dropped, the fail policy decides), rather than fall back to checking none.
    try {
      if (typeof verdictKey !== "string") throw new Error("expected a string");
      cfg.verdictKeys = parseVerdictKeys(verdictKey);
    } catch (err) {
      cfg.verdictKeys = [];
      problems.push(`verdictKey: ${(err as Error).message}; no verdict is accepted until it is fixed`);
    }
  }
  return cfg;
}
