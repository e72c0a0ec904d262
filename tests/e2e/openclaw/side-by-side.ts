/**
 * The same scripted loop (the model calls `read notes.txt` 40 times, then answers
 * "done") through OpenClaw 2026.9.6 twice: with its own loop detection on
 * (`tools.loopDetection.enabled: true`; its thresholds are fixed at 10/20/30), and with
 * its detection off and the loopfuse plugin, the worker at warning 10, critical 20,
 * global 30. Prints the call-by-call table (what the model received after call n) and
 * each run's end as Markdown.
 *
 *   node --no-warnings=ExperimentalWarning side-by-side.ts     (needs ../../../.venv or $LOOPFUSE_BIN)
 */
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { OpenClawHome, read, startLoopfuse, stopAll, WORK, type AgentRun } from "./harness.ts";

const CALLS = 40;
const loop = Array.from({ length: CALLS }, () => read("notes.txt"));

async function main(): Promise<void> {
  const loopfuse = await startLoopfuse("side", { tools: { loopDetection: { enabled: true, warningThreshold: 10, criticalThreshold: 20, globalCircuitBreakerThreshold: 30 } } });
  const native = new OpenClawHome("native");
  native.set((c) => (c.tools.loopDetection = { enabled: true }));
  const withPlugin = new OpenClawHome("plugin");
  await withPlugin.installPlugin({ bootstrap: loopfuse.bootstrap, topics: loopfuse.topics, timeoutMs: 10_000 });
  for (const home of [native, withPlugin]) writeFileSync(join(home.workspace, "notes.txt"), "hello notes\n");
  const runs: [string, AgentRun][] = [
    ["OpenClaw 2026.9.6, own detection", await native.run(loop)],
    ["loopfuse plugin, 10/20/30", await withPlugin.run(loop)],
  ];
  const cell = (run: AgentRun, n: number): string => {
    if (n > run.turns) return "(no call: the run had ended)";
    if (n === run.turns) return run.turns > run.received.length && n <= CALLS ? "(made; its result never reached the model: the run ended)" : "";
    const seen = run.received[n - 1]!.replace(/\n+/g, " ⏎ ").trim();
    return seen === "hello notes" ? "ran: `hello notes`" : /^CRITICAL|^loopfuse/.test(seen) ? `not run: \`${seen}\`` : `ran: \`${seen}\``;
  };
  const lines = [`| call | ${runs.map(([name]) => name).join(" | ")} |`, `|---|${runs.map(() => "---").join("|")}|`];
  const rows: { from: number; to: number; row: string }[] = [];
  for (let n = 1; n <= CALLS; n++) {
    const row = runs.map(([, run]) => cell(run, n)).join(" | ");
    const last = rows.at(-1);
    if (last && last.row === row) last.to = n; // equal rows in a row are one line: "11-19"
    else rows.push({ from: n, to: n, row });
  }
  for (const { from, to, row } of rows) lines.push(`| ${from === to ? from : `${from}-${to}`} | ${row} |`);
  lines.push("", ...runs.map(([name, run]) =>
    `- ${name}: ${run.turns} model turns, exit ${run.exitCode}, answer ${JSON.stringify(run.answer.payloads?.map((p) => p.text) ?? [])}` +
    `${(run.answer.meta as { error?: { message?: string } } | undefined)?.error?.message ? `, error: ${(run.answer.meta as { error: { message: string } }).error.message}` : ""}, ${run.wallMs} ms`));
  const table = lines.join("\n");
  writeFileSync(join(WORK, "side-by-side.md"), table + "\n");
  console.log(table);
}

try {
  await main();
} finally {
  await stopAll();
}
