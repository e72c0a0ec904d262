/**
 * End to end over SASL_SSL: the plugin as the least-privileged `gateway` user of
 * `loopfuse broker --kafka --secure` (TLS from a CA made at start, SCRAM-SHA-512, ACLs
 * letting it write the input topics and read its reply topic only) and `loopfuse worker`
 * as the `worker` user, on loopfuse's default topics (the ones the ACLs name). One
 * secured broker for the file. A refused password or an untrusted certificate is one
 * log line naming the setting, and the calls fall to the fail policy.
 */
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { after, before, describe, it } from "node:test";
import { readTlsFiles, resolveConfig } from "../src/config.js";
import { TIMEOUT_MESSAGE } from "../src/index.js";
import { connectionOptions } from "../src/transport.js";
import { Agent, gateway, type Gateway } from "./agent.js";
import { Processes, SECURE_BROKER_UNAVAILABLE, startBroker, startWorker, waitFor } from "./loopfuse-processes.js";
import { REPO_ROOT } from "./support.js";

const BIN = process.env.LOOPFUSE_BIN ?? resolve(REPO_ROOT, ".venv/bin");
const DETECTION = { tools: { loopDetection: { enabled: true, warningThreshold: 3, criticalThreshold: 5 } } };
const work = mkdtempSync(join(tmpdir(), "loopfuse-openclaw-secure-"));
const processes = new Processes(work);

/** A CA of our own (not the broker's), made with openssl: its certificate and key files. */
function otherCa(name: string): { cert: string; key: string } {
  const cert = join(work, `${name}.pem`);
  const key = join(work, `${name}.key`);
  execFileSync(
    "openssl",
    [
      "req",
      "-x509",
      "-newkey",
      "rsa:2048",
      "-nodes",
      "-keyout",
      key,
      "-out",
      cert,
      "-days",
      "1",
      "-subj",
      `/CN=${name}`,
    ],
    { stdio: "ignore" },
  );
  return { cert, key };
}

/** Every line the plugin logged at warn or error. */
const complaints = (gw: Gateway) => gw.api.logs.filter((l) => l.level !== "info").map((l) => l.message);

