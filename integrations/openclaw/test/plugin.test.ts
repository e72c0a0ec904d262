/** The plugin against a fake OpenClaw `api` and an in-memory transport (no Kafka). */
import assert from "node:assert/strict";
import { readFileSync, existsSync } from "node:fs";
import { resolve } from "node:path";
import { describe, it } from "node:test";
import {
  CONFIG_SCHEMA,
  createLoopfusePlugin,
  parseVerdictKeys,
  resolveConfig,
  signVerdict,
  VerdictVerifier,
  SIGNATURE_HEADER,
  type LoopfuseGuard,
} from "../src/index.js";
import defaultEntry from "../src/index.js";
import { blockedToolResult, TIMEOUT_MESSAGE } from "../src/guard.js";
import { FakeApi, FakeTransport, PACKAGE_ROOT, inputEventValidator, tick, toolCtx } from "./support.js";

const INCARNATION = "0e4b6c1d-1111-4222-8333-944455556666";

function setup(pluginConfig: Record<string, unknown> = {}) {
  const transport = new FakeTransport();
  let guard: LoopfuseGuard | undefined;
  const plugin = createLoopfusePlugin({
    transport: () => transport,
    incarnation: INCARNATION,
    onGuard: (g) => (guard = g),
  });
  const api = new FakeApi({ timeoutMs: 200, ...pluginConfig });
  plugin.register(api);
  const events = () => transport.sent.map((s) => s.event);
  /** One tool call as OpenClaw makes it: before_tool_call, then (if not blocked) the tool and the result middleware. */
  async function call(
    sessionKey: string,
    runId: string,
    toolCallId: string | undefined,
    toolName: string,
    params: Record<string, unknown>,
    result: unknown = { content: [{ type: "text", text: "ok" }], details: { status: "completed" } },
    isError = false,
  ) {
    const decision = (await api.emit(
      "before_tool_call",
      { toolName, params, runId, toolCallId },
      toolCtx(sessionKey, runId, toolCallId, { toolName }),
    )) as { block?: boolean; blockReason?: string } | undefined;
    if (decision?.block) return { decision, seen: decision.blockReason };
    const seen = await api.runMiddleware(
      { toolCallId: toolCallId ?? "host-made-id", toolName, args: params, isError, result },
      { runtime: "openclaw" }, // as seen in production: no session or run on this seam
    );
    await tick();
    return { decision, seen };
  }
  return { api, transport, guard: guard!, events, call };
}

