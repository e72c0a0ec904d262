//! The volatileResults rule's masking: streams/engine/volatile.py's scanner, line for
//! line (its docstring says what is masked and why it is not a regular expression).
//!
//! Python walks code points, this walks UTF-8 bytes: only ASCII is ever classified and
//! every split falls on an ASCII byte, so a non-ASCII character is a separator on both
//! sides and the masked strings are the same.

use std::collections::HashSet;

/// A user pattern's token class (volatile.py's CLASSES).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenClass {
    Digits,
    Hex,
    Alnum,
    Id,
}

impl TokenClass {
    pub fn named(name: &str) -> Option<TokenClass> {
        match name {
            "digits" => Some(TokenClass::Digits),
            "hex" => Some(TokenClass::Hex),
            "alnum" => Some(TokenClass::Alnum),
            "id" => Some(TokenClass::Id),
            _ => None,
        }
    }

    fn holds(self, byte: u8) -> bool {
        match self {
            TokenClass::Digits => byte.is_ascii_digit(),
            TokenClass::Hex => byte.is_ascii_hexdigit(),
            TokenClass::Alnum => byte.is_ascii_alphanumeric(),
            TokenClass::Id => byte.is_ascii_alphanumeric() || matches!(byte, b'_' | b'.' | b'-'),
        }
    }
}

/// rule_config.py's VolatileResults: the tools in scope (None: every tool) and the
/// user's patterns, in order.
#[derive(Clone, Debug, Default)]
pub struct VolatileResults {
    pub tools: Option<HashSet<String>>,
    pub patterns: Vec<(String, TokenClass)>,
}

impl VolatileResults {
    pub fn applies(&self, tool: &str) -> bool {
        self.tools.as_ref().is_none_or(|tools| tools.contains(tool))
    }

    /// volatile.py's `mask_text`.
    pub fn mask(&self, text: &str) -> String {
        let mut text = text.to_owned();
        for (prefix, class) in &self.patterns {
            text = mask_prefixed(&text, prefix, *class);
        }
        mask_fixed(&text)
    }
}

const MASKED: &str = "<masked>";
const TMP_PREFIXES: [&[u8]; 5] = [
    b"/tmp/",
    b"/var/tmp/",
    b"/var/folders/",
    b"/private/tmp/",
    b"/private/var/folders/",
];
const UNITS: [&[u8]; 7] = [b"ns", b"us", b"ms", b"s", b"m", b"h", b"d"];
const PID_WORDS: [&[u8]; 4] = [b"pid", b"ppid", b"pgid", b"tid"];

fn alnum(byte: u8) -> bool {
    byte.is_ascii_alphanumeric()
}

fn path(byte: u8) -> bool {
    alnum(byte)
        || matches!(
            byte,
            b'_' | b'.' | b'-' | b'/' | b'~' | b'+' | b'@' | b'%' | b'='
        )
}

fn context_separator(byte: u8) -> bool {
    matches!(byte, b' ' | b'\t' | b':' | b'=' | b'#')
}

fn mask_prefixed(text: &str, prefix: &str, class: TokenClass) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut start = 0;
    while let Some(offset) = text[start..].find(prefix) {
        let end = start + offset + prefix.len();
        let mut stop = end;
        while stop < bytes.len() && class.holds(bytes[stop]) {
            stop += 1;
        }
        out.push_str(&text[start..end]);
        if stop > end {
            out.push_str(MASKED);
        }
        start = stop;
    }
    out.push_str(&text[start..]);
    out
}

fn mask_fixed(text: &str) -> String {
    let bytes = text.as_bytes();
    let size = bytes.len();
    let mut out = String::with_capacity(size);
    let mut copied = 0;
    let mut i = 0;
    while i < size {
        let c = bytes[i];
        if c == b'/'
            && (i == 0 || !path(bytes[i - 1]))
            && TMP_PREFIXES.iter().any(|p| bytes[i..].starts_with(p))
        {
            let end = run(bytes, i, path);
            out.push_str(&text[copied..i]);
            out.push_str("<tmp>");
            i = end;
            copied = end;
            continue;
        }
        if alnum(c) && (i == 0 || !alnum(bytes[i - 1])) {
            if let Some((end, placeholder)) = token(bytes, i) {
                out.push_str(&text[copied..i]);
                out.push_str(placeholder);
                i = end;
                copied = end;
                continue;
            }
            i = run(bytes, i, alnum);
            continue;
        }
        i += 1;
    }
    out.push_str(&text[copied..]);
    out
}

fn run(bytes: &[u8], start: usize, holds: impl Fn(u8) -> bool) -> usize {
    let mut end = start;
    while end < bytes.len() && holds(bytes[end]) {
        end += 1;
    }
    end
}

/// volatile.py's `_fixed`: `9` a digit, `x` a hex digit, anything else itself.
fn fixed(bytes: &[u8], at: usize, shape: &[u8]) -> bool {
    if at + shape.len() > bytes.len() {
        return false;
    }
    shape.iter().enumerate().all(|(offset, want)| {
        let c = bytes[at + offset];
        match want {
            b'9' => c.is_ascii_digit(),
            b'x' => c.is_ascii_hexdigit(),
            _ => c == *want,
        }
    })
}

fn word_end(bytes: &[u8], at: usize) -> bool {
    at >= bytes.len() || !alnum(bytes[at])
}