describe(
  "end to end over SASL_SSL, as the gateway user",
  { timeout: 300_000, skip: SECURE_BROKER_UNAVAILABLE ?? false },
  () => {
    let secured: (overrides?: Record<string, unknown>) => Record<string, unknown>;
    let password: string;

    before(async () => {
      const { bootstrap, security } = await startBroker(processes, BIN, "secure", { secure: true });
      await startWorker(processes, BIN, {
        name: "secure",
        bootstrap,
        detection: DETECTION,
        env: security!.env("worker"),
      });
      const user = security!.env("gateway");
      password = user.LOOPFUSE_SASL_PASSWORD!;
      secured = (overrides = {}) => ({
        bootstrap,
        clientId: `secure-${process.pid}`,
        ssl: { caFile: user.LOOPFUSE_SSL_CAFILE },
        sasl: { mechanism: "scram-sha-512", username: user.LOOPFUSE_SASL_USERNAME, password },
        topics: { replies: user.LOOPFUSE_REPLY_TOPICS },
        ...overrides,
      });
    });

    after(() => processes.stopAll());

    it("a looping session is warned, then blocked, over TLS with the broker's CA and SCRAM-SHA-512", async () => {
      const gw = await gateway(secured({ timeoutMs: 10_000 }));
      const agent = new Agent(gw, "agent:main:secure-loop", "run-secure-1");
      const calls = [];
      for (let i = 0; i < 6; i++) calls.push(await agent.call("exec", { command: "make" }, "still broken"));
      console.log(`#   ${agent.transcript.join("\n#   ")}`);
      assert.deepEqual(
        calls.map((c) => c.verdict?.action),
        ["allow", "allow", "allow", "warn", "warn", "block"],
      );
      assert.ok(calls[3]!.seen.startsWith("still broken | WARNING: You have called exec 3 times"), calls[3]!.seen);
      assert.equal(calls[5]!.seen, `BLOCKED: ${calls[5]!.verdict?.message}`);
      assert.deepEqual(complaints(gw), []);
      assert.ok(!JSON.stringify(gw.api.logs).includes(password));
      await gw.guard.stop();
    });

    it("a wrong password: one line naming sasl.username / sasl.password, never the password; calls fall to the fail policy", async () => {
      const wrong = `not-the-password-${process.pid}`;
      const config = secured({ timeoutMs: 1500, failPolicy: "closed" });
      const gw = await gateway(
        { ...config, sasl: { ...(config.sasl as object), password: wrong } },
        { connect: false },
      );
      const agent = new Agent(gw, "agent:main:wrong-password", "run-wrong-password");
      const first = await agent.call("exec", { command: "ls" }, "unused");
      await waitFor("the refusal", 15_000, () => (complaints(gw).length ? true : undefined));
      const second = await agent.call("exec", { command: "ls" }, "unused"); // meanwhile the transport retried
      assert.deepEqual(
        [first.seen, second.seen],
        [`BLOCKED: ${TIMEOUT_MESSAGE("closed")}`, `BLOCKED: ${TIMEOUT_MESSAGE("closed")}`],
      );
      assert.deepEqual(complaints(gw), [
        'loopfuse: Kafka refused the SASL credentials of user "gateway" (sasl.username / sasl.password); every call falls to the fail-closed policy until it is fixed',
      ]);
      assert.ok(!JSON.stringify(gw.api.logs).includes(wrong));
      await gw.guard.stop();
    });

    it("a CA file of another CA: one line naming ssl.caFile; calls fall to the fail policy", async () => {
      const { cert } = otherCa("other-ca");
      const gw = await gateway(secured({ timeoutMs: 1500, failPolicy: "open", ssl: { caFile: cert } }), {
        connect: false,
      });
      const agent = new Agent(gw, "agent:main:other-ca", "run-other-ca");
      const first = await agent.call("exec", { command: "ls" }, "listing");
      await waitFor("the refusal", 15_000, () => (complaints(gw).length ? true : undefined));
      const second = await agent.call("exec", { command: "ls" }, "listing");
      assert.deepEqual([first.decision, second.decision], [undefined, undefined]); // fail-open: the tool ran
      assert.deepEqual([first.seen, second.seen], ["listing", "listing"]);
      const lines = complaints(gw);
      assert.equal(lines.length, 1, lines.join("\n"));
      assert.match(
        lines[0]!,
        /^loopfuse: the broker's certificate is not trusted \(ssl\.caFile ".*other-ca\.pem" is not the CA that signed it; UNABLE_TO_VERIFY_LEAF_SIGNATURE\)/,
      );
      await gw.guard.stop();
    });

    it("a gateway that reads the verdicts topic (no reply topic): one line, the ACLs deny it; calls fall to the fail policy", async () => {
      const gw = await gateway(secured({ timeoutMs: 1500, topics: { replies: "" } }), { connect: false });
      const agent = new Agent(gw, "agent:main:v1", "run-v1");
      const first = await agent.call("exec", { command: "ls" }, "listing");
      await waitFor("the refusal", 15_000, () => (complaints(gw).length ? true : undefined));
      await agent.call("exec", { command: "ls" }, "listing");
      assert.equal(first.decision, undefined);
      const lines = complaints(gw);
      assert.equal(lines.length, 1, lines.join("\n"));
      assert.match(
        lines[0]!,
        /^loopfuse: Kafka's ACLs deny user "gateway" topic loopfuse\.verdicts \(TOPIC_AUTHORIZATION_FAILED; topics\)/,
      );
      await gw.guard.stop();
    });

    it("the TLS files reach the client as Node's ca / cert / key; a key not the certificate's is a config error naming both", () => {
      const client = otherCa("client");
      const stranger = otherCa("stranger");
      const files = readTlsFiles({ caFile: client.cert, certFile: client.cert, keyFile: client.key });
      const options = connectionOptions(resolveConfig(secured()), files) as {
        tls?: Record<string, string>;
        sasl?: { mechanism: string };
      };
      const { ca, cert, key } = options.tls ?? {};
      assert.ok(ca?.startsWith("-----BEGIN CERTIFICATE-----"));
      assert.equal(cert, ca);
      assert.match(key ?? "", /PRIVATE KEY/);
      assert.equal(options.sasl?.mechanism, "SCRAM-SHA-512");
      assert.throws(
        () => readTlsFiles({ caFile: null, certFile: client.cert, keyFile: stranger.key }),
        /^ConfigError: ssl\.certFile \/ ssl\.keyFile: /,
      );
    });
  },
);