describe("registration", () => {
  it("registers the hooks and the result middleware for both runtimes", () => {
    const { api } = setup();
    assert.deepEqual(api.hooks.map((h) => h.hookName).sort(), [
      "after_compaction",
      "agent_end",
      "before_tool_call",
      "gateway_stop",
    ]);
    assert.equal(api.hooks.find((h) => h.hookName === "before_tool_call")?.opts?.priority, -100);
    assert.equal(api.middlewares.length, 1);
    assert.deepEqual(api.middlewares[0]?.options, { runtimes: ["openclaw", "codex"] });
  });

  it("manifest, package.json and entry agree", () => {
    const manifest = JSON.parse(readFileSync(resolve(PACKAGE_ROOT, "openclaw.plugin.json"), "utf8"));
    assert.equal(manifest.id, "loopfuse");
    assert.equal(defaultEntry.id, manifest.id);
    assert.deepEqual(manifest.configSchema, JSON.parse(JSON.stringify(CONFIG_SCHEMA)));
    assert.deepEqual(defaultEntry.configSchema, CONFIG_SCHEMA);
    assert.deepEqual(manifest.contracts.agentToolResultMiddleware, ["openclaw", "codex"]);
    assert.equal(manifest.activation.onStartup, true);
    const pkg = JSON.parse(readFileSync(resolve(PACKAGE_ROOT, "package.json"), "utf8"));
    assert.ok(pkg.openclaw.compat.pluginApi);
    for (const entry of pkg.openclaw.extensions) assert.ok(existsSync(resolve(PACKAGE_ROOT, entry)), entry);
  });

  it("registers its hooks in every registration mode, and opens Kafka only at the first hook call", async () => {
    // OpenClaw 2026.9.6 registers "full" at start-up, then "discovery" loads whose hooks a run may use.
    for (const mode of ["full", "discovery", "tool-discovery", "setup-only", "setup-runtime", "cli-metadata"]) {
      const api = Object.assign(new FakeApi({ timeoutMs: 200 }), { registrationMode: mode });
      const transport = new FakeTransport();
      createLoopfusePlugin({ transport: () => transport }).register(api);
      assert.deepEqual(
        api.hooks.map((h) => h.hookName).sort(),
        ["after_compaction", "agent_end", "before_tool_call", "gateway_stop"],
        mode,
      );
      assert.equal(api.middlewares.length, 1, mode);
      assert.equal(transport.deliver, null, `${mode}: no client before a hook runs`);
      await api.emit("before_tool_call", { toolName: "read", params: {}, toolCallId: "c" }, toolCtx("s", "r", "c"));
      assert.notEqual(transport.deliver, null, `${mode}: started by the first call`);
      assert.equal(transport.sent.length, 1, mode);
    }
  });

  it("registered twice in one process (same config): one guard, so calls and results meet", async () => {
    const guards: LoopfuseGuard[] = [];
    const config = { bootstrap: "127.0.0.1:1", clientId: `twice-${process.pid}`, timeoutMs: 50 };
    const first = new FakeApi(config);
    const second = new FakeApi(config);
    createLoopfusePlugin({ onGuard: (g) => guards.push(g) }).register(first);
    createLoopfusePlugin({ onGuard: (g) => guards.push(g) }).register(second);
    assert.equal(guards[0], guards[1]);
    await guards[0]!.stop();
    const third = new FakeApi(config);
    createLoopfusePlugin({ onGuard: (g) => guards.push(g) }).register(third);
    assert.notEqual(guards[2], guards[0]); // a stopped guard is replaced
    assert.notEqual(guards[2]!.incarnation, guards[0]!.incarnation);
    await guards[2]!.stop();
  });

  it("config: defaults, values, and wrong values reported", () => {
    assert.equal(resolveConfig(undefined).failPolicy, "open");
    assert.equal(resolveConfig(undefined).timeoutMs, 5000);
    const problems: string[] = [];
    const cfg = resolveConfig(
      {
        bootstrap: "a:1, b:2",
        failPolicy: "closed",
        topics: { verdicts: "v" },
        timeoutMs: 20000,
        typo: 1,
        shadow: "yes",
      },
      problems,
    );
    assert.deepEqual(cfg.bootstrap, ["a:1", "b:2"]);
    assert.equal(cfg.failPolicy, "closed");
    assert.equal(cfg.topics.verdicts, "v");
    assert.equal(cfg.topics.toolCalls, "agent.tool-calls");
    assert.equal(cfg.shadow, false);
    assert.equal(problems.length, 3, problems.join("; ")); // typo, timeout over the host budget, shadow
  });

  it("config: ssl is off, true (Node's default CAs) or the PEM files to use; wrong entries reported", () => {
    assert.equal(resolveConfig({}).ssl, null);
    assert.deepEqual(resolveConfig({ ssl: true }).ssl, { caFile: null, certFile: null, keyFile: null });
    assert.deepEqual(resolveConfig({ ssl: { caFile: "/etc/ca.pem" } }).ssl, {
      caFile: "/etc/ca.pem",
      certFile: null,
      keyFile: null,
    });
    const problems: string[] = [];
    const cfg = resolveConfig({ ssl: { cafile: "/etc/ca.pem", caFile: "", certFile: "/c.pem" } }, problems);
    assert.deepEqual(cfg.ssl, { caFile: null, certFile: null, keyFile: null });
    assert.deepEqual(problems, [
      "ssl.cafile: unknown key",
      "ssl.caFile: expected a file path",
      "ssl.keyFile: ssl.certFile and ssl.keyFile go together (no client certificate used)",
    ]);
    assert.deepEqual(resolveConfig({ ssl: "yes" }, problems).ssl, null);
    assert.equal(problems.at(-1), "ssl: expected a boolean or {caFile, certFile, keyFile}");
  });

  it("an unreadable ssl.caFile: one config error naming it; every call falls to the fail policy at once", async () => {
    const api = new FakeApi({
      bootstrap: "127.0.0.1:1",
      ssl: { caFile: "/nonexistent/ca.pem" },
      failPolicy: "closed",
      timeoutMs: 5000,
      clientId: `no-ca-${process.pid}`,
    });
    let guard: LoopfuseGuard | undefined;
    createLoopfusePlugin({ onGuard: (g) => (guard = g) }).register(api); // the real Kafka transport
    const started = Date.now();
    for (const id of ["c1", "c2"]) {
      const decision = await api.emit(
        "before_tool_call",
        { toolName: "exec", params: {}, toolCallId: id },
        toolCtx("s", "r", id),
      );
      assert.deepEqual(decision, { block: true, blockReason: TIMEOUT_MESSAGE("closed") });
    }
    assert.ok(Date.now() - started < 1000, "decided without waiting for the timeout");
    assert.deepEqual(
      api.logs.filter((l) => l.level !== "info").map((l) => l.message),
      [
        'loopfuse: could not connect to Kafka: ConfigError: ssl.caFile: cannot read "/nonexistent/ca.pem" (ENOENT); every call falls to the fail-closed policy',
      ],
    );
    await guard!.stop();
  });
});

