/**
 * The loopfuse plugin inside OpenClaw 2026.9.6's own agent loop: `openclaw agent --local`
 * against a scripted model, the plugin installed into an isolated OpenClaw home as the
 * docs say, loopfuse's worker on a test broker. Only the model is scripted: OpenClaw runs
 * its loop and its `exec` tool; what the model received after each call is read from the
 * scripted model's log. Worker config: warning 3, critical 5; agent "run-ender" also has
 * run endings (loopfuse aborts the run at its second critical). Last, the plugin connects
 * over SASL_SSL as the least-privileged gateway user of a secured broker.
 */
import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { exec, OpenClawHome, SECURE_BROKER_UNAVAILABLE, startLoopfuse, stop, stopAll, WORK, type Loopfuse } from "./harness.ts";

const DETECTION = {
  tools: { loopDetection: { enabled: true, warningThreshold: 3, criticalThreshold: 5 } },
  agents: { list: [{ id: "run-ender", loopfuse: { rules: { runEnding: {} } } }] },
};
const BLOCK = "CRITICAL: Called exec with identical arguments and identical outcomes 5 times. Session execution blocked to prevent runaway loops.";
const ENDING = "Ending this run: the model kept repeating a blocked tool call and made no progress.";
const FAIL_CLOSED = "loopfuse did not answer in time; the call is blocked by the fail-closed policy.";
const WARNING = (n: number) => `WARNING: You have called exec ${n} times with identical arguments. If this is not making progress, stop retrying and report the task as failed.`;
const counter = join(WORK, "ran.txt");
const ran = () => (existsSync(counter) ? readFileSync(counter, "utf8").split("\n").filter(Boolean).length : 0);
const looping = (n: number) => Array.from({ length: n }, () => exec(`echo ran >> ${counter}; echo still broken`));

describe("the OpenClaw plugin in OpenClaw's own agent loop", { timeout: 600_000 }, () => {
  let loopfuse: Loopfuse;
  let home: OpenClawHome;

  before(async () => {
    loopfuse = await startLoopfuse("loop", DETECTION);
    home = new OpenClawHome("loop");
    await home.installPlugin({ ...loopfuse.connection, timeoutMs: 10_000, failPolicy: "open" });
  });

  after(stopAll);

  it("a loop is warned from call 4, blocked from call 6, and the tool stops running", async () => {
    const run = await home.run(looping(9));
    assert.equal(run.exitCode, 0, run.stderr.slice(-2000));
    assert.equal(run.received.length, 9);
    run.received.forEach((seen, i) => {
      const n = i + 1; // what the model received after call n
      if (n <= 3) assert.equal(seen, "still broken", `call ${n}`);
      else if (n <= 5) {
        assert.ok(seen.startsWith("still broken"), `call ${n}: ${seen}`);
        assert.ok(seen.endsWith(WARNING(n - 1)), `call ${n}: ${seen}`);
      } else assert.equal(seen, BLOCK, `call ${n}`);
    });
    assert.equal(ran(), 5); // calls 1-5 ran; from call 6 none did
    assert.equal(run.answer.payloads?.[0]?.text, "done"); // the run went on to the model's answer
  });

  it("a healthy session is untouched", async () => {
    const before = ran();
    const run = await home.run([1, 2, 3, 4].map((i) => exec(`echo ran >> ${counter}; echo step ${i} ok`)));
    assert.equal(run.exitCode, 0, run.stderr.slice(-2000));
    assert.deepEqual(run.received, ["step 1 ok", "step 2 ok", "step 3 ok", "step 4 ok"]);
    assert.equal(ran() - before, 4);
  });

  it("with run endings on, the abort at the run's second critical blocks the rest of the run", async () => {
    // OpenClaw 2026.9.6 ends a run only when every tool result of a batch says
    // `terminate`, and a call vetoed in before_tool_call never reaches the result
    // middleware that could say it: a plugin cannot end the run, so the plugin blocks
    // every later call of the run with the abort's message until the model stops.
    const before = ran();
    const run = await home.run(looping(9), { agent: "run-ender" });
    assert.equal(run.exitCode, 0, run.stderr.slice(-2000));
    assert.deepEqual(run.received.slice(5), [
      BLOCK, // call 6: the first critical
      BLOCK, // call 7: the second; its abort comes beside the block
      `${BLOCK} ${ENDING}`, // call 8 on: blocked by the plugin itself, not asked of loopfuse
      `${BLOCK} ${ENDING}`,
    ]);
    assert.equal(ran() - before, 5);
  });

  it("with the worker down, the fail policy decides: fail-closed blocks every call", async () => {
    await stop(loopfuse.worker);
    home.set((c) => Object.assign(c.plugins.entries.loopfuse.config, { timeoutMs: 1500, failPolicy: "closed" }));
    const before = ran();
    const run = await home.run(looping(2));
    assert.deepEqual(run.received, [FAIL_CLOSED, FAIL_CLOSED]);
    assert.equal(ran() - before, 0);
  });
});

describe("over SASL_SSL, as the gateway user of a secured broker", { timeout: 600_000, skip: SECURE_BROKER_UNAVAILABLE ?? false }, () => {
  let home: OpenClawHome;

  before(async () => {
    const loopfuse = await startLoopfuse("secure", DETECTION, { secure: true });
    home = new OpenClawHome("secure");
    // Fail-closed: were TLS or the credentials refused, every call would show FAIL_CLOSED.
    await home.installPlugin({ ...loopfuse.connection, timeoutMs: 10_000, failPolicy: "closed" });
  });

  after(stopAll);

  it("a loop is warned, then blocked, and the model receives the block message", async () => {
    const before = ran();
    const run = await home.run(looping(6));
    assert.equal(run.exitCode, 0, run.stderr.slice(-2000));
    assert.equal(run.received.length, 6);
    assert.deepEqual(run.received.slice(0, 3), ["still broken", "still broken", "still broken"]);
    for (const n of [4, 5]) {
      const seen = run.received[n - 1]!;
      assert.ok(seen.startsWith("still broken") && seen.endsWith(WARNING(n - 1)), `call ${n}: ${seen}`);
    }
    assert.equal(run.received[5], BLOCK); // call 6: blocked, the tool did not run
    assert.equal(ran() - before, 5);
  });
});
