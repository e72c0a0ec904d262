/**
 * verdict_signing.mjs - what verifying verdict signatures costs the OpenClaw plugin per
 * verdict (docs/benchmarks.md: Verdict signatures); the Python side: bench/verdict_signing.py.
 *
 * The plugin's own code (integrations/openclaw/dist/src/signature.js: build it first with
 * `npm run build` there). Per verdict record of this gateway, as the transport and the
 * guard handle it: the key compared, then (with a key) the signature checked, then the
 * value decoded and parsed. Medians over --rounds; the unsigned path in the same run.
 *
 * Usage:
 *   node bench/verdict_signing.mjs [--verdicts 20000] [--rounds 7]
 */
import { randomUUID } from "node:crypto";
import { fileURLToPath } from "node:url";
import { dirname, resolve } from "node:path";

const root = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const { parseVerdictKeys, signVerdict, VerdictVerifier, SIGNATURE_HEADER } = await import(
  resolve(root, "integrations/openclaw/dist/src/signature.js")
);

const arg = (name, fallback) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? Number(process.argv[i + 1]) : fallback;
};
const n = arg("verdicts", 20_000);
const rounds = arg("rounds", 7);

const [key] = parseVerdictKeys(`k1:${Buffer.from(Array.from({ length: 32 }, (_, i) => i)).toString("base64")}`);
const incarnation = randomUUID();
const mine = Buffer.from(incarnation);
const name = Buffer.from(SIGNATURE_HEADER);
const records = Array.from({ length: n }, (_, i) => {
  const value = Buffer.from(JSON.stringify({
    type: "verdict", verdict_id: `v${i}`, session_key: `s${i % 100}`, run_id: "run-1", agent_id: "main",
    call_id: `call-${i}`, seq: i, incarnation, tool_name: "read", action: "allow", level: "none",
    detector: null, count: 0, message: null, args_hash: "3f2a9c1e5b7d4f60", event_ts: 1, decided_ts: 2,
  }));
  return { key: mine, value, headers: [[name, signVerdict(key, mine, value)]] };
});
const verifier = new VerdictVerifier([key]);

function read(check) {
  let matched = 0;
  const started = process.hrtime.bigint();
  for (const record of records) {
    if (!(record.key && mine.equals(record.key))) continue;
    if (check && verifier.check(record.key, record.value, record.headers) !== "ok") continue;
    const verdict = JSON.parse(record.value.toString("utf8"));
    if (verdict.incarnation === incarnation) matched++;
  }
  if (matched !== n) throw new Error(`matched ${matched} of ${n}`);
  return Number(process.hrtime.bigint() - started) / 1000 / n;
}

function signing() {
  const started = process.hrtime.bigint();
  for (const record of records) signVerdict(key, record.key, record.value);
  return Number(process.hrtime.bigint() - started) / 1000 / n;
}

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
read(false), read(true), signing(); // warm up (JIT)
const plain = [], keyed = [], signed = [];
for (let r = 0; r < rounds; r++) {
  plain.push(read(false));
  keyed.push(read(true));
  signed.push(signing());
}
const p = median(plain), k = median(keyed);
console.log(`plugin: reading without a key ${p.toFixed(2)} µs/verdict; with a key ${k.toFixed(2)} µs/verdict ` +
  `(+${(k - p).toFixed(2)} µs, +${(((k - p) / p) * 100).toFixed(1)}%); signing alone ${median(signed).toFixed(2)} µs`);
console.log(`(${n} verdicts, median of ${rounds} rounds, Node ${process.version})`);
