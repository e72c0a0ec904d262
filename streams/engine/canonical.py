"""Canonical JSON per RFC 8785 (JCS): the bytes that call and result fingerprints hash.

The reference implementation is the ``rfc8785`` package. It is exact but pure Python
(~10 µs for a small dict, ~65 µs for a 10 KB result). orjson with sorted keys produces
the very same bytes for most real payloads, 10-60x faster, and differs from JCS in
only three places, which the fast path checks for before trusting it:

* floats: orjson writes ``1.0`` and ``1e16`` where ECMAScript writes ``1`` and
  ``10000000000000000``;
* integers beyond 2**53: JavaScript (OpenClaw) only has doubles, so they must be
  rounded to the nearest double first;
* key order: orjson sorts by code point, JCS by UTF-16 code unit. The two agree
  unless a key holds a character >= U+E000 (which UTF-16 sorts after astral
  characters' surrogates).

tests/unit/test_canonical.py holds both paths to the same bytes on a broad corpus.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
import rfc8785

from loopfuse.streams.engine.native import NATIVE

_MAX_SAFE_INT = 2**53 - 1
_BMP_SAFE_LIMIT = "\ue000"
_SORT = orjson.OPT_SORT_KEYS


def _fast_path_ok(value: Any) -> bool:
    kind = type(value)
    if kind is str or kind is bool or value is None:
        return True
    if kind is int:
        return bool(-_MAX_SAFE_INT <= value <= _MAX_SAFE_INT)
    if kind is dict:
        for key, child in value.items():
            if not key.isascii() and max(key) >= _BMP_SAFE_LIMIT:
                return False
            # Strings are most leaves: test them inline rather than by a call.
            if type(child) is not str and not _fast_path_ok(child):
                return False
        return True
    if kind is list:
        for child in value:  # noqa: SIM110 - a loop, not all(): no generator per list
            if type(child) is not str and not _fast_path_ok(child):
                return False
        return True
    return False  # floats, and anything that is not plain JSON


def _as_javascript(value: Any) -> Any:
    """What JSON.parse would have made of the value: big ints become doubles."""
    kind = type(value)
    if kind is int and not -_MAX_SAFE_INT <= value <= _MAX_SAFE_INT:
        try:
            return float(value)
        except OverflowError:
            return None  # JSON.parse gives Infinity, which JSON.stringify writes as null
    if kind is dict:
        return {key: _as_javascript(child) for key, child in value.items()}
    if kind is list or kind is tuple:
        return [_as_javascript(child) for child in value]
    return value


#: The native judge's canonical JSON (None for what it leaves to the code below), when built.
_native_canonical: Callable[[Any], bytes | None] | None = (
    None if NATIVE is None else NATIVE.canonical_json
)


def canonical_json(value: Any) -> bytes:
    """RFC 8785 bytes of a JSON value (as decoded from the wire)."""
    if _native_canonical is not None and (native := _native_canonical(value)) is not None:
        return native
    return pure_canonical_json(value)


def pure_canonical_json(value: Any) -> bytes:
    """:func:`canonical_json` in Python: the reference the native judge is held to."""
    if _fast_path_ok(value):
        try:
            return orjson.dumps(value, option=_SORT)
        except orjson.JSONEncodeError:
            pass  # e.g. a lone surrogate: let the reference implementation decide
    return rfc8785.dumps(_as_javascript(value))
