"""The volatileResults rule's masking: what it masks, and the native scanner held to volatile.py.

Both engines keep the hash of the masked outcome in the state, so the two scanners must
mask every string alike: hypothesis draws strings from fragments that sit on every
edge of the fixed set (a timestamp one digit short, a duration with a letter after it,
a port after a non-address, non-ASCII around tokens) and the user's prefixed classes.
"""

from __future__ import annotations

from types import ModuleType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loopfuse.streams.engine.volatile import mask_text
from tests.fixtures.hostile_strings import HOSTILE

MASKED = [
    ("1 passed in 3.21s", "1 passed in <duration>"),
    ("took 120ms, real 0m0.004s", "took <duration>, real <duration>"),
    (
        "web-7d9f8b6c5d-x2x4q   1/1   Running   0   5m3s",
        "web-7d9f8b6c5d-x2x4q   1/1   Running   0   <duration>",
    ),
    ("[2026-12-01T10:11:12.123Z] start", "[<time>] start"),
    ("2026-12-01 10:11:12,345 INFO", "<time> INFO"),
    ("Date: Tue, 01 Dec 2026 10:11:12 GMT", "Date: Tue, 01 Dec 2026 <time> GMT"),
    ("ts=1790000000123", "ts=<epoch>"),
    ("x-request-id: 3f2b8c1e-1a2b-4c3d-9e8f-0123456789ab", "x-request-id: <uuid>"),
    ("container 4f3a9c2e1b0d9a8b exited", "container <hex> exited"),
    ("Process Group PGID: 48213", "Process Group PGID: <pid>"),
    ("sshd[4242]: accepted; pid=77", "sshd[<pid>]: accepted; pid=<pid>"),
    (
        "Connected to localhost (127.0.0.1) port 8080",
        "Connected to localhost (127.0.0.1) port <port>",
    ),
    (
        "listening on 127.0.0.1:54321 and localhost:3000",
        "listening on 127.0.0.1:<port> and localhost:<port>",
    ),
    ("wrote /tmp/tmp.aB3dE9/out.log and /var/folders/x1/T/y", "wrote <tmp> and <tmp>"),
]
KEPT = [
    "3 passed, 1 failed",  # counts are progress
    "RESTARTS 4",
    "v1.2.3 12:3 5mb 3days deadbeef",  # almost a token: kept whole
    "/home/me/tmp/x",  # not a temporary directory
    "commit 3f2a1bc",  # a short sha
    "1234.0.0.1:80",  # not an address
]


@pytest.mark.parametrize(("text", "masked"), MASKED)
def test_volatile_tokens_are_masked(text: str, masked: str) -> None:
    assert mask_text(text) == masked


@pytest.mark.parametrize("text", KEPT)
def test_what_tells_progress_apart_is_kept(text: str) -> None:
    assert mask_text(text) == text


def test_a_user_pattern_masks_the_run_of_its_class_after_its_prefix() -> None:
    patterns = (("req_", "alnum"), ("build #", "digits"))
    assert mask_text("req_8sdf7SDF8 build #4101 req_", patterns) == (
        "req_<masked> build #<masked> req_"
    )


_FRAGMENTS = st.sampled_from(
    [
        "2026-12-01",
        "T",
        " ",
        "10:11",
        ":12",
        ".5",
        ",345",
        "Z",
        "+01:00",
        "-0500",
        "3",
        "21",
        "1790000000",
        "123",
        ".",
        "s",
        "ms",
        "m",
        "h",
        "d",
        "us",
        "x",
        "3f2b8c1e",
        "-1a2b",
        "-4c3d",
        "-9e8f",
        "-0123456789ab",
        "deadbeef0123",
        "pid",
        "PGID",
        "port",
        ": ",
        "=",
        "#",
        "[",
        "]",
        "sshd",
        "localhost",
        ":",
        "127.0.0.1",
        "/tmp/",
        "/var/folders/",
        "tmp.aB3",
        "/",
        "req_",
        "é",
        "ünï",
        "\n",
        "\t",
        "_",
        "-",
        "A",
        "F",
    ]
)
_TEXTS = st.one_of(
    st.lists(_FRAGMENTS, max_size=24).map("".join),
    st.sampled_from(list(HOSTILE.values())),
    st.text(max_size=40),
)
_PATTERNS = st.lists(
    st.tuples(
        st.sampled_from(["req_", "#", "job ", "id=", "x"]),
        st.sampled_from(["digits", "hex", "alnum", "id"]),
    ),
    max_size=3,
).map(tuple)


@settings(max_examples=1_500, deadline=None)
@given(_TEXTS, _PATTERNS)
def test_the_native_scanner_masks_as_python_does(
    native: ModuleType, text: str, patterns: tuple[tuple[str, str], ...]
) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        assert native.mask_volatile(text, list(patterns)) is None  # a lone surrogate
        return
    assert native.mask_volatile(text, list(patterns)) == mask_text(text, patterns)