describe("wire events", () => {
  it("every event validates against schemas/input-event.schema.json, keyed by session", async () => {
    const validate = inputEventValidator();
    const { api, transport, call } = setup();
    transport.judge = (e) => (e.seq === 2 ? { action: "warn" } : { action: "allow" });
    await call("agent:main:1", "run-1", "call_a", "exec", { command: "ls" });
    await call(
      "agent:main:1",
      "run-1",
      "call_b",
      "exec",
      { command: "ls" },
      { content: [{ type: "text", text: "boom" }] },
      true,
    );
    await api.emit(
      "after_compaction",
      { messageCount: 3, compactedCount: 10 },
      { sessionKey: "agent:main:1", runId: "run-1", agentId: "main" },
    );
    await api.emit(
      "agent_end",
      { runId: "run-1", messages: [], success: true },
      { sessionKey: "agent:main:1", runId: "run-1", agentId: "main" },
    );
    await tick();
    assert.deepEqual(
      transport.sent.map((s) => [s.topic, s.event.type]),
      [
        ["agent.tool-calls", "tool_call"],
        ["agent.tool-results", "tool_result"],
        ["agent.tool-calls", "tool_call"],
        ["agent.tool-results", "tool_result"],
        ["agent.compactions", "compaction"],
        ["agent.compactions", "run_ended"],
      ],
    );
    for (const { key, event } of transport.sent) {
      assert.equal(validate(event), null, JSON.stringify(event));
      assert.equal(key, "agent:main:1");
      assert.equal(event.incarnation, INCARNATION);
      assert.equal(event.event_id, `${INCARNATION}:${event.seq}`);
      assert.equal(typeof event.ts, "number");
      assert.equal(event.agent_id, "main");
      assert.equal(event.run_id, "run-1");
    }
    assert.deepEqual(
      transport.sent.map((s) => s.event.seq),
      [0, 1, 2, 3, 4, 5],
    );
    const [call0, result0, , error1] = transport.sent.map((s) => s.event);
    assert.equal(call0?.call_id, "call_a");
    assert.deepEqual(call0?.args, { command: "ls" });
    assert.equal(result0?.call_id, "call_a");
    assert.deepEqual(result0?.result, { content: [{ type: "text", text: "ok" }], details: { status: "completed" } });
    assert.equal("error" in result0!, false);
    assert.equal(error1?.error, "boom");
    assert.equal("result" in error1!, false);
  });

  it("seq is assigned synchronously per session key, in hook-call order", async () => {
    const { api, transport } = setup();
    const order: number[] = [];
    transport.judge = () => null; // nobody answers; calls run on the fail-open timeout
    const calls = [
      ["s1", "c1"],
      ["s2", "c2"],
      ["s1", "c3"],
      ["s1", "c4"],
      ["s2", "c5"],
    ].map(([sk, id]) =>
      api.emit("before_tool_call", { toolName: "read", params: { id }, toolCallId: id }, toolCtx(sk!, "r", id)),
    );
    await tick();
    for (const s of transport.sent) order.push(s.event.seq);
    assert.deepEqual(
      transport.sent.map((s) => [s.event.session_key, s.event.call_id, s.event.seq]),
      [
        ["s1", "c1", 0],
        ["s2", "c2", 0],
        ["s1", "c3", 1],
        ["s1", "c4", 2],
        ["s2", "c5", 1],
      ],
    );
    await Promise.all(calls);
  });

  it("a call without toolCallId gets <incarnation prefix>-<n>; its result is matched by tool name", async () => {
    const validate = inputEventValidator();
    const { transport, call } = setup();
    await call("s", "r", undefined, "read", { path: "a" });
    const [c, r] = transport.sent.map((s) => s.event);
    assert.match(String(c?.call_id), /^lf0e4b6c1d1111-1$/);
    assert.equal(r?.call_id, c?.call_id);
    assert.equal(validate(r), null);
  });

  it("identifiers over 512 UTF-8 bytes are replaced by a stable hash", async () => {
    const validate = inputEventValidator();
    const { transport, call } = setup();
    const longKey = "agent:main:" + "é".repeat(300); // 611 bytes
    await call(longKey, "r".repeat(513), "c".repeat(600), "exec", { command: "ls" });
    await call(longKey, "r".repeat(513), "c".repeat(600), "exec", { command: "ls" });
    const [first, , second] = transport.sent;
    assert.match(first!.event.session_key, /^lf-sha256:[0-9a-f]{64}$/);
    assert.equal(first!.key, first!.event.session_key);
    assert.equal(second!.event.session_key, first!.event.session_key);
    assert.equal(second!.event.seq, 2); // one session
    assert.match(String(first!.event.run_id), /^lf-sha256:/);
    assert.match(String(first!.event.call_id), /^lf-sha256:/);
    for (const s of transport.sent) assert.equal(validate(s.event), null);
    assert.equal(transport.sent.length, 4); // verdicts matched on the hashed ids: no timeouts
  });

  it("compaction is keyed by sessionKey although OpenClaw rotates sessionId", async () => {
    const { api, transport } = setup();
    await api.emit(
      "after_compaction",
      { messageCount: 1, compactedCount: 5 },
      { sessionKey: "k", sessionId: "old", runId: "r" },
    );
    await api.emit(
      "after_compaction",
      { messageCount: 1, compactedCount: 5 },
      { sessionKey: "k", sessionId: "new", runId: "r" },
    );
    await tick();
    assert.deepEqual(
      transport.sent.map((s) => [s.key, s.event.seq]),
      [
        ["k", 0],
        ["k", 1],
      ],
    );
  });

  it("a compaction or run end whose context has no run belongs to the session's current run", async () => {
    const { api, transport, call } = setup();
    await call("k", "run-7", "c1", "exec", { command: "ls" });
    await api.emit("after_compaction", { messageCount: 1, compactedCount: 5 }, { sessionKey: "k" });
    await api.emit("agent_end", { messages: [], success: true }, { sessionKey: "k" });
    await tick();
    assert.deepEqual(
      transport.sent.slice(2).map((s) => [s.event.type, s.event.run_id]),
      [
        ["compaction", "run-7"],
        ["run_ended", "run-7"],
      ],
    );
  });

  it("agent_end of a session this process never published for sends nothing", async () => {
    const { api, transport } = setup();
    await api.emit("agent_end", { runId: "r", messages: [], success: true }, { sessionKey: "chat-only", runId: "r" });
    await tick();
    assert.equal(transport.sent.length, 0);
  });
});

