//! Session state format 5 (streams/engine/state_codec.py has the layout): transcoded
//! to and from version 4's body, the MessagePack array msgspec writes and reads in C.
//!
//! Building Python objects through PyO3 costs more than msgspec does, so the state's
//! objects stay msgspec's: `compact_state` reads the body the Python encoder wrote and
//! writes format 5, `expand_state` reads format 5 and writes the body msgspec decodes.
//! Both return None for what they do not take (a value format 5 has no room for; corrupt
//! bytes), never panic, and give the bytes the pure codec gives.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use pyo3::prelude::*;
use pyo3::types::PyBytes;

const HEAD: usize = 17; // version:u8 touched_ms:i64 last_event_ms:i64
const FIELDS: usize = 13; // version 4's body
const RECORD_FIELDS: usize = 7; // loopfuse.streams.engine.history.Record

/// Fingerprints and run keys are hashes already, and strings here are a session's
/// tool names: a multiply-rotate hash is enough (std's SipHash would cost more than
/// the transcoding).
#[derive(Default)]
struct Mix(u64);

impl Mix {
    fn add(&mut self, value: u64) {
        self.0 = (self.0.rotate_left(5) ^ value).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl Hasher for Mix {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
    }
    fn write_u64(&mut self, value: u64) {
        self.add(value);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

type Refs<K> = HashMap<K, u64, BuildHasherDefault<Mix>>;

// -- MessagePack, the forms msgspec writes -------------------------------------------

pub(crate) struct Pack<'a> {
    pub(crate) data: &'a [u8],
    pub(crate) pos: usize,
}

impl<'a> Pack<'a> {
    pub(crate) fn byte(&mut self) -> Option<u8> {
        let byte = *self.data.get(self.pos)?;
        self.pos += 1;
        Some(byte)
    }

    pub(crate) fn take(&mut self, length: usize) -> Option<&'a [u8]> {
        let end = self.pos.checked_add(length)?;
        let bytes = self.data.get(self.pos..end)?;
        self.pos = end;
        Some(bytes)
    }

    pub(crate) fn be<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }

    pub(crate) fn be16(&mut self) -> Option<usize> {
        Some(usize::from(u16::from_be_bytes(self.be()?)))
    }

    pub(crate) fn be32(&mut self) -> Option<usize> {
        usize::try_from(u32::from_be_bytes(self.be()?)).ok()
    }

    /// An unsigned integer of 64 bits or fewer (a negative one is not).
    pub(crate) fn uint(&mut self) -> Option<u64> {
        let tag = self.byte()?;
        match tag {
            0x00..=0x7f => Some(u64::from(tag)),
            0xcc => Some(u64::from(self.byte()?)),
            0xcd => Some(u64::from(u16::from_be_bytes(self.be()?))),
            0xce => Some(u64::from(u32::from_be_bytes(self.be()?))),
            0xcf => Some(u64::from_be_bytes(self.be()?)),
            // msgspec writes non-negative ints unsigned; a signed form may hold one too
            0xd0..=0xd3 | 0xe0..=0xff => {
                self.pos -= 1;
                u64::try_from(self.sint()?).ok()
            }
            _ => None,
        }
    }

    /// A signed integer of 64 bits.
    pub(crate) fn sint(&mut self) -> Option<i64> {
        let tag = self.byte()?;
        match tag {
            0x00..=0x7f => Some(i64::from(tag)),
            0xe0..=0xff => Some(i64::from(tag as i8)),
            0xcc => Some(i64::from(self.byte()?)),
            0xcd => Some(i64::from(u16::from_be_bytes(self.be()?))),
            0xce => Some(i64::from(u32::from_be_bytes(self.be()?))),
            0xcf => i64::try_from(u64::from_be_bytes(self.be()?)).ok(),
            0xd0 => Some(i64::from(i8::from_be_bytes(self.be()?))),
            0xd1 => Some(i64::from(i16::from_be_bytes(self.be()?))),
            0xd2 => Some(i64::from(i32::from_be_bytes(self.be()?))),
            0xd3 => Some(i64::from_be_bytes(self.be()?)),
            _ => None,
        }
    }

