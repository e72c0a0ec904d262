//! A strict JSON reader for one input event: a tree borrowing the wire bytes.
//!
//! It reads only what it is sure the Python decoder reads the same way, and gives up
//! (`None`) on everything else: invalid UTF-8, any grammar error, a lone surrogate
//! escape, a duplicate key, an integer outside i64, a number that is not a finite
//! double, nesting beyond the bound. Giving up is never a rejection: the Python
//! decoder then decides, and words the rejection, as it always did.

use std::borrow::Cow;
use std::collections::HashSet;

use crate::canonical::find_special;

pub enum Value<'a> {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(Cow<'a, str>),
    Array(Vec<Value<'a>>),
    /// Keys in wire order (a Python dict keeps them so), none twice.
    Object(Vec<(Cow<'a, str>, Value<'a>)>),
}

impl<'a> Value<'a> {
    /// The value of `key` in an object (what `dict.get` gives), else None.
    pub fn get(&self, key: &str) -> Option<&Value<'a>> {
        match self {
            Value::Object(entries) => entries.iter().find(|(name, _)| name == key).map(|e| &e.1),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(text) => Some(text),
            _ => None,
        }
    }
}

pub struct Parsed<'a> {
    pub value: Value<'a>,
    /// Nesting as the Python decoder's `_depth` counts it: a scalar or an empty
    /// container is 1, a container with children one more than its deepest child.
    pub depth: usize,
}

struct Reader<'a> {
    text: &'a str,
    bytes: &'a [u8],
    pos: usize,
    max_depth: usize,
}

/// The event's top-level object, each value with its depth; None where the Python
/// decoder must decide.
pub fn parse_object(raw: &[u8], max_depth: usize) -> Option<Vec<(Cow<'_, str>, Parsed<'_>)>> {
    let text = std::str::from_utf8(raw).ok()?;
    let mut reader = Reader {
        text,
        bytes: raw,
        pos: 0,
        max_depth,
    };
    reader.skip_ws();
    if reader.peek()? != b'{' {
        return None;
    }
    reader.pos += 1;
    let mut entries: Vec<(Cow<'_, str>, Parsed<'_>)> = Vec::with_capacity(12);
    reader.skip_ws();
    if reader.peek()? == b'}' {
        reader.pos += 1;
    } else {
        loop {
            reader.skip_ws();
            let key = reader.string()?;
            if entries.iter().any(|(name, _)| *name == key) {
                return None;
            }
            reader.skip_ws();
            reader.expect(b':')?;
            reader.skip_ws();
            let child = reader.value(2)?;
            entries.push((key, child));
            reader.skip_ws();
            match reader.next()? {
                b',' => continue,
                b'}' => break,
                _ => return None,
            }
        }
    }
    reader.skip_ws();
    if reader.pos != raw.len() {
        return None;
    }
    Some(entries)
}

