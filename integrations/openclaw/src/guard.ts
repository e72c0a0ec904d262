/**
 * The loopfuse side of an OpenClaw gateway: turns hook calls into loopfuse wire events
 * (v1) and loopfuse verdicts into hook answers.
 *
 * Restart-safe contract (as the Python client): every event carries `incarnation`, a
 * random id made once per plugin process; `seq` counts per session key from 0 within
 * the incarnation, assigned synchronously when the hook is called; `event_id` is
 * `<incarnation>:<seq>`. A verdict answers the pending call with the same
 * (session_key, call_id, seq) and, when the verdict names an incarnation, the same
 * incarnation; every other verdict is counted and dropped.
 */
import { createHash, randomUUID } from "node:crypto";
import type { LoopfuseConfig } from "./config.js";
import { boundedId } from "./ids.js";
import type { ReadCounts, Transport } from "./transport.js";
import type {
  AfterCompactionEvent,
  AgentEndEvent,
  AgentHookContext,
  AgentToolResult,
  BeforeToolCallEvent,
  BeforeToolCallResult,
  PluginLogger,
  ToolHookContext,
  ToolResultMiddlewareContext,
  ToolResultMiddlewareEvent,
} from "./types.js";

export type Action = "allow" | "warn" | "block" | "abort";

/** A loopfuse verdict as read from the verdict topic (fields the plugin uses). */
export interface Verdict {
  type?: string;
  verdict_id: string;
  session_key: string | null;
  run_id: string | null;
  call_id: string | null;
  seq: number | null;
  tool_name?: string | null;
  action: Action;
  level?: string;
  detector?: string | null;
  count?: number;
  message: string | null;
  incarnation?: string | null;
  [key: string]: unknown;
}

export type WireEvent = Record<string, unknown> & {
  type: "tool_call" | "tool_result" | "compaction" | "run_ended";
  event_id: string;
  incarnation: string;
  session_key: string;
  run_id: string | null;
  agent_id: string | null;
  seq: number;
  ts: number;
};

/** Counters for operators (and tests); never reset. */
export interface GuardStats {
  published: number;
  publishErrors: number;
  verdictsMatched: number;
  /** Verdicts for no pending call of this process (other gateways', duplicates, late). */
  verdictsUnmatched: number;
  /** Verdicts that arrived after their call had timed out. */
  verdictsLate: number;
  /** Verdicts naming another incarnation (a previous process of this gateway). */
  verdictsOtherIncarnation: number;
  verdictsInvalid: number;
  allows: number;
  warns: number;
  blocks: number;
  aborts: number;
  /** Calls blocked locally because loopfuse aborted their run. */
  abortBlocks: number;
  timeouts: number;
  timeoutsAllowed: number;
  timeoutsBlocked: number;
  /** Tool results that could not be tied to a session (no call seen, no session key). */
  orphanResults: number;
  /** Verdicts that shadow mode did not enforce (block, warn, abort). */
  shadowIgnored: number;
  internalErrors: number;
}

/** What the agent is given instead of running a blocked tool (loopfuse's shape, spec 6). */
export function blockedToolResult(message: string): AgentToolResult {
  return {
    content: [{ type: "text", text: message }],
    details: { status: "blocked", deniedReason: "tool-loop", reason: message },
  };
}

export const TIMEOUT_MESSAGE = (policy: "open" | "closed") =>
  `loopfuse did not answer in time; the call is ${policy === "open" ? "allowed" : "blocked"} by the fail-${policy} policy.`;

/** Largest event the plugin publishes as is (loopfuse's default limit is 1 MiB). */
export const MAX_EVENT_BYTES = 1_000_000;

interface Scope {
  sessionKey: string;
  runId: string | null;
  agentId: string | null;
}

interface CallRecord {
  scope: Scope;
  rawToolCallId: string | null;
  callId: string;
  toolName: string;
  args: unknown;
  /** Published instead of args when they were too large. */
  argsHash: string | null;
  argsAction: string | null;
  /** loopfuse's warning, appended to the result the agent sees. */
  warning: string | null;
  /** The result is already published (blocked calls): the middleware leaves it alone. */
  done: boolean;
}

interface Waiter {
  resolve: (verdict: Verdict | null) => void;
  timer: NodeJS.Timeout;
}

