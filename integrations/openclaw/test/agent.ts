/** The plugin driven as OpenClaw drives it (hooks in OpenClaw's order) on its real Kafka transport, with a transcript of what the agent saw. */
import assert from "node:assert/strict";
import { createLoopfusePlugin, type LoopfuseGuard, type Verdict, type WireEvent } from "../src/index.js";
import { FakeApi, toolCtx } from "./support.js";

export interface Gateway {
  api: FakeApi;
  guard: LoopfuseGuard;
  events: { topic: string; event: WireEvent }[];
  verdicts: Verdict[];
}

/**
 * The plugin registered with `config` (its whole plugin config). By default connected
 * (verdicts are being read) with nothing logged as an error; `connect: false` returns at
 * once, for a gateway Kafka refuses.
 */
export async function gateway(config: Record<string, unknown>, opts: { connect?: boolean } = {}): Promise<Gateway> {
  const events: Gateway["events"] = [];
  const verdicts: Verdict[] = [];
  let guard: LoopfuseGuard | undefined;
  const plugin = createLoopfusePlugin({
    onEvent: (topic, event) => events.push({ topic, event: structuredClone(event) }),
    onVerdict: (v) => verdicts.push(v),
    onGuard: (g) => (guard = g),
  });
  const api = new FakeApi({ groupSessionTimeoutMs: 6000, ...config });
  plugin.register(api);
  if (opts.connect ?? true) {
    await guard!.start();
    assert.deepEqual(
      api.logs.filter((l) => l.level === "error"),
      [],
    );
  }
  return { api, guard: guard!, events, verdicts };
}

/** What an OpenClaw agent run looks like to the plugin, with a transcript of what the agent saw. */
export class Agent {
  readonly transcript: string[] = [];
  readonly sessionKey: string;
  runId: string;
  private readonly gw: Gateway;
  private n = 0;
  private seenVerdicts = 0;

  constructor(gw: Gateway, sessionKey: string, runId: string) {
    this.gw = gw;
    this.sessionKey = sessionKey;
    this.runId = runId;
  }

  async call(toolName: string, params: Record<string, unknown>, output: string, details: Record<string, unknown> = {}) {
    this.noteAborts();
    const toolCallId = `toolu_${this.runId}_${++this.n}`;
    const ctx = toolCtx(this.sessionKey, this.runId, toolCallId, { toolName });
    const before = this.gw.verdicts.length;
    const decision = (await this.gw.api.emit(
      "before_tool_call",
      { toolName, params, runId: this.runId, toolCallId },
      ctx,
    )) as { block?: boolean; blockReason?: string } | undefined;
    const verdict = this.gw.verdicts.slice(before).find((v) => v.call_id === toolCallId);
    const judged = verdict
      ? `${verdict.action}${verdict.detector ? ` (${verdict.detector}, count ${verdict.count})` : ""}`
      : `no verdict (${decision?.block ? "blocked" : "allowed"} by the plugin)`;
    let seen: string;
    if (decision?.block) {
      seen = `BLOCKED: ${decision.blockReason}`;
    } else {
      const result = { content: [{ type: "text", text: output }], details: { status: "completed", ...details } };
      const shown = (await this.gw.api.runMiddleware(
        { toolCallId, toolName, args: params, result },
        { runtime: "openclaw" },
      )) as {
        content: { text: string }[];
      };
      seen = shown.content.map((c) => c.text).join(" | ");
    }
    this.transcript.push(
      `${this.sessionKey} #${this.n} ${toolName} ${JSON.stringify(params)} -> ${judged} -> agent saw: ${seen}`,
    );
    return { decision, verdict, seen };
  }

  /** Abort verdicts arrive on their own (for a tool_result), between calls. */
  private noteAborts() {
    for (const v of this.gw.verdicts.slice(this.seenVerdicts)) {
      if (v.action === "abort" && v.session_key === this.sessionKey) {
        this.transcript.push(
          `${this.sessionKey} <- loopfuse: abort (${v.detector}, count ${v.count}) for the result of ${v.call_id}: ${v.message}`,
        );
      }
    }
    this.seenVerdicts = this.gw.verdicts.length;
  }

  async compaction() {
    await this.gw.api.emit(
      "after_compaction",
      { messageCount: 12, compactedCount: 40 },
      { sessionKey: this.sessionKey, runId: this.runId, agentId: "main" },
    );
    this.transcript.push(`${this.sessionKey} -- after_compaction --`);
  }

  async end() {
    await this.gw.api.emit(
      "agent_end",
      { runId: this.runId, messages: [], success: true },
      { sessionKey: this.sessionKey, runId: this.runId, agentId: "main" },
    );
    this.transcript.push(`${this.sessionKey} -- agent_end --`);
  }
}