impl<'a> Reader<'a> {
    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.pos).copied()
    }

    fn next(&mut self) -> Option<u8> {
        let byte = self.peek()?;
        self.pos += 1;
        Some(byte)
    }

    fn expect(&mut self, byte: u8) -> Option<()> {
        (self.next()? == byte).then_some(())
    }

    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.pos += 1;
        }
    }

    fn literal(&mut self, word: &[u8], value: Value<'a>) -> Option<Parsed<'a>> {
        if self.bytes.get(self.pos..self.pos + word.len())? != word {
            return None;
        }
        self.pos += word.len();
        Some(Parsed { value, depth: 1 })
    }

    /// A value `level` deep in the document (the top-level object is level 1).
    fn value(&mut self, level: usize) -> Option<Parsed<'a>> {
        if level > self.max_depth {
            return None; // too deep to be sure of: the Python decoder decides
        }
        match self.peek()? {
            b'{' => self.object(level),
            b'[' => self.array(level),
            b'"' => Some(Parsed {
                value: Value::Str(self.string()?),
                depth: 1,
            }),
            b't' => self.literal(b"true", Value::Bool(true)),
            b'f' => self.literal(b"false", Value::Bool(false)),
            b'n' => self.literal(b"null", Value::Null),
            _ => Some(Parsed {
                value: self.number()?,
                depth: 1,
            }),
        }
    }

    fn object(&mut self, level: usize) -> Option<Parsed<'a>> {
        self.pos += 1;
        let mut entries: Vec<(Cow<'a, str>, Value<'a>)> = Vec::new();
        let mut seen: Option<HashSet<Cow<'a, str>>> = None;
        let mut depth = 1;
        self.skip_ws();
        if self.peek()? == b'}' {
            self.pos += 1;
            return Some(Parsed {
                value: Value::Object(entries),
                depth,
            });
        }
        loop {
            self.skip_ws();
            let key = self.string()?;
            // Duplicate keys: msgspec and orjson keep the last; not decided here.
            if entries.len() < 16 {
                if entries.iter().any(|(name, _)| *name == key) {
                    return None;
                }
            } else {
                let set = seen.get_or_insert_with(|| entries.iter().map(|e| e.0.clone()).collect());
                if !set.insert(key.clone()) {
                    return None;
                }
            }
            self.skip_ws();
            self.expect(b':')?;
            self.skip_ws();
            let child = self.value(level + 1)?;
            depth = depth.max(child.depth + 1);
            entries.push((key, child.value));
            self.skip_ws();
            match self.next()? {
                b',' => continue,
                b'}' => {
                    return Some(Parsed {
                        value: Value::Object(entries),
                        depth,
                    })
                }
                _ => return None,
            }
        }
    }

    fn array(&mut self, level: usize) -> Option<Parsed<'a>> {
        self.pos += 1;
        let mut items = Vec::new();
        let mut depth = 1;
        self.skip_ws();
        if self.peek()? == b']' {
            self.pos += 1;
            return Some(Parsed {
                value: Value::Array(items),
                depth,
            });
        }
        loop {
            self.skip_ws();
            let child = self.value(level + 1)?;
            depth = depth.max(child.depth + 1);
            items.push(child.value);
            self.skip_ws();
            match self.next()? {
                b',' => continue,
                b']' => {
                    return Some(Parsed {
                        value: Value::Array(items),
                        depth,
                    })
                }
                _ => return None,
            }
        }
    }

    fn hex4(&mut self) -> Option<u32> {
        let digits = self.bytes.get(self.pos..self.pos + 4)?;
        let mut code = 0;
        for &digit in digits {
            code = code * 16 + char::from(digit).to_digit(16)?;
        }
        self.pos += 4;
        Some(code)
    }

    fn string(&mut self) -> Option<Cow<'a, str>> {
        if self.next()? != b'"' {
            return None;
        }
        let start = self.pos;
        // The common case: no escape, borrowed as it is (the input is valid UTF-8).
        self.pos += find_special(&self.bytes[self.pos..])?;
        if self.peek()? == b'"' {
            let text = &self.text[start..self.pos];
            self.pos += 1;
            return Some(Cow::Borrowed(text));
        }
        let mut out = String::from(&self.text[start..self.pos]);
        loop {
            match self.next()? {
                b'"' => return Some(Cow::Owned(out)),
                b'\\' => {
                    let escaped = match self.next()? {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => {
                            let high = self.hex4()?;
                            if (0xDC00..0xE000).contains(&high) {
                                return None; // a lone low surrogate
                            }
                            if (0xD800..0xDC00).contains(&high) {
                                if self.bytes.get(self.pos..self.pos + 2)? != b"\\u" {
                                    return None; // a lone high surrogate
                                }
                                self.pos += 2;
                                let low = self.hex4()?;
                                if !(0xDC00..0xE000).contains(&low) {
                                    return None;
                                }
                                char::from_u32(0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00))?
                            } else {
                                char::from_u32(high)?
                            }
                        }
                        _ => return None,
                    };
                    out.push(escaped);
                }
                _ => return None, // a raw control character is not JSON
            }
            let run = self.pos;
            self.pos += find_special(&self.bytes[self.pos..])?;
            out.push_str(&self.text[run..self.pos]);
        }
    }

    fn number(&mut self) -> Option<Value<'a>> {
        let start = self.pos;
        if self.peek() == Some(b'-') {
            self.pos += 1;
        }
        match self.next()? {
            b'0' => {}
            b'1'..=b'9' => self.digits(),
            _ => return None,
        }
        let mut integer = true;
        if self.peek() == Some(b'.') {
            self.pos += 1;
            integer = false;
            if !self.peek()?.is_ascii_digit() {
                return None;
            }
            self.digits();
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.pos += 1;
            integer = false;
            if let Some(b'+' | b'-') = self.peek() {
                self.pos += 1;
            }
            if !self.peek()?.is_ascii_digit() {
                return None;
            }
            self.digits();
        }
        let token = &self.text[start..self.pos];
        if integer {
            // Beyond i64 the Python decoder takes another path (msgspec reads it
            // exactly, orjson cannot write it): not decided here.
            return token.parse::<i64>().ok().map(Value::Int);
        }
        let number: f64 = token.parse().ok()?;
        number.is_finite().then_some(Value::Float(number))
    }

    fn digits(&mut self) {
        while let Some(b'0'..=b'9') = self.peek() {
            self.pos += 1;
        }
    }
}