    pub(crate) fn array(&mut self) -> Option<usize> {
        let tag = self.byte()?;
        Some(match tag {
            0x90..=0x9f => usize::from(tag & 0x0f),
            0xdc => self.be16()?,
            0xdd => self.be32()?,
            _ => return None,
        })
    }

    pub(crate) fn map(&mut self) -> Option<usize> {
        let tag = self.byte()?;
        Some(match tag {
            0x80..=0x8f => usize::from(tag & 0x0f),
            0xde => self.be16()?,
            0xdf => self.be32()?,
            _ => return None,
        })
    }

    pub(crate) fn nil(&mut self) -> bool {
        if self.data.get(self.pos) == Some(&0xc0) {
            self.pos += 1;
            return true;
        }
        false
    }

    pub(crate) fn bool(&mut self) -> Option<bool> {
        match self.byte()? {
            0xc2 => Some(false),
            0xc3 => Some(true),
            _ => None,
        }
    }

    pub(crate) fn str(&mut self) -> Option<&'a [u8]> {
        let tag = self.byte()?;
        let length = match tag {
            0xa0..=0xbf => usize::from(tag & 0x1f),
            0xd9 => usize::from(self.byte()?),
            0xda => self.be16()?,
            0xdb => self.be32()?,
            _ => return None,
        };
        // UTF-8 already: msgspec wrote it from Python strs (and format 5's reader checks)
        self.take(length)
    }

    pub(crate) fn bin(&mut self) -> Option<&'a [u8]> {
        let length = match self.byte()? {
            0xc4 => usize::from(self.byte()?),
            0xc5 => self.be16()?,
            0xc6 => self.be32()?,
            _ => return None,
        };
        self.take(length)
    }
}

pub(crate) fn pack_uint(out: &mut Vec<u8>, value: u64) {
    if value < 0x80 {
        out.push(value as u8);
    } else if value <= 0xff {
        out.extend_from_slice(&[0xcc, value as u8]);
    } else if value <= 0xffff {
        out.push(0xcd);
        out.extend_from_slice(&(value as u16).to_be_bytes());
    } else if value <= 0xffff_ffff {
        out.push(0xce);
        out.extend_from_slice(&(value as u32).to_be_bytes());
    } else {
        out.push(0xcf);
        out.extend_from_slice(&value.to_be_bytes());
    }
}

pub(crate) fn pack_sint(out: &mut Vec<u8>, value: i64) {
    if value >= 0 {
        pack_uint(out, value as u64);
    } else if value >= -32 {
        out.push(value as u8);
    } else if value >= -128 {
        out.extend_from_slice(&[0xd0, value as u8]);
    } else if value >= -32768 {
        out.push(0xd1);
        out.extend_from_slice(&(value as i16).to_be_bytes());
    } else if value >= i64::from(i32::MIN) {
        out.push(0xd2);
        out.extend_from_slice(&(value as i32).to_be_bytes());
    } else {
        out.push(0xd3);
        out.extend_from_slice(&value.to_be_bytes());
    }
}

fn pack_header(out: &mut Vec<u8>, length: usize, fix: u8, wide: u8) {
    if length < 16 {
        out.push(fix | length as u8);
    } else if length <= 0xffff {
        out.push(wide);
        out.extend_from_slice(&(length as u16).to_be_bytes());
    } else {
        out.push(wide + 1);
        out.extend_from_slice(&(length as u32).to_be_bytes());
    }
}

pub(crate) fn pack_array(out: &mut Vec<u8>, length: usize) {
    pack_header(out, length, 0x90, 0xdc);
}

pub(crate) fn pack_map(out: &mut Vec<u8>, length: usize) {
    pack_header(out, length, 0x80, 0xde);
}

pub(crate) fn pack_str(out: &mut Vec<u8>, text: &[u8]) {
    let length = text.len();
    if length < 32 {
        out.push(0xa0 | length as u8);
    } else if length <= 0xff {
        out.extend_from_slice(&[0xd9, length as u8]);
    } else if length <= 0xffff {
        out.push(0xda);
        out.extend_from_slice(&(length as u16).to_be_bytes());
    } else {
        out.push(0xdb);
        out.extend_from_slice(&(length as u32).to_be_bytes());
    }
    out.extend_from_slice(text);
}