export interface GuardOptions {
  config: LoopfuseConfig;
  transport: Transport;
  logger?: PluginLogger;
  /** Fixed incarnation (tests); default crypto.randomUUID(). */
  incarnation?: string;
  now?: () => number;
  /** Called with every event before it is published (audit, tests). */
  onEvent?: (topic: string, event: WireEvent) => void;
  /** Called with every verdict matched to a call, and with every abort taken. */
  onVerdict?: (verdict: Verdict) => void;
}

const SEP = "\u0000";
const MAX_CALL_RECORDS = 10_000;
const MAX_REMEMBERED = 4096;

function textOf(result: unknown): string {
  if (typeof result === "string") return result;
  if (!result || typeof result !== "object") return "";
  const content = (result as AgentToolResult).content;
  if (typeof content === "string") return content;
  if (!Array.isArray(content)) return "";
  return content
    .map((item) =>
      typeof item === "string"
        ? item
        : item && typeof item === "object" && typeof (item as { text?: unknown }).text === "string"
          ? (item as { text: string }).text
          : "",
    )
    .filter(Boolean)
    .join("\n");
}

/** JSON with sorted keys: equal values give equal text (for digests). */
function canonicalJson(value: unknown): string {
  return JSON.stringify(value, (_key, v: unknown) => {
    if (v && typeof v === "object" && !Array.isArray(v)) {
      return Object.fromEntries(
        Object.entries(v as Record<string, unknown>).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)),
      );
    }
    return v;
  });
}

function digest(value: unknown): string {
  return `lf-sha256:${createHash("sha256")
    .update(canonicalJson(value) ?? "null", "utf8")
    .digest("hex")}`;
}

/** The value made JSON-safe (drops functions, turns bigint into text); undefined when impossible. */
function jsonSafe(value: unknown): unknown {
  try {
    const text = JSON.stringify(value, (_k, v: unknown) => (typeof v === "bigint" ? v.toString() : v));
    return text === undefined ? null : JSON.parse(text);
  } catch {
    return undefined;
  }
}

/** Append loopfuse's warning to a tool result where the model reads it (its content). */
export function appendWarning(result: AgentToolResult, message: string): AgentToolResult {
  const content = result?.content;
  if (typeof content === "string") {
    return { ...result, content: content ? `${content}\n\n${message}` : message };
  }
  const blocks = Array.isArray(content) ? content : [];
  return { ...result, content: [...blocks, { type: "text", text: message }] };
}

export class LoopfuseGuard {
  readonly incarnation: string;
  readonly stats: GuardStats = {
    published: 0,
    publishErrors: 0,
    verdictsMatched: 0,
    verdictsUnmatched: 0,
    verdictsLate: 0,
    verdictsOtherIncarnation: 0,
    verdictsInvalid: 0,
    allows: 0,
    warns: 0,
    blocks: 0,
    aborts: 0,
    abortBlocks: 0,
    timeouts: 0,
    timeoutsAllowed: 0,
    timeoutsBlocked: 0,
    orphanResults: 0,
    shadowIgnored: 0,
    internalErrors: 0,
  };

  /**
   * Records the verdict reader read: other gateways' replies among them (skipped unparsed)
   * and, with `verdictKey`, verdicts dropped unsigned or badly signed.
   */
  get readCounts(): ReadCounts | undefined {
    return this.transport.counts;
  }

  private readonly config: LoopfuseConfig;
  private readonly transport: Transport;
  private readonly logger: PluginLogger;
  private readonly now: () => number;
  private readonly onEvent?: GuardOptions["onEvent"];
  private readonly onVerdictHook?: GuardOptions["onVerdict"];
  private readonly callPrefix: string;
  private callCounter = 0;
  private readonly seqs = new Map<string, number>();
  private readonly pending = new Map<string, Waiter>();
  private readonly expired = new Set<string>();
  private readonly records: CallRecord[] = [];
  private readonly knownRuns = new Set<string>();
  /** The run of each session's latest tool call (for hooks whose context has no run). */
  private readonly lastRun = new Map<string, string>();
  private readonly abortedRuns = new Map<string, string>();
  private readonly abortIds = new Set<string>();
  private started: Promise<void> | null = null;
  /** Set by stop(); a stopped guard publishes nothing more. */
  stopped = false;
  /** The transport gave up (a config error, logged once): sends fail without a line each. */
  private unavailable = false;

