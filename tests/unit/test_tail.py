"""``loopfuse tail``'s memory of ids shown: a repeat is dropped, the memory stays bounded."""

from __future__ import annotations

from loopfuse.streams.ops.tail import SeenIds


def test_a_repeat_is_seen_and_the_oldest_id_is_forgotten_past_the_limit() -> None:
    seen = SeenIds(limit=3)
    assert [seen.again(i) for i in ("a", "b", "a", "c", "d")] == [False, False, True, False, False]
    assert len(seen) == 3  # "b" went first: "a" was seen again after it
    assert [seen.again(i) for i in ("a", "c", "d", "b")] == [True, True, True, False]
    assert seen.again(None) is False and seen.again(None) is False  # no id: never a repeat
    for i in range(10_000):
        seen.again(str(i))
    assert len(seen) == 3
