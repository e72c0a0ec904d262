/**
 * End to end: the plugin (its real Kafka transport, @platformatic/kafka) against `loopfuse broker --kafka` +
 * `loopfuse worker`, driven like OpenClaw drives it; the verdicts the plugin acted on
 * must equal `loopfuse replay` of the events it published.
 *
 * The loopfuse executables come from $LOOPFUSE_BIN, else ../../.venv/bin (CI creates
 * it before this runs). Every process started here is stopped by its PID.
 */
import assert from "node:assert/strict";
import { spawn, type ChildProcess } from "node:child_process";
import { once } from "node:events";
import { existsSync, mkdtempSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { randomBytes } from "node:crypto";
import { Producer } from "@platformatic/kafka";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { after, before, describe, it } from "node:test";
import {
  createLoopfusePlugin,
  parseVerdictKeys,
  signVerdict,
  SIGNATURE_HEADER,
  TIMEOUT_MESSAGE,
  type LoopfuseGuard,
  type Verdict,
  type WireEvent,
} from "../src/index.js";
import { FakeApi, REPO_ROOT, inputEventValidator, toolCtx } from "./support.js";

const BIN = process.env.LOOPFUSE_BIN ?? resolve(REPO_ROOT, ".venv/bin");
const LOOPFUSE = join(BIN, "loopfuse");
const RUN_ID = `${process.pid}-${Date.now().toString(36)}`;
const TOPICS = {
  toolCalls: `oc-${RUN_ID}.tool-calls`,
  toolResults: `oc-${RUN_ID}.tool-results`,
  compactions: `oc-${RUN_ID}.compactions`,
  verdicts: `oc-${RUN_ID}.verdicts`,
};
/** The worker signs its verdicts (LOOPFUSE_VERDICT_KEY); gateways without `verdictKey` ignore the signatures. */
const VERDICT_KEY = `e2e:${randomBytes(32).toString("base64")}`;
const DETECTION = {
  tools: {
    loopDetection: {
      enabled: true,
      warningThreshold: 3,
      criticalThreshold: 5,
      globalCircuitBreakerThreshold: 12,
      postCompactionGuard: { windowSize: 3 },
    },
  },
};

const work = mkdtempSync(join(tmpdir(), "loopfuse-openclaw-e2e-"));
const children: ChildProcess[] = [];

function freePort(): Promise<number> {
  return new Promise((res, rej) => {
    const server = createServer();
    server.listen(0, "127.0.0.1", () => {
      const address = server.address();
      server.close(() => (typeof address === "object" && address ? res(address.port) : rej(new Error("no port"))));
    });
  });
}

function start(args: string[], env: Record<string, string>, logName: string): ChildProcess {
  const child = spawn(LOOPFUSE, args, { env: { ...process.env, ...env }, stdio: ["ignore", "pipe", "pipe"] });
  children.push(child);
  const log: string[] = [];
  child.stdout?.on("data", (d: Buffer) => log.push(d.toString()));
  child.stderr?.on("data", (d: Buffer) => log.push(d.toString()));
  child.on("exit", () => writeFileSync(join(work, logName), log.join("")));
  (child as ChildProcess & { log: string[] }).log = log;
  return child;
}

/** SIGTERM by PID, SIGKILL after 10 s. */
async function stop(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null || child.pid === undefined) return;
  const exited = once(child, "exit");
  process.kill(child.pid, "SIGTERM");
  const timer = setTimeout(() => child.pid !== undefined && child.exitCode === null && process.kill(child.pid, "SIGKILL"), 10_000);
  await exited;
  clearTimeout(timer);
}

async function waitFor<T>(what: string, timeoutMs: number, probe: () => Promise<T | undefined> | T | undefined): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await probe();
    if (value !== undefined) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

interface Gateway {
  api: FakeApi;
  guard: LoopfuseGuard;
  events: { topic: string; event: WireEvent }[];
  verdicts: Verdict[];
}