  constructor(options: GuardOptions) {
    this.config = options.config;
    this.transport = options.transport;
    this.logger = options.logger ?? { info: () => {}, warn: () => {}, error: () => {} };
    this.incarnation = options.incarnation ?? randomUUID();
    this.callPrefix = `lf${this.incarnation.replace(/-/g, "").slice(0, 12)}`;
    this.now = options.now ?? Date.now;
    this.onEvent = options.onEvent;
    this.onVerdictHook = options.onVerdict;
  }

  // -- lifecycle ---------------------------------------------------------------------

  /** Connect in the background; resolves when verdicts are being read. Never rejects. */
  start(): Promise<void> {
    this.started ??= this.transport
      .start((raw) => this.onVerdictMessage(raw))
      .then(
        () => this.logger.info(`loopfuse: connected (incarnation ${this.incarnation})`),
        (err: unknown) => {
          this.unavailable = true;
          if (this.stopped) return; // stopped before it connected: nothing to report
          this.logger.error(
            `loopfuse: could not connect to Kafka: ${String(err)}; every call falls to the fail-${this.config.failPolicy} policy`,
          );
        },
      );
    return this.started;
  }

  async stop(): Promise<void> {
    if (this.stopped) return;
    this.stopped = true;
    for (const [key, waiter] of this.pending) {
      clearTimeout(waiter.timer);
      waiter.resolve(null);
      this.pending.delete(key);
    }
    await this.transport.stop();
    this.logger.info(`loopfuse: stopped; ${JSON.stringify(this.stats)}`);
  }

  // -- hooks -------------------------------------------------------------------------

  /** `before_tool_call`: publish the call, wait for its verdict. Never throws. */
  async beforeToolCall(
    event: BeforeToolCallEvent,
    ctx: ToolHookContext = {},
  ): Promise<BeforeToolCallResult | undefined> {
    try {
      return await this.checkCall(event, ctx);
    } catch (err) {
      this.stats.internalErrors++;
      this.logger.error(`loopfuse: before_tool_call failed: ${String(err)}`);
      if (this.config.failPolicy === "closed" && !this.config.shadow) {
        return { block: true, blockReason: TIMEOUT_MESSAGE("closed") };
      }
      return undefined;
    }
  }

  /** Result middleware: publish the outcome; append a warning. Never throws. */
  async onToolResult(
    event: ToolResultMiddlewareEvent,
    ctx: ToolResultMiddlewareContext = {},
  ): Promise<{ result: AgentToolResult } | undefined> {
    try {
      return this.publishResult(event, ctx);
    } catch (err) {
      this.stats.internalErrors++;
      this.logger.error(`loopfuse: tool result middleware failed: ${String(err)}`);
      return undefined;
    }
  }

  /** `after_compaction`: arms loopfuse's post-compaction guard for the run. */
  onCompaction(_event: AfterCompactionEvent, ctx: AgentHookContext = {}): void {
    try {
      const scope = this.scopeOf(ctx, undefined);
      if (!scope) return;
      // The guard is per run: without a run in the context, the session's current run.
      scope.runId ??= this.lastRun.get(scope.sessionKey) ?? null;
      this.publish(this.config.topics.compactions, this.envelope("compaction", scope));
    } catch (err) {
      this.stats.internalErrors++;
      this.logger.error(`loopfuse: after_compaction failed: ${String(err)}`);
    }
  }

  /** `agent_end`: the run is over; loopfuse frees its guard and warnings. */
  onAgentEnd(event: AgentEndEvent, ctx: AgentHookContext = {}): void {
    try {
      const scope = this.scopeOf(ctx, event.runId);
      if (!scope) return;
      scope.runId ??= this.lastRun.get(scope.sessionKey) ?? null;
      const rk = this.runKey(scope);
      if (this.lastRun.get(scope.sessionKey) === scope.runId) this.lastRun.delete(scope.sessionKey);
      // Only sessions this process published for: chat-only runs cost loopfuse nothing.
      if (this.seqs.has(scope.sessionKey)) {
        this.publish(this.config.topics.compactions, this.envelope("run_ended", scope));
      }
      this.knownRuns.delete(rk);
      this.abortedRuns.delete(rk);
      for (let i = this.records.length - 1; i >= 0; i--) {
        if (this.runKey(this.records[i]!.scope) === rk) this.records.splice(i, 1);
      }
    } catch (err) {
      this.stats.internalErrors++;
      this.logger.error(`loopfuse: agent_end failed: ${String(err)}`);
    }
  }

