/**
 * End to end: the plugin (its real Kafka transport, @platformatic/kafka) against `loopfuse broker --kafka` +
 * `loopfuse worker`, driven like OpenClaw drives it; the verdicts the plugin acted on
 * must equal `loopfuse replay` of the events it published.
 *
 * The loopfuse executables come from $LOOPFUSE_BIN, else ../../.venv/bin (CI creates
 * it before this runs). Every process started here is stopped by its PID.
 */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { once } from "node:events";
import { randomBytes } from "node:crypto";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { after, before, describe, it } from "node:test";
import { Producer } from "@platformatic/kafka";
import { parseVerdictKeys, signVerdict, SIGNATURE_HEADER, TIMEOUT_MESSAGE, type Verdict } from "../src/index.js";
import { Agent, gateway, type Gateway } from "./agent.js";
import { Processes, startBroker, startWorker, stop, waitFor, type Logged } from "./loopfuse-processes.js";
import { REPO_ROOT, inputEventValidator } from "./support.js";

const BIN = process.env.LOOPFUSE_BIN ?? resolve(REPO_ROOT, ".venv/bin");
const LOOPFUSE = join(BIN, "loopfuse");
const RUN_ID = `${process.pid}-${Date.now().toString(36)}`;
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
const processes = new Processes(work);

/** Verdict fields that must agree between the worker and replay (decided_ts is the decider's clock). */
function comparable(v: Verdict) {
  const { decided_ts: _d, incarnation: _i, ...rest } = v as Verdict & { decided_ts?: unknown };
  return rest;
}
const order = (
  a: { session_key: string | null; seq: number | null },
  b: { session_key: string | null; seq: number | null },
) => String(a.session_key).localeCompare(String(b.session_key)) || (a.seq ?? 0) - (b.seq ?? 0);

