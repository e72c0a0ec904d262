"""``ops/plain``: an agent's string as an operator sees it, plain and one line."""

from __future__ import annotations

import io
import unicodedata

from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

from loopfuse.streams.ops.plain import shown, shown_all, shown_time, text
from tests.fixtures.hostile_strings import HOSTILE

_HIDDEN = {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"}


def _unescaped(value: str) -> str:
    """The agent's string back from what was shown (uncut): no information lost."""
    return value.encode("latin-1", "backslashreplace").decode("unicode_escape")


def test_controls_bidi_and_format_characters_are_shown_as_escapes() -> None:
    assert shown("a\x1b[31mb\rc\nd\x07e\x7ff\x9bg") == r"a\x1b[31mb\x0dc\x0ad\x07e\x7ff\x9bg"
    assert shown("abc\u202egnp.exe \u2066x\u2069 z\u200bw\ufeff") == (
        r"abc\u202egnp.exe \u2066x\u2069 z\u200bw\ufeff"
    )
    assert shown("half\ud800 one\u2028two") == r"half\ud800 one\u2028two"
    assert shown("café ünïcode 日本") == "café ünïcode 日本"  # printable text stays as it is


def test_a_backslash_is_doubled_so_an_escape_shown_is_never_the_agents_text() -> None:
    assert shown("\\x1b") == r"\\x1b"
    assert shown("\x1b") == r"\x1b"


def test_a_long_value_is_cut_with_an_ellipsis_never_inside_an_escape() -> None:
    assert shown("x" * 200, 10) == "x" * 9 + "…"
    assert shown("x" * 10, 10) == "x" * 10
    assert shown("abcdef\x1b", 10) == r"abcdef\x1b"  # fits whole
    assert shown("abcdefg\x1b", 10) == "abcdefg…"  # does not: never half an escape
    assert shown("x" * 600, None) == "x" * 600
    assert shown(12345) == "12345"


def test_text_is_never_read_as_markup() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, color_system="truecolor", width=200)
    for payload in (
        "[/bold]",
        "[link=https://evil.example]click[/link]",
        "[bold red]x",
        ":warning:",
    ):
        console.print(text(payload))
    assert out.getvalue() == (
        "[/bold]\n[link=https://evil.example]click[/link]\n[bold red]x\n:warning:\n"
    )


@given(st.text(), st.integers(1, 300))
def test_any_string_is_one_printable_line_within_the_limit(value: str, limit: int) -> None:
    cut = shown(value, limit)
    assert len(cut) <= limit
    assert not any(unicodedata.category(c) in _HIDDEN for c in cut)
    whole = shown(value, None)
    assert _unescaped(whole) == value
    assert cut == whole or (cut.endswith("…") and whole.startswith(cut[:-1]))


def test_every_corpus_payload_round_trips() -> None:
    for payload in HOSTILE.values():
        assert _unescaped(shown(payload, None)) == payload


def test_a_sinks_markup_is_shown_in_its_inert_form_cut_whole() -> None:
    markup = {"[": "\\x5b", "\\": "\\x5c"}
    assert shown("[x](https://e.example) \\ \u202e", None, markup) == (
        r"\x5bx](https://e.example) \x5c \u202e"
    )
    assert (
        shown("ab[", 6, markup) == r"ab\x5b" and shown("ab[", 5, markup) == "ab…"
    )  # never half of an inert form
    assert shown("plain", None, markup) == "plain"


def test_shown_all_shows_every_string_of_a_json_value_keys_too() -> None:
    value = {"exec\u202etxt.exe": ["a\x1b", 1, 2.5, None, True, {"k": "v\u2066"}], "n": 2**70}
    assert shown_all(value, None) == {
        r"exec\u202etxt.exe": [r"a\x1b", 1, 2.5, None, True, {"k": r"v\u2066"}],
        "n": str(2**70),  # no JSON writer takes it as a number
    }
    deep: list[object] = []
    for _ in range(300):
        deep = [deep]
    assert "nested too deep" in str(shown_all(deep, None))


def test_shown_time_is_a_date_or_the_number_no_date_can_hold() -> None:
    assert shown_time(0) == "1970-01-01 00:00:00.000"
    assert shown_time(253_402_300_799_999) == "9999-12-31 23:59:59.999"
    assert shown_time(253_402_300_800_000) == "253402300800000 ms"
    assert shown_time(-(2**63)) == "-9223372036854775808 ms"
    assert shown_time(1e300) == shown_time("NaN") == shown_time(True) == shown_time(None) == "-"
