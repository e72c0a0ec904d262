"""What every written format carries: version 4's body (the state but its head, as
msgspec writes and reads it in C), the head, the persisted enums, and the state built
back from a body and checked. Format 5 is the same fields, compact
(:mod:`~loopfuse.streams.engine.state_codec.v5`).
"""

from __future__ import annotations

import struct
from typing import Final, NamedTuple

import msgspec

from loopfuse.schemas.events import Action, Detector, InputEvent
from loopfuse.streams.engine.history import Record
from loopfuse.streams.engine.rule_state import decode_rule_state, encode_rule_state
from loopfuse.streams.engine.state import (
    Decision,
    EventAtRest,
    Guard,
    ResultAtRest,
    SessionState,
)
from loopfuse.streams.engine.state_codec.varint import read_uvarint, write_uvarint

# Persisted enums: a decision is stored as indexes into these tuples. Append only -
# never reorder or remove an entry, or states already written would read back as
# other verdicts.
ACTIONS: Final[tuple[Action, ...]] = ("allow", "warn", "block", "abort")
DETECTORS: Final[tuple[Detector | None, ...]] = (
    None,
    "unknown_tool_repeat",
    "global_circuit_breaker",
    "known_poll_no_progress",
    "ping_pong",
    "generic_repeat",
    "compaction_loop_persisted",
    "sequence_gap",
    # opt-in rules (docs/configuration.md: Rules)
    "tool_loop_run_ended",
    "cycle",
    "repeated_failure",
    "argument_churn",
    "run_call_cap",
    "token_budget",
    "cost_budget",
    "fleet_tool_breaker",  # the fleet-wide tool breaker
    "identical_calls",
)
ACTION_CODE: Final = {name: code for code, name in enumerate(ACTIONS)}
DETECTOR_CODE: Final = {name: code for code, name in enumerate(DETECTORS)}

HEAD: Final = struct.Struct("<Bqq")  # version, touched_ms, last_event_ms
U64: Final = struct.Struct("<Q")


class StateTooLarge(ValueError):
    """A session's state does not fit its byte cap even with everything sheddable gone."""


class Body(NamedTuple):
    """Version 4's body, one MessagePack array: the state but its head, as msgspec writes
    and reads it in C. Typed, so that a field of another type is refused as the bytes
    are read, not met by the engine later."""

    next_seq: int  # + 1; 0 for None
    verdict_floor: int
    incarnation: int
    history: list[Record]
    # run key -> (window, remaining, (tool, sig, result) of the first result, broken)
    guards: dict[int, tuple[int, int, tuple[str, int, int] | None, bool]]
    warnings: dict[int, tuple[int, int]]
    seen_ids: list[int]
    # (event, ACTIONS index, DETECTORS index, count, detail, seq)
    decisions: list[tuple[int, int, int, int, str | None, int]]
    parked: dict[int, bytes]  # seq -> the event's JSON
    skipped: list[tuple[int, int]]
    retired: list[tuple[int, int]]
    pending: list[bytes]  # the events' JSON
    rules: bytes  # loopfuse.streams.engine.rule_state's bytes; empty: no rule touched it


BODY_DECODER: Final = msgspec.msgpack.Decoder(Body)
# Events at rest as JSON (loopfuse.streams.engine.state.encode_event; formats 1 to 3 kept JSON
# too, written by the pydantic models then: the same fields, which this reads back; a
# result without ``failure``, written before it was kept, reads as None).
_EVENT_DECODER: Final = msgspec.json.Decoder(EventAtRest)


def rules_bytes(state: SessionState) -> bytes:
    """The opt-in rules' tallies as a body carries them; empty: no rule touched it."""
    if state.rules is None or state.rules.empty():
        return b""
    out = bytearray()
    encode_rule_state(out, state.rules, write_uvarint)
    return bytes(out)


def state_of_body(body: Body, touched_ms: int, last_event_ms: int) -> SessionState:
    state = SessionState(
        history=body.history,
        warnings=body.warnings,
        next_seq=None if body.next_seq == 0 else body.next_seq - 1,
        skipped=body.skipped,
        seen_ids=body.seen_ids,
        verdict_floor=body.verdict_floor,
        touched_ms=touched_ms,
        last_event_ms=last_event_ms,
        incarnation=body.incarnation,
        retired=body.retired,
    )
    for run, (window, remaining, first, broken) in body.guards.items():
        state.guards[run] = Guard(window, remaining, first, broken)
    if body.decisions:
        for _event, action, detector, _count, _detail, _seq in body.decisions:
            # a negative index would read from the end: corrupt, as one past the end is
            if not (0 <= action < len(ACTIONS) and 0 <= detector < len(DETECTORS)):
                raise ValueError("corrupt session state: a decision's action or detector")
        state.decisions = [
            Decision(event, ACTIONS[action], DETECTORS[detector], count, detail, seq)
            for event, action, detector, count, detail, seq in body.decisions
        ]
    for seq, text in body.parked.items():
        state.park_as_read(seq, event_from_json(text), text)
    state.pending.extend(map(event_from_json, body.pending))
    if body.rules:
        state.rules, pos = decode_rule_state(body.rules, 0, read_uvarint)
        if pos != len(body.rules):
            raise ValueError(f"session state has {len(body.rules) - pos} trailing bytes")
    return state


def event_from_json(text: bytes) -> InputEvent:
    """An event at rest (kept as its JSON, fingerprints only)."""
    try:
        event: InputEvent = _EVENT_DECODER.decode(text)
    except msgspec.MsgspecError as exc:
        raise ValueError(f"corrupt session state: an event at rest: {exc}") from None
    if type(event) is ResultAtRest and event.failure is not None and event.failure >> 64:
        raise ValueError("corrupt session state: a failure identity beyond 64 bits")
    return event
