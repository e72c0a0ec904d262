"""What ``loopfuse whatif`` compares: the verdicts issued against a candidate's, per call.

A call is identified the way the worker keys it, within its tenant: the session key,
the gateway incarnation, the run, the call id and ``seq``, and whether the verdict is
an ``abort`` (an abort carries the call id of the call or result it ends the run at,
beside that call's own verdict). Two verdicts of one call differ when their action or
their detector does. Every other number (counts per action and detector, per agent and
tool, the sessions that would newly warn, block or abort) is drawn from those pairs, so
the terminal, the JSON and the HTML report cannot disagree.

Pure: no I/O. The values are the agents' strings as they came; whoever shows them
renders them as plain text (``loopfuse.streams.ops.plain``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

ACTIONS = ("allow", "warn", "block", "abort")
#: The actions a session can newly reach, or no longer (allow is every session's).
LOOP_ACTIONS = ("warn", "block", "abort")
#: The fleet breaker judges across sessions and the fleet: whatif judges sessions alone,
#: so the verdicts it issued are counted apart, never as a change.
FLEET_DETECTOR = "fleet_tool_breaker"

#: Dead letters listed with where their record is (all are counted).
MAX_LETTERS_SHOWN = 100

#: (tenant, session key, incarnation, run id, call id, seq, abort)
CallKey = tuple[str, str, str | None, str | None, str | None, int | None, bool]
#: (tenant, session key)
SessionKey = tuple[str, str]


@dataclass(frozen=True, slots=True)
class Judgement:
    """One verdict's parts that whatif compares and shows."""

    action: str
    detector: str | None
    agent: str | None
    tool: str | None
    message: str | None

    @property
    def label(self) -> str:
        return self.action if self.detector is None else f"{self.action} ({self.detector})"


def _opt_str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def verdict_parts(document: object, tenant: str) -> tuple[CallKey, Judgement] | None:
    """The key and judgement of a verdict document, or None for anything that is not
    a well-formed one (a hostile record on an output topic is skipped, not a crash)."""
    if not isinstance(document, dict) or document.get("type") != "verdict":
        return None
    action = document.get("action")
    session = document.get("session_key")
    seq = document.get("seq")
    if action not in ACTIONS or not isinstance(session, str):
        return None
    if seq is not None and (not isinstance(seq, int) or isinstance(seq, bool)):
        return None
    key: CallKey = (
        tenant,
        session,
        _opt_str(document.get("incarnation")),
        _opt_str(document.get("run_id")),
        _opt_str(document.get("call_id")),
        seq,
        action == "abort",
    )
    return key, Judgement(
        action,
        _opt_str(document.get("detector")),
        _opt_str(document.get("agent_id")),
        _opt_str(document.get("tool_name")),
        _opt_str(document.get("message")),
    )


def _changed(actual: Judgement | None, candidate: Judgement | None) -> bool:
    """Whether a compared pair differs: an abort one side issued and the other did not,
    or another action or detector (the fleet breaker's verdicts are not compared)."""
    if actual is not None and actual.detector == FLEET_DETECTOR:
        return False
    if actual is None or candidate is None:
        return True
    return actual.action != candidate.action or actual.detector != candidate.detector


@dataclass(slots=True)
class _Session:
    agent: str | None = None
    partial: bool = False
    calls: dict[CallKey, tuple[Judgement | None, Judgement | None]] = field(default_factory=dict)


