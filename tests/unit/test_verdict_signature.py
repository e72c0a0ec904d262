"""Verdict signatures (docs/wire-format.md: Verdict signatures): what is signed, what a
gateway with a key drops and counts, key rotation, and settings errors that never
print a key. The worker side and the real broker: tests/integration/test_verdict_signing.py."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from loopfuse.schemas.verdict_signature import (
    HEADER,
    VerdictSigner,
    VerdictVerifier,
    parse_verdict_keys,
)
from loopfuse.streams.gateway.client import GatewayClient, Topics
from loopfuse.streams.settings import Settings, describe_settings_error

ROOT = Path(__file__).resolve().parents[2]
SECRET = bytes(range(32))  # the test vector's key (docs/wire-format.md)
SPEC = f"k1:{base64.b64encode(SECRET).decode()}"
OLD = f"k0:{base64.b64encode(b'o' * 32).decode()}"
KEY, VALUE = b"requester-1", b'{"type":"verdict","action":"block"}'


def test_a_signature_is_the_documented_hmac_of_key_and_value_and_deterministic() -> None:
    [key] = parse_verdict_keys(SPEC)
    signer = VerdictSigner(key)
    signed = signer.signature(KEY, VALUE)
    # what another implementation computes from docs/wire-format.md's description
    message = b"loopfuse-verdict-sig-v1\x00" + len(KEY).to_bytes(4, "big") + KEY + VALUE
    mac = hmac.new(SECRET, message, hashlib.sha256).digest()
    assert signed == b"k1:" + base64.urlsafe_b64encode(mac).rstrip(b"=")
    assert signer.signature(KEY, VALUE) == signed
    # the test vector docs/wire-format.md and the OpenClaw plugin's test quote
    assert signed == b"k1:59MfjKvsUSjSlBVvHVxLIVC-wJCqCEhNTdJDgoVpZeQ"
    # the key is bound, and where it ends: moving a byte from key to value changes it
    assert signer.signature(KEY[:-1], KEY[-1:] + VALUE) != signed


def _flip(data: bytes, index: int) -> bytes:
    return data[:index] + bytes([data[index] ^ 1]) + data[index + 1 :]


def test_a_flipped_bit_anywhere_an_unsigned_record_and_an_unknown_key_id_are_rejected() -> None:
    keys = parse_verdict_keys(SPEC)
    signed = VerdictSigner(keys[0]).signature(KEY, VALUE)
    verifier = VerdictVerifier(keys)
    assert verifier.check(KEY, VALUE, [(HEADER, signed)]) == "ok"
    assert verifier.check(KEY, VALUE, [("other", b"x"), (HEADER, signed)]) == "ok"
    assert verifier.check(KEY, _flip(VALUE, 30), [(HEADER, signed)]) == "bad"
    assert verifier.check(_flip(KEY, 0), VALUE, [(HEADER, signed)]) == "bad"
    assert verifier.check(KEY, VALUE, [(HEADER, _flip(signed, len(signed) - 5))]) == "bad"
    assert verifier.check(KEY, VALUE, []) == "unsigned"
    assert verifier.check(KEY, VALUE, [("loopfuse-sig-old", signed)]) == "unsigned"
    [other] = parse_verdict_keys(OLD)  # a key this gateway does not have
    assert (
        verifier.check(KEY, VALUE, [(HEADER, VerdictSigner(other).signature(KEY, VALUE))]) == "bad"
    )
    # the right MAC under an id this gateway does not know, and garbage
    assert verifier.check(KEY, VALUE, [(HEADER, b"k9" + signed[2:])]) == "bad"
    for junk in (b"", b":", b"k1", b"k1:", b"\xff\xfe", None):
        assert verifier.check(KEY, VALUE, [(HEADER, junk)]) == "bad"


def test_rotation_the_first_key_signs_and_every_listed_key_verifies() -> None:
    new, old = parse_verdict_keys(f"{SPEC}, {OLD}")
    assert (new.key_id, old.key_id) == ("k1", "k0")
    verifier = VerdictVerifier([new, old])
    by_old = VerdictSigner(old).signature(KEY, VALUE)  # a worker not yet rotated
    assert verifier.check(KEY, VALUE, [(HEADER, by_old)]) == "ok"
    assert VerdictVerifier([new]).check(KEY, VALUE, [(HEADER, by_old)]) == "bad"  # old retired


def test_both_base64_alphabets_with_or_without_padding_decode_to_the_same_key() -> None:
    secret = b"\xfb\xff" * 17  # 34 bytes: '+' and '/' (or '-' and '_'), padding '='
    standard = base64.b64encode(secret).decode()
    urlsafe = base64.urlsafe_b64encode(secret).decode().rstrip("=")
    assert "=" in standard and "/" in standard and "_" in urlsafe
    assert parse_verdict_keys(f"a:{standard}")[0].secret == secret
    assert parse_verdict_keys(f"a:{urlsafe}")[0].secret == secret
    assert "secret" not in repr(parse_verdict_keys(f"a:{standard}")[0])


SECRETISH = base64.b64encode(b"hunter2-" * 2).decode()  # 16 bytes: too short


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (f"k1:{SECRETISH}", "key 1 is shorter than 32 bytes"),
        (SECRETISH, "key 1 must be id:base64"),
        (f"k1:{SECRETISH}!!", "key 1 is not base64 after its id"),
        (f"{SPEC},k1:{base64.b64encode(b'x' * 40).decode()}", "key 2 repeats the id"),
        (f"bad id:{SECRETISH}", "key 1 must be id:base64"),
        (",", "no key"),
    ],
)
def test_a_malformed_key_is_one_line_naming_the_variable_and_never_the_key(
    value: str, why: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOOPFUSE_VERDICT_KEY", value)
    with pytest.raises(ValidationError) as caught:
        Settings()
    line = describe_settings_error(caught.value)
    assert line.startswith("invalid setting LOOPFUSE_VERDICT_KEY: ") and why in line
    for shown in (line, str(caught.value), repr(caught.value)):
        assert SECRETISH not in shown and "aHVudGVy" not in shown


def test_the_worker_with_a_malformed_key_exits_2_with_one_line_and_no_key() -> None:
    env = {**os.environ, "LOOPFUSE_VERDICT_KEY": f"k1:{SECRETISH}"}
    done = subprocess.run(
        [sys.executable, "-m", "loopfuse.streams.cli", "worker"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "loopfuse worker: invalid setting LOOPFUSE_VERDICT_KEY: key 1 is shorter than 32 "
        "bytes (openssl rand -base64 32)"
    ]
    assert SECRETISH not in done.stderr + done.stdout


def test_no_key_or_an_empty_one_means_no_signing() -> None:
    assert Settings().verdict_keys() == ()
    assert Settings(verdict_key="").verdict_keys() == ()
    assert [k.key_id for k in Settings(verdict_key=f"{SPEC},{OLD}").verdict_keys()] == ["k1", "k0"]
    assert SPEC not in repr(Settings(verdict_key=SPEC))


# -- the gateway client: what a call gets -----------------------------------------------


@dataclass
class _Record:
    value: bytes
    key: bytes | None = None
    headers: list[tuple[str, bytes]] = field(default_factory=list)
    serialized_key_size: int = 0
    serialized_value_size: int = 0


class _Consumer:
    """Hands the reader one batch, then nothing."""

    def __init__(self, records: list[_Record]) -> None:
        self.batches = [{"tp": records}]

    async def getmany(self, timeout_ms: int = 0) -> dict[str, list[_Record]]:
        if self.batches:
            return self.batches.pop(0)
        await asyncio.sleep(timeout_ms / 1000)
        return {}


def _verdict(client: GatewayClient, action: str) -> bytes:
    return (
        '{"type":"verdict","verdict_id":"v","session_key":"s","run_id":"r","agent_id":null,'
        f'"call_id":"c","seq":0,"incarnation":"{client.incarnation}","tool_name":"exec",'
        f'"action":"{action}","level":"none","detector":null,"count":0,"message":null,'
        '"args_hash":"h","event_ts":1,"decided_ts":1}'
    ).encode()


async def _read(client: GatewayClient, records: list[_Record]) -> str | None:
    """What a pending call (session s, call c) gets from these records, if anything."""
    from loopfuse.streams.gateway.client import _Pending

    waiter: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    client._pending[("s", "c")] = _Pending(waiter, 0, client.incarnation, "h")
    client._consumer = _Consumer(records)  # type: ignore[assignment]
    reader = asyncio.ensure_future(client._read_verdicts())
    try:
        return (await asyncio.wait_for(waiter, 0.5)).action  # type: ignore[no-any-return]
    except TimeoutError:
        return None
    finally:
        reader.cancel()


async def test_a_client_with_a_key_takes_the_signed_verdict_and_counts_the_forgeries() -> None:
    client = GatewayClient("127.0.0.1:1", topics=Topics(replies=None), verdict_key=f"{SPEC},{OLD}")
    [mine] = parse_verdict_keys(SPEC)
    [theirs] = parse_verdict_keys(f"k1:{base64.b64encode(b'x' * 32).decode()}")  # same id
    allow, block = _verdict(client, "allow"), _verdict(client, "block")
    forged = [
        _Record(allow, b"s"),  # unsigned
        _Record(allow, b"s", [(HEADER, VerdictSigner(theirs).signature(b"s", allow))]),
        _Record(allow, b"s", [(HEADER, VerdictSigner(mine).signature(b"s", block))]),  # swapped
        _Record(allow, b"x", [(HEADER, VerdictSigner(mine).signature(b"s", allow))]),  # re-keyed
    ]
    genuine = _Record(block, b"s", [(HEADER, VerdictSigner(mine).signature(b"s", block))])
    assert await _read(client, [*forged, genuine]) == "block"
    stats = client.stats
    assert (stats.unsigned_verdicts, stats.bad_signatures, stats.verdicts) == (1, 3, 1)
    assert stats.undecodable_records == 0 and stats.dropped_verdicts == 0  # never parsed


async def test_a_client_with_a_key_facing_an_unsigning_worker_gets_no_verdict(
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = GatewayClient("127.0.0.1:1", topics=Topics(replies=None), verdict_key=SPEC)
    unsigned = [_Record(_verdict(client, "block"), b"s") for _ in range(5)]
    assert await _read(client, unsigned) is None  # the call times out: its fail policy
    assert client.stats.unsigned_verdicts == 5 and client.stats.verdicts == 0
    logged = [r.getMessage() for r in caplog.records if "dropping a verdict" in r.getMessage()]
    assert len(logged) == 1, logged  # at most one line every 10 s
    assert "LOOPFUSE_VERDICT_KEY" in logged[0] and SPEC.split(":")[1] not in logged[0]


async def test_a_client_without_a_key_ignores_signatures() -> None:
    client = GatewayClient("127.0.0.1:1", topics=Topics(replies=None))
    record = _Record(_verdict(client, "warn"), b"s", [(HEADER, b"k1:whatever")])
    assert await _read(client, [record]) == "warn"
    assert client.stats.unsigned_verdicts == client.stats.bad_signatures == 0


# -- the worker: what it hands the producer ---------------------------------------------


class _Producer:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes | None, bytes, list[tuple[str, bytes]] | None]] = []

    async def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes,
        partition: int | None,
        timestamp: None,
        headers: list[tuple[str, bytes]] | None,
    ) -> Any:
        self.sent.append((topic, key, value, headers))
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


async def test_the_worker_signs_every_verdict_wherever_it_goes_and_nothing_else() -> None:
    from types import SimpleNamespace

    from loopfuse.streams.worker.faust_compat.producer import VerdictSigning, deliver
    from tests.unit.test_processor import Feed
    from tests.unit.test_reply_routing import asking, calls, make, reply

    events = [
        *asking(calls("routed", 6)),
        *calls("v1", 6),
        *[{**e, "reply_to": reply(topic="not-a-reply-topic")} for e in calls("lost", 2)],
    ]
    messages = make().process([Feed().record(e) for e in events])
    keys = parse_verdict_keys(SPEC)
    producer = _Producer()
    signing = VerdictSigning(VerdictSigner(keys[0]), ("verdicts", "loopfuse.replies"))
    await deliver(SimpleNamespace(producer=producer), messages, signing)  # type: ignore[arg-type]
    verifier = VerdictVerifier(keys)
    verdicts = [(t, k, v, h) for t, k, v, h in producer.sent if b'"type":"verdict"' in v]
    assert {t for t, *_ in verdicts} == {"loopfuse.replies", "verdicts"} and len(verdicts) == 14
    assert all(verifier.check(k, v, h or []) == "ok" for _, k, v, h in verdicts)
    # the bytes are the processor's, unchanged; loop events go unsigned
    assert [v for _, _, v, _ in producer.sent] == [v for _, _, v, _ in messages]
    others = [h for t, _, _, h in producer.sent if t not in ("verdicts", "loopfuse.replies")]
    assert others and all(h is None for h in others)


def test_a_record_with_many_signature_headers_costs_one_mac_per_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    keys = parse_verdict_keys(f"{SPEC},{OLD}")
    verifier = VerdictVerifier(keys)
    macs = []
    real = VerdictSigner.signature
    monkeypatch.setattr(
        VerdictSigner,
        "signature",
        lambda self, key, value: macs.append(1) or real(self, key, value),
    )
    junk = [(HEADER, f"{k}:{'A' * 43}".encode()) for k in ("k1", "k0") for _ in range(5_000)]
    assert verifier.check(KEY, VALUE * 1_000, junk) == "bad"
    assert len(macs) == 2
