"""Session state as bytes: the value of the session table and its changelog.

The format is versioned by its first byte, and every version ever written stays
readable (a changelog outlives the code that wrote it). Format 5 is written where the
native codec is (:mod:`loopfuse.streams.engine.native`), else version 4
(:data:`WRITTEN_VERSION`); both engines read and write both. The worker encodes every
touched session once per checkpoint (and decodes one it has not cached), so the written
format is the one cheapest to write and read at its size. The byte layouts are in
docs/wire-format.md (Session state bytes).

One module per format: :mod:`.v5` and :mod:`.v4` (written), :mod:`.frozen` (versions 1
to 3, read only); :mod:`.body` what they share, :mod:`.varint` the varints; this module
the entry points and the dispatch by version, and :func:`fit`, which holds a state to
its byte cap.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Final

from loopfuse.streams.engine.native import NATIVE
from loopfuse.streams.engine.state import SessionState
from loopfuse.streams.engine.state_codec import frozen, v4, v5
from loopfuse.streams.engine.state_codec.body import (
    ACTIONS,
    DETECTORS,
    HEAD,
    StateTooLarge,
)

__all__ = [
    "ACTIONS",
    "DETECTORS",
    "FORMAT_VERSION",
    "WRITTEN_VERSION",
    "StateTooLarge",
    "decode",
    "encode",
    "encode_body",
    "fit",
    "idle_stamps",
    "shed_marks",
]

FORMAT_VERSION: Final = 5  # the newest format, read and written by both codecs
#: The native codec, or None (the pure one): read at each call, so a test can take it away.
_NATIVE_CODEC = NATIVE
#: What :func:`encode` writes by default: format 5 where the native codec is, else 4
#: (the pure writer of format 5 costs far more than msgspec's of format 4).
WRITTEN_VERSION: Final = 4 if NATIVE is None else 5

_I64: Final = struct.Struct("<q")


# -- writing -------------------------------------------------------------------------


def encode(state: SessionState, version: int = WRITTEN_VERSION) -> bytes:
    """The state's bytes in format ``version`` (4 or 5; by default the one this process
    writes, see WRITTEN_VERSION)."""
    if version == 5 and _NATIVE_CODEC is None:
        try:
            return v5.write(state)
        except (OverflowError, ValueError, struct.error):
            return encode(state, 4)  # a value format 5 has no room for: version 4
    # msgspec writes version 4's body in C (the records' bytes kept, see
    # SessionState.history_bytes), the native codec makes it format 5
    return encode_body(state.touched_ms, state.last_event_ms, v4.body_of(state), version)


def encode_body(
    touched_ms: int, last_event_ms: int, body: bytes, version: int = WRITTEN_VERSION
) -> bytes:
    """A state's bytes from its version-4 body (msgspec's, or the native fold's:
    native/src/state_bytes.rs), in format ``version`` (5 only where the native codec is)."""
    native = _NATIVE_CODEC
    if version == 5 and native is not None:
        compact: bytes | None = native.compact_state(touched_ms, last_event_ms, body)
        if compact is not None:  # None: a value format 5 has no room for (none the engine makes)
            return compact
    return HEAD.pack(4, touched_ms, last_event_ms) + body


# -- reading -------------------------------------------------------------------------


def _read_v5(data: bytes) -> tuple[SessionState, int]:
    return v5.read(data, _NATIVE_CODEC)


_READERS: Final[dict[int, Callable[[bytes], tuple[SessionState, int]]]] = {
    1: frozen.read_v1,
    2: frozen.read_v2,
    3: frozen.read_v3,
    4: v4.read,
    5: _read_v5,
}


def decode(data: bytes) -> SessionState:
    """The state in ``data``, whichever format version wrote it.

    Truncated or corrupt bytes raise ValueError (and nothing else): the worker then
    starts the session afresh rather than stopping.
    """
    reader = _READERS.get(data[0]) if data else None
    if reader is None:
        raise ValueError(f"unknown session state format {data[:1]!r}")
    try:
        state, pos = reader(data)
    except (IndexError, KeyError, struct.error, OverflowError, TypeError) as exc:
        raise ValueError(f"corrupt session state: {exc!r}") from None
    if pos != len(data):
        raise ValueError(f"session state has {len(data) - pos} trailing bytes")
    return state


def idle_stamps(data: bytes) -> tuple[int, int]:
    """``(touched_ms, last_event_ms)`` of state bytes without decoding the rest.

    Idle expiry reads these for every session on every scan. Bytes too short for
    them, or of no known version, raise ValueError as :func:`decode` does.
    """
    if not data or data[0] not in _READERS or len(data) < (17 if data[0] >= 2 else 9):
        raise ValueError(f"not session state bytes: {data[:17]!r}")
    touched_ms: int = _I64.unpack_from(data, 1)[0]
    last_event_ms: int = _I64.unpack_from(data, 9)[0] if data[0] >= 2 else 0
    return touched_ms, last_event_ms


# -- fitting a cap -------------------------------------------------------------------


def shed_marks(state: SessionState) -> tuple[int, ...]:
    """What :func:`fit` sheds from, counted: each of its steps lessens one, so a state
    was cut to fit when these changed."""
    rules = state.rules
    return (
        len(state.history),
        len(state.warnings),
        len(state.guards),
        len(state.decisions),
        state.verdict_floor,
        len(state.retired),
        len(state.seen_ids),
        0 if rules is None else len(rules.runs),
        0 if rules is None else len(rules.failures),
    )


def fit(state: SessionState, cap: int, version: int = WRITTEN_VERSION) -> bytes:
    """The state's bytes (format ``version``), shedding the oldest evidence until they
    fit in ``cap``.

    Identifiers are bounded at decode and every collection is capped, so with the
    default config a state fits in the default cap whatever the input; a large
    ``historySize`` or many long ids can still exceed it. Then the oldest history
    records go first (they would be trimmed next anyway), then warning buckets,
    guards, remembered verdicts and incarnations. Events waiting on a gap are never
    shed (they are input not yet applied): their bytes are capped by the engine.
    Raises StateTooLarge when nothing is left to shed.

    The cap is held to version 4's bytes, whichever format is written (format 5's are
    fewer): so a pure engine (writing 4) and a native one (writing 5) shed at the same
    events, and their verdicts stay the same however large a history is configured.
    """
    body = v4.body_of(state)
    while HEAD.size + len(body) > cap:
        if len(state.history) > 1:
            del state.history[: max(1, len(state.history) // 4)]
            state.forget_derived()
        elif state.warnings:
            for key in list(state.warnings)[: max(1, len(state.warnings) // 2)]:
                del state.warnings[key]
        elif state.guards:
            for run in list(state.guards)[: max(1, len(state.guards) // 2)]:
                del state.guards[run]
        elif state.rules is not None and state.rules.sheddable():
            state.rules.shed()
        elif state.decisions:
            state.decisions.clear()
            # no verdict is vouched for any more: none is re-sent for a redelivery
            state.verdict_floor = max(state.verdict_floor, state.next_seq or 0)
        elif state.retired or state.history or state.seen_ids:
            state.retired.clear()
            state.history.clear()
            state.seen_ids.clear()
            state.forget_derived()
        else:
            raise StateTooLarge(
                f"session state is {HEAD.size + len(body)} bytes with nothing left to shed "
                f"(the cap is {cap})"
            )
        body = v4.body_of(state)
    if version == 5 and _NATIVE_CODEC is None:
        return encode(state, 5)
    return encode_body(state.touched_ms, state.last_event_ms, body, version)
