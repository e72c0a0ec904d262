/**
 * loopfuse for OpenClaw: every tool call is published to loopfuse and waits (bounded)
 * for its verdict; results, compactions and run ends are published so loopfuse sees
 * whole sessions.
 *
 * Hooks: `before_tool_call` (publish the call, wait, veto), the agent tool-result
 * middleware (publish the structured result, append warnings), `after_compaction`,
 * `agent_end`, `gateway_stop`.
 */
import { randomUUID } from "node:crypto";
import { CONFIG_SCHEMA, resolveConfig, type LoopfuseConfig } from "./config.js";
import { LoopfuseGuard, type GuardOptions } from "./guard.js";
import { KafkaTransport, type Transport } from "./transport.js";
import type {
  AfterCompactionEvent,
  AgentEndEvent,
  AgentHookContext,
  BeforeToolCallEvent,
  PluginApi,
  PluginEntry,
  PluginLogger,
  ToolHookContext,
} from "./types.js";

export { CONFIG_SCHEMA, resolveConfig } from "./config.js";
export type { LoopfuseConfig } from "./config.js";
export { LoopfuseGuard, blockedToolResult, appendWarning, TIMEOUT_MESSAGE } from "./guard.js";
export type { GuardStats, Verdict, WireEvent } from "./guard.js";
export { KafkaTransport } from "./transport.js";
export type { ReadCounts, Transport } from "./transport.js";
export { parseVerdictKeys, signVerdict, VerdictVerifier, SIGNATURE_HEADER } from "./signature.js";
export type { VerdictKey, SignatureCheck } from "./signature.js";
export { boundedId, MAX_ID_BYTES } from "./ids.js";
export type * from "./types.js";

export const PLUGIN_ID = "loopfuse";

/** The runtimes whose tool results the middleware sees (as the manifest's contract). */
export const RESULT_MIDDLEWARE_RUNTIMES = ["openclaw", "codex"];

interface EntryOptions {
  id: string;
  name: string;
  description: string;
  configSchema: Record<string, unknown>;
  register: (api: PluginApi) => void;
}

/**
 * The entry shape OpenClaw loads (what the SDK's `definePluginEntry` from
 * `openclaw/plugin-sdk/plugin-entry` produces): id, name, description, a config
 * schema and `register(api)`. Defined here so the plugin has no runtime dependency
 * on the `openclaw` package.
 */
export function definePluginEntry(options: EntryOptions): PluginEntry {
  const { configSchema, ...rest } = options;
  return {
    ...rest,
    get configSchema() {
      return configSchema;
    },
  };
}

export interface PluginHooksForTests {
  /** Build the transport (default: KafkaTransport, @platformatic/kafka). */
  transport?: (config: LoopfuseConfig, incarnation: string, logger: PluginLogger) => Transport;
  incarnation?: string;
  onEvent?: GuardOptions["onEvent"];
  onVerdict?: GuardOptions["onVerdict"];
  /** Receives the guard once registered. */
  onGuard?: (guard: LoopfuseGuard) => void;
}

const consoleLogger: PluginLogger = {
  info: (m) => console.info(m),
  warn: (m) => console.warn(m),
  error: (m) => console.error(m),
};

const SHARED_GUARDS = Symbol.for("loopfuse.openclaw.guards");

function sharedGuard(key: string, make: () => LoopfuseGuard): LoopfuseGuard {
  const registry = globalThis as typeof globalThis & { [SHARED_GUARDS]?: Map<string, LoopfuseGuard> };
  const guards = (registry[SHARED_GUARDS] ??= new Map());
  const existing = guards.get(key);
  if (existing && !existing.stopped) return existing;
  const guard = make();
  guards.set(key, guard);
  return guard;
}

/** The plugin; `hooks` lets tests substitute the transport and observe events. */
export function createLoopfusePlugin(hooks: PluginHooksForTests = {}): PluginEntry {
  return definePluginEntry({
    id: PLUGIN_ID,
    name: "loopfuse",
    description: "Fleet-wide tool-call loop detection: loopfuse judges every tool call before it runs.",
    configSchema: CONFIG_SCHEMA as unknown as Record<string, unknown>,
    register(api: PluginApi) {
      // Hooks in every registration mode: OpenClaw 2026.9.6 registers the plugin once
      // "full" at start-up and again in "discovery" loads, and an agent run may take its
      // hooks from a discovery registration. Registering opens nothing: the guard (one
      // per config per process) connects to Kafka on its first hook call, so a discovery
      // or CLI-metadata load that never runs a hook opens no network client.
      const logger = api.logger ?? consoleLogger;
      const problems: string[] = [];
      const config = resolveConfig(api.pluginConfig, problems);
      const full = !api.registrationMode || api.registrationMode === "full";
      // A malformed verdictKey has no default to fall back to: it says what happens instead.
      if (full)
        for (const problem of problems)
          logger.warn(`loopfuse config: ${problem}${problem.startsWith("verdictKey:") ? "" : " (default used)"}`);
      const make = () => {
        const incarnation = hooks.incarnation ?? randomUUID();
        const transport = (hooks.transport ?? ((c, i, l) => new KafkaTransport(c, i, l)))(config, incarnation, logger);
        const made = new LoopfuseGuard({
          config,
          transport,
          logger,
          incarnation,
          onEvent: hooks.onEvent,
          onVerdict: hooks.onVerdict,
        });
        return made;
      };
      // OpenClaw registers a plugin more than once in a process (discovery loads, a
      // runtime registry loaded for the result middleware, a reload): one guard per config
      // per process, so calls and their results meet in one place and one incarnation
      // counts seq. Taken at this registration's first hook call (or made then); a
      // registration after gateway_stop (a reload) gets a new one.
      let own: LoopfuseGuard | undefined;
      const guard = (): LoopfuseGuard => {
        if (!own) {
          own = hooks.transport ? make() : sharedGuard(JSON.stringify(config), make);
          hooks.onGuard?.(own);
        }
        return own;
      };
      if (hooks.onGuard) guard(); // tests observe the guard before the first hook

      // Lowest priority: calls another policy blocks never reach loopfuse (they did not run).
      api.on(
        "before_tool_call",
        (event: BeforeToolCallEvent, ctx: ToolHookContext) => guard().beforeToolCall(event, ctx),
        { priority: -100 },
      );
      let middleware = false;
      if (typeof api.registerAgentToolResultMiddleware === "function") {
        try {
          api.registerAgentToolResultMiddleware((event, ctx) => guard().onToolResult(event, ctx), {
            runtimes: RESULT_MIDDLEWARE_RUNTIMES,
          });
          middleware = true;
        } catch (err) {
          logger.error(`loopfuse: registerAgentToolResultMiddleware refused: ${String(err)}`);
        }
      }
      if (!middleware && full) {
        logger.error(
          "loopfuse: no tool-result middleware (enable the plugin explicitly; the manifest declares " +
            "contracts.agentToolResultMiddleware): tool results are not published and warnings not shown",
        );
      }
      api.on("after_compaction", (event: AfterCompactionEvent, ctx: AgentHookContext) =>
        guard().onCompaction(event, ctx),
      );
      api.on("agent_end", (event: AgentEndEvent, ctx: AgentHookContext) => guard().onAgentEnd(event, ctx));
      api.on("gateway_stop", () => guard().stop());
    },
  });
}

export default createLoopfusePlugin();