  // -- calls -------------------------------------------------------------------------

  private async checkCall(event: BeforeToolCallEvent, ctx: ToolHookContext): Promise<BeforeToolCallResult | undefined> {
    const scope = this.scopeOf(ctx, event.runId) ?? { sessionKey: "openclaw:no-session", runId: null, agentId: null };
    const rk = this.runKey(scope);
    const rawToolCallId = event.toolCallId || ctx.toolCallId || null;
    const abortMessage = this.abortedRuns.get(rk);
    if (abortMessage !== undefined) {
      if (!this.config.shadow) {
        this.stats.abortBlocks++;
        return { block: true, blockReason: abortMessage };
      }
      this.stats.shadowIgnored++;
    }
    const callId = rawToolCallId ? boundedId(rawToolCallId) : `${this.callPrefix}-${++this.callCounter}`;
    const toolName = event.toolName || ctx.toolName || "unknown";
    const record: CallRecord = {
      scope,
      rawToolCallId,
      callId,
      toolName,
      args: event.params ?? {},
      argsHash: null,
      argsAction: null,
      warning: null,
      done: false,
    };
    const call = this.envelope("tool_call", scope);
    Object.assign(call, { call_id: callId, tool_name: toolName });
    this.putArgs(call, record);
    this.knownRuns.add(rk);
    if (scope.runId) this.lastRun.set(scope.sessionKey, scope.runId);

    const key = this.waitKey(scope.sessionKey, callId, call.seq);
    const verdictArrives = new Promise<Verdict | null>((resolve) => {
      const timer = setTimeout(() => {
        if (this.pending.delete(key)) {
          this.remember(this.expired, key);
          resolve(null);
        }
      }, this.config.timeoutMs);
      this.pending.set(key, { resolve, timer });
    });
    this.publish(this.config.topics.toolCalls, call, () => {
      // Not published: there will be no verdict; decide now instead of at the timeout.
      const waiter = this.pending.get(key);
      if (waiter) {
        clearTimeout(waiter.timer);
        this.pending.delete(key);
        waiter.resolve(null);
      }
    });
    const verdict = await verdictArrives;

    if (verdict === null) {
      this.stats.timeouts++;
      if (this.config.failPolicy === "open" || this.config.shadow) {
        this.stats.timeoutsAllowed++;
        this.keepRecord(record);
        return undefined;
      }
      this.stats.timeoutsBlocked++;
      return this.blockCall(record, TIMEOUT_MESSAGE("closed"));
    }
    this.onVerdictHook?.(verdict);
    switch (verdict.action) {
      case "warn":
        this.stats.warns++;
        if (this.config.shadow) this.stats.shadowIgnored++;
        else record.warning = verdict.message ?? null;
        this.keepRecord(record);
        return undefined;
      case "block":
        this.stats.blocks++;
        if (this.config.shadow) {
          this.stats.shadowIgnored++;
          this.keepRecord(record);
          return undefined;
        }
        return this.blockCall(record, verdict.message || "Tool call blocked by loopfuse (tool loop).");
      default:
        this.stats.allows++;
        this.keepRecord(record);
        return undefined;
    }
  }

  /** Veto the call and publish loopfuse's blocked-result shape as its outcome. */
  private blockCall(record: CallRecord, message: string): BeforeToolCallResult {
    record.done = true;
    this.keepRecord(record); // should the host still run result middleware for it, nothing is published twice
    const result = this.envelope("tool_result", record.scope);
    Object.assign(result, { call_id: record.callId, tool_name: record.toolName });
    this.putRecordedArgs(result, record);
    result.result = blockedToolResult(message);
    this.publish(this.config.topics.toolResults, result);
    return { block: true, blockReason: message };
  }

