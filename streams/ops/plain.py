"""Agent-supplied strings as an operator sees them: plain text, every control shown escaped.

Every string in a loop event, a verdict or a dead letter (tool names, agent ids, session
keys, messages) comes from an AI agent or its tools, so it is hostile. Operator tools
show such a value through :func:`shown` (a ``str``) or :func:`text` (a rich ``Text``,
which rich never parses as markup): C0 and C1 controls, DEL, line and paragraph
separators, format characters (bidi overrides, zero-width joiners, soft hyphens) and
lone surrogates appear as ``\\xNN`` / ``\\uNNNN`` escapes, a backslash as ``\\\\`` (so an
escape shown is never the agent's own text), and a long value is cut with ``…``.
"""

from __future__ import annotations

import unicodedata

from rich.text import Text

#: Default width of one value in a table cell or a log line, in characters.
LIMIT = 120
#: Unicode categories shown escaped: controls, format characters (bidi, zero-width),
#: surrogates, private use, line / paragraph separators, unassigned code points.
_HIDDEN = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


def _escape(char: str) -> str:
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


def shown(value: object, limit: int | None = LIMIT) -> str:
    """``value`` as one line of plain text: controls escaped, at most ``limit``
    characters (None: whole), a cut value ending in ``…``."""
    string = value if isinstance(value, str) else str(value)
    # Fast path: nothing to escape and short enough (most ids).
    if (
        (limit is None or len(string) <= limit)
        and "\\" not in string
        and (string.isascii() and string.isprintable())
    ):
        return string
    pieces: list[str] = []
    width = 0
    for char in string:
        piece = _escape(char)
        if limit is not None and width + len(piece) > limit - 1:
            # Cut only if something is left over; whole escapes, never half of one.
            remaining = "".join(_escape(c) for c in string[len(pieces) :])
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