async function gateway(bootstrap: string, config: Record<string, unknown>): Promise<Gateway> {
  const events: Gateway["events"] = [];
  const verdicts: Verdict[] = [];
  let guard: LoopfuseGuard | undefined;
  const plugin = createLoopfusePlugin({
    onEvent: (topic, event) => events.push({ topic, event: structuredClone(event) }),
    onVerdict: (v) => verdicts.push(v),
    onGuard: (g) => (guard = g),
  });
  const api = new FakeApi({ bootstrap, topics: TOPICS, groupSessionTimeoutMs: 6000, clientId: `e2e-${RUN_ID}`, ...config });
  plugin.register(api);
  await guard!.start();
  assert.deepEqual(api.logs.filter((l) => l.level === "error"), []);
  return { api, guard: guard!, events, verdicts };
}

/** What an OpenClaw agent run looks like to the plugin, with a transcript of what the agent saw. */
class Agent {
  readonly transcript: string[] = [];
  private n = 0;
  private seenVerdicts = 0;
  constructor(
    private readonly gw: Gateway,
    readonly sessionKey: string,
    public runId: string,
  ) {}

  async call(toolName: string, params: Record<string, unknown>, output: string, details: Record<string, unknown> = {}) {
    this.noteAborts();
    const toolCallId = `toolu_${this.runId}_${++this.n}`;
    const ctx = toolCtx(this.sessionKey, this.runId, toolCallId, { toolName });
    const before = this.gw.verdicts.length;
    const decision = (await this.gw.api.emit("before_tool_call", { toolName, params, runId: this.runId, toolCallId }, ctx)) as
      | { block?: boolean; blockReason?: string }
      | undefined;
    const verdict = this.gw.verdicts.slice(before).find((v) => v.call_id === toolCallId);
    const judged = verdict
      ? `${verdict.action}${verdict.detector ? ` (${verdict.detector}, count ${verdict.count})` : ""}`
      : `no verdict (${decision?.block ? "blocked" : "allowed"} by the plugin)`;
    let seen: string;
    if (decision?.block) {
      seen = `BLOCKED: ${decision.blockReason}`;
    } else {
      const result = { content: [{ type: "text", text: output }], details: { status: "completed", ...details } };
      const shown = (await this.gw.api.runMiddleware({ toolCallId, toolName, args: params, result }, { runtime: "openclaw" })) as {
        content: { text: string }[];
      };
      seen = shown.content.map((c) => c.text).join(" | ");
    }
    this.transcript.push(`${this.sessionKey} #${this.n} ${toolName} ${JSON.stringify(params)} -> ${judged} -> agent saw: ${seen}`);
    return { decision, verdict, seen };
  }

  /** Abort verdicts arrive on their own (for a tool_result), between calls. */
  private noteAborts() {
    for (const v of this.gw.verdicts.slice(this.seenVerdicts)) {
      if (v.action === "abort" && v.session_key === this.sessionKey) {
        this.transcript.push(`${this.sessionKey} <- loopfuse: abort (${v.detector}, count ${v.count}) for the result of ${v.call_id}: ${v.message}`);
      }
    }
    this.seenVerdicts = this.gw.verdicts.length;
  }

  async compaction() {
    await this.gw.api.emit("after_compaction", { messageCount: 12, compactedCount: 40 }, { sessionKey: this.sessionKey, runId: this.runId, agentId: "main" });
    this.transcript.push(`${this.sessionKey} -- after_compaction --`);
  }

  async end() {
    await this.gw.api.emit("agent_end", { runId: this.runId, messages: [], success: true }, { sessionKey: this.sessionKey, runId: this.runId, agentId: "main" });
    this.transcript.push(`${this.sessionKey} -- agent_end --`);
  }
}

/** Verdict fields that must agree between the worker and replay (decided_ts is the decider's clock). */
function comparable(v: Verdict) {
  const { decided_ts: _d, incarnation: _i, ...rest } = v as Verdict & { decided_ts?: unknown };
  return rest;
}
const order = (a: { session_key: string | null; seq: number | null }, b: { session_key: string | null; seq: number | null }) =>
  String(a.session_key).localeCompare(String(b.session_key)) || (a.seq ?? 0) - (b.seq ?? 0);

