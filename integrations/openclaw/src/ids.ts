import { createHash } from "node:crypto";

/** loopfuse accepts identifiers of at most this many UTF-8 bytes. */
export const MAX_ID_BYTES = 512;

/**
 * An identifier that fits loopfuse's limit.
 *
 * Identifiers up to 512 UTF-8 bytes pass unchanged. A longer one is replaced by
 * `lf-sha256:` + the hex SHA-256 of its UTF-8 bytes (74 bytes): stable (the same
 * long id always maps to the same value, across processes too), so events of one
 * session keep one key and a verdict still matches its call; truncation could merge
 * two different ids that share a prefix.
 */
export function boundedId(id: string): string {
  if (Buffer.byteLength(id, "utf8") <= MAX_ID_BYTES) {
    return id;
  }
  return `lf-sha256:${createHash("sha256").update(id, "utf8").digest("hex")}`;
}

/** `boundedId` for optional identifiers (null stays null). */
export function boundedOptionalId(id: string | undefined | null): string | null {
  return id === undefined || id === null || id === "" ? null : boundedId(id);
}
