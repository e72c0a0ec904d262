/**
 * openclaw_detector.mjs - a baseline for loopfuse's benchmarks: OpenClaw's
 * in-process tool-loop detection algorithm (`tools.loopDetection`), in plain
 * JavaScript on V8, folding loopfuse's JSONL wire events (v1) one session at a time.
 *
 * This is NOT OpenClaw's code. It was written from the detection semantics in
 * ../shared/spec/loop-detection.md (and loopfuse's docs/wire-format.md where the wire format
 * needs reading), the way OpenClaw's in-process detector computes them:
 *
 *   - call signature = tool name + SHA-256 hex digest of a stable (sorted keys,
 *     no whitespace) JSON stringify of the args (spec 2);
 *   - result fingerprint = SHA-256 hex of the normalised result (spec 3), errors
 *     prefixed so they never equal a success;
 *   - per-session history of the last 30 records, trimmed oldest first (spec 4);
 *   - the counters of spec 5 and the decision table of spec 6 over the current
 *     run's records, with the default config: detection enabled, all detectors
 *     on, warning 10, critical 20, unknownTool 10, global breaker 30;
 *   - the post-compaction guard of spec 7 (window 3), one per run.
 *
 * Not modelled (the benchmark workload needs none of it): per-agent configs,
 * loopfuse.rules, loop events and their warning buckets, seq ordering and
 * duplicate detection (the input is taken to be in order), dead letters.
 *
 * Usage:
 *   node bench/openclaw_detector.mjs [--quiet] EVENTS.jsonl > verdicts.jsonl
 *
 * Output: one verdict JSON line per tool_call (`call_id`, `action`
 * allow|warn|block, `level`, `detector`, `count`, `message`, ...), plus an
 * `abort` verdict carrying the result's `call_id` when the post-compaction guard
 * trips. `--quiet` builds every verdict's JSON string but writes none.
 * The file is read into memory and split into lines first; only the fold
 * (JSON.parse + judge + JSON.stringify of every line) is timed. Last stderr line:
 *   openclaw_v8_events_per_s=<float> calls=<int>
 *
 * No npm dependencies: node: built-ins only (Node.js 20+).
 */

import { readFileSync, writeSync } from "node:fs";
import { createHash } from "node:crypto";

// -- configuration (spec 1 defaults, detection enabled) ------------------------------

const CONFIG = Object.freeze({
  enabled: true,
  historySize: 30,
  warningThreshold: 10,
  criticalThreshold: 20,
  unknownToolThreshold: 10,
  globalCircuitBreakerThreshold: 30,
  detectors: { genericRepeat: true, knownPollNoProgress: true, pingPong: true },
  guardWindow: 3,
});
const DETECTING = CONFIG.enabled === true;
const RECORDING = CONFIG.enabled !== false; // calls recorded, guard on, unless explicitly off

// -- fingerprints (spec 2) ---------------------------------------------------------------

/** Stable JSON: object keys sorted (UTF-16 code units, JS's default sort), no whitespace,
 * ECMAScript number and string formatting. */
function stableStringify(value) {
  if (value === null || typeof value !== "object") {
    const text = JSON.stringify(value);
    return text === undefined ? "null" : text;
  }
  if (Array.isArray(value)) {
    let out = "[";
    for (let i = 0; i < value.length; i++) {
      if (i) out += ",";
      out += stableStringify(value[i]);
    }
    return out + "]";
  }
  const keys = Object.keys(value).sort();
  let out = "{";
  let first = true;
  for (const key of keys) {
    const child = value[key];
    if (child === undefined) continue;
    if (!first) out += ",";
    first = false;
    out += JSON.stringify(key) + ":" + stableStringify(child);
  }
  return out + "}";
}

function sha256(text) {
  return createHash("sha256").update(text).digest("hex");
}

const ERROR_PREFIX = "error:";

// -- result normalisation (spec 3) ------------------------------------------------------

