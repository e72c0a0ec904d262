//! Canonical JSON (RFC 8785) of values read from the wire, and ECMAScript's number text.
//!
//! What the Python engine's `canonical_json` writes for the same value: strings escaped
//! as JCS (and orjson) escape them, keys in UTF-16 code-unit order, numbers as
//! JavaScript's `String(number)`. Integers beyond 2**53 - 1 (which JavaScript rounds
//! first) give `None`: the Python engine decides them.

use crate::json::Value;

pub const MAX_SAFE_INT: i64 = (1 << 53) - 1;

/// Where the next byte a JSON string cannot hold as it is (`"`, `\\`, a control
/// character) is in `bytes`. Sixteen bytes at a time (SSE2, which every x86-64 has),
/// else eight: most strings have none, or few, and long texts are most of an event.
pub fn find_special(bytes: &[u8]) -> Option<usize> {
    let mut start = 0;
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{
            _mm_cmpeq_epi8, _mm_loadu_si128, _mm_min_epu8, _mm_movemask_epi8, _mm_or_si128,
            _mm_set1_epi8,
        };
        // SAFETY: SSE2 is part of x86-64; every load reads 16 bytes inside `bytes`.
        unsafe {
            let quote = _mm_set1_epi8(b'"' as i8);
            let backslash = _mm_set1_epi8(b'\\' as i8);
            let control = _mm_set1_epi8(0x1f);
            while start + 16 <= bytes.len() {
                let chunk = _mm_loadu_si128(bytes.as_ptr().add(start).cast());
                let special = _mm_or_si128(
                    _mm_or_si128(
                        _mm_cmpeq_epi8(chunk, quote),
                        _mm_cmpeq_epi8(chunk, backslash),
                    ),
                    // unsigned: a byte is a control character iff min(byte, 0x1f) == byte
                    _mm_cmpeq_epi8(_mm_min_epu8(chunk, control), chunk),
                );
                let mask = _mm_movemask_epi8(special);
                if mask != 0 {
                    return Some(start + mask.trailing_zeros() as usize);
                }
                start += 16;
            }
        }
    }
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    while let Some(chunk) = bytes.get(start..start + 8) {
        let word = u64::from_le_bytes(chunk.try_into().expect("eight bytes"));
        let quote = word ^ (ONES * u64::from(b'"'));
        let backslash = word ^ (ONES * u64::from(b'\\'));
        // A byte of `x` is zero (or below n) iff its high bit is set in these.
        let found = (quote.wrapping_sub(ONES) & !quote)
            | (backslash.wrapping_sub(ONES) & !backslash)
            | (word.wrapping_sub(ONES * 0x20) & !word);
        if found & HIGH != 0 {
            break;
        }
        start += 8;
    }
    bytes[start..]
        .iter()
        .position(|&byte| byte == b'"' || byte == b'\\' || byte < 0x20)
        .map(|offset| start + offset)
}

pub fn write_string(out: &mut Vec<u8>, text: &str) {
    out.push(b'"');
    let mut rest = text.as_bytes();
    while let Some(index) = find_special(rest) {
        out.extend_from_slice(&rest[..index]);
        match rest[index] {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            0x08 => out.extend_from_slice(b"\\b"),
            0x09 => out.extend_from_slice(b"\\t"),
            0x0a => out.extend_from_slice(b"\\n"),
            0x0c => out.extend_from_slice(b"\\f"),
            0x0d => out.extend_from_slice(b"\\r"),
            control => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                out.extend_from_slice(b"\\u00");
                out.push(HEX[usize::from(control >> 4)]);
                out.push(HEX[usize::from(control & 0xf)]);
            }
        }
        rest = &rest[index + 1..];
    }
    out.extend_from_slice(rest);
    out.push(b'"');
}

