"""Agent-supplied strings as an operator sees them: plain text, every control shown escaped.

Every string in a loop event, a verdict or a dead letter (tool names, agent ids, session
keys, messages) comes from an AI agent or its tools, so it is hostile. Operator tools
show such a value through :func:`shown` (a ``str``) or :func:`text` (a rich ``Text``,
which rich never parses as markup): C0 and C1 controls, DEL, line and paragraph
separators, format characters (bidi overrides, zero-width joiners, soft hyphens) and
lone surrogates appear as ``\\xNN`` / ``\\uNNNN`` escapes, a backslash as ``\\\\`` (so an
escape shown is never the agent's own text), and a long value is cut with ``…``.

A sink with markup of its own (a chat that renders Markdown) passes its ``markup``: the
characters it reads as syntax, each with the inert form it is shown as. :func:`shown_all`
does the same for every string inside a JSON value (the audit report's data, a
notification's ``loop_event``), and :func:`shown_time` writes an event time.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import TypeGuard

from rich.text import Text

from loopfuse.schemas.events import MAX_EVENT_TS

#: Default width of one value in a table cell or a log line, in characters.
LIMIT = 120
#: Unicode categories shown escaped: controls, format characters (bidi, zero-width),
#: surrogates, private use, line / paragraph separators, unassigned code points.
_HIDDEN = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


#: Characters a sink reads as markup, each with the inert text shown in its place.
Markup = Mapping[str, str]
_NO_MARKUP: Markup = {}


def _escape(char: str, markup: Markup = _NO_MARKUP) -> str:
    if char in markup:
        return markup[char]
    if char == "\\":
        return "\\\\"
    code = ord(char)
    if unicodedata.category(char) not in _HIDDEN:
        return char
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def shown(value: object, limit: int | None = LIMIT, markup: Markup = _NO_MARKUP) -> str:
    """``value`` as one line of plain text: controls escaped, each character of
    ``markup`` replaced by its inert form, at most ``limit`` characters (None: whole), a
    cut value ending in ``…``."""
    string = value if isinstance(value, str) else str(value)
    # Fast path: nothing to escape and short enough (most ids).
    if (
        (limit is None or len(string) <= limit)
        and "\\" not in string
        and (string.isascii() and string.isprintable())
        and not any(char in string for char in markup)
    ):
        return string
    pieces: list[str] = []
    width = 0
    for char in string:
        piece = _escape(char, markup)
        if limit is not None and width + len(piece) > limit - 1:
            # Cut only if something is left over; whole escapes, never half of one.
            remaining = "".join(_escape(c, markup) for c in string[len(pieces) :])
            if width + len(remaining) <= limit:
                pieces.append(remaining)
                return "".join(pieces)
            pieces.append("…")
            return "".join(pieces)
        pieces.append(piece)
        width += len(piece)
    return "".join(pieces)


def text(value: object, limit: int | None = LIMIT, style: str = "") -> Text:
    """:func:`shown` as a rich ``Text`` (rich never reads markup in a ``Text``)."""
    return Text(shown(value, limit), style=style)


#: Containers nested deeper than this in a value given to :func:`shown_all` are
#: replaced by :data:`TOO_DEEP` (the value stays small and any JSON writer takes it).
MAX_DEPTH = 8
TOO_DEEP = "(nested too deep to show)"


def shown_all(
    value: object,
    limit: int | None = LIMIT,
    markup: Markup = _NO_MARKUP,
    depth: int = MAX_DEPTH,
) -> object:
    """A JSON-like value with every string in it (object keys too) :func:`shown`;
    numbers, booleans and null as they are, containers below ``depth`` levels replaced
    by :data:`TOO_DEEP`, anything else shown as its text."""
    if isinstance(value, str):
        return shown(value, limit, markup)
    if value is None or isinstance(value, bool | float):
        return value
    if isinstance(value, int):
        # beyond 64 bits a JSON writer refuses it (orjson): its digits, as text
        return value if -(2**63) <= value < 2**64 else shown(value, limit, markup)
    if isinstance(value, dict | list | tuple):
        if depth <= 0:
            return shown(TOO_DEEP, limit, markup)
        if isinstance(value, dict):
            return {
                shown(key, limit, markup): shown_all(item, limit, markup, depth - 1)
                for key, item in value.items()
            }
        return [shown_all(item, limit, markup, depth - 1) for item in value]
    return shown(value, limit, markup)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def is_date(ms: object) -> TypeGuard[int]:
    """Whether ``ms`` is an event time an operator can be shown as a date: an integer of
    epoch milliseconds the wire takes (1970 .. year 9999, ``schemas.events``)."""
    return isinstance(ms, int) and not isinstance(ms, bool) and 0 <= ms <= MAX_EVENT_TS


def shown_time(ms: object) -> str:
    """An event time as a UTC date and time to the millisecond; an integer no date can
    hold (before 1970, after year 9999) as its number of ``ms``; anything else ``-``."""
    if is_date(ms):
        moment = _EPOCH + timedelta(milliseconds=ms)  # exact: ms / 1000 is a float
        return moment.strftime("%Y-%m-%d %H:%M:%S.%f")[:23]
    if isinstance(ms, int) and not isinstance(ms, bool):
        return f"{ms} ms"
    return "-"