pub(crate) fn pack_bin(out: &mut Vec<u8>, bytes: &[u8]) {
    let length = bytes.len();
    if length <= 0xff {
        out.extend_from_slice(&[0xc4, length as u8]);
    } else if length <= 0xffff {
        out.push(0xc5);
        out.extend_from_slice(&(length as u16).to_be_bytes());
    } else {
        out.push(0xc6);
        out.extend_from_slice(&(length as u32).to_be_bytes());
    }
    out.extend_from_slice(bytes);
}

// -- format 5's varints ----------------------------------------------------------------

fn put(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn put_signed(out: &mut Vec<u8>, value: i64) {
    put(out, ((value << 1) ^ (value >> 63)) as u64);
}

struct Compact<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Compact<'a> {
    fn byte(&mut self) -> Option<u8> {
        let byte = *self.data.get(self.pos)?;
        self.pos += 1;
        Some(byte)
    }

    fn take(&mut self, length: usize) -> Option<&'a [u8]> {
        let end = self.pos.checked_add(length)?;
        let bytes = self.data.get(self.pos..end)?;
        self.pos = end;
        Some(bytes)
    }

    /// A uvarint of at most 64 bits (ten bytes, the last 0 or 1), as the pure reader takes.
    fn read(&mut self) -> Option<u64> {
        let mut value = 0u64;
        for index in 0..10 {
            let byte = self.byte()?;
            if index == 9 && byte > 1 {
                return None;
            }
            value |= u64::from(byte & 0x7f) << (7 * index);
            if byte < 0x80 {
                return Some(value);
            }
        }
        None
    }

    fn signed(&mut self) -> Option<i64> {
        let raw = self.read()?;
        Some(((raw >> 1) as i64) ^ -((raw & 1) as i64))
    }

    /// A length or an item count: each item takes a byte at least.
    fn count(&mut self) -> Option<usize> {
        let count = usize::try_from(self.read()?).ok()?;
        (count <= self.data.len() - self.pos).then_some(count)
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }

    fn bytes(&mut self) -> Option<&'a [u8]> {
        let length = self.count()?;
        self.take(length)
    }
}

// -- version 4's body -> format 5 ------------------------------------------------------

const RUN_CHANGES: u8 = 0x10;
const HAS_CALL: u8 = 0x20;
const HAS_UNKNOWN: u8 = 0x40;

/// Words (64-bit values) and texts met so far: written in full the first time, as refs
/// after, in the layout's order (the pure writer's order, so the bytes are the same).
struct Seen<'a> {
    strings: Refs<&'a [u8]>,
    words: Refs<u64>,
}

impl<'a> Seen<'a> {
    /// A text: 0 None, 1 new (length, UTF-8), n the (n - 2)th met.
    fn text(&mut self, out: &mut Vec<u8>, text: Option<&'a [u8]>) {
        let Some(text) = text else {
            out.push(0);
            return;
        };
        let next = self.strings.len() as u64;
        let ref_ = *self.strings.entry(text).or_insert(next);
        if ref_ == next {
            out.push(1);
            put(out, text.len() as u64);
            out.extend_from_slice(text);
        } else {
            put(out, ref_ + 2);
        }
    }

    /// A word: 0 zero, 1 new (8 bytes), n the (n - 2)th met.
    fn word(&mut self, out: &mut Vec<u8>, value: u64) {
        if value == 0 {
            out.push(0);
            return;
        }
        let next = self.words.len() as u64;
        let ref_ = *self.words.entry(value).or_insert(next);
        if ref_ == next {
            out.push(1);
            out.extend_from_slice(&value.to_le_bytes());
        } else {
            put(out, ref_ + 2);
        }
    }

    /// A record's sig or result, its mode in the record's flags: 0 zero, 1 new, 2 a ref.
    fn field(&mut self, out: &mut Vec<u8>, value: u64) -> u8 {
        if value == 0 {
            return 0;
        }
        let next = self.words.len() as u64;
        let ref_ = *self.words.entry(value).or_insert(next);
        if ref_ == next {
            out.extend_from_slice(&value.to_le_bytes());
            1
        } else {
            put(out, ref_);
            2
        }
    }
}