/// ECMAScript's Number::toString of a finite double (RFC 8785 section 3.2.2.3).
pub fn write_number(out: &mut Vec<u8>, number: f64) {
    if number == 0.0 {
        out.push(b'0'); // -0 too
        return;
    }
    if number < 0.0 {
        out.push(b'-');
    }
    // The fewest digits that read back as the same double and, of those, the closest to
    // it, ties to even (what Python's repr gives, and so the Python reference). Rust's
    // shortest form gives how many; its exact form at that many is the closest, ties to
    // even, where that reads back (the shortest form alone may take the other of two
    // equally close: 562949953421312.25 -> ...312.3 where Python writes ...312.2).
    let shortest = format!("{:e}", number.abs());
    let count = shortest
        .split_once('e')
        .map_or(1, |(m, _)| m.bytes().filter(u8::is_ascii_digit).count());
    let exact = format!("{:.*e}", count - 1, number.abs());
    let scientific = if exact.parse::<f64>() == Ok(number.abs()) {
        exact
    } else {
        shortest
    };
    let (mantissa, exponent) = scientific
        .split_once('e')
        .expect("LowerExp writes an exponent");
    let mut digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    while digits.len() > 1 && digits.ends_with('0') {
        digits.pop(); // a carry (9.95 -> 1.0e1) leaves a zero ECMAScript does not write
    }
    let exponent: i32 = exponent
        .parse()
        .expect("LowerExp writes a decimal exponent");
    let k = digits.len() as i32;
    let n = exponent + 1; // the value is 0.<digits> * 10^n
    if k <= n && n <= 21 {
        out.extend_from_slice(digits.as_bytes());
        out.resize(out.len() + (n - k) as usize, b'0');
    } else if 0 < n && n <= 21 {
        out.extend_from_slice(&digits.as_bytes()[..n as usize]);
        out.push(b'.');
        out.extend_from_slice(&digits.as_bytes()[n as usize..]);
    } else if -6 < n && n <= 0 {
        out.extend_from_slice(b"0.");
        out.resize(out.len() + (-n) as usize, b'0');
        out.extend_from_slice(digits.as_bytes());
    } else {
        out.push(digits.as_bytes()[0]);
        if k > 1 {
            out.push(b'.');
            out.extend_from_slice(&digits.as_bytes()[1..]);
        }
        out.push(b'e');
        out.push(if n - 1 < 0 { b'-' } else { b'+' });
        out.extend_from_slice((n - 1).abs().to_string().as_bytes());
    }
}

pub fn write_int(out: &mut Vec<u8>, number: i64) -> Option<()> {
    if !(-MAX_SAFE_INT..=MAX_SAFE_INT).contains(&number) {
        return None;
    }
    out.extend_from_slice(number.to_string().as_bytes());
    Some(())
}

/// Appends the canonical JSON of a value read from the wire; `None` where the Python
/// engine decides.
pub fn write_value(out: &mut Vec<u8>, value: &Value<'_>) -> Option<()> {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(flag) => out.extend_from_slice(if *flag { b"true" } else { b"false" }),
        Value::Int(number) => write_int(out, *number)?,
        Value::Float(number) => write_number(out, *number),
        Value::Str(text) => write_string(out, text),
        Value::Array(items) => {
            out.push(b'[');
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.push(b',');
                }
                write_value(out, item)?;
            }
            out.push(b']');
        }
        Value::Object(entries) => write_object(
            out,
            entries
                .iter()
                .map(|(key, child)| (key.as_ref(), child))
                .collect(),
            write_value,
        )?,
    }
    Some(())
}

/// `{"key":value,...}` with the keys in JCS order ([`sort_keys`]), each value written
/// by `write`: one writer for JSON values and for outcome maps.
pub fn write_object<T>(
    out: &mut Vec<u8>,
    mut entries: Vec<(&str, &T)>,
    write: impl Fn(&mut Vec<u8>, &T) -> Option<()>,
) -> Option<()> {
    sort_keys(&mut entries);
    out.push(b'{');
    for (index, (key, child)) in entries.into_iter().enumerate() {
        if index > 0 {
            out.push(b',');
        }
        write_string(out, key);
        out.push(b':');
        write(out, child)?;
    }
    out.push(b'}');
    Some(())
}

/// JCS orders keys by their UTF-16 code units. That is byte order unless a key holds a
/// character >= U+E000 (which UTF-16 sorts after the surrogates of astral characters).
pub fn sort_keys<T>(entries: &mut [(&str, T)]) {
    if entries
        .iter()
        .all(|(key, _)| key.chars().all(|c| c < '\u{e000}'))
    {
        entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
    } else {
        entries.sort_unstable_by(|a, b| a.0.encode_utf16().cmp(b.0.encode_utf16()));
    }
}