@dataclass
class WhatIf:
    """The comparison of one window: the issued verdicts against the candidate's.

    ``issued`` takes every verdict read from the output topics whose call is in the
    window (the caller decides that); ``judged`` every verdict the candidate gave.
    """

    sessions: dict[SessionKey, _Session] = field(default_factory=dict)
    #: (detector, action, enforced) -> [issued, candidate] loop events
    loop_events: dict[tuple[str, str, bool], list[int]] = field(default_factory=dict)
    dead_letters: Counter[str] = field(default_factory=Counter)
    #: the first dead letters: (code, where its record is: TOPIC[PARTITION]@OFFSET)
    letters: list[tuple[str, str | None]] = field(default_factory=list)
    duplicates: int = 0

    def _session(self, key: CallKey) -> _Session:
        return self.sessions.setdefault((key[0], key[1]), _Session())

    def issued(self, key: CallKey, judgement: Judgement) -> None:
        session = self._session(key)
        before = session.calls.get(key)
        if before is not None and before[0] is not None:
            self.duplicates += 1  # written again (a worker restart): the first counts
            return
        session.calls[key] = (judgement, None if before is None else before[1])
        session.agent = session.agent or judgement.agent

    def judged(self, key: CallKey, judgement: Judgement) -> None:
        session = self._session(key)
        before = session.calls.get(key)
        session.calls[key] = (None if before is None else before[0], judgement)
        session.agent = session.agent or judgement.agent

    def partial(self, session: SessionKey) -> None:
        """Mark a session whose events began before the window (judged from there)."""
        self.sessions.setdefault(session, _Session()).partial = True

    def loop_event(self, detector: str, action: str, enforced: bool, *, candidate: bool) -> None:
        row = self.loop_events.setdefault((detector, action, enforced), [0, 0])
        row[1 if candidate else 0] += 1

    def dead_letter(self, code: str, where: str | None = None) -> None:
        self.dead_letters[code] += 1
        if len(self.letters) < MAX_LETTERS_SHOWN:
            self.letters.append((code, where))

    # -- views ------------------------------------------------------------------------

    def to_dict(self, session_rows: int = 1000) -> dict[str, Any]:
        pairs = 0
        unanswered = 0  # judged by the candidate, no verdict found on the outputs
        unjudged = 0  # issued, the candidate gave none (its event was a dead letter, say)
        fleet = 0
        changed_calls = 0
        by_pair: Counter[tuple[str, str | None, int]] = Counter()
        by_agent: dict[str, list[Counter[str]]] = {}
        by_tool: dict[str, list[Counter[str]]] = {}
        newly: dict[str, list[SessionKey]] = {a: [] for a in LOOP_ACTIONS}
        no_longer: dict[str, list[SessionKey]] = {a: [] for a in LOOP_ACTIONS}
        changed: list[tuple[SessionKey, _Session, int]] = []
        for session_key, session in sorted(self.sessions.items()):
            reached: list[set[str]] = [set(), set()]
            differs = 0
            for call, (actual, candidate) in session.calls.items():
                if actual is not None and actual.detector == FLEET_DETECTOR:
                    fleet += 1
                    continue
                if not call[6]:  # a call's verdict: both sides have one, or it is not compared
                    if actual is None:
                        unanswered += 1
                        continue
                    if candidate is None:
                        unjudged += 1
                        continue
                    pairs += 1
                for side, judgement in enumerate((actual, candidate)):
                    if judgement is None:
                        continue  # an abort one side did not issue
                    by_pair[(judgement.action, judgement.detector, side)] += 1
                    reached[side].add(judgement.action)
                    for rows, name in ((by_agent, judgement.agent), (by_tool, judgement.tool)):
                        counters = rows.setdefault(name or "", [Counter(), Counter()])
                        counters[side][judgement.action] += 1
                if _changed(actual, candidate):
                    differs += 1
            changed_calls += differs
            for action in LOOP_ACTIONS:
                if action in reached[1] and action not in reached[0]:
                    newly[action].append(session_key)
                if action in reached[0] and action not in reached[1]:
                    no_longer[action].append(session_key)
            if differs:
                changed.append((session_key, session, differs))
        changed.sort(key=lambda item: (-item[2], item[0]))

        def side_row(counters: list[Counter[str]]) -> dict[str, Any]:
            return {
                "issued": {a: counters[0][a] for a in ACTIONS},
                "candidate": {a: counters[1][a] for a in ACTIONS},
            }

        def table(rows: dict[str, list[Counter[str]]]) -> list[dict[str, Any]]:
            def weight(counters: list[Counter[str]]) -> int:
                return -sum(abs(counters[1][a] - counters[0][a]) for a in LOOP_ACTIONS)

            ordered = sorted(rows.items(), key=lambda kv: (weight(kv[1]), kv[0]))
            return [{"name": name, **side_row(counters)} for name, counters in ordered]

        detectors = sorted({(a, d) for a, d, _ in by_pair}, key=lambda p: (p[0], p[1] or ""))
        return {
            "totals": {
                "sessions": len(self.sessions),
                "partial_sessions": sum(1 for s in self.sessions.values() if s.partial),
                "calls_compared": pairs,
                "calls_changed": changed_calls,
                "sessions_changed": len(changed),
                "unanswered": unanswered,
                "not_judged": unjudged,
                "fleet_breaker": fleet,
                "duplicates": self.duplicates,
                "dead_letters": sum(self.dead_letters.values()),
            },
            "by_action_detector": [
                {
                    "action": action,
                    "detector": detector,
                    "issued": by_pair[(action, detector, 0)],
                    "candidate": by_pair[(action, detector, 1)],
                }
                for action, detector in detectors
            ],
            "by_agent": table(by_agent),
            "by_tool": table(by_tool),
            "newly": {a: [_session_name(k) for k in keys] for a, keys in newly.items()},
            "no_longer": {a: [_session_name(k) for k in keys] for a, keys in no_longer.items()},
            "loop_events": [
                {
                    "detector": detector,
                    "action": action,
                    "enforced": enforced,
                    "issued": counts[0],
                    "candidate": counts[1],
                }
                for (detector, action, enforced), counts in sorted(self.loop_events.items())
            ],
            "dead_letters": dict(sorted(self.dead_letters.items())),
            "dead_letter_records": [{"code": c, "record": w} for c, w in self.letters],
            "sessions": [_session_view(key, session) for key, session, _ in changed[:session_rows]],
            "sessions_shown": min(len(changed), session_rows),
        }


def _session_name(key: SessionKey) -> dict[str, str]:
    return {"tenant": key[0], "session": key[1]}


def _session_view(key: SessionKey, session: _Session) -> dict[str, Any]:
    calls = []
    ordered = sorted(session.calls.items(), key=lambda kv: (kv[0][5] is None, kv[0][5] or 0, kv[0]))
    for call, (actual, candidate) in ordered:
        either = candidate or actual
        assert either is not None  # a pair has at least one side
        calls.append(
            {
                "run": call[3],
                "call_id": call[4],
                "seq": call[5],
                "tool": either.tool,
                "issued": None if actual is None else actual.label,
                "candidate": None if candidate is None else candidate.label,
                "changed": _changed(actual, candidate)
                and (call[6] or (actual is not None and candidate is not None)),
                "message": None if candidate is None else candidate.message,
            }
        )
    return {
        "tenant": key[0],
        "session": key[1],
        "agent": session.agent,
        "partial": session.partial,
        "calls": calls,
    }
