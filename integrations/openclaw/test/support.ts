/** Test doubles: an OpenClaw-like `api` that records registrations, an in-memory transport, the wire schema. */
import { readFileSync } from "node:fs";
import { dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import Ajv2020Module from "ajv/dist/2020.js";
import type { Transport } from "../src/transport.js";
import type { PluginApi, PluginLogger, ToolResultMiddleware } from "../src/types.js";
import type { Verdict, WireEvent } from "../src/guard.js";

/** integrations/openclaw (tests run from dist/test). */
export const PACKAGE_ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "../..");
export const REPO_ROOT = resolve(PACKAGE_ROOT, "../..");

type AjvCtor = new (opts: Record<string, unknown>) => {
  addKeyword: (k: string) => void;
  compile: (schema: unknown) => ((data: unknown) => boolean) & { errors?: unknown };
};

/** A validator of loopfuse's input-event JSON Schema (schemas/input-event.schema.json). */
export function inputEventValidator(): (event: unknown) => string | null {
  const Ajv2020 = ((Ajv2020Module as unknown as { default?: AjvCtor }).default ?? Ajv2020Module) as unknown as AjvCtor;
  const ajv = new Ajv2020({ allErrors: true, strict: true });
  ajv.addKeyword("discriminator"); // OpenAPI annotation pydantic emits; oneOf does the work
  const schema = JSON.parse(readFileSync(resolve(REPO_ROOT, "schemas/input-event.schema.json"), "utf8"));
  const validate = ajv.compile(schema);
  return (event) => (validate(event) ? null : JSON.stringify(validate.errors));
}

export interface Registration {
  hookName: string;
  handler: (event: unknown, ctx: unknown) => unknown;
  opts?: { priority?: number; timeoutMs?: number };
}

export class FakeApi implements PluginApi {
  readonly hooks: Registration[] = [];
  readonly middlewares: { handler: ToolResultMiddleware; options?: { runtimes?: string[] } }[] = [];
  readonly logs: { level: string; message: string }[] = [];
  readonly logger: PluginLogger = {
    info: (message) => this.logs.push({ level: "info", message }),
    warn: (message) => this.logs.push({ level: "warn", message }),
    error: (message) => this.logs.push({ level: "error", message }),
  };
  id = "loopfuse";

  constructor(public pluginConfig?: Record<string, unknown>) {}

  on = (hookName: string, handler: Registration["handler"], opts?: { priority?: number; timeoutMs?: number }) => {
    this.hooks.push({ hookName, handler, opts });
  };

  registerAgentToolResultMiddleware = (handler: ToolResultMiddleware, options?: { runtimes?: string[] }) => {
    this.middlewares.push({ handler, options });
  };

  /** Run a hook as OpenClaw does: every handler for the name, in priority order. */
  async emit(hookName: string, event: unknown, ctx: unknown): Promise<unknown> {
    const handlers = this.hooks
      .filter((h) => h.hookName === hookName)
      .sort((a, b) => (b.opts?.priority ?? 0) - (a.opts?.priority ?? 0));
    let last: unknown;
    for (const h of handlers) last = await h.handler(event, ctx);
    return last;
  }

  /** Run the tool-result middleware chain; returns the result the agent sees. */
  async runMiddleware(
    event: { toolCallId: string; toolName: string; args: Record<string, unknown>; isError?: boolean; result: unknown },
    ctx: unknown,
  ): Promise<unknown> {
    let current = event.result;
    for (const m of this.middlewares) {
      const next = await m.handler({ ...event, result: current } as never, ctx as never);
      if (next && typeof next === "object" && "result" in next) current = next.result;
    }
    return current;
  }
}

export interface Sent {
  topic: string;
  key: string;
  event: WireEvent;
}

/**
 * In-memory transport: records what is sent; `judge` answers tool calls (a verdict,
 * or null for silence), delivered asynchronously as Kafka would.
 */
export class FakeTransport implements Transport {
  readonly sent: Sent[] = [];
  deliver: ((raw: string) => void) | null = null;
  judge: (event: WireEvent) => Partial<Verdict> | null = () => ({ action: "allow" });
  failSends = false;
  stopped = false;

  async start(onVerdict: (raw: string) => void): Promise<void> {
    this.deliver = onVerdict;
  }

  async send(topic: string, key: string, value: string): Promise<void> {
    if (this.failSends) throw new Error("broker unreachable");
    const event = JSON.parse(value) as WireEvent;
    this.sent.push({ topic, key, event });
    if (event.type === "tool_call") {
      const answer = this.judge(event);
      if (answer) setImmediate(() => this.push(verdictFor(event, answer)));
    }
  }

  push(verdict: Partial<Verdict>): void {
    this.deliver?.(JSON.stringify(verdict));
  }

  async stop(): Promise<void> {
    this.stopped = true;
  }
}

/** A verdict as loopfuse's worker writes it for `event`, with `fields` over it. */
export function verdictFor(event: WireEvent, fields: Partial<Verdict>): Verdict {
  const action = fields.action ?? "allow";
  return {
    type: "verdict",
    verdict_id: `v-${event.session_key}-${String(event.call_id)}-${action}`,
    session_key: event.session_key,
    run_id: event.run_id,
    agent_id: event.agent_id,
    call_id: event.call_id as string,
    seq: event.seq,
    tool_name: event.tool_name as string,
    action,
    level: action === "allow" ? "none" : action === "warn" ? "warning" : "critical",
    detector: action === "allow" ? null : "generic_repeat",
    count: action === "allow" ? 0 : 10,
    message: action === "allow" ? null : `loopfuse says ${action}`,
    args_hash: "h",
    event_ts: event.ts,
    decided_ts: event.ts,
    ...fields,
  };
}

/** OpenClaw's hook context for a tool call. */
export function toolCtx(sessionKey: string, runId: string, toolCallId?: string, extra: Record<string, unknown> = {}) {
  return { agentId: "main", sessionKey, sessionId: `sid-${sessionKey}`, runId, toolName: "exec", toolCallId, ...extra };
}

export const tick = () => new Promise((r) => setImmediate(r));