  private publishResult(
    event: ToolResultMiddlewareEvent,
    ctx: ToolResultMiddlewareContext,
  ): { result: AgentToolResult } | undefined {
    const record = this.takeRecord(event, ctx);
    if (record?.done) return undefined;
    const scope = record?.scope ?? this.scopeOf(ctx, undefined);
    if (!scope) {
      this.stats.orphanResults++;
      return undefined;
    }
    const toolName = record?.toolName ?? (event.toolName || "unknown");
    const out = this.envelope("tool_result", scope);
    Object.assign(out, {
      call_id:
        record?.callId ?? (event.toolCallId ? boundedId(event.toolCallId) : `${this.callPrefix}-${++this.callCounter}`),
      tool_name: toolName,
    });
    if (record) this.putRecordedArgs(out, record);
    else this.putArgs(out, { args: event.args ?? {}, argsHash: null, argsAction: null } as CallRecord);
    if (event.isError) {
      out.error = textOf(event.result) || "tool error";
    } else {
      out.result = this.boundedResult(out, event.result);
    }
    this.publish(this.config.topics.toolResults, out);
    if (record?.warning && !this.config.shadow) {
      return { result: appendWarning(event.result, record.warning) };
    }
    return undefined;
  }

  // -- verdicts ----------------------------------------------------------------------

  /** One message of the verdict topic. */
  onVerdictMessage(raw: string): void {
    let verdict: Verdict;
    try {
      verdict = JSON.parse(raw) as Verdict;
    } catch {
      this.stats.verdictsInvalid++;
      return;
    }
    if (
      !verdict ||
      typeof verdict !== "object" ||
      (verdict.type !== undefined && verdict.type !== "verdict") ||
      !["allow", "warn", "block", "abort"].includes(verdict.action)
    ) {
      this.stats.verdictsInvalid++;
      return;
    }
    if (verdict.incarnation != null && verdict.incarnation !== this.incarnation) {
      this.stats.verdictsOtherIncarnation++;
      return;
    }
    if (verdict.action === "abort") {
      this.takeAbort(verdict);
      return;
    }
    const key = this.waitKey(verdict.session_key ?? verdict.run_id ?? "", verdict.call_id ?? "", verdict.seq ?? -1);
    const waiter = this.pending.get(key);
    if (!waiter) {
      if (this.expired.has(key)) this.stats.verdictsLate++;
      else this.stats.verdictsUnmatched++;
      return;
    }
    clearTimeout(waiter.timer);
    this.pending.delete(key);
    this.stats.verdictsMatched++;
    waiter.resolve(verdict);
  }

  /**
   * loopfuse aborts a run: OpenClaw 2026.9.6 gives a plugin no way to end it at a blocked
   * call (a result's `terminate` ends a run, but a call vetoed in before_tool_call never
   * reaches the result middleware), so block its later calls.
   */
  private takeAbort(verdict: Verdict): void {
    // An abort ends the run: it must name this process's incarnation, which every event
    // the plugin publishes carries (an abort with none answers someone else's events).
    if (verdict.incarnation !== this.incarnation) {
      this.stats.verdictsOtherIncarnation++;
      return;
    }
    const rk = `${verdict.session_key ?? verdict.run_id ?? ""}${SEP}${verdict.run_id ?? ""}`;
    if (!this.knownRuns.has(rk)) {
      this.stats.verdictsUnmatched++;
      return;
    }
    if (this.abortIds.has(verdict.verdict_id)) return; // redelivered
    this.remember(this.abortIds, verdict.verdict_id);
    this.stats.aborts++;
    this.onVerdictHook?.(verdict);
    if (this.config.shadow) {
      this.stats.shadowIgnored++;
      return;
    }
    this.abortedRuns.set(rk, verdict.message || "Run aborted by loopfuse: the tool loop persisted after compaction.");
    this.logger.warn(`loopfuse: run ${verdict.run_id ?? "(none)"} aborted: ${verdict.message ?? ""}`);
  }

  // -- events ------------------------------------------------------------------------

  private scopeOf(
    ctx: { sessionKey?: string; sessionId?: string; runId?: string; agentId?: string },
    runId: string | undefined,
  ): Scope | null {
    const run = runId || ctx.runId || null;
    // Keyed by sessionKey: OpenClaw may rotate sessionId (compaction, /new), the key stays.
    const session = ctx.sessionKey || run || ctx.sessionId || null;
    if (!session) return null;
    return {
      sessionKey: boundedId(session),
      runId: run ? boundedId(run) : null,
      agentId: ctx.agentId ? boundedId(ctx.agentId) : null,
    };
  }

  private runKey(scope: Scope): string {
    return `${scope.sessionKey}${SEP}${scope.runId ?? ""}`;
  }

  private waitKey(sessionKey: string, callId: string, seq: number): string {
    return `${sessionKey}${SEP}${callId}${SEP}${seq}`;
  }

