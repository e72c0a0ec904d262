"""Varints of the state bytes: LEB128 unsigned, zigzag signed, and counts that cannot
exceed the bytes left (so corrupt data never allocates or loops for long).

The ``*64`` forms are format 5's: at most 64 bits, as the native codec reads them;
the others are the older formats', and the opt-in rules' tallies
(:mod:`loopfuse.streams.engine.rule_state`).
"""

from __future__ import annotations

from typing import Final

I64_MIN: Final = -(1 << 63)
I64_MAX: Final = (1 << 63) - 1


def write_uvarint(out: bytearray, value: int) -> None:
    if value < 0x80:  # most counts and small numbers: one byte
        out.append(value)
        return
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def write_uvarint64(out: bytearray, value: int) -> None:
    """A uvarint of format 5: at most 64 bits, as the native codec reads them."""
    if 0 <= value < 0x80:
        out.append(value)
        return
    if value >> 64 or value < 0:
        raise OverflowError(f"{value} is not a 64-bit unsigned int")
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def write_svarint64(out: bytearray, value: int) -> None:
    """A zigzag varint of a 64-bit signed int (small either side of 0: one byte)."""
    if not I64_MIN <= value <= I64_MAX:
        raise OverflowError(f"{value} is not a 64-bit signed int")
    write_uvarint64(out, (value << 1) if value >= 0 else ((-value) << 1) - 1)


def read_uvarint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


def read_count(data: bytes, pos: int) -> tuple[int, int]:
    """A length or an item count: each item takes a byte at least, so more than the
    bytes left means corrupt data (and must not allocate or loop for that long)."""
    count, pos = read_uvarint(data, pos)
    if count > len(data) - pos:
        raise ValueError(f"corrupt session state: a count of {count} at byte {pos}")
    return count, pos


def read_svarint(data: bytes, pos: int) -> tuple[int, int]:
    raw, pos = read_uvarint(data, pos)
    return (raw >> 1) if not raw & 1 else -((raw + 1) >> 1), pos


def read_uvarint64(data: bytes, pos: int) -> tuple[int, int]:
    """A uvarint of format 5: more than 64 bits is corrupt (the native codec's limit)."""
    byte = data[pos]
    if byte < 0x80:  # most refs and counts
        return byte, pos + 1
    value, end = read_uvarint(data, pos)
    if value >> 64 or end - pos > 10:
        raise ValueError(f"corrupt session state: a varint of more than 64 bits at byte {pos}")
    return value, end


def read_count64(data: bytes, pos: int) -> tuple[int, int]:
    """A count of format 5 (:func:`read_count` of a 64-bit varint)."""
    count, pos = read_uvarint64(data, pos)
    if count > len(data) - pos:
        raise ValueError(f"corrupt session state: a count of {count} at byte {pos}")
    return count, pos


def read_svarint64(data: bytes, pos: int) -> tuple[int, int]:
    raw, pos = read_uvarint64(data, pos)
    return (raw >> 1) if not raw & 1 else -((raw + 1) >> 1), pos
