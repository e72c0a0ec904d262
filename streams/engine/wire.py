"""An input event from its wire bytes, with its fingerprints when the native judge made them.

The native judge checks an event's bytes as loopfuse.schemas.decode
would and computes its args and result tokens from them in the same pass, where the
engine would otherwise walk the decoded payload again. It answers only for bytes that
decoder accepts through its msgspec pass, so the event is msgspec's, as the decoder would
build it; for everything else (every rejection among it) that decoder decides and words
it, so dead letters stay the same. Without the native judge this is
loopfuse.schemas.decode alone, and the engine computes the fingerprints itself.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from loopfuse.schemas.decode import DEFAULT_MAX_DEPTH, DEFAULT_MAX_EVENT_BYTES, decode_event
from loopfuse.schemas.events import DEFAULT_MAX_IDENTIFIER_BYTES, InputEvent
from loopfuse.streams.engine.fingerprint import Fingerprints
from loopfuse.streams.engine.native import NATIVE

_EVENT_DECODER = msgspec.json.Decoder(InputEvent)
#: The native judge's check and fingerprints of an event's bytes (None: the Python
#: decoder decides), when built.
_native_fingerprints: Callable[[bytes, int, int, int], Fingerprints | None] | None = (
    None if NATIVE is None else NATIVE.event_fingerprints
)


def decode_fingerprinted(
    raw: bytes | None,
    *,
    max_bytes: int = DEFAULT_MAX_EVENT_BYTES,
    max_depth: int = DEFAULT_MAX_DEPTH,
    max_identifier_bytes: int = DEFAULT_MAX_IDENTIFIER_BYTES,
) -> tuple[InputEvent, Fingerprints | None]:
    """``decode_event`` (same event, same EventRejected) and the native judge's
    fingerprints of it, None where the Python decoder decided."""
    if _native_fingerprints is not None and type(raw) is bytes:
        fingerprints = _native_fingerprints(raw, max_bytes, max_depth, max_identifier_bytes)
        if fingerprints is not None:
            return _EVENT_DECODER.decode(raw), fingerprints
    event = decode_event(
        raw, max_bytes=max_bytes, max_depth=max_depth, max_identifier_bytes=max_identifier_bytes
    )
    return event, None