  /** A new event of the session: seq assigned here, synchronously, in hook-call order. */
  private envelope(type: WireEvent["type"], scope: Scope): WireEvent {
    const seq = this.seqs.get(scope.sessionKey) ?? 0;
    this.seqs.set(scope.sessionKey, seq + 1);
    return {
      type,
      event_id: `${this.incarnation}:${seq}`,
      incarnation: this.incarnation,
      session_key: scope.sessionKey,
      run_id: scope.runId,
      agent_id: scope.agentId,
      seq,
      ts: Math.floor(this.now()),
    };
  }

  private putArgs(event: WireEvent, record: CallRecord): void {
    const safe = jsonSafe(record.args);
    record.args = safe === undefined ? {} : safe;
    const size = Buffer.byteLength(JSON.stringify(record.args), "utf8");
    if (size > MAX_EVENT_BYTES / 2) {
      // Too large to publish: an opaque token (equal args, equal token) instead.
      record.argsHash = digest(record.args);
      const action = (record.args as { action?: unknown } | null)?.action;
      record.argsAction = typeof action === "string" ? action : null;
    }
    this.putRecordedArgs(event, record);
  }

  private putRecordedArgs(event: WireEvent, record: CallRecord): void {
    if (record.argsHash) {
      event.args_hash = record.argsHash;
      if (record.argsAction) event.args_action = record.argsAction;
    } else {
      event.args = record.args;
    }
  }

  /** The result as published: a digest when it would make the event too large for loopfuse. */
  private boundedResult(event: WireEvent, result: AgentToolResult): unknown {
    const safe = jsonSafe(result);
    const value = safe === undefined ? { content: [{ type: "text", text: textOf(result) }] } : safe;
    const size = Buffer.byteLength(JSON.stringify({ ...event, result: value }), "utf8");
    if (size <= MAX_EVENT_BYTES) return value;
    const details = (value as { details?: unknown } | null)?.details;
    const status = details && typeof details === "object" ? (details as { status?: unknown }).status : undefined;
    return {
      content: [{ type: "text", text: `${digest(value)} (result of ${size} bytes digested by the loopfuse plugin)` }],
      details: typeof status === "string" ? { status } : {},
    };
  }

  private publish(topic: string, event: WireEvent, onError?: () => void): void {
    if (this.stopped) {
      onError?.();
      return;
    }
    void this.start(); // lazily: the first event connects (a plugin load alone opens nothing)
    this.onEvent?.(topic, event);
    let value: string;
    try {
      value = JSON.stringify(event);
    } catch (err) {
      this.stats.publishErrors++;
      this.logger.error(`loopfuse: event not serialisable: ${String(err)}`);
      onError?.();
      return;
    }
    this.transport.send(topic, event.session_key, value).then(
      () => {
        this.stats.published++;
      },
      (err: unknown) => {
        this.stats.publishErrors++;
        if (!this.unavailable) this.logger.warn(`loopfuse: publish to ${topic} failed: ${String(err)}`);
        onError?.();
      },
    );
  }

  // -- bookkeeping -------------------------------------------------------------------

  private keepRecord(record: CallRecord): void {
    this.records.push(record);
    if (this.records.length > MAX_CALL_RECORDS) this.records.shift();
  }

  /** The call a result belongs to: by OpenClaw's toolCallId, else the session's oldest open call of that tool. */
  private takeRecord(event: ToolResultMiddlewareEvent, ctx: ToolResultMiddlewareContext): CallRecord | undefined {
    const session = ctx.sessionKey ? boundedId(ctx.sessionKey) : null;
    let index = -1;
    if (event.toolCallId) {
      index = this.records.findIndex(
        (r) => r.rawToolCallId === event.toolCallId && (!session || r.scope.sessionKey === session),
      );
      if (index < 0) index = this.records.findIndex((r) => r.rawToolCallId === event.toolCallId);
    }
    if (index < 0) {
      index = this.records.findIndex(
        (r) =>
          r.rawToolCallId === null && r.toolName === event.toolName && (!session || r.scope.sessionKey === session),
      );
    }
    if (index < 0) return undefined;
    const [record] = this.records.splice(index, 1);
    return record;
  }

  private remember(set: Set<string>, key: string): void {
    set.add(key);
    if (set.size > MAX_REMEMBERED) {
      const oldest = set.values().next().value;
      if (oldest !== undefined) set.delete(oldest);
    }
  }
}
