"""Version 4: the head, then one MessagePack array written and read by msgspec in C
(its fields: :class:`~loopfuse.streams.engine.state_codec.body.Body`). The format the
pure engine writes; its layout is in docs/wire-format.md (Session state bytes).
"""

from __future__ import annotations

from typing import Final

import msgspec

from loopfuse.streams.engine.state import SessionState, encode_event
from loopfuse.streams.engine.state_codec.body import (
    ACTION_CODE,
    BODY_DECODER,
    DETECTOR_CODE,
    HEAD,
    rules_bytes,
    state_of_body,
)

_BODY_ENCODER: Final = msgspec.msgpack.Encoder()


def body_of(state: SessionState) -> bytes:
    """Version 4's body: the state but its head, in one msgspec call."""
    rules = rules_bytes(state)
    # _Body's fields, as a tuple (written alike): the history as its records' bytes
    return _BODY_ENCODER.encode(
        (
            0 if state.next_seq is None else state.next_seq + 1,
            state.verdict_floor,
            state.incarnation,
            msgspec.Raw(state.history_bytes()),
            {
                run: (guard.window, max(guard.remaining, 0), guard.first, guard.broken)
                for run, guard in state.guards.items()
            }
            if state.guards
            else {},
            state.warnings,
            state.seen_ids,
            [
                (
                    d.event,
                    ACTION_CODE[d.action],
                    DETECTOR_CODE[d.detector],
                    d.count,
                    d.detail,
                    d.seq,
                )
                for d in state.decisions
            ],
            state.parked_json() if state.parked else {},
            state.skipped,
            state.retired,
            list(map(encode_event, state.pending)),
            rules,
        )
    )


def read(data: bytes) -> tuple[SessionState, int]:
    """The head, then the body in one msgspec call."""
    _, touched_ms, last_event_ms = HEAD.unpack_from(data, 0)
    body = BODY_DECODER.decode(memoryview(data)[HEAD.size :])
    return state_of_body(body, touched_ms, last_event_ms), len(data)