describe("verdicts", () => {
  it("allow: the tool runs and the agent sees its own result", async () => {
    const { call, guard } = setup();
    const { decision, seen } = await call("s", "r", "c1", "exec", { command: "ls" });
    assert.equal(decision, undefined);
    assert.deepEqual(seen, { content: [{ type: "text", text: "ok" }], details: { status: "completed" } });
    assert.equal(guard.stats.allows, 1);
  });

  it("warn: the tool runs, the warning is appended to what the agent sees, loopfuse gets the original result", async () => {
    const { transport, call, guard } = setup();
    transport.judge = () => ({
      action: "warn",
      message: "WARNING: You have called exec 10 times with identical arguments.",
    });
    const { decision, seen } = await call("s", "r", "c1", "exec", { command: "ls" });
    assert.equal(decision, undefined);
    assert.deepEqual(seen, {
      content: [
        { type: "text", text: "ok" },
        { type: "text", text: "WARNING: You have called exec 10 times with identical arguments." },
      ],
      details: { status: "completed" },
    });
    assert.deepEqual(transport.sent[1]?.event.result, {
      content: [{ type: "text", text: "ok" }],
      details: { status: "completed" },
    });
    assert.equal(guard.stats.warns, 1);
  });

  it("block: the call is vetoed with loopfuse's message and loopfuse's blocked-result shape is published", async () => {
    const validate = inputEventValidator();
    const { api, transport, call, guard } = setup();
    const msg =
      "CRITICAL: Called process with identical arguments and no progress 20 times. Session execution blocked.";
    transport.judge = () => ({ action: "block", message: msg });
    const { decision } = await call("s", "r", "c1", "process", { action: "poll", sessionId: "x" });
    assert.deepEqual(decision, { block: true, blockReason: msg });
    await tick();
    const result = transport.sent[1]!.event;
    assert.equal(result.type, "tool_result");
    assert.equal(result.call_id, "c1");
    assert.deepEqual(result.args, { action: "poll", sessionId: "x" });
    assert.deepEqual(result.result, blockedToolResult(msg));
    assert.deepEqual(result.result, {
      content: [{ type: "text", text: msg }],
      details: { status: "blocked", deniedReason: "tool-loop", reason: msg },
    });
    assert.equal(validate(result), null);
    // Should the host still pass the vetoed call through result middleware, nothing is published twice.
    await api.runMiddleware({ toolCallId: "c1", toolName: "process", args: {}, result: { content: [] } }, {});
    await tick();
    assert.equal(transport.sent.length, 2);
    assert.equal(guard.stats.blocks, 1);
  });

  it("abort: every later call of that run is blocked with the abort message; other runs go on; agent_end clears it", async () => {
    const { api, transport, call, guard } = setup();
    const abortMsg = "CRITICAL: exec repeated 3 times after compaction with identical results. Run aborted.";
    await call("s", "run-1", "c1", "exec", { command: "make" });
    await call("s", "run-2", "c2", "exec", { command: "make" });
    const resultEvent = transport.sent[1]!.event;
    transport.push({
      type: "verdict",
      verdict_id: "abort-1",
      session_key: "s",
      run_id: "run-1",
      call_id: resultEvent.call_id as string,
      seq: resultEvent.seq,
      action: "abort",
      level: "critical",
      detector: "compaction_loop_persisted",
      count: 3,
      message: abortMsg,
      incarnation: INCARNATION,
    });
    const blocked = await call("s", "run-1", "c3", "read", { path: "x" });
    assert.deepEqual(blocked.decision, { block: true, blockReason: abortMsg });
    const other = await call("s", "run-2", "c4", "read", { path: "x" });
    assert.equal(other.decision, undefined);
    assert.equal(guard.stats.aborts, 1);
    assert.equal(guard.stats.abortBlocks, 1);
    // An abort for a run this process never saw is somebody else's.
    transport.push({
      type: "verdict",
      verdict_id: "abort-2",
      session_key: "s",
      run_id: "run-9",
      call_id: "z",
      seq: 1,
      action: "abort",
      message: "x",
      incarnation: INCARNATION,
    });
    assert.equal(guard.stats.aborts, 1);
    await api.emit("agent_end", { runId: "run-1", messages: [], success: false }, { sessionKey: "s", runId: "run-1" });
    await tick();
    assert.equal(transport.sent.at(-1)?.event.type, "run_ended");
    const after = await call("s", "run-1", "c5", "read", { path: "x" });
    assert.equal(after.decision, undefined);
  });

  it("abort: taken only with this process's incarnation; another's or none, under the same session, run and call, is dropped and counted", async () => {
    // What the worker routes here when someone else publishes in its own incarnation under
    // this gateway's session key, run id and reply_to (loopfuse docs/wire-format.md).
    const { transport, call, guard } = setup();
    await call("s", "run-V", "c1", "exec", { command: "ls" });
    const resultEvent = transport.sent[1]!.event;
    const abort = {
      type: "verdict",
      verdict_id: "abort-V",
      session_key: "s",
      run_id: "run-V",
      call_id: resultEvent.call_id as string,
      seq: resultEvent.seq,
      action: "abort",
      level: "critical",
      detector: "compaction_loop_persisted",
      count: 3,
      message: "CRITICAL: aborted",
    } as const;
    transport.push({ ...abort, incarnation: "0e4b6c1d-ffff-4222-8333-attacker0000" });
    transport.push({ ...abort, verdict_id: "abort-other", incarnation: "another-gateway" });
    transport.push({ ...abort, verdict_id: "abort-none" }); // events sent with no incarnation
    transport.push({ ...abort, verdict_id: "abort-null", incarnation: null });
    assert.equal(guard.stats.aborts, 0);
    assert.equal(guard.stats.verdictsOtherIncarnation, 4);
    const after = await call("s", "run-V", "c2", "read", { path: "x" });
    assert.equal(after.decision, undefined); // the run goes on
    transport.push({ ...abort, incarnation: INCARNATION });
    assert.equal(guard.stats.aborts, 1);
    const blocked = await call("s", "run-V", "c3", "read", { path: "x" });
    assert.deepEqual(blocked.decision, { block: true, blockReason: "CRITICAL: aborted" });
  });

  it("a verdict is matched by (session_key, call_id, seq) and incarnation; any other is counted and dropped", async () => {
    const { api, transport, guard } = setup({ timeoutMs: 300 });
    transport.judge = () => null;
    const pending = api.emit(
      "before_tool_call",
      { toolName: "exec", params: { command: "ls" }, toolCallId: "c1" },
      toolCtx("s", "r", "c1"),
    );
    await tick();
    const call = transport.sent[0]!.event;
    const base = {
      type: "verdict",
      verdict_id: "v",
      session_key: "s",
      run_id: "r",
      call_id: "c1",
      seq: call.seq,
      message: "stop",
    };
    transport.push({ ...base, seq: call.seq + 1, action: "block" }); // same call id, other seq: an older call's verdict
    transport.push({ ...base, call_id: "c2", action: "block" });
    transport.push({ ...base, session_key: "other", action: "block" });
    transport.push({ ...base, incarnation: "previous-process", action: "block" });
    transport.deliver?.("not json");
    transport.push({ ...base, action: "block", incarnation: INCARNATION });
    assert.deepEqual(await pending, { block: true, blockReason: "stop" });
    assert.equal(guard.stats.verdictsUnmatched, 3);
    assert.equal(guard.stats.verdictsOtherIncarnation, 1);
    assert.equal(guard.stats.verdictsInvalid, 1);
    assert.equal(guard.stats.verdictsMatched, 1);
    transport.push({ ...base, action: "block" }); // redelivered
    assert.equal(guard.stats.verdictsUnmatched, 4);
  });

  it("no verdict in time, fail-open: the tool runs; counted; a late verdict is counted as late", async () => {
    const { transport, call, guard } = setup({ timeoutMs: 50 });
    transport.judge = () => null;
    const started = Date.now();
    const { decision } = await call("s", "r", "c1", "exec", { command: "ls" });
    assert.equal(decision, undefined);
    assert.ok(Date.now() - started >= 45);
    assert.equal(guard.stats.timeouts, 1);
    assert.equal(guard.stats.timeoutsAllowed, 1);
    const c = transport.sent[0]!.event;
    transport.push({
      type: "verdict",
      verdict_id: "v",
      session_key: "s",
      run_id: "r",
      call_id: "c1",
      seq: c.seq,
      action: "block",
      message: "late",
    });
    assert.equal(guard.stats.verdictsLate, 1);
  });

  it("no verdict in time, fail-closed: blocked with the timeout message and the blocked shape published", async () => {
    const { transport, call, guard } = setup({ timeoutMs: 50, failPolicy: "closed" });
    transport.judge = () => null;
    const { decision } = await call("s", "r", "c1", "exec", { command: "ls" });
    assert.deepEqual(decision, { block: true, blockReason: TIMEOUT_MESSAGE("closed") });
    await tick();
    assert.deepEqual(transport.sent[1]?.event.result, blockedToolResult(TIMEOUT_MESSAGE("closed")));
    assert.equal(guard.stats.timeoutsBlocked, 1);
  });

  it("a failed publish decides at once by the fail policy (no wait for the timeout)", async () => {
    const { transport, call, guard } = setup({ timeoutMs: 5000, failPolicy: "closed" });
    transport.failSends = true;
    const started = Date.now();
    const { decision } = await call("s", "r", "c1", "exec", { command: "ls" });
    assert.deepEqual(decision, { block: true, blockReason: TIMEOUT_MESSAGE("closed") });
    assert.ok(Date.now() - started < 1000);
    assert.ok(guard.stats.publishErrors >= 1);
  });

  it("shadow: verdicts are reported, nothing is blocked or appended", async () => {
    const { transport, call, guard } = setup({ shadow: true });
    transport.judge = (e) => ({ action: e.call_id === "c1" ? "block" : "warn", message: "loop" });
    const first = await call("s", "r", "c1", "exec", { command: "ls" });
    assert.equal(first.decision, undefined);
    const second = await call("s", "r", "c2", "exec", { command: "ls" });
    assert.deepEqual(second.seen, { content: [{ type: "text", text: "ok" }], details: { status: "completed" } });
    assert.deepEqual(
      transport.sent.map((s) => s.event.type),
      ["tool_call", "tool_result", "tool_call", "tool_result"],
    );
    assert.deepEqual(transport.sent[1]?.event.result, {
      content: [{ type: "text", text: "ok" }],
      details: { status: "completed" },
    });
    assert.equal(guard.stats.blocks, 1);
    assert.equal(guard.stats.shadowIgnored, 2);
  });

  it("oversized args and results are published as digests, so the event stays under loopfuse's size limit", async () => {
    const validate = inputEventValidator();
    const { transport, call } = setup();
    const big = "x".repeat(700_000);
    await call(
      "s",
      "r",
      "c1",
      "write",
      { action: "create", content: big },
      { content: [{ type: "text", text: big + big }], details: { status: "ok" } },
    );
    const [c, r] = transport.sent.map((s) => s.event);
    assert.match(String(c?.args_hash), /^lf-sha256:/);
    assert.equal(c?.args_action, "create");
    assert.equal("args" in c!, false);
    assert.equal(r?.args_hash, c?.args_hash);
    assert.ok(JSON.stringify(r).length < 10_000);
    assert.equal(validate(c), null);
    assert.equal(validate(r), null);
  });

  it("after gateway_stop nothing is published; calls fall to the fail policy at once", async () => {
    const { api, transport, guard } = setup({ timeoutMs: 10_000 });
    await api.emit("gateway_stop", {}, {});
    const started = Date.now();
    const decision = await api.emit(
      "before_tool_call",
      { toolName: "exec", params: {}, toolCallId: "c" },
      toolCtx("s", "r", "c"),
    );
    assert.equal(decision, undefined);
    assert.ok(Date.now() - started < 1000);
    assert.equal(transport.sent.length, 0);
    assert.equal(guard.stopped, true);
  });

  it("gateway_stop stops the transport and releases waiting calls", async () => {
    const { api, transport } = setup({ timeoutMs: 10_000 });
    transport.judge = () => null;
    const pending = api.emit(
      "before_tool_call",
      { toolName: "exec", params: {}, toolCallId: "c" },
      toolCtx("s", "r", "c"),
    );
    await tick();
    await api.emit("gateway_stop", {}, {});
    assert.equal(await pending, undefined);
    assert.equal(transport.stopped, true);
  });
});