describe("end to end: loopfuse broker + worker", { timeout: 240_000 }, () => {
  let worker: Logged;
  let bootstrap: string;
  let configFile: string;
  let plugin: (config: Record<string, unknown>) => Promise<Gateway>;

  before(async () => {
    ({ bootstrap } = await startBroker(processes, BIN, "e2e"));
    const started = await startWorker(processes, BIN, {
      name: "e2e",
      bootstrap,
      detection: DETECTION,
      id: `oc-${RUN_ID}`,
      env: { LOOPFUSE_VERDICT_KEY: VERDICT_KEY },
    });
    worker = started.process;
    configFile = started.configFile;
    plugin = (config) => gateway({ bootstrap, topics: started.topics, clientId: `e2e-${RUN_ID}`, ...config });
  });

  after(() => processes.stopAll());

  it("a looping session is warned, then blocked, then aborted after compaction, exactly as loopfuse replay judges it; a healthy one is untouched", async () => {
    const gw = await plugin({ timeoutMs: 10_000, failPolicy: "open" });
    const loop = new Agent(gw, "agent:main:looping", "run-loop-1");
    const healthy = new Agent(gw, "agent:main:healthy", "run-ok-1");

    // A stuck poll: identical call, identical result, until loopfuse blocks it.
    const pollResults = [];
    for (let i = 0; i < 6; i++) {
      pollResults.push(
        await loop.call("process", { action: "poll", sessionId: "build-42" }, "build still running", {
          sessionId: "build-42",
        }),
      );
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
    for (const line of healthy.transcript.filter((l) => l.includes(" exec ")))
      assert.match(line, /-> allow -> agent saw: \d+ passed$/);
    assert.equal(gw.guard.stats.timeouts, 0);
    assert.equal(gw.guard.stats.aborts, 1);
    assert.equal(gw.guard.stats.publishErrors, 0);

    // Every published event is valid wire format.
    const validate = inputEventValidator();
    for (const { event } of gw.events) assert.equal(validate(event), null, JSON.stringify(event));

    // The same events through `loopfuse replay`: the same verdicts.
    const eventsFile = join(work, "events.jsonl");
    writeFileSync(eventsFile, gw.events.map(({ event }) => JSON.stringify(event)).join("\n") + "\n");
    const replay = processes.adopt(
      spawn(LOOPFUSE, ["replay", "--config", configFile, eventsFile], { stdio: ["ignore", "pipe", "pipe"] }),
    );
    let out = "";
    replay.stdout?.on("data", (d: Buffer) => (out += d.toString()));
    const [code] = (await once(replay, "exit")) as [number];
    assert.equal(code, 0);
    const replayed = out
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l) as Verdict & { type: string });
    assert.deepEqual(
      replayed.filter((o) => o.type === "dead_letter"),
      [],
    );
    const expected = replayed
      .filter((o) => o.type === "verdict")
      .map(comparable)
      .sort(order);
    const got = gw.verdicts.map(comparable).sort(order);
    assert.deepEqual(got, expected);
    await gw.guard.stop();
  });

  it("each gateway reads its own reply partition: an idle one reads none of a busy one's verdicts", async () => {
    const busy = await plugin({ timeoutMs: 10_000, replyPartition: 0, clientId: `e2e-busy-${RUN_ID}` });
    const idle = await plugin({ timeoutMs: 10_000, replyPartition: 1, clientId: `e2e-idle-${RUN_ID}` });
    const calls = async (gw: Gateway, sessions: number, each: number, prefix: string) => {
      const runs = Array.from({ length: sessions }, async (_, s) => {
        const agent = new Agent(gw, `agent:main:${prefix}-${s}`, `run-${prefix}-${s}`);
        const out = [];
        for (let n = 0; n < each; n++)
          out.push((await agent.call("read", { path: `/f/${n}` }, `content ${n}`)).decision);
        return out;
      });
      return (await Promise.all(runs)).flat();
    };
    const busyDecisions = await calls(busy, 10, 20, "busy");
    const idleDecisions = await calls(idle, 1, 3, "idle");
    await new Promise((r) => setTimeout(r, 500));
    assert.ok(
      busyDecisions.every((d) => d === undefined),
      "every busy call allowed",
    );
    assert.ok(
      idleDecisions.every((d) => d === undefined),
      "every idle call allowed",
    );
    assert.equal(busy.guard.stats.verdictsMatched, 200);
    assert.equal(idle.guard.stats.verdictsMatched, 3);
    // its own three verdicts and nothing else came to the idle gateway
    assert.deepEqual(idle.guard.readCounts, {
      recordsRead: 3,
      foreignRecords: 0,
      unsignedVerdicts: 0,
      badSignatures: 0,
    });
    await busy.guard.stop();
    await idle.guard.stop();
  });

  it("with verdictKey: forged allows on the reply partition are dropped and counted; the worker's signed block is what the call gets", async () => {
    const gw = await plugin({
      timeoutMs: 10_000,
      verdictKey: VERDICT_KEY,
      replyPartition: 2,
      clientId: `e2e-signed-${RUN_ID}`,
    });
    const agent = new Agent(gw, "agent:main:forged", "run-forged-1");
    const poll = () =>
      agent.call("process", { action: "poll", sessionId: "build-7" }, "build still running", { sessionId: "build-7" });
    const actions = [];
    for (let i = 0; i < 5; i++) actions.push((await poll()).verdict?.action);
    assert.deepEqual(actions, ["allow", "allow", "allow", "warn", "warn"]); // signed verdicts, taken
    const forger = new Producer({
      clientId: `e2e-forger-${RUN_ID}`,
      bootstrapBrokers: [bootstrap],
      autocreateTopics: false,
    });
    const wrongKey = parseVerdictKeys(`e2e:${randomBytes(32).toString("base64")}`)[0]!; // same id, not the worker's
    const before = gw.events.length;
    // The worker frozen (SIGSTOP, by its PID) for a moment: the forgeries are read before its verdict can come.
    process.kill(worker.pid!, "SIGSTOP");
    let sixth: ReturnType<typeof poll>;
    try {
      sixth = poll(); // the worker blocks it
      const call = await waitFor(
        "the sixth call published",
        5_000,
        () => gw.events.slice(before).find((e) => e.event.type === "tool_call")?.event,
      );
      const forged = Buffer.from(
        JSON.stringify({
          type: "verdict",
          verdict_id: "forged",
          session_key: call.session_key,
          run_id: call.run_id,
          agent_id: call.agent_id ?? null,
          call_id: call.call_id,
          seq: call.seq,
          incarnation: call.incarnation,
          tool_name: call.tool_name,
          action: "allow",
          level: "none",
          detector: null,
          count: 0,
          message: null,
          args_hash: null,
          event_ts: call.ts,
          decided_ts: call.ts,
        }),
      );
      const key = Buffer.from(gw.guard.incarnation); // keyed as this gateway's replies: not skipped as another's
      await forger.send({
        messages: [
          { topic: "loopfuse.replies", partition: 2, key, value: forged },
          {
            topic: "loopfuse.replies",
            partition: 2,
            key,
            value: forged,
            headers: new Map([[Buffer.from(SIGNATURE_HEADER), signVerdict(wrongKey, key, forged)]]),
          },
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
    const gw = await plugin({ timeoutMs: 1500, failPolicy: "closed" });
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
