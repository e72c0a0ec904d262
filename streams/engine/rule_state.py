"""What the opt-in rules remember of a session, and its bytes.

Kept apart from the history so that a session no rule touches has none of it: its
state is then byte for byte what it was before the rules existed. When there is
some, it is written after the version-3 body as a tagged trailer, which readers of
version 3 without rules never meet (additive: old bytes still decode).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field

MAX_RUN_TALLIES = 32  # runs counted per session, oldest dropped first (like MAX_GUARDS)
MAX_FAILURE_STREAKS = 64  # (run, tool) failure identities per session, oldest dropped first

_TRAILER_TAG = 0x52  # "R": a byte no version-3 body ends with before its end
_TRAILER_VERSION = 1
# Version 2 adds the identical-call streaks at the end; a state without any is written
# as version 1, byte for byte what it was before the streaks existed.
_TRAILER_VERSION_STREAKS = 2
_U64 = struct.Struct("<Q")
_F64 = struct.Struct("<d")
# The varint codec is state.py's, passed in, so that this module needs nothing of it.
_Writer = Callable[[bytearray, int], None]
_Reader = Callable[[bytes, int], tuple[int, int]]


@dataclass(slots=True)
class RunTally:
    """One run's counters: calls judged, criticals, the blocked streak and its spend."""

    calls: int = 0
    criticals: int = 0
    blocked_streak: int = 0
    tokens: int = 0
    cost: float = 0.0


@dataclass(slots=True)
class RuleState:
    # run_key(run) -> its tally; insertion order = age (at most MAX_RUN_TALLIES)
    runs: dict[int, RunTally] = field(default_factory=dict)
    # (run_key(run), hash of the tool name) -> (error fingerprint, consecutive count)
    failures: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)
    session_tokens: int = 0
    session_cost: float = 0.0
    # run_key(run) -> (signature of its latest call, how many in a row); insertion
    # order = age (at most MAX_RUN_TALLIES)
    identical: dict[int, tuple[int, int]] = field(default_factory=dict)

    def identical_streak(self, run: int, sig: int) -> int:
        """How many calls of ``sig`` in a row the run has made, this one not counted."""
        streak = self.identical.get(run)
        return streak[1] if streak is not None and streak[0] == sig else 0

    def note_call(self, run: int, sig: int) -> None:
        count = self.identical_streak(run, sig) + 1
        self.identical.pop(run, None)  # re-inserted: the newest
        self.identical[run] = (sig, count)
        if len(self.identical) > MAX_RUN_TALLIES:
            del self.identical[next(iter(self.identical))]

    def tally(self, run: int) -> RunTally:
        """The run's tally, created (and the oldest dropped past the cap) if new."""
        found = self.runs.get(run)
        if found is None:
            found = self.runs[run] = RunTally()
            if len(self.runs) > MAX_RUN_TALLIES:
                del self.runs[next(iter(self.runs))]
        return found

    def note_failure(self, key: tuple[int, int], error: int) -> None:
        previous = self.failures.pop(key, None)  # re-inserted: the newest
        count = previous[1] + 1 if previous is not None and previous[0] == error else 1
        self.failures[key] = (error, count)
        if len(self.failures) > MAX_FAILURE_STREAKS:
            del self.failures[next(iter(self.failures))]

    def forget_run(self, run: int) -> None:
        self.runs.pop(run, None)
        for key in [key for key in self.failures if key[0] == run]:
            del self.failures[key]
        self.identical.pop(run, None)

    def sheddable(self) -> bool:
        return bool(self.runs or self.failures or self.identical)

    def shed(self) -> None:
        """Drop the older half of the tallies and failure identities (SessionState.fit)."""
        for run in list(self.runs)[: max(1, len(self.runs) // 2)] if self.runs else []:
            del self.runs[run]
        for key in list(self.failures)[: max(1, len(self.failures) // 2)] if self.failures else []:
            del self.failures[key]
        for run in (
            list(self.identical)[: max(1, len(self.identical) // 2)] if self.identical else []
        ):
            del self.identical[run]

    def empty(self) -> bool:
        return not (
            self.runs or self.failures or self.session_tokens or self.session_cost or self.identical
        )


def encode_rule_state(out: bytearray, rules: RuleState, uvarint: _Writer) -> None:
    out.append(_TRAILER_TAG)
    uvarint(out, _TRAILER_VERSION_STREAKS if rules.identical else _TRAILER_VERSION)
    uvarint(out, len(rules.runs))
    for run, tally in rules.runs.items():
        out += _U64.pack(run)
        uvarint(out, tally.calls)
        uvarint(out, tally.criticals)
        uvarint(out, tally.blocked_streak)
        uvarint(out, tally.tokens)
        out += _F64.pack(tally.cost)
    uvarint(out, len(rules.failures))
    for (run, tool), (error, count) in rules.failures.items():
        out += struct.pack("<QQQ", run, tool, error)
        uvarint(out, count)
    uvarint(out, rules.session_tokens)
    out += _F64.pack(rules.session_cost)
    if rules.identical:
        uvarint(out, len(rules.identical))
        for run, (sig, count) in rules.identical.items():
            out += struct.pack("<QQ", run, sig)
            uvarint(out, count)


def decode_rule_state(data: bytes, pos: int, read_uvarint: _Reader) -> tuple[RuleState, int]:
    if data[pos] != _TRAILER_TAG:
        raise ValueError(f"session state has {len(data) - pos} trailing bytes")
    version, pos = read_uvarint(data, pos + 1)
    if version not in (_TRAILER_VERSION, _TRAILER_VERSION_STREAKS):
        raise ValueError(f"unknown rule state format {version}")
    rules = RuleState()
    count, pos = read_uvarint(data, pos)
    for _ in range(count):
        run = _U64.unpack_from(data, pos)[0]
        tally = RunTally()
        tally.calls, pos = read_uvarint(data, pos + 8)
        tally.criticals, pos = read_uvarint(data, pos)
        tally.blocked_streak, pos = read_uvarint(data, pos)
        tally.tokens, pos = read_uvarint(data, pos)
        tally.cost = _F64.unpack_from(data, pos)[0]
        pos += 8
        rules.runs[run] = tally
    count, pos = read_uvarint(data, pos)
    for _ in range(count):
        run, tool, error = struct.unpack_from("<QQQ", data, pos)
        streak, pos = read_uvarint(data, pos + 24)
        rules.failures[(run, tool)] = (error, streak)
    rules.session_tokens, pos = read_uvarint(data, pos)
    rules.session_cost = _F64.unpack_from(data, pos)[0]
    pos += 8
    if version == _TRAILER_VERSION_STREAKS:
        count, pos = read_uvarint(data, pos)
        for _ in range(count):
            run, sig = struct.unpack_from("<QQ", data, pos)
            streak, pos = read_uvarint(data, pos + 16)
            rules.identical[run] = (sig, streak)
    return rules, pos
