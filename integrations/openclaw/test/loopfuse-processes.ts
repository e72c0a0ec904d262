/**
 * loopfuse's broker and worker as child processes, for the end-to-end tests of this
 * package and of tests/e2e/openclaw (which imports this file as TypeScript: Node type
 * stripping, so only `node:` imports and erasable syntax here).
 *
 * Every process started through a `Processes` is stopped by its PID.
 */
import assert from "node:assert/strict";
import { spawn, type ChildProcess } from "node:child_process";
import { once } from "node:events";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { join } from "node:path";

/** A child whose stdout and stderr are kept (and written to its log file on exit). */
export interface Logged extends ChildProcess {
  log: string[];
}

/** SIGTERM by PID, SIGKILL after 10 s. */
export async function stop(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null || child.pid === undefined) return;
  const exited = once(child, "exit");
  process.kill(child.pid, "SIGTERM");
  const timer = setTimeout(
    () => child.pid !== undefined && child.exitCode === null && process.kill(child.pid, "SIGKILL"),
    10_000,
  );
  await exited;
  clearTimeout(timer);
}

export async function waitFor<T>(
  what: string,
  timeoutMs: number,
  probe: () => Promise<T | undefined> | T | undefined,
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await probe();
    if (value !== undefined) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

export function freePort(): Promise<number> {
  return new Promise((res, rej) => {
    const server = createServer();
    server.listen(0, "127.0.0.1", () => {
      const address = server.address();
      server.close(() => (typeof address === "object" && address ? res(address.port) : rej(new Error("no port"))));
    });
  });
}

/** The children one test file started, and the folder their logs go to. */
export class Processes {
  readonly children: ChildProcess[] = [];
  readonly work: string;

  constructor(work: string) {
    this.work = work;
  }

  /** Keep a child started elsewhere, so stopAll stops it too. */
  adopt<C extends ChildProcess>(child: C): C {
    this.children.push(child);
    return child;
  }

  start(command: string, args: string[], env: Record<string, string>, logName: string, cwd = this.work): Logged {
    const child = this.adopt(
      spawn(command, args, { cwd, env: { ...process.env, ...env }, stdio: ["ignore", "pipe", "pipe"] }) as Logged,
    );
    child.log = [];
    child.stdout?.on("data", (d: Buffer) => child.log.push(d.toString()));
    child.stderr?.on("data", (d: Buffer) => child.log.push(d.toString()));
    child.on("exit", () => writeFileSync(join(this.work, logName), child.log.join("")));
    return child;
  }

  async stopAll(): Promise<void> {
    for (const child of this.children.splice(0).reverse()) await stop(child);
  }
}

/** The suite runs on the embedded broker (LOOPFUSE_TEST_BROKER=embedded, as pytest's broker choice). */
export const ON_EMBEDDED_BROKER = (process.env.LOOPFUSE_TEST_BROKER ?? "").toLowerCase() === "embedded";

/** Why a secured broker cannot run here (it is Apache Kafka, with openssl), or null. */
export const SECURE_BROKER_UNAVAILABLE = ON_EMBEDDED_BROKER
  ? "the suite runs on the embedded broker (LOOPFUSE_TEST_BROKER=embedded), which has no TLS or ACLs"
  : null;

/** What `loopfuse broker --kafka --secure` made: the CA and each user's LOOPFUSE_* variables. */
export interface Security {
  folder: string;
  caFile: string;
  /** USER.env as variables (LOOPFUSE_SASL_USERNAME, LOOPFUSE_SASL_PASSWORD, ...). */
  env(user: string): Record<string, string>;
}

export interface Broker {
  bootstrap: string;
  /** Set for a secured broker. */
  security: Security | null;
}

function envFile(path: string): Record<string, string> {
  const lines = readFileSync(path, "utf8")
    .split("\n")
    .filter((l) => l.includes("="));
  return Object.fromEntries(lines.map((l) => [l.slice(0, l.indexOf("=")), l.slice(l.indexOf("=") + 1)]));
}

/**
 * `loopfuse broker --kafka` (one KRaft node; the embedded broker under
 * ON_EMBEDDED_BROKER), or with `secure` `loopfuse broker --kafka --secure`: TLS with a
 * CA made at start, SASL_SSL with SCRAM-SHA-512, ACLs per role on the default topics.
 */
export async function startBroker(
  processes: Processes,
  bin: string,
  name: string,
  opts: { secure?: boolean } = {},
): Promise<Broker> {
  const loopfuse = join(bin, "loopfuse");
  assert.ok(existsSync(loopfuse), `${loopfuse} missing: run ./dev test once (it creates .venv) or set LOOPFUSE_BIN`);
  const args = opts.secure
    ? ["broker", "--kafka", "--secure"]
    : ON_EMBEDDED_BROKER
      ? ["broker"]
      : ["broker", "--kafka"];
  const broker = processes.start(loopfuse, args, {}, `${name}-broker.log`);
  const lines = await waitFor("the broker's bootstrap line", 180_000, () => {
    if (broker.exitCode !== null)
      throw new Error(`broker exited ${broker.exitCode}: ${broker.log.join("").slice(-2000)}`);
    const out = broker.log.join("");
    const bootstrap = /^bootstrap=(\S+)$/m.exec(out)?.[1];
    const folder = /^security=(\S+)$/m.exec(out)?.[1];
    return bootstrap && (folder || !opts.secure) ? { bootstrap, folder } : undefined;
  });
  if (!lines.folder) return { bootstrap: lines.bootstrap, security: null };
  const folder = lines.folder;
  return {
    bootstrap: lines.bootstrap,
    security: { folder, caFile: join(folder, "ca.pem"), env: (user) => envFile(join(folder, `${user}.env`)) },
  };
}

export interface Topics {
  toolCalls: string;
  toolResults: string;
  compactions: string;
  verdicts: string;
}

/** loopfuse's topic names (what a secured broker's ACLs grant). */
export const DEFAULT_TOPICS: Topics = {
  toolCalls: "agent.tool-calls",
  toolResults: "agent.tool-results",
  compactions: "agent.compactions",
  verdicts: "loopfuse.verdicts",
};

export interface Worker {
  process: Logged;
  /** The topics it reads and writes (the plugin's `topics`). */
  topics: Topics;
  /** Its loopDetection config file (for `loopfuse replay --config`). */
  configFile: string;
}

/**
 * `loopfuse worker` judging with `detection` (a loopDetection config file's content),
 * ready (/ready answers 200). With `id`, its topics and app id are named after it (many
 * workers on one broker); without, loopfuse's defaults. `env` adds variables (a user's
 * USER.env on a secured broker).
 */
export async function startWorker(
  processes: Processes,
  bin: string,
  opts: { name: string; bootstrap: string; detection: unknown; id?: string; env?: Record<string, string> },
): Promise<Worker> {
  const { name, id } = opts;
  const topics = id
    ? {
        toolCalls: `${id}.tool-calls`,
        toolResults: `${id}.tool-results`,
        compactions: `${id}.compactions`,
        verdicts: `${id}.verdicts`,
      }
    : DEFAULT_TOPICS;
  const named: Record<string, string> = id
    ? {
        LOOPFUSE_APP_ID: id,
        LOOPFUSE_TOPIC_TOOL_CALLS: topics.toolCalls,
        LOOPFUSE_TOPIC_TOOL_RESULTS: topics.toolResults,
        LOOPFUSE_TOPIC_COMPACTIONS: topics.compactions,
        LOOPFUSE_TOPIC_VERDICTS: topics.verdicts,
        LOOPFUSE_TOPIC_LOOP_EVENTS: `${id}.loop-events`,
        LOOPFUSE_TOPIC_DEAD_LETTERS: `${id}.dead-letters`,
      }
    : {};
  const configFile = join(processes.work, `${name}-detection.json`);
  writeFileSync(configFile, JSON.stringify(opts.detection));
  const webPort = await freePort();
  const worker = processes.start(
    join(bin, "loopfuse"),
    ["worker"],
    {
      LOOPFUSE_BOOTSTRAP_SERVERS: opts.bootstrap,
      LOOPFUSE_EMBEDDED_BROKER: String(ON_EMBEDDED_BROKER),
      LOOPFUSE_BROKER_SESSION_TIMEOUT: "6",
      LOOPFUSE_BROKER_HEARTBEAT_INTERVAL: "1",
      ...named,
      LOOPFUSE_PARTITIONS: "2",
      LOOPFUSE_STORE: "memory://",
      LOOPFUSE_DATA_DIR: join(processes.work, `${name}-data`),
      LOOPFUSE_WEB_PORT: String(webPort),
      LOOPFUSE_CONFIG_FILE: configFile,
      ...opts.env,
    },
    `${name}-worker.log`,
  );
  await waitFor("worker /ready", 120_000, async () => {
    if (worker.exitCode !== null)
      throw new Error(`worker exited ${worker.exitCode}: ${worker.log.join("").slice(-2000)}`);
    try {
      return (await fetch(`http://127.0.0.1:${webPort}/ready`)).status === 200 ? true : undefined;
    } catch {
      return undefined;
    }
  });
  return { process: worker, topics, configFile };
}