describe("verdict signatures (loopfuse docs/wire-format.md: Verdict signatures)", () => {
  // The Python side's test vector (tests/unit/test_verdict_signature.py): the same bytes verify.
  const SECRET = Buffer.from(Array.from({ length: 32 }, (_, i) => i));
  const SPEC = `k1:${SECRET.toString("base64")}`;
  const OLD = `k0:${Buffer.alloc(32, "o").toString("base64")}`;
  const KEY = Buffer.from("requester-1");
  const VALUE = Buffer.from('{"type":"verdict","action":"block"}');
  const header = (value: Buffer | string): [Buffer, Buffer][] => [[Buffer.from(SIGNATURE_HEADER), Buffer.from(value)]];
  const flip = (data: Buffer, i: number) => {
    const copy = Buffer.from(data);
    copy[i]! ^= 1;
    return copy;
  };

  it("signs exactly as the Python worker does (the documented test vector)", () => {
    const [key] = parseVerdictKeys(SPEC);
    assert.equal(signVerdict(key!, KEY, VALUE).toString(), "k1:59MfjKvsUSjSlBVvHVxLIVC-wJCqCEhNTdJDgoVpZeQ");
  });

  it("a flipped bit in value, key or signature, an unsigned record and an unknown key id are rejected; rotation accepts the old key", () => {
    const keys = parseVerdictKeys(`${SPEC}, ${OLD}`);
    const verifier = new VerdictVerifier(keys);
    const signed = signVerdict(keys[0]!, KEY, VALUE);
    assert.equal(verifier.check(KEY, VALUE, header(signed)), "ok");
    assert.equal(verifier.check(KEY, flip(VALUE, 30), header(signed)), "bad");
    assert.equal(verifier.check(flip(KEY, 0), VALUE, header(signed)), "bad");
    assert.equal(verifier.check(KEY, VALUE, header(flip(signed, signed.length - 5))), "bad");
    assert.equal(verifier.check(KEY, VALUE, []), "unsigned");
    assert.equal(verifier.check(KEY, VALUE, [[Buffer.from("other"), signed]]), "unsigned");
    assert.equal(verifier.check(KEY, VALUE, header(`k9${signed.toString().slice(2)}`)), "bad");
    for (const junk of ["", ":", "k1", "k1:", "k1:" + "A".repeat(43)])
      assert.equal(verifier.check(KEY, VALUE, header(junk)), "bad");
    // signed by the previous key (a worker not yet rotated): accepted while it is listed
    const byOld = signVerdict(keys[1]!, KEY, VALUE);
    assert.equal(verifier.check(KEY, VALUE, header(byOld)), "ok");
    assert.equal(new VerdictVerifier([keys[0]!]).check(KEY, VALUE, header(byOld)), "bad");
  });

  it("config: a valid verdictKey is parsed; a malformed one is reported without the key and accepts no verdict", () => {
    assert.equal(resolveConfig({}).verdictKeys, null);
    assert.deepEqual(
      resolveConfig({ verdictKey: `${SPEC},${OLD}` }).verdictKeys?.map((k) => k.keyId),
      ["k1", "k0"],
    );
    const short = `k1:${Buffer.from("hunter2-hunter2!").toString("base64")}`;
    for (const [value, why] of [
      [short, "key 1 is shorter than 32 bytes"],
      [`${SPEC},${SPEC}`, "key 2 repeats the id"],
      ["no-colon", "key 1 must be id:base64"],
      [`k1:${"!".repeat(44)}`, "key 1 is not base64"],
    ] as const) {
      const problems: string[] = [];
      const cfg = resolveConfig({ verdictKey: value }, problems);
      assert.deepEqual(cfg.verdictKeys, [], value); // checked against no key: fails closed
      assert.equal(problems.length, 1);
      assert.match(problems[0]!, new RegExp(`^verdictKey: ${why}.*no verdict is accepted`));
      assert.ok(!problems[0]!.includes("aHVudGVy") && !problems[0]!.includes(SPEC.slice(3)), problems[0]);
    }
    // the manifest's pattern refuses what the host can refuse before the plugin loads
    const pattern = new RegExp(CONFIG_SCHEMA.properties.verdictKey.pattern);
    assert.ok(pattern.test(SPEC) && pattern.test(` ${SPEC} , ${OLD} `));
    assert.ok(!pattern.test(short) && !pattern.test("k1") && !pattern.test(`${SPEC},`));
  });
});