fn compact(touched_ms: i64, last_event_ms: i64, body: &[u8]) -> Option<Vec<u8>> {
    let mut pack = Pack { data: body, pos: 0 };
    // sized for a history of 30 or so (a table that grows rehashes: that was a third
    // of the time)
    let mut seen = Seen {
        strings: Refs::with_capacity_and_hasher(16, Default::default()),
        words: Refs::with_capacity_and_hasher(64, Default::default()),
    };
    let mut out = Vec::with_capacity(body.len() / 2 + 64);
    out.push(5);
    out.extend_from_slice(&touched_ms.to_le_bytes());
    out.extend_from_slice(&last_event_ms.to_le_bytes());
    if pack.array()? != FIELDS {
        return None;
    }
    put(&mut out, pack.uint()?); // next_seq + 1
    put(&mut out, pack.uint()?); // verdict_floor
    seen.word(&mut out, pack.uint()?); // incarnation

    let records = pack.array()?;
    put(&mut out, records as u64);
    let (mut previous_ts, mut previous_run) = (last_event_ms, 0u64);
    for _ in 0..records {
        if pack.array()? != RECORD_FIELDS {
            return None;
        }
        let tool = pack.str()?;
        let sig = pack.uint()?;
        let run = pack.uint()?;
        let call = pack.uint()?;
        let result = pack.uint()?;
        let unknown = if pack.nil() { None } else { Some(pack.str()?) };
        let ts = pack.sint()?;
        let at = out.len();
        out.push(0); // the record's flags, known once its fields are written
        seen.text(&mut out, Some(tool));
        let mut flags = seen.field(&mut out, sig);
        if run != previous_run {
            flags |= RUN_CHANGES;
            seen.word(&mut out, run);
            previous_run = run;
        }
        flags |= seen.field(&mut out, result) << 2;
        if call != 0 {
            flags |= HAS_CALL;
            put(&mut out, call);
        }
        if unknown.is_some() {
            flags |= HAS_UNKNOWN;
            seen.text(&mut out, unknown);
        }
        put_signed(&mut out, ts.checked_sub(previous_ts)?);
        previous_ts = ts;
        out[at] = flags;
    }

    let guards = pack.map()?;
    put(&mut out, guards as u64);
    for _ in 0..guards {
        let run = pack.uint()?;
        if pack.array()? != 4 {
            return None;
        }
        let window = pack.uint()?;
        let remaining = pack.uint()?;
        let first = if pack.nil() {
            None
        } else {
            if pack.array()? != 3 {
                return None;
            }
            Some((pack.str()?, pack.uint()?, pack.uint()?))
        };
        let broken = pack.bool()?;
        seen.word(&mut out, run);
        put(&mut out, window);
        put(&mut out, remaining);
        out.push(u8::from(first.is_some()) | (u8::from(broken) << 1));
        if let Some((tool, sig, result)) = first {
            seen.text(&mut out, Some(tool));
            seen.word(&mut out, sig);
            seen.word(&mut out, result);
        }
    }

    let warnings = pack.map()?;
    put(&mut out, warnings as u64);
    for _ in 0..warnings {
        let key = pack.uint()?;
        if pack.array()? != 2 {
            return None;
        }
        let owner = pack.uint()?;
        let bucket = pack.uint()?;
        out.extend_from_slice(&key.to_le_bytes());
        seen.word(&mut out, owner);
        put(&mut out, bucket);
    }

    let seen_ids = pack.array()?;
    put(&mut out, seen_ids as u64);
    for _ in 0..seen_ids {
        out.extend_from_slice(&pack.uint()?.to_le_bytes());
    }

    let decisions = pack.array()?;
    put(&mut out, decisions as u64);
    for _ in 0..decisions {
        if pack.array()? != 6 {
            return None;
        }
        for _ in 0..4 {
            put(&mut out, pack.uint()?); // event, action, detector, count
        }
        let detail = if pack.nil() { None } else { Some(pack.str()?) };
        seen.text(&mut out, detail);
        put_signed(&mut out, pack.sint()?);
    }

    let parked = pack.map()?;
    put(&mut out, parked as u64);
    for _ in 0..parked {
        put(&mut out, pack.uint()?);
        let json = pack.bin()?;
        put(&mut out, json.len() as u64);
        out.extend_from_slice(json);
    }

    let skipped = pack.array()?;
    put(&mut out, skipped as u64);
    for _ in 0..skipped {
        if pack.array()? != 2 {
            return None;
        }
        put(&mut out, pack.uint()?); // first
        put(&mut out, pack.uint()?); // last
    }

    let retired = pack.array()?;
    put(&mut out, retired as u64);
    for _ in 0..retired {
        if pack.array()? != 2 {
            return None;
        }
        out.extend_from_slice(&pack.uint()?.to_le_bytes()); // incarnation key
        put(&mut out, pack.uint()?); // its next seq
    }

    let pending = pack.array()?;
    put(&mut out, pending as u64);
    for _ in 0..pending {
        let json = pack.bin()?;
        put(&mut out, json.len() as u64);
        out.extend_from_slice(json);
    }
    let rules = pack.bin()?;
    put(&mut out, rules.len() as u64);
    out.extend_from_slice(rules);
    (pack.pos == body.len()).then_some(out)
}