describe("end to end: loopfuse broker + worker", { timeout: 240_000 }, () => {
  let bootstrap = "";
  let worker: ChildProcess;
  const configFile = join(work, "detection.json");

  before(async () => {
    assert.ok(existsSync(LOOPFUSE), `${LOOPFUSE} missing: create the venv (python3 -m venv .venv && .venv/bin/pip install -e '.[test,rocksdb]') or set LOOPFUSE_BIN`);
    writeFileSync(configFile, JSON.stringify(DETECTION));
    // Apache Kafka (one KRaft node: `loopfuse broker --kafka`) unless the suite runs on
    // the embedded broker (LOOPFUSE_TEST_BROKER=embedded, as pytest's broker choice).
    const embedded = (process.env.LOOPFUSE_TEST_BROKER ?? "").toLowerCase() === "embedded";
    const broker = start(embedded ? ["broker"] : ["broker", "--kafka"], {}, "broker.log");
    bootstrap = await waitFor("the broker's bootstrap line", 120_000, () => {
      const m = /bootstrap=(\S+)/.exec((broker as ChildProcess & { log: string[] }).log.join(""));
      return m?.[1];
    });
    const webPort = await freePort();
    worker = start(["worker"], {
      LOOPFUSE_BOOTSTRAP_SERVERS: bootstrap,
      LOOPFUSE_EMBEDDED_BROKER: String(embedded),
      LOOPFUSE_BROKER_SESSION_TIMEOUT: "6",
      LOOPFUSE_BROKER_HEARTBEAT_INTERVAL: "1",
      LOOPFUSE_APP_ID: `oc-e2e-${RUN_ID}`,
      LOOPFUSE_TOPIC_TOOL_CALLS: TOPICS.toolCalls,
      LOOPFUSE_TOPIC_TOOL_RESULTS: TOPICS.toolResults,
      LOOPFUSE_TOPIC_COMPACTIONS: TOPICS.compactions,
      LOOPFUSE_TOPIC_VERDICTS: TOPICS.verdicts,
      LOOPFUSE_TOPIC_LOOP_EVENTS: `oc-${RUN_ID}.loop-events`,
      LOOPFUSE_TOPIC_DEAD_LETTERS: `oc-${RUN_ID}.dead-letters`,
      LOOPFUSE_PARTITIONS: "2",
      LOOPFUSE_STORE: "memory://",
      LOOPFUSE_DATA_DIR: join(work, "data"),
      LOOPFUSE_WEB_PORT: String(webPort),
      LOOPFUSE_CONFIG_FILE: configFile,
      LOOPFUSE_VERDICT_KEY: VERDICT_KEY,
    }, "worker.log");
    await waitFor("worker /ready", 120_000, async () => {
      if (worker.exitCode !== null) throw new Error(`worker exited ${worker.exitCode}: ${(worker as ChildProcess & { log: string[] }).log.join("").slice(-2000)}`);
      try {
        const res = await fetch(`http://127.0.0.1:${webPort}/ready`);
        return res.status === 200 ? true : undefined;
      } catch {
        return undefined;
      }
    });
  });

  after(async () => {
    for (const child of children.reverse()) await stop(child);
  });

  it("a looping session is warned, then blocked, then aborted after compaction, exactly as loopfuse replay judges it; a healthy one is untouched", async () => {
    const gw = await gateway(bootstrap, { timeoutMs: 10_000, failPolicy: "open" });
    const loop = new Agent(gw, "agent:main:looping", "run-loop-1");
    const healthy = new Agent(gw, "agent:main:healthy", "run-ok-1");

    // A stuck poll: identical call, identical result, until loopfuse blocks it.
    const pollResults = [];
    for (let i = 0; i < 6; i++) {
      pollResults.push(await loop.call("process", { action: "poll", sessionId: "build-42" }, "build still running", { sessionId: "build-42" }));
      await healthy.call("exec", { command: `pytest tests/test_${i}.py` }, `${i + 1} passed`);
    }
    // Then it compacts, and keeps repeating one command with one result: loopfuse aborts the run.
    await loop.compaction();
    const afterCompaction = [];
    for (let i = 0; i < 4; i++) {
      afterCompaction.push(await loop.call("exec", { command: "cat build.log" }, "error: missing dep"));
      if (i === 2) {
        // loopfuse judges the 3rd identical result and sends abort: wait for it before the next call.
        await waitFor("the abort verdict", 20_000, () => (gw.guard.stats.aborts > 0 ? true : undefined));
      }
    }
    await loop.end();
    await healthy.end();
    await new Promise((r) => setTimeout(r, 500));

    const transcript = [...loop.transcript, ...healthy.transcript];
    const transcriptFile = join(work, "transcript.txt");
    writeFileSync(transcriptFile, transcript.join("\n") + "\n");
    console.log(`# transcript (${transcriptFile}):\n${transcript.map((l) => `#   ${l}`).join("\n")}`);

    // What the agent saw.
    const actions = pollResults.map((r) => r.verdict?.action);
    assert.ok(actions.includes("warn"), `no warning: ${actions.join(",")}`);
    assert.equal(actions.at(-1), "block", `no block: ${actions.join(",")}`);
    const warned = pollResults.find((r) => r.verdict?.action === "warn")!;
    assert.ok(warned.seen.includes(String(warned.verdict?.message)), "the warning is appended to the result");
    assert.equal(pollResults.at(-1)!.seen, `BLOCKED: ${pollResults.at(-1)!.verdict?.message}`);
    assert.equal(afterCompaction.at(-1)!.decision?.block, true);
    assert.match(afterCompaction.at(-1)!.seen, /BLOCKED: .*compaction/i);
    assert.equal(afterCompaction.at(-1)!.verdict, undefined, "blocked locally after the abort");
    for (const line of healthy.transcript.filter((l) => l.includes(" exec "))) assert.match(line, /-> allow -> agent saw: \d+ passed$/);
    assert.equal(gw.guard.stats.timeouts, 0);
    assert.equal(gw.guard.stats.aborts, 1);
    assert.equal(gw.guard.stats.publishErrors, 0);

    // Every published event is valid wire format.
    const validate = inputEventValidator();
    for (const { event } of gw.events) assert.equal(validate(event), null, JSON.stringify(event));

    // The same events through `loopfuse replay`: the same verdicts.
    const eventsFile = join(work, "events.jsonl");
    writeFileSync(eventsFile, gw.events.map(({ event }) => JSON.stringify(event)).join("\n") + "\n");
    const replay = spawn(LOOPFUSE, ["replay", "--config", configFile, eventsFile], { stdio: ["ignore", "pipe", "pipe"] });
    children.push(replay);
    let out = "";
    replay.stdout?.on("data", (d: Buffer) => (out += d.toString()));
    const [code] = (await once(replay, "exit")) as [number];
    assert.equal(code, 0);
    const replayed = out.trim().split("\n").map((l) => JSON.parse(l) as Verdict & { type: string });
    assert.deepEqual(replayed.filter((o) => o.type === "dead_letter"), []);
    const expected = replayed.filter((o) => o.type === "verdict").map(comparable).sort(order);
    const got = gw.verdicts.map(comparable).sort(order);
    assert.deepEqual(got, expected);
    await gw.guard.stop();
  });

  it("each gateway reads its own reply partition: an idle one reads none of a busy one's verdicts", async () => {
    const busy = await gateway(bootstrap, { timeoutMs: 10_000, replyPartition: 0, clientId: `e2e-busy-${RUN_ID}` });
    const idle = await gateway(bootstrap, { timeoutMs: 10_000, replyPartition: 1, clientId: `e2e-idle-${RUN_ID}` });
    const calls = async (gw: Gateway, sessions: number, each: number, prefix: string) => {
      const runs = Array.from({ length: sessions }, async (_, s) => {
        const agent = new Agent(gw, `agent:main:${prefix}-${s}`, `run-${prefix}-${s}`);
        const out = [];
        for (let n = 0; n < each; n++) out.push((await agent.call("read", { path: `/f/${n}` }, `content ${n}`)).decision);
        return out;
      });
      return (await Promise.all(runs)).flat();
    };
    const busyDecisions = await calls(busy, 10, 20, "busy");
    const idleDecisions = await calls(idle, 1, 3, "idle");
    await new Promise((r) => setTimeout(r, 500));
    assert.ok(busyDecisions.every((d) => d === undefined), "every busy call allowed");
    assert.ok(idleDecisions.every((d) => d === undefined), "every idle call allowed");
    assert.equal(busy.guard.stats.verdictsMatched, 200);
    assert.equal(idle.guard.stats.verdictsMatched, 3);
    // its own three verdicts and nothing else came to the idle gateway
    assert.deepEqual(idle.guard.readCounts, { recordsRead: 3, foreignRecords: 0, unsignedVerdicts: 0, badSignatures: 0 });
    await busy.guard.stop();
    await idle.guard.stop();
  });

  it("with verdictKey: forged allows on the reply partition are dropped and counted; the worker's signed block is what the call gets", async () => {
    const gw = await gateway(bootstrap, { timeoutMs: 10_000, verdictKey: VERDICT_KEY, replyPartition: 2, clientId: `e2e-signed-${RUN_ID}` });
    const agent = new Agent(gw, "agent:main:forged", "run-forged-1");
    const poll = () => agent.call("process", { action: "poll", sessionId: "build-7" }, "build still running", { sessionId: "build-7" });
    const actions = [];
    for (let i = 0; i < 5; i++) actions.push((await poll()).verdict?.action);
    assert.deepEqual(actions, ["allow", "allow", "allow", "warn", "warn"]); // signed verdicts, taken
    const forger = new Producer({ clientId: `e2e-forger-${RUN_ID}`, bootstrapBrokers: [bootstrap], autocreateTopics: false });
    const wrongKey = parseVerdictKeys(`e2e:${randomBytes(32).toString("base64")}`)[0]!; // same id, not the worker's
    const before = gw.events.length;
    // The worker frozen (SIGSTOP, by its PID) for a moment: the forgeries are read before its verdict can come.
    process.kill(worker.pid!, "SIGSTOP");
    let sixth: ReturnType<typeof poll>;
    try {
      sixth = poll(); // the worker blocks it
      const call = await waitFor("the sixth call published", 5_000, () => gw.events.slice(before).find((e) => e.event.type === "tool_call")?.event);
      const forged = Buffer.from(JSON.stringify({
        type: "verdict", verdict_id: "forged", session_key: call.session_key, run_id: call.run_id, agent_id: call.agent_id ?? null,
        call_id: call.call_id, seq: call.seq, incarnation: call.incarnation, tool_name: call.tool_name, action: "allow",
        level: "none", detector: null, count: 0, message: null, args_hash: null, event_ts: call.ts, decided_ts: call.ts,
      }));
      const key = Buffer.from(gw.guard.incarnation); // keyed as this gateway's replies: not skipped as another's
      await forger.send({
        messages: [
          { topic: "loopfuse.replies", partition: 2, key, value: forged },
          { topic: "loopfuse.replies", partition: 2, key, value: forged, headers: new Map([[Buffer.from(SIGNATURE_HEADER), signVerdict(wrongKey, key, forged)]]) },
        ],
      });
      await waitFor("the forgeries read", 5_000, () => {
        const counts = gw.guard.readCounts!;
        return counts.unsignedVerdicts + counts.badSignatures >= 2 ? true : undefined;
      });
    } finally {
      process.kill(worker.pid!, "SIGCONT");
      await forger.close();
    }
    const { verdict, decision } = await sixth;
    assert.equal(verdict?.action, "block");
    assert.equal(decision?.block, true);
    assert.deepEqual(gw.guard.readCounts, { recordsRead: 8, foreignRecords: 0, unsignedVerdicts: 1, badSignatures: 1 });
    assert.equal(gw.guard.stats.verdictsMatched, 6);
    assert.equal(gw.guard.stats.timeouts, 0);
    assert.equal(gw.api.logs.filter((l) => l.message.includes("dropping a verdict record")).length, 1); // at most one line per 10 s
    await gw.guard.stop();
  });

  it("with the worker down, the fail policy decides within the timeout", async () => {
    await stop(worker);
    const gw = await gateway(bootstrap, { timeoutMs: 1500, failPolicy: "closed" });
    const agent = new Agent(gw, "agent:main:down", "run-down");
    const started = Date.now();
    const { decision } = await agent.call("exec", { command: "ls" }, "unused");
    const waited = Date.now() - started;
    assert.deepEqual(decision, { block: true, blockReason: TIMEOUT_MESSAGE("closed") });
    assert.ok(waited >= 1400 && waited < 5000, `waited ${waited} ms`);
    assert.equal(gw.guard.stats.timeoutsBlocked, 1);
    console.log(`#   ${agent.transcript.join("\n#   ")}`);
    await gw.guard.stop();
  });
});
