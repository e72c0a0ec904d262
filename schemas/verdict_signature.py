"""Verdict signatures: an HMAC-SHA256 of a verdict record's key and value, in a header.

Optional (``LOOPFUSE_VERDICT_KEY``, the OpenClaw plugin's ``verdictKey``): for a shared
cluster whose operators will not set ACLs, where anyone who can write to the reply or
verdicts topic could otherwise forge an ``allow``. The verdict's bytes are left exactly
as they are (v1 gateways read them unchanged); the signature travels in the record
header ``loopfuse-sig`` (docs/wire-format.md: Verdict signatures, the exact bytes).

What is signed, and why only that: the record's key and value. The value is the
verdict (session, call id, seq, incarnation, args hash, action); the key is whom it
is for (a reply's requester, a v1 verdict's session). The topic and partition are
not: a verdict falls back from its reply topic to the verdicts topic when its reply
cannot be routed, and a mirrored cluster renames topics; a copy moved to another
topic or partition is still only a copy (see the docs for what a replay can do).

Part of the wire contract, so it lives with the schemas: the worker signs with it and
the Python gateway client verifies with it; no I/O.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

#: The record header that carries a verdict's signature.
HEADER = "loopfuse-sig"
#: Domain separation: these bytes start every signed message, so a loopfuse verdict
#: MAC can never be mistaken for (or made from) a MAC of anything else under the key.
DOMAIN = b"loopfuse-verdict-sig-v1\x00"
#: Shortest secret accepted (HMAC-SHA256's own block of security: 256 bits).
MIN_KEY_BYTES = 32
_KEY_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
_BASE64 = re.compile(r"[A-Za-z0-9+/_-]+={0,2}")

Check = Literal["ok", "unsigned", "bad"]


class VerdictKeyError(ValueError):
    """A malformed key list. The message says what is wrong, never any part of a key."""


@dataclass(frozen=True, slots=True)
class VerdictKey:
    """One shared secret and the id a signature names it by (``repr`` hides the secret)."""

    key_id: str
    secret: bytes = field(repr=False)


def parse_verdict_keys(text: str) -> tuple[VerdictKey, ...]:
    """``id:base64[,id:base64...]``: the current key first, then older ones still accepted.

    Base64 in either alphabet (standard or URL-safe), padding optional; each secret at
    least :data:`MIN_KEY_BYTES` bytes (``openssl rand -base64 32``).
    """
    keys: list[VerdictKey] = []
    for number, entry in enumerate((part.strip() for part in text.split(",")), start=1):
        if not entry:
            continue
        key_id, colon, encoded = entry.partition(":")
        if not colon or not _KEY_ID.fullmatch(key_id):
            raise VerdictKeyError(
                f"key {number} must be id:base64, the id 1-64 characters of A-Z a-z 0-9 . _ -"
            )
        if any(k.key_id == key_id for k in keys):
            raise VerdictKeyError(f"key {number} repeats the id of an earlier key")
        secret = _decode_base64(encoded.strip())
        if secret is None:
            raise VerdictKeyError(f"key {number} is not base64 after its id")
        if len(secret) < MIN_KEY_BYTES:
            raise VerdictKeyError(
                f"key {number} is shorter than {MIN_KEY_BYTES} bytes (openssl rand -base64 32)"
            )
        keys.append(VerdictKey(key_id, secret))
    if not keys:
        raise VerdictKeyError("no key (expected id:base64[,id:base64...])")
    return tuple(keys)


def _decode_base64(encoded: str) -> bytes | None:
    if not _BASE64.fullmatch(encoded):
        return None
    standard = encoded.rstrip("=").replace("-", "+").replace("_", "/")
    try:
        return base64.b64decode(standard + "=" * (-len(standard) % 4), validate=True)
    except (binascii.Error, ValueError):
        return None


class VerdictSigner:
    """Signs with one key: the header value is ``<key id>:<base64url(MAC), no padding>``,
    MAC = HMAC-SHA256(secret, DOMAIN + u32 big-endian length of the record key + record
    key + record value). The length keeps the key/value boundary unambiguous; a null
    record key signs as an empty one."""

    def __init__(self, key: VerdictKey) -> None:
        self.key_id = key.key_id
        self._prefix = key.key_id.encode("ascii") + b":"
        # The key's pads and the domain are hashed once; each signature starts from a
        # copy (1.4 µs for a 400-byte verdict, against 2.0 µs for hmac.digest, which
        # sets the key up every time: timeit on the benchmark's machine).
        self._start = hmac.new(key.secret, DOMAIN, hashlib.sha256)

    def signature(self, key: bytes | None, value: bytes) -> bytes:
        key = key or b""
        mac = self._start.copy()
        mac.update(len(key).to_bytes(4, "big") + key)
        mac.update(value)
        return self._prefix + base64.urlsafe_b64encode(mac.digest()).rstrip(b"=")

    def header(self, key: bytes | None, value: bytes) -> tuple[str, bytes]:
        return (HEADER, self.signature(key, value))


class VerdictVerifier:
    """Checks a record's signature against every listed key id (rotation: old ones too)."""

    def __init__(self, keys: Iterable[VerdictKey]) -> None:
        self._signers = {key.key_id.encode("ascii"): VerdictSigner(key) for key in keys}

    def check(
        self, key: bytes | None, value: bytes, headers: Sequence[tuple[str, bytes | None]]
    ) -> Check:
        """``ok``: a ``loopfuse-sig`` header names a known key and its MAC matches;
        ``unsigned``: no such header; ``bad``: otherwise (unknown key id, wrong MAC,
        malformed). Compared in constant time, on the encoded forms: the attacker's
        bytes are never decoded. Each key's MAC is computed once per record, however
        many headers name it (a forged record with thousands of them must not cost
        thousands of MACs of its value)."""
        found = False
        expected: dict[bytes, bytes] = {}
        for name, given in headers:
            if name != HEADER:
                continue
            found = True
            key_id, colon, _ = (given or b"").partition(b":")
            signer = self._signers.get(key_id) if colon else None
            if signer is None:
                continue
            if key_id not in expected:
                expected[key_id] = signer.signature(key, value)
            if hmac.compare_digest(expected[key_id], given or b""):
                return "ok"
        return "bad" if found else "unsigned"
