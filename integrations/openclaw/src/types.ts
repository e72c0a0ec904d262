/**
 * The parts of OpenClaw's plugin API this plugin uses, described structurally.
 *
 * Written from OpenClaw's documented hook contracts (src/plugins/hook-types.ts,
 * agent-tool-result-middleware-types.ts, docs/plugins/hooks/*) so the plugin builds
 * without the `openclaw` package; only the fields loopfuse reads are listed, and every
 * field OpenClaw marks optional is optional here too.
 */

/** `before_tool_call` event. */
export interface BeforeToolCallEvent {
  toolName: string;
  params: Record<string, unknown>;
  runId?: string;
  toolCallId?: string;
}

/** Context of the tool hooks (`before_tool_call`, `after_tool_call`). */
export interface ToolHookContext {
  agentId?: string;
  sessionKey?: string;
  sessionId?: string;
  runId?: string;
  toolName?: string;
  toolCallId?: string;
}

/** What `before_tool_call` may return; `block: true` is terminal. */
export interface BeforeToolCallResult {
  block?: boolean;
  blockReason?: string;
}

/** Context of the agent hooks (`agent_end`, `after_compaction`, ...). */
export interface AgentHookContext {
  runId?: string;
  agentId?: string;
  sessionKey?: string;
  sessionId?: string;
}

export interface AgentEndEvent {
  runId?: string;
  success?: boolean;
  error?: string;
}

export interface AfterCompactionEvent {
  messageCount?: number;
  compactedCount?: number;
  tokenCount?: number;
}

/** A tool result as agents see it: content blocks plus structured details. */
export interface AgentToolResult {
  content?: unknown;
  details?: unknown;
  [key: string]: unknown;
}

/** Event of `api.registerAgentToolResultMiddleware` handlers. */
export interface ToolResultMiddlewareEvent {
  toolCallId: string;
  toolName: string;
  args: Record<string, unknown>;
  isError?: boolean;
  result: AgentToolResult;
}

/** Context of result middleware; in practice often without session or run. */
export interface ToolResultMiddlewareContext {
  runtime?: string;
  agentId?: string;
  sessionId?: string;
  sessionKey?: string;
  runId?: string;
}

export type ToolResultMiddleware = (
  event: ToolResultMiddlewareEvent,
  ctx: ToolResultMiddlewareContext,
) => Promise<{ result: AgentToolResult } | void> | { result: AgentToolResult } | void;

export interface PluginLogger {
  debug?: (message: string) => void;
  info: (message: string) => void;
  warn: (message: string) => void;
  error: (message: string) => void;
}

// eslint-disable-next-line @typescript-eslint/no-explicit-any -- hook handlers are typed per hook name by the host
type Handler = (event: any, ctx: any) => unknown;

/** The registration surface OpenClaw hands to `register(api)`. */
export interface PluginApi {
  id?: string;
  /** "full" for the live gateway; discovery/setup/CLI-metadata loads use other modes. */
  registrationMode?: string;
  pluginConfig?: Record<string, unknown>;
  logger?: PluginLogger;
  on: (hookName: string, handler: Handler, opts?: { priority?: number; timeoutMs?: number }) => unknown;
  registerAgentToolResultMiddleware?: (handler: ToolResultMiddleware, options?: { runtimes?: string[] }) => unknown;
}

/** The object OpenClaw loads from a plugin entry module. */
export interface PluginEntry {
  id: string;
  name: string;
  description: string;
  readonly configSchema: Record<string, unknown>;
  register: (api: PluginApi) => void;
}