// -- format 5 -> version 4's body ------------------------------------------------------

/// Format 5 as it is read: the words and texts met so far, for the refs that follow.
struct Expand<'a> {
    bytes: Compact<'a>,
    strings: Vec<&'a [u8]>,
    words: Vec<u64>,
}

impl<'a> Expand<'a> {
    fn text(&mut self) -> Option<Option<&'a [u8]>> {
        match self.bytes.read()? {
            0 => Some(None),
            1 => {
                let text = self.bytes.bytes()?;
                std::str::from_utf8(text).ok()?;
                self.strings.push(text);
                Some(Some(text))
            }
            tag => Some(Some(*self.strings.get(usize::try_from(tag - 2).ok()?)?)),
        }
    }

    fn word(&mut self) -> Option<u64> {
        match self.bytes.read()? {
            0 => Some(0),
            1 => {
                let value = self.bytes.u64()?;
                self.words.push(value);
                Some(value)
            }
            tag => self.words.get(usize::try_from(tag - 2).ok()?).copied(),
        }
    }

    fn field(&mut self, mode: u8) -> Option<u64> {
        match mode {
            0 => Some(0),
            1 => {
                let value = self.bytes.u64()?;
                self.words.push(value);
                Some(value)
            }
            2 => self.words.get(usize::try_from(self.bytes.read()?).ok()?).copied(),
            _ => None,
        }
    }
}

pub(crate) fn pack_text(out: &mut Vec<u8>, text: Option<&[u8]>) {
    match text {
        Some(text) => pack_str(out, text),
        None => out.push(0xc0),
    }
}

