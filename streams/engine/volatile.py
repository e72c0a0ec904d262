"""Volatile tokens masked out of a tool result before its outcome token is taken.

The ``volatileResults`` rule (docs/configuration.md: Rules): real tool output carries
tokens that change on every call while nothing progresses (timestamps, durations,
request ids, PIDs, ports, temporary paths, ages), so a build retried fifty times never
has the same result twice. Masking them makes "same outcome" mean what a reader means.

The masking is a hand-written scanner, not a regular expression, and
native/src/engine/volatile.rs is the same scanner line for line: both sides must mask
every string identically (the state holds the hash of the masked outcome), and a
scanner over ASCII character classes has no dialect to disagree on. Only ASCII
characters are ever classified, so a non-ASCII character (a code point here, its
UTF-8 bytes there) is an ordinary separator on both sides.

User patterns are literal-prefixed token classes, not regular expressions: a regex
dialect identical in Python's ``re`` and Rust would need a syntax checker of its own,
and a user's regex can backtrack for seconds on one result; a prefix and a class scan
in linear time and mean the same everywhere.

Pass 1, the user's patterns in their order: wherever ``prefix`` occurs, the longest
run of the pattern's class right after it becomes ``<masked>``.

Pass 2, the fixed set, left to right. At a ``/`` not inside a path: a temporary path
(``/tmp/``, ``/var/tmp/``, ``/var/folders/``, ``/private/tmp/``,
``/private/var/folders/`` and the path characters after it) becomes ``<tmp>``. At the
start of a word (an ASCII letter or digit after anything else), the first of these
that ends at a word's end (the end of the text or a character that is not an ASCII
letter or digit):

1. a UUID (8-4-4-4-12 hex digits): ``<uuid>``;
2. an ISO date ``YYYY-MM-DD``, optionally ``T`` or a space and a time; or a time
   ``HH:MM[:SS[(.|,)digits]]``, optionally ``Z`` or ``+HH[[:]MM]`` / ``-HH[[:]MM]``:
   ``<time>``;
3. 10 or more digits, optionally ``.digits`` (epoch seconds to nanoseconds):
   ``<epoch>``;
4. a duration or age: one or more of digits[.digits] followed by a unit
   (``ns``, ``us``, ``ms``, ``s``, ``m``, ``h``, ``d``), as ``3.21s``, ``120ms``,
   ``5m3s``, ``3d``, ``0m0.004s``: ``<duration>``;
5. up to 7 digits after ``pid``, ``ppid``, ``pgid`` or ``tid`` (any case) and one to
   three of space, tab, ``:``, ``=``, ``#``; or inside ``name[...]``: ``<pid>``;
   up to 5 digits after ``port`` so, or after ``localhost:``, an IPv4 address and
   ``:``, or ``]:``: ``<port>``;
6. 12 or more hex digits with a digit among them: ``<hex>``.

Anything else is kept as it is: plain numbers (``3 passed``, ``RESTARTS 4``, a line
count) still tell progress apart.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Final, Literal

TokenClass = Literal["digits", "hex", "alnum", "id"]

_DIGITS: Final = frozenset("0123456789")
_HEX: Final = frozenset("0123456789abcdefABCDEF")
_LETTERS: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
_ALNUM: Final = _DIGITS | _LETTERS
_PATH: Final = _ALNUM | frozenset("_.-/~+@%=")
CLASSES: Final[dict[str, frozenset[str]]] = {
    "digits": _DIGITS,
    "hex": _HEX,
    "alnum": _ALNUM,
    "id": _ALNUM | frozenset("_.-"),
}
_TMP_PREFIXES: Final = (
    "/tmp/",
    "/var/tmp/",
    "/var/folders/",
    "/private/tmp/",
    "/private/var/folders/",
)
_UNITS: Final = ("ns", "us", "ms", "s", "m", "h", "d")  # two letters first: 5ms is not 5m
_PID_WORDS: Final = frozenset({"pid", "ppid", "pgid", "tid"})
_CONTEXT_SEPARATORS: Final = frozenset(" \t:=#")
MASKED: Final = "<masked>"
# Where the scanner can match at all: a word starting with a hex digit (every token of
# the fixed set does) or a slash. Jumping between these is the character loop of
# volatile.rs with the positions that cannot match skipped (Python pays per step).
_CANDIDATES: Final = re.compile(r"(?<![A-Za-z0-9])[0-9A-Fa-f]|/")

Pattern = tuple[str, str]  # (prefix, token class name)


def mask_text(text: str, patterns: tuple[Pattern, ...] = ()) -> str:
    """``text`` with its volatile tokens replaced (the module docstring's two passes)."""
    for prefix, name in patterns:
        text = _mask_prefixed(text, prefix, CLASSES[name])
    return _mask_fixed(text)


def masker(patterns: tuple[Pattern, ...]) -> Callable[[str], str]:
    return lambda text: mask_text(text, patterns)


def mask_value(value: Any, mask: Callable[[str], str]) -> Any:
    """A JSON value with every string in it masked (object keys stay)."""
    if isinstance(value, str):
        return mask(value)
    if isinstance(value, dict):
        return {key: mask_value(child, mask) for key, child in value.items()}
    if isinstance(value, list):
        return [mask_value(child, mask) for child in value]
    return value


def _mask_prefixed(text: str, prefix: str, chars: frozenset[str]) -> str:
    out: list[str] = []
    start = 0
    size = len(text)
    while True:
        found = text.find(prefix, start)
        if found < 0:
            break
        end = found + len(prefix)
        stop = end
        while stop < size and text[stop] in chars:
            stop += 1
        out.append(text[start:end])
        if stop > end:
            out.append(MASKED)
        start = stop
    out.append(text[start:])
    return "".join(out)


def _mask_fixed(text: str) -> str:
    out: list[str] = []
    copied = 0  # text[copied:i] is still to be copied; nothing before it is looked at
    for candidate in _CANDIDATES.finditer(text):
        i = candidate.start()
        if i < copied:
            continue  # inside a token already masked
        if text[i] == "/":
            if (i == 0 or text[i - 1] not in _PATH) and text.startswith(_TMP_PREFIXES, i):
                end = _run(text, i, _PATH)
                out.append(text[copied:i])
                out.append("<tmp>")
                copied = end
            continue
        end, placeholder = _token(text, i)
        if end:
            out.append(text[copied:i])
            out.append(placeholder)
            copied = end
    out.append(text[copied:])
    return "".join(out)


def _run(text: str, start: int, chars: frozenset[str]) -> int:
    """Where the run of ``chars`` from ``start`` ends."""
    end = start
    while end < len(text) and text[end] in chars:
        end += 1
    return end


def _fixed(text: str, at: int, shape: str) -> bool:
    """Whether ``text[at:]`` starts with ``shape``: ``9`` a digit, ``x`` a hex digit,
    anything else itself."""
    if at + len(shape) > len(text):
        return False
    for offset, want in enumerate(shape):
        c = text[at + offset]
        if want == "9":
            if c not in _DIGITS:
                return False
        elif want == "x":
            if c not in _HEX:
                return False
        elif c != want:
            return False
    return True


def _word_end(text: str, at: int) -> bool:
    return at >= len(text) or text[at] not in _ALNUM


def _token(text: str, i: int) -> tuple[int, str]:
    """(end, placeholder) of the volatile token at the word start ``i``, else (0, "")."""
    if _fixed(text, i, "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx") and _word_end(text, i + 36):
        return i + 36, "<uuid>"
    end = _timestamp(text, i)
    if end and _word_end(text, end):
        return end, "<time>"
    digits = _run(text, i, _DIGITS) - i
    if digits >= 10:
        end = i + digits
        if _fixed(text, end, ".9"):
            end = _run(text, end + 1, _DIGITS)
        if _word_end(text, end):
            return end, "<epoch>"
    if digits:
        end = _duration(text, i)
        if end and _word_end(text, end):
            return end, "<duration>"
        end = i + digits
        if _word_end(text, end):
            context = _context(text, i, end)
            if context == "pid" and digits <= 7:
                return end, "<pid>"
            if context == "port" and digits <= 5:
                return end, "<port>"
    end = _run(text, i, _HEX)
    if end - i >= 12 and _word_end(text, end) and any(c in _DIGITS for c in text[i:end]):
        return end, "<hex>"
    return 0, ""


def _time(text: str, at: int) -> int:
    if not _fixed(text, at, "99:99"):
        return 0
    end = at + 5
    if _fixed(text, end, ":99"):
        end += 3
        if _fixed(text, end, ".9") or _fixed(text, end, ",9"):
            end = _run(text, end + 1, _DIGITS)
    if end < len(text) and text[end] == "Z":
        return end + 1
    if _fixed(text, end, "+99") or _fixed(text, end, "-99"):
        end += 3
        if _fixed(text, end, ":99"):
            end += 3
        elif _fixed(text, end, "99"):
            end += 2
    return end


def _timestamp(text: str, at: int) -> int:
    if _fixed(text, at, "9999-99-99"):
        end = at + 10
        if end < len(text) and text[end] in "T ":
            time = _time(text, end + 1)
            if time:
                return time
        return end
    return _time(text, at)


def _duration(text: str, at: int) -> int:
    """The end of one or more number-unit pairs from ``at``, else 0."""
    end = 0
    pos = at
    while pos < len(text) and text[pos] in _DIGITS:
        pos = _run(text, pos, _DIGITS)
        if _fixed(text, pos, ".9"):
            pos = _run(text, pos + 1, _DIGITS)
        unit = next((u for u in _UNITS if text.startswith(u, pos)), None)
        if unit is None:
            break
        pos += len(unit)
        end = pos
    return end


def _context(text: str, start: int, end: int) -> Literal["pid", "port", ""]:
    """What the number ``text[start:end]`` is by what stands before it."""
    if (
        start > 1
        and text[start - 1] == "["
        and text[start - 2] in _ALNUM
        and end < len(text)
        and text[end] == "]"
    ):
        return "pid"
    if start > 0 and text[start - 1] == ":":
        host = start - 1
        if host >= 1 and text[host - 1] == "]":
            return "port"
        if host >= 9 and text.startswith("localhost", host - 9) and _not_word(text, host - 10):
            return "port"
        if _ipv4_before(text, host):
            return "port"
    # keywords: one to three separators back, then the word before them
    word_end = start
    while word_end > 0 and start - word_end < 3 and text[word_end - 1] in _CONTEXT_SEPARATORS:
        word_end -= 1
    if word_end == start:
        return ""
    word_start = word_end
    while word_start > 0 and text[word_start - 1] in _ALNUM:
        word_start -= 1
    word = text[word_start:word_end].lower()
    if word in _PID_WORDS:
        return "pid"
    if word == "port":
        return "port"
    return ""


def _not_word(text: str, at: int) -> bool:
    """Whether ``text[at]`` is not a letter or digit (or before the text)."""
    return at < 0 or text[at] not in _ALNUM


def _ipv4_before(text: str, end: int) -> bool:
    """Whether ``text[:end]`` ends with four dot-separated groups of 1-3 digits."""
    pos = end
    for group in range(4):
        digits_end = pos
        while pos > 0 and digits_end - pos < 3 and text[pos - 1] in _DIGITS:
            pos -= 1
        if pos == digits_end:
            return False
        if group < 3:
            if pos == 0 or text[pos - 1] != ".":
                return False
            pos -= 1
    return _not_word(text, pos - 1) and (pos == 0 or text[pos - 1] != ".")
