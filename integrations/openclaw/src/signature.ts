/**
 * Verdict signatures (loopfuse's docs/wire-format.md, Verdict signatures): the same
 * checks as the Python client (schemas/verdict_signature.py). With `verdictKey` set, a
 * verdict record of this gateway is accepted only when its `loopfuse-sig` header is
 * `<key id>:<base64url(HMAC-SHA256), no padding>` of
 * `"loopfuse-verdict-sig-v1\0" || u32be(len(record key)) || record key || record value`
 * under one of the listed keys. The verdict's bytes are unchanged; headers are ignored
 * without a key.
 */
import { createHmac, timingSafeEqual, type Hmac } from "node:crypto";

export const SIGNATURE_HEADER = "loopfuse-sig";
const DOMAIN = Buffer.from("loopfuse-verdict-sig-v1\0", "latin1");
export const MIN_KEY_BYTES = 32;
const KEY_ID = /^[A-Za-z0-9._-]{1,64}$/;
const BASE64 = /^[A-Za-z0-9+/_-]+={0,2}$/;
const HEADER_NAME = Buffer.from(SIGNATURE_HEADER, "latin1");

export interface VerdictKey {
  keyId: string;
  secret: Buffer;
}

export type SignatureCheck = "ok" | "unsigned" | "bad";

/**
 * `id:base64[,id:base64...]`: the current key first, older ones after (rotation). The
 * error message says what is wrong with which key by its position, never any part of it.
 */
export function parseVerdictKeys(text: string): VerdictKey[] {
  const keys: VerdictKey[] = [];
  const entries = text.split(",").map((entry) => entry.trim());
  entries.forEach((entry, index) => {
    if (!entry) return;
    const n = index + 1;
    const colon = entry.indexOf(":");
    const keyId = colon < 0 ? "" : entry.slice(0, colon);
    if (!KEY_ID.test(keyId)) throw new Error(`key ${n} must be id:base64, the id 1-64 characters of A-Z a-z 0-9 . _ -`);
    if (keys.some((k) => k.keyId === keyId)) throw new Error(`key ${n} repeats the id of an earlier key`);
    const encoded = entry.slice(colon + 1).trim();
    if (!BASE64.test(encoded)) throw new Error(`key ${n} is not base64 after its id`);
    // Buffer's base64 decoder takes both alphabets, with or without padding.
    const secret = Buffer.from(encoded, "base64");
    if (secret.length < MIN_KEY_BYTES)
      throw new Error(`key ${n} is shorter than ${MIN_KEY_BYTES} bytes (openssl rand -base64 32)`);
    keys.push({ keyId, secret });
  });
  if (keys.length === 0) throw new Error("no key (expected id:base64[,id:base64...])");
  return keys;
}

function mac(secret: Buffer, key: Buffer | null, value: Buffer): Hmac {
  const length = Buffer.alloc(4);
  length.writeUInt32BE(key?.length ?? 0);
  return createHmac("sha256", secret)
    .update(DOMAIN)
    .update(length)
    .update(key ?? Buffer.alloc(0))
    .update(value);
}

/** The header value a worker with `key` puts on a record (tests and the benchmark sign with it). */
export function signVerdict(key: VerdictKey, recordKey: Buffer | null, value: Buffer): Buffer {
  return Buffer.from(`${key.keyId}:${mac(key.secret, recordKey, value).digest("base64url")}`, "latin1");
}

export class VerdictVerifier {
  private readonly secrets: Map<string, Buffer>;

  constructor(keys: VerdictKey[]) {
    this.secrets = new Map(keys.map((k) => [k.keyId, k.secret]));
  }

  /**
   * `ok`: a `loopfuse-sig` header names a listed key and its MAC matches; `unsigned`: no
   * such header; `bad`: anything else (unknown key id, wrong MAC, malformed). Compared
   * with timingSafeEqual, after a length check (the length is public).
   */
  check(
    recordKey: Buffer | null,
    value: Buffer | null,
    headers: Iterable<[Buffer | null, Buffer | null]> | undefined,
  ): SignatureCheck {
    let found = false;
    // One MAC per key and record, however many headers name it (a forged record with
    // thousands of them must not cost thousands of MACs of its value).
    const expected = new Map<string, Buffer>();
    for (const [name, given] of headers ?? []) {
      if (!name || !HEADER_NAME.equals(name)) continue;
      found = true;
      if (!given) continue;
      const colon = given.indexOf(0x3a); // ":"
      if (colon < 1) continue;
      const keyId = given.subarray(0, colon).toString("latin1");
      const secret = this.secrets.get(keyId);
      const encoded = given.subarray(colon + 1);
      if (!secret || encoded.length !== 43) continue; // 32 bytes in base64url, unpadded
      // Compared as encoded, as the Python client does: a non-canonical encoding of the
      // right MAC is refused by both.
      let mine = expected.get(keyId);
      if (!mine) {
        mine = Buffer.from(mac(secret, recordKey, value ?? Buffer.alloc(0)).digest("base64url"), "latin1");
        expected.set(keyId, mine);
      }
      if (timingSafeEqual(encoded, mine)) return "ok";
    }
    return found ? "bad" : "unsigned";
  }
}
