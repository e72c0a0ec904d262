"""One call of a session's history (and, once known, its outcome): :class:`Record`.

A msgspec Struct, so that the state codec writes and reads a whole history in C (an
array per record) and the detectors read its fields as slots.
"""

from __future__ import annotations

import msgspec


class Record(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """Immutable: a result replaces its call's record. (No GC tracking: a record
    holds only ints and strings.)"""

    tool: str
    sig: int  # call signature: tool name + args fingerprint, 64-bit
    run: int  # run_key of the (scoped) run id: 0 for none; compared, never shown
    call: int  # 32-bit hash of the call id while the result is pending, else 0
    result: int  # 64-bit result fingerprint, 0 = no result yet
    unknown: str | None  # unknown-tool name carried by the result
    ts: int  # event time, epoch ms


#: A record's MessagePack (an array of its fields), as the state codec writes it in a
#: history. Records are immutable, so a session keeps each one's (see
#: SessionState.history_bytes) rather than writing all of them at every checkpoint.
encode_record = msgspec.msgpack.Encoder().encode


def array_header(length: int) -> bytes:
    """The MessagePack header of an array of ``length`` items, as msgspec writes it."""
    if length < 16:
        return bytes((0x90 | length,))
    if length < 0x10000:
        return b"\xdc" + length.to_bytes(2, "big")
    return b"\xdd" + length.to_bytes(4, "big")