const UNKNOWN_TOOL_RE = /unknown tool[:\s]+["']?([a-z0-9_.-]+)["']?/i;
const TOOL_NOT_FOUND_RE = /tool\s+["']?([a-z0-9_.-]+)["']?\s+(?:not found|is not available)/i;
const SEND_ACTIONS = new Set([
  "send", "broadcast", "reply", "thread-reply", "sendWithEffect", "sendAttachment",
  "upload-file", "sticker", "poll",
]);
const SEND_TOOLS = new Set(); // configured provider send tools: none by default
const VOLATILE_SEND_KEYS = new Set([
  "messageId", "message_id", "messageIds", "platformMessageId", "platformMessageIds",
  "fileId", "file_id", "fileKey", "pollId", "poll_id", "receipt", "runId",
  "idempotencyKey", "ts", "timestamp", "sentAt", "deliveredAt", "createdAt",
]);

const isObject = (v) => v !== null && typeof v === "object" && !Array.isArray(v);
const strOrNull = (v) => (typeof v === "string" ? v : null);
const numOrNull = (v) => (typeof v === "number" ? v : null);

function unknownToolName(errorText) {
  const raw = errorText.trim();
  if (!raw) return null;
  const match = UNKNOWN_TOOL_RE.exec(raw) || TOOL_NOT_FOUND_RE.exec(raw);
  if (!match) return null;
  const name = match[1].trim().slice(0, 512);
  return name ? name.toLowerCase() : null;
}

function contentText(result) {
  const content = result.content;
  if (!Array.isArray(content)) return "";
  const texts = [];
  for (const entry of content) {
    if (isObject(entry) && typeof entry.type === "string" && typeof entry.text === "string") {
      texts.push(entry.text);
    }
  }
  return texts.join("\n").trim();
}

function execOutcome(details, text) {
  const status = details.status;
  if (typeof status !== "string") return null;
  if (status === "running") {
    return { status, tail: strOrNull(details.tail) || "" };
  }
  if (status === "completed" || status === "failed") {
    const aggregated = typeof details.aggregated === "string" ? details.aggregated.trim() : "";
    return {
      status,
      exitCode: numOrNull(details.exitCode),
      timedOut: details.timedOut === true,
      output: aggregated || text,
    };
  }
  if (status === "approval-pending" || status === "approval-unavailable") {
    return {
      status,
      reason: strOrNull(details.reason),
      host: strOrNull(details.host),
      command: strOrNull(details.command) || "",
      warningText: strOrNull(details.warningText) || "",
    };
  }
  return null;
}

const orNull = (v) => (v === undefined ? null : v);

function processOutcome(action, details, text) {
  if (action === "poll") {
    return {
      action, status: orNull(details.status), exitCode: orNull(details.exitCode),
      exitSignal: orNull(details.exitSignal), aggregated: orNull(details.aggregated), text,
    };
  }
  return {
    action, status: orNull(details.status), totalLines: orNull(details.totalLines),
    totalChars: orNull(details.totalChars), truncated: orNull(details.truncated),
    exitCode: orNull(details.exitCode), exitSignal: orNull(details.exitSignal), text,
  };
}

function isMessageObject(v) {
  return (
    typeof v.id === "string" && typeof v.text === "string" &&
    (typeof v.direction === "string" || typeof v.senderId === "string" ||
      typeof v.accountId === "string" || isObject(v.conversation))
  );
}

function stripVolatile(value) {
  if (Array.isArray(value)) return value.map(stripVolatile);
  if (!isObject(value)) return value;
  const dropId = isMessageObject(value);
  const out = {};
  for (const key of Object.keys(value)) {
    if (VOLATILE_SEND_KEYS.has(key) || (dropId && key === "id")) continue;
    out[key] = stripVolatile(value[key]);
  }
  return out;
}

/** The part of a successful result that decides "same outcome"; undefined = record nothing. */
function normalisedResult(tool, action, result) {
  if (!isObject(result)) return result === null || result === undefined ? undefined : result;
  const details = isObject(result.details) ? result.details : {};
  if (details.status === "blocked" && details.deniedReason === "tool-loop") return undefined;
  const text = contentText(result);
  if (tool === "exec") {
    const outcome = execOutcome(details, text);
    if (outcome !== null) return outcome;
  }
  if (tool === "process" && (action === "poll" || action === "log")) {
    return processOutcome(action, details, text);
  }
  if (tool === "sessions_send" || SEND_TOOLS.has(tool) ||
      (tool === "message" && SEND_ACTIONS.has(action))) {
    return stripVolatile(details);
  }
  return { details, text };
}

/** args.action when a string, else the gateway's args_action hint (hashed args). */
function actionOf(ev) {
  if (isObject(ev.args)) return typeof ev.args.action === "string" ? ev.args.action : null;
  return typeof ev.args_action === "string" ? ev.args_action : null;
}

function errorText(error) {
  if (error === undefined || error === null) return null;
  if (typeof error === "string") return error;
  if (isObject(error)) {
    return (typeof error.message === "string" && error.message) ||
      (typeof error.name === "string" ? error.name : "");
  }
  return String(error);
}

/** [result fingerprint or null (nothing recorded), unknown-tool name or null]. */
function resultFingerprint(ev) {
  const err = errorText(ev.error);
  let unknown = typeof ev.unknown_tool === "string" && ev.unknown_tool
    ? ev.unknown_tool.toLowerCase() : null;
  if (err !== null) {
    unknown = unknown || unknownToolName(err);
  }
  if (typeof ev.result_hash === "string") return [ev.result_hash, unknown];
  if (err !== null) return [ERROR_PREFIX + sha256(err), unknown];
  const outcome = normalisedResult(ev.tool_name, actionOf(ev), ev.result);
  if (outcome === undefined) return [null, unknown];
  return [sha256(stableStringify(outcome)), unknown];
}

function argsToken(ev) {
  if (typeof ev.args_hash === "string") return ev.args_hash;
  return sha256(stableStringify(ev.args === undefined ? null : ev.args));
}

const hasArgs = (ev) => ev.args !== undefined || typeof ev.args_hash === "string";

// -- sessions and history (spec 4) ------------------------------------------------------

/** Run ids compare trimmed; none (or blank) is "" here, which no trimmed id can be. */
function runScope(runId) {
  return typeof runId === "string" ? runId.trim() : "";
}

const sessions = new Map();

function sessionOf(key) {
  let s = sessions.get(key);
  if (s === undefined) {
    s = { key, history: [], guards: new Map() };
    sessions.set(key, s);
  }
  return s;
}

function appendRecord(history, record) {
  history.push(record);
  if (history.length > CONFIG.historySize) {
    history.splice(0, history.length - CONFIG.historySize);
  }
}

// -- counters (spec 5) and decision (spec 6) --------------------------------------------

const KNOWN_POLL_TOOLS = new Set(["command_status"]);

function isKnownPoll(tool, action) {
  return KNOWN_POLL_TOOLS.has(tool) ||
    (tool === "process" && (action === "poll" || action === "log"));
}

function unknownToolStreak(h, tool) {
  let streak = 0;
  let name = null;
  for (let i = h.length - 1; i >= 0; i--) {
    const rec = h[i];
    if (rec.tool !== tool || rec.unknown === null) break;
    if (name === null) name = rec.unknown;
    else if (rec.unknown !== name) break;
    streak++;
  }
  return [streak, name];
}

function noProgressStreak(h, sig) {
  let streak = 0;
  let latest = null;
  for (let i = h.length - 1; i >= 0; i--) {
    const rec = h[i];
    if (rec.sig !== sig || rec.result === null) continue; // skipped, not a break
    if (latest === null) latest = rec.result;
    else if (rec.result !== latest) break;
    streak++;
  }
  return streak;
}

/** [count, no-progress evidence] of the ping-pong detector for a call of signature sig. */
function pingPong(h, sig) {
  const n = h.length;
  if (n === 0) return [0, false];
  const lastSig = h[n - 1].sig;
  let otherSig = null;
  for (let i = n - 2; i >= 0; i--) {
    if (h[i].sig !== lastSig) {
      otherSig = h[i].sig;
      break;
    }
  }
  if (otherSig === null) return [0, false];
  let tail = 0;
  for (let i = n - 1; i >= 0; i--) {
    if (h[i].sig !== (tail % 2 === 0 ? lastSig : otherSig)) break;
    tail++;
  }
  if (tail < 2 || sig !== otherSig) return [0, false];
  let resultLast = null;
  let resultOther = null;
  let evidence = true;
  for (let i = n - tail; i < n; i++) {
    const rec = h[i];
    if (rec.result === null) { evidence = false; break; }
    if (rec.sig === lastSig) {
      if (resultLast === null) resultLast = rec.result;
      else if (rec.result !== resultLast) { evidence = false; break; }
    } else if (resultOther === null) {
      resultOther = rec.result;
    } else if (rec.result !== resultOther) {
      evidence = false;
      break;
    }
  }
  if (resultLast === null || resultOther === null) evidence = false;
  return [tail + 1, evidence];
}

const MESSAGES = {
  unknown_tool_repeat: (tool, n, u) =>
    `CRITICAL: attempted unavailable tool ${u || tool} ${n} times. Stop retrying that missing tool and answer without it.`,
  global_circuit_breaker: (tool, n) =>
    `CRITICAL: ${tool} has repeated identical no-progress outcomes ${n} times. Session execution blocked by global circuit breaker to prevent runaway loops.`,
  known_poll_critical: (tool, n) =>
    `CRITICAL: Called ${tool} with identical arguments and no progress ${n} times. This appears to be a stuck polling loop. Session execution blocked to prevent resource waste.`,
  known_poll_warning: (tool, n) =>
    `WARNING: You have called ${tool} ${n} times with identical arguments and no progress. Stop polling and either (1) increase wait time between checks, or (2) report the task as failed if the process is stuck.`,
  ping_pong_critical: (n) =>
    `CRITICAL: You are alternating between repeated tool-call patterns (${n} consecutive calls) with no progress. This appears to be a stuck ping-pong loop. Session execution blocked to prevent resource waste.`,
  ping_pong_warning: (n) =>
    `WARNING: You are alternating between repeated tool-call patterns (${n} consecutive calls). This looks like a ping-pong loop; stop retrying and report the task as failed.`,
  generic_critical: (tool, n) =>
    `CRITICAL: Called ${tool} with identical arguments and identical outcomes ${n} times. Session execution blocked to prevent runaway loops.`,
  generic_warning: (tool, n) =>
    `WARNING: You have called ${tool} ${n} times with identical arguments. If this is not making progress, stop retrying and report the task as failed.`,
};

function detection(level, detector, count, message) {
  return { level, detector, count, message };
}

/** The decision table of spec 6 over the run's records h (before the call is recorded). */
function detect(h, tool, sig, knownPoll) {
  if (h.length === 0) return null;
  const c = CONFIG;
  const [unknownCount, unknownName] = unknownToolStreak(h, tool);
  if (unknownCount >= c.unknownToolThreshold) {
    return detection("critical", "unknown_tool_repeat", unknownCount,
      MESSAGES.unknown_tool_repeat(tool, unknownCount, unknownName));
  }
  let recent = 0;
  for (let i = 0; i < h.length; i++) if (h[i].sig === sig) recent++;
  const streak = recent ? noProgressStreak(h, sig) : 0;
  if (streak >= c.globalCircuitBreakerThreshold) {
    return detection("critical", "global_circuit_breaker", streak,
      MESSAGES.global_circuit_breaker(tool, streak));
  }
  if (knownPoll && c.detectors.knownPollNoProgress) {
    if (streak >= c.criticalThreshold) {
      return detection("critical", "known_poll_no_progress", streak,
        MESSAGES.known_poll_critical(tool, streak));
    }
    if (streak >= c.warningThreshold) {
      return detection("warning", "known_poll_no_progress", streak,
        MESSAGES.known_poll_warning(tool, streak));
    }
  }
  if (c.detectors.pingPong) {
    const [count, evidence] = pingPong(h, sig);
    if (count >= c.criticalThreshold && evidence) {
      return detection("critical", "ping_pong", count, MESSAGES.ping_pong_critical(count));
    }
    if (count >= c.warningThreshold) {
      return detection("warning", "ping_pong", count, MESSAGES.ping_pong_warning(count));
    }
  }
  if (!knownPoll && c.detectors.genericRepeat) {
    if (streak >= c.criticalThreshold) {
      return detection("critical", "generic_repeat", streak, MESSAGES.generic_critical(tool, streak));
    }
    if (recent >= c.warningThreshold) {
      return detection("warning", "generic_repeat", recent, MESSAGES.generic_warning(tool, recent));
    }
  }
  return null;
}

/** The records detection may see: those of the current run. */
function runHistory(history, run) {
  for (let i = 0; i < history.length; i++) {
    if (history[i].run !== run) return history.filter((rec) => rec.run === run);
  }
  return history;
}

function verdict(s, ev, action, level, detector, count, message, token) {
  return JSON.stringify({
    type: "verdict",
    session_key: s.key,
    run_id: ev.run_id ?? null,
    agent_id: ev.agent_id ?? null,
    call_id: ev.call_id ?? null,
    seq: ev.seq ?? null,
    tool_name: ev.tool_name ?? null,
    action,
    level,
    detector,
    count,
    message,
    args_hash: token,
  });
}

// -- event handlers ----------------------------------------------------------------------

function onToolCall(s, ev) {
  const tool = ev.tool_name;
  const run = runScope(ev.run_id);
  const token = argsToken(ev);
  const sig = tool + "\u0000" + token;
  let d = null;
  if (DETECTING) {
    const h = runHistory(s.history, run);
    d = detect(h, tool, sig, isKnownPoll(tool, actionOf(ev)));
  }
  const critical = d !== null && d.level === "critical";
  if (RECORDING && !critical) {
    // a critical call is not recorded: the block stays in force until the args change
    appendRecord(s.history, {
      tool, sig, run, call: ev.call_id ?? null, result: null, unknown: null, ts: ev.ts,
    });
  }
  if (d === null) return verdict(s, ev, "allow", "none", null, 0, null, token);
  return verdict(s, ev, critical ? "block" : "warn", d.level, d.detector, d.count, d.message, token);
}

function guardMessage(tool, n, window) {
  return `CRITICAL: tool ${tool} repeated ${n} times with identical arguments and identical results within ${window} attempts after auto-compaction. The compaction did not break the loop. Aborting to prevent runaway resource use.`;
}

function onToolResult(s, ev) {
  if (!RECORDING) return null;
  const [result, unknown] = resultFingerprint(ev);
  if (result === null) return null; // no result, or the loop detector's own block
  const tool = ev.tool_name;
  const run = runScope(ev.run_id);
  const callId = typeof ev.call_id === "string" && ev.call_id ? ev.call_id : null;
  let token = null;
  let sig = null;
  if (hasArgs(ev)) {
    token = argsToken(ev);
    sig = tool + "\u0000" + token;
  }
  const history = s.history;
  let matched = null;
  for (let i = history.length - 1; i >= 0; i--) {
    const rec = history[i];
    if (rec.run === run && rec.result === null && rec.tool === tool &&
        (callId === null || rec.call === callId) && (sig === null || rec.sig === sig)) {
      matched = rec;
      break;
    }
  }
  if (matched !== null) {
    matched.result = result;
    matched.unknown = unknown;
    sig = matched.sig;
  } else if (sig === null) {
    return null; // orphan: a result without args for a call not in the history
  } else {
    appendRecord(history, { tool, sig, run, call: null, result, unknown, ts: ev.ts });
  }

  // post-compaction guard (spec 7)
  const guard = s.guards.get(run);
  if (guard === undefined) return null;
  guard.remaining -= 1;
  const triple = tool + "\u0001" + sig + "\u0001" + result;
  guard.seen.push(triple);
  let occurrences = 0;
  for (const t of guard.seen) if (t === triple) occurrences++;
  if (occurrences >= guard.window) {
    s.guards.delete(run);
    return verdict(s, ev, "abort", "critical", "compaction_loop_persisted", occurrences,
      guardMessage(tool, occurrences, guard.window), token);
  }
  if (guard.remaining <= 0) s.guards.delete(run);
  return null;
}

function onCompaction(s, ev) {
  if (!RECORDING) return; // the guard is on unless loop detection is explicitly disabled
  const window = CONFIG.guardWindow;
  s.guards.set(runScope(ev.run_id), { window, remaining: window, seen: [] });
}

function onRunEnded(s, ev) {
  s.guards.delete(runScope(ev.run_id));
}

/** One wire line in, its verdict JSON string (or null) out. */
function judge(line) {
  let ev;
  try {
    ev = JSON.parse(line);
  } catch {
    return null;
  }
  if (!isObject(ev)) return null;
  const key = ev.session_key || ev.run_id || "";
  switch (ev.type) {
    case "tool_call":
      calls++;
      return onToolCall(sessionOf(key), ev);
    case "tool_result":
      return onToolResult(sessionOf(key), ev);
    case "compaction":
      onCompaction(sessionOf(key), ev);
      return null;
    case "run_ended":
      onRunEnded(sessionOf(key), ev);
      return null;
    default:
      return null;
  }
}

// -- main ------------------------------------------------------------------------------

let calls = 0;

function main(argv) {
  const quiet = argv.includes("--quiet");
  const files = argv.filter((a) => !a.startsWith("--"));
  if (files.length !== 1) {
    process.stderr.write("usage: node bench/openclaw_detector.mjs [--quiet] EVENTS.jsonl\n");
    process.exit(2);
  }
  const lines = readFileSync(files[0], "utf8").split("\n");
  let events = 0;
  let bytes = 0;
  const out = quiet ? null : [];
  const started = process.hrtime.bigint();
  for (const line of lines) {
    if (!line.trim()) continue;
    events++;
    const v = judge(line);
    if (v !== null) {
      bytes += v.length; // every verdict string is used, even in quiet mode
      if (out !== null) out.push(v);
    }
  }
  const seconds = Number(process.hrtime.bigint() - started) / 1e9;
  if (out !== null && out.length) {
    const chunk = 4096;
    for (let i = 0; i < out.length; i += chunk) {
      writeSync(1, out.slice(i, i + chunk).join("\n") + "\n");
    }
  }
  process.stderr.write(
    `events=${events} verdict_bytes=${bytes} seconds=${seconds.toFixed(3)}\n` +
    `openclaw_v8_events_per_s=${(events / seconds).toFixed(1)} calls=${calls}\n`,
  );
}

main(process.argv.slice(2));