fn token(bytes: &[u8], i: usize) -> Option<(usize, &'static str)> {
    if fixed(bytes, i, b"xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx") && word_end(bytes, i + 36) {
        return Some((i + 36, "<uuid>"));
    }
    let end = timestamp(bytes, i);
    if end != 0 && word_end(bytes, end) {
        return Some((end, "<time>"));
    }
    let digits = run(bytes, i, |c| c.is_ascii_digit()) - i;
    if digits >= 10 {
        let mut end = i + digits;
        if fixed(bytes, end, b".9") {
            end = run(bytes, end + 1, |c| c.is_ascii_digit());
        }
        if word_end(bytes, end) {
            return Some((end, "<epoch>"));
        }
    }
    if digits > 0 {
        let end = duration(bytes, i);
        if end != 0 && word_end(bytes, end) {
            return Some((end, "<duration>"));
        }
        let end = i + digits;
        if word_end(bytes, end) {
            match context(bytes, i, end) {
                Context::Pid if digits <= 7 => return Some((end, "<pid>")),
                Context::Port if digits <= 5 => return Some((end, "<port>")),
                _ => {}
            }
        }
    }
    let end = run(bytes, i, |c| c.is_ascii_hexdigit());
    if end - i >= 12 && word_end(bytes, end) && bytes[i..end].iter().any(u8::is_ascii_digit) {
        return Some((end, "<hex>"));
    }
    None
}

fn time(bytes: &[u8], at: usize) -> usize {
    if !fixed(bytes, at, b"99:99") {
        return 0;
    }
    let mut end = at + 5;
    if fixed(bytes, end, b":99") {
        end += 3;
        if fixed(bytes, end, b".9") || fixed(bytes, end, b",9") {
            end = run(bytes, end + 1, |c| c.is_ascii_digit());
        }
    }
    if bytes.get(end) == Some(&b'Z') {
        return end + 1;
    }
    if fixed(bytes, end, b"+99") || fixed(bytes, end, b"-99") {
        end += 3;
        if fixed(bytes, end, b":99") {
            end += 3;
        } else if fixed(bytes, end, b"99") {
            end += 2;
        }
    }
    end
}

fn timestamp(bytes: &[u8], at: usize) -> usize {
    if fixed(bytes, at, b"9999-99-99") {
        let end = at + 10;
        if matches!(bytes.get(end), Some(b'T' | b' ')) {
            let time = time(bytes, end + 1);
            if time != 0 {
                return time;
            }
        }
        return end;
    }
    time(bytes, at)
}

/// The end of one or more number-unit pairs from `at`, else 0.
fn duration(bytes: &[u8], at: usize) -> usize {
    let mut end = 0;
    let mut pos = at;
    while pos < bytes.len() && bytes[pos].is_ascii_digit() {
        pos = run(bytes, pos, |c| c.is_ascii_digit());
        if fixed(bytes, pos, b".9") {
            pos = run(bytes, pos + 1, |c| c.is_ascii_digit());
        }
        let Some(unit) = UNITS.iter().find(|u| bytes[pos..].starts_with(u)) else {
            break;
        };
        pos += unit.len();
        end = pos;
    }
    end
}

enum Context {
    Pid,
    Port,
    None,
}

/// volatile.py's `_context`: what the number `bytes[start..end]` is by what stands
/// before it.
fn context(bytes: &[u8], start: usize, end: usize) -> Context {
    if start > 1
        && bytes[start - 1] == b'['
        && alnum(bytes[start - 2])
        && bytes.get(end) == Some(&b']')
    {
        return Context::Pid;
    }
    if start > 0 && bytes[start - 1] == b':' {
        let host = start - 1;
        if host >= 1 && bytes[host - 1] == b']' {
            return Context::Port;
        }
        if host >= 9
            && &bytes[host - 9..host] == b"localhost"
            && not_word(bytes, host as isize - 10)
        {
            return Context::Port;
        }
        if ipv4_before(bytes, host) {
            return Context::Port;
        }
    }
    let mut word_end = start;
    while word_end > 0 && start - word_end < 3 && context_separator(bytes[word_end - 1]) {
        word_end -= 1;
    }
    if word_end == start {
        return Context::None;
    }
    let mut word_start = word_end;
    while word_start > 0 && alnum(bytes[word_start - 1]) {
        word_start -= 1;
    }
    let word = bytes[word_start..word_end].to_ascii_lowercase();
    if PID_WORDS.contains(&word.as_slice()) {
        Context::Pid
    } else if word == b"port" {
        Context::Port
    } else {
        Context::None
    }
}

fn not_word(bytes: &[u8], at: isize) -> bool {
    at < 0 || !alnum(bytes[at as usize])
}

/// Whether `bytes[..end]` ends with four dot-separated groups of 1-3 digits.
fn ipv4_before(bytes: &[u8], end: usize) -> bool {
    let mut pos = end;
    for group in 0..4 {
        let digits_end = pos;
        while pos > 0 && digits_end - pos < 3 && bytes[pos - 1].is_ascii_digit() {
            pos -= 1;
        }
        if pos == digits_end {
            return false;
        }
        if group < 3 {
            if pos == 0 || bytes[pos - 1] != b'.' {
                return false;
            }
            pos -= 1;
        }
    }
    not_word(bytes, pos as isize - 1) && (pos == 0 || bytes[pos - 1] != b'.')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_what_changes_between_calls() {
        let rule = VolatileResults::default();
        assert_eq!(rule.mask("1 passed in 3.21s"), "1 passed in <duration>");
        assert_eq!(
            rule.mask("Process Group PGID: 12345 on 127.0.0.1:54321"),
            "Process Group PGID: <pid> on 127.0.0.1:<port>"
        );
        assert_eq!(
            rule.mask("2024-01-02T10:11:12.5Z /tmp/tmp.x1/a ünï 3d"),
            "<time> <tmp> ünï <duration>"
        );
    }
}