pub(crate) fn expand(data: &[u8]) -> Option<Vec<u8>> {
    if data.len() < HEAD || data[0] != 5 {
        return None;
    }
    let last_event_ms = i64::from_le_bytes(data[9..HEAD].try_into().ok()?);
    let mut state = Expand {
        bytes: Compact { data, pos: HEAD },
        strings: Vec::new(),
        words: Vec::new(),
    };
    let mut out = Vec::with_capacity(data.len() * 2 + 64);
    pack_array(&mut out, FIELDS);
    pack_uint(&mut out, state.bytes.read()?); // next_seq + 1
    pack_uint(&mut out, state.bytes.read()?); // verdict_floor
    pack_uint(&mut out, state.word()?); // incarnation

    let records = state.bytes.count()?;
    pack_array(&mut out, records);
    let (mut ts, mut run) = (last_event_ms, 0u64);
    for _ in 0..records {
        let flags = state.bytes.byte()?;
        if flags > 0x7f {
            return None;
        }
        let tool = state.text()??;
        let sig = state.field(flags & 3)?;
        if flags & RUN_CHANGES != 0 {
            run = state.word()?;
        }
        let result = state.field((flags >> 2) & 3)?;
        let call = if flags & HAS_CALL != 0 { state.bytes.read()? } else { 0 };
        let unknown = if flags & HAS_UNKNOWN != 0 { state.text()? } else { None };
        ts = ts.checked_add(state.bytes.signed()?)?;
        pack_array(&mut out, RECORD_FIELDS);
        pack_str(&mut out, tool);
        pack_uint(&mut out, sig);
        pack_uint(&mut out, run);
        pack_uint(&mut out, call);
        pack_uint(&mut out, result);
        pack_text(&mut out, unknown);
        pack_sint(&mut out, ts);
    }

    let guards = state.bytes.count()?;
    pack_map(&mut out, guards);
    for _ in 0..guards {
        pack_uint(&mut out, state.word()?); // run
        pack_array(&mut out, 4);
        pack_uint(&mut out, state.bytes.read()?); // window
        pack_uint(&mut out, state.bytes.read()?); // remaining
        let flags = state.bytes.byte()?;
        if flags & 1 != 0 {
            let tool = state.text()??;
            let sig = state.word()?;
            let result = state.word()?;
            pack_array(&mut out, 3);
            pack_str(&mut out, tool);
            pack_uint(&mut out, sig);
            pack_uint(&mut out, result);
        } else {
            out.push(0xc0);
        }
        if flags > 3 {
            return None;
        }
        out.push(if flags > 1 { 0xc3 } else { 0xc2 });
    }

    let warnings = state.bytes.count()?;
    pack_map(&mut out, warnings);
    for _ in 0..warnings {
        pack_uint(&mut out, state.bytes.u64()?);
        pack_array(&mut out, 2);
        pack_uint(&mut out, state.word()?); // owner
        pack_uint(&mut out, state.bytes.read()?); // bucket
    }

    let seen_ids = state.bytes.count()?;
    pack_array(&mut out, seen_ids);
    for _ in 0..seen_ids {
        pack_uint(&mut out, state.bytes.u64()?);
    }

    let decisions = state.bytes.count()?;
    pack_array(&mut out, decisions);
    for _ in 0..decisions {
        pack_array(&mut out, 6);
        for _ in 0..4 {
            pack_uint(&mut out, state.bytes.read()?); // event, action, detector, count
        }
        let detail = state.text()?;
        pack_text(&mut out, detail);
        pack_sint(&mut out, state.bytes.signed()?);
    }

    let bytes = &mut state.bytes;
    let parked = bytes.count()?;
    pack_map(&mut out, parked);
    for _ in 0..parked {
        pack_uint(&mut out, bytes.read()?);
        pack_bin(&mut out, bytes.bytes()?);
    }

    let skipped = bytes.count()?;
    pack_array(&mut out, skipped);
    for _ in 0..skipped {
        pack_array(&mut out, 2);
        pack_uint(&mut out, bytes.read()?);
        pack_uint(&mut out, bytes.read()?);
    }

    let retired = bytes.count()?;
    pack_array(&mut out, retired);
    for _ in 0..retired {
        pack_array(&mut out, 2);
        pack_uint(&mut out, bytes.u64()?);
        pack_uint(&mut out, bytes.read()?);
    }

    let pending = bytes.count()?;
    pack_array(&mut out, pending);
    for _ in 0..pending {
        pack_bin(&mut out, bytes.bytes()?);
    }
    pack_bin(&mut out, bytes.bytes()?); // rules
    (bytes.pos == data.len()).then_some(out)
}

/// Format 5 of a state: its head's two clocks and version 4's body (what the Python
/// encoder writes); None when the body holds what format 5 has no room for.
#[pyfunction]
pub fn compact_state<'py>(
    py: Python<'py>,
    touched_ms: i64,
    last_event_ms: i64,
    body: &[u8],
) -> Option<Bound<'py, PyBytes>> {
    compact(touched_ms, last_event_ms, body).map(|state| PyBytes::new(py, &state))
}

/// Version 4's body (for msgspec to decode) of format-5 state bytes; None when they
/// are not a whole format-5 state.
#[pyfunction]
pub fn expand_state<'py>(py: Python<'py>, data: &[u8]) -> Option<Bound<'py, PyBytes>> {
    expand(data).map(|body| PyBytes::new(py, &body))
}
