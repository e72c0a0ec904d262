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

/// Where MessagePack is written: bytes, or only counted (`Count`: a state's version-4
/// size, which its cap is held to, without writing version 4).
pub(crate) trait Sink {
    fn push(&mut self, byte: u8);
    fn extend_from_slice(&mut self, bytes: &[u8]);
}

impl Sink for Vec<u8> {
    fn push(&mut self, byte: u8) {
        Vec::push(self, byte);
    }
    fn extend_from_slice(&mut self, bytes: &[u8]) {
        Vec::extend_from_slice(self, bytes);
    }
}

/// The bytes a writer would write.
#[derive(Default)]
pub(crate) struct Count(pub(crate) usize);

impl Sink for Count {
    fn push(&mut self, _: u8) {
        self.0 += 1;
    }
    fn extend_from_slice(&mut self, bytes: &[u8]) {
        self.0 += bytes.len();
    }
}

pub(crate) fn pack_uint<S: Sink>(out: &mut S, value: u64) {
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

pub(crate) fn pack_sint<S: Sink>(out: &mut S, value: i64) {
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

fn pack_header<S: Sink>(out: &mut S, length: usize, fix: u8, wide: u8) {
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

pub(crate) fn pack_array<S: Sink>(out: &mut S, length: usize) {
    pack_header(out, length, 0x90, 0xdc);
}

pub(crate) fn pack_map<S: Sink>(out: &mut S, length: usize) {
    pack_header(out, length, 0x80, 0xde);
}

pub(crate) fn pack_str<S: Sink>(out: &mut S, text: &[u8]) {
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

pub(crate) fn pack_bin<S: Sink>(out: &mut S, bytes: &[u8]) {
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

/// The words met so far and the order each was first met in: an open-addressing table
/// (a state meets some 60 words, each a hash already: one multiply spreads them, and a
/// lookup is a probe or two, where a general map's hashing cost a third of the writing).
/// One table serves every state a thread writes (`Words::lend`): a slot is taken only
/// in the current state's generation, so nothing is cleared between states, and the
/// table stays in the cache (a new one, zeroed, missed it at every probe).
struct Words {
    /// (word, generation << 32 | order)
    slots: Vec<(u64, u64)>,
    generation: u64,
    len: u64,
}

thread_local! {
    static WORDS: std::cell::Cell<Option<Words>> = const { std::cell::Cell::new(None) };
}

impl Words {
    /// The thread's table, for a state of about `words` words (`give_back` returns it).
    fn lend(words: usize) -> Self {
        let wanted = (words + words / 3 + 1).next_power_of_two().max(64);
        let mut table = WORDS.take().unwrap_or(Words {
            slots: Vec::new(),
            generation: 0,
            len: 0,
        });
        table.generation += 1;
        table.len = 0;
        // a fresh table where it is too small, or far too large after one big state
        if table.slots.len() < wanted
            || table.slots.len() > 16 * wanted
            || table.generation > u64::from(u32::MAX)
        {
            table.slots = vec![(0, 0); wanted];
            table.generation = 1;
        }
        table
    }

    fn give_back(self) {
        WORDS.set(Some(self));
    }

    /// The order `word` was first met in, and whether that is now.
    fn order(&mut self, word: u64) -> (u64, bool) {
        if 4 * self.len as usize >= 3 * self.slots.len() {
            self.grow();
        }
        let mask = self.slots.len() - 1;
        let mut index = Self::start(word, mask);
        loop {
            let (key, stamp) = self.slots[index];
            if stamp >> 32 != self.generation {
                self.slots[index] = (word, self.generation << 32 | self.len);
                self.len += 1;
                return (self.len - 1, true);
            }
            if key == word {
                return (stamp & 0xffff_ffff, false);
            }
            index = (index + 1) & mask;
        }
    }

    fn start(word: u64, mask: usize) -> usize {
        (word.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40) as usize & mask
    }

    /// Twice the slots, this generation's words in them (a fresh table: generation 1).
    fn grow(&mut self) {
        let size = 2 * self.slots.len();
        let old = std::mem::replace(&mut self.slots, vec![(0, 0); size]);
        let generation = std::mem::replace(&mut self.generation, 1);
        let mask = size - 1;
        for (key, stamp) in old
            .into_iter()
            .filter(|(_, stamp)| stamp >> 32 == generation)
        {
            let mut index = Self::start(key, mask);
            while self.slots[index].1 >> 32 == 1 {
                index = (index + 1) & mask;
            }
            self.slots[index] = (key, 1 << 32 | (stamp & 0xffff_ffff));
        }
    }
}

/// The texts met so far, in the order first met: a list searched in order while short
/// (a state holds a few tool names, most records sharing one, and its decisions'
/// details), each with a tag (its length and first bytes) compared before its bytes;
/// a map past that.
struct Texts<'a> {
    list: Vec<(u64, &'a [u8])>,
    map: Option<Refs<&'a [u8]>>,
}

impl<'a> Texts<'a> {
    const LISTED: usize = 16;

    /// Its length and its first, middle and last bytes.
    fn tag(text: &[u8]) -> u64 {
        match text {
            [] => 0,
            [first, .., last] | [first @ last] => {
                let middle = text[text.len() / 2];
                text.len() as u64
                    | u64::from(*first) << 40
                    | u64::from(middle) << 48
                    | u64::from(*last) << 56
            }
        }
    }

    /// The order `text` was first met in, and whether that is now.
    fn order(&mut self, text: &'a [u8]) -> (u64, bool) {
        let next = self.list.len() as u64;
        if let Some(map) = &mut self.map {
            let order = *map.entry(text).or_insert(next);
            if order == next {
                self.list.push((0, text)); // no longer searched by tag
            }
            return (order, order == next);
        }
        // a record's tool name is shared (history.rs's `shared_name`): its pointer tells it
        // without its bytes
        let same = |seen: &[u8]| seen.as_ptr() == text.as_ptr() && seen.len() == text.len();
        if let Some(order) = self.list.iter().position(|(_, seen)| same(seen)) {
            return (order as u64, false);
        }
        let tag = Self::tag(text);
        if let Some(order) = self
            .list
            .iter()
            .position(|(seen_tag, seen)| *seen_tag == tag && *seen == text)
        {
            return (order as u64, false);
        }
        self.list.push((tag, text));
        if self.list.len() > Self::LISTED {
            let mut map = Refs::with_capacity_and_hasher(2 * self.list.len(), Default::default());
            for (order, (_, seen)) in self.list.iter().enumerate() {
                map.insert(*seen, order as u64);
            }
            self.map = Some(map);
        }
        (next, true)
    }
}

/// Words (64-bit values) and texts met so far: written in full the first time, as refs
/// after, in the layout's order (the pure writer's order, so the bytes are the same).
struct Seen<'a> {
    strings: Texts<'a>,
    words: Words,
}

impl<'a> Seen<'a> {
    /// A text: 0 None, 1 new (length, UTF-8), n the (n - 2)th met.
    fn text(&mut self, out: &mut Vec<u8>, text: Option<&'a [u8]>) {
        let Some(text) = text else {
            out.push(0);
            return;
        };
        match self.strings.order(text) {
            (_, true) => {
                out.push(1);
                put(out, text.len() as u64);
                out.extend_from_slice(text);
            }
            (order, false) => put(out, order + 2),
        }
    }

    /// A word: 0 zero, 1 new (8 bytes), n the (n - 2)th met.
    fn word(&mut self, out: &mut Vec<u8>, value: u64) {
        if value == 0 {
            out.push(0);
            return;
        }
        match self.words.order(value) {
            (_, true) => {
                out.push(1);
                out.extend_from_slice(&value.to_le_bytes());
            }
            (order, false) => put(out, order + 2),
        }
    }

    /// A record's sig or result, its mode in the record's flags: 0 zero, 1 new, 2 a ref.
    fn field(&mut self, out: &mut Vec<u8>, value: u64) -> u8 {
        if value == 0 {
            return 0;
        }
        match self.words.order(value) {
            (_, true) => {
                out.extend_from_slice(&value.to_le_bytes());
                1
            }
            (order, false) => {
                put(out, order);
                2
            }
        }
    }
}

/// Format 5 as it is written, part by part in the layout's order: from version 4's body
/// (`compact`) or straight from a native state (state_bytes.rs's `write_v5`), so both
/// give the same bytes for the same state. The caller writes each part's count, then
/// its items.
pub(crate) struct V5<'a> {
    out: Vec<u8>,
    seen: Seen<'a>,
    previous_ts: i64,
    previous_run: u64,
}

impl<'a> V5<'a> {
    /// The head, then `next_seq + 1`, `verdict_floor` and the incarnation key; `words`:
    /// about how many words the state holds (its table is sized for them).
    pub(crate) fn new(
        touched_ms: i64,
        last_event_ms: i64,
        next_seq: u64,
        verdict_floor: u64,
        incarnation: u64,
        capacity: usize,
        words: usize,
    ) -> Self {
        let mut out = Vec::with_capacity(capacity);
        out.push(5);
        out.extend_from_slice(&touched_ms.to_le_bytes());
        out.extend_from_slice(&last_event_ms.to_le_bytes());
        let mut writer = V5 {
            out,
            seen: Seen {
                strings: Texts {
                    list: Vec::with_capacity(8),
                    map: None,
                },
                words: Words::lend(words),
            },
            previous_ts: last_event_ms,
            previous_run: 0,
        };
        put(&mut writer.out, next_seq);
        put(&mut writer.out, verdict_floor);
        writer.seen.word(&mut writer.out, incarnation);
        writer
    }

    /// A part's count of items (or a length).
    pub(crate) fn count(&mut self, count: usize) {
        put(&mut self.out, count as u64);
    }

    /// A history record; None when its time is more than 64 bits from the previous one's.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn record(
        &mut self,
        tool: &'a [u8],
        sig: u64,
        run: u64,
        call: u64,
        result: u64,
        unknown: Option<&'a [u8]>,
        ts: i64,
    ) -> Option<()> {
        let delta = ts.checked_sub(self.previous_ts)?;
        let (out, seen) = (&mut self.out, &mut self.seen);
        let at = out.len();
        out.push(0); // the record's flags, known once its fields are written
        seen.text(out, Some(tool));
        let mut flags = seen.field(out, sig);
        if run != self.previous_run {
            flags |= RUN_CHANGES;
            seen.word(out, run);
            self.previous_run = run;
        }
        flags |= seen.field(out, result) << 2;
        if call != 0 {
            flags |= HAS_CALL;
            put(out, call);
        }
        if unknown.is_some() {
            flags |= HAS_UNKNOWN;
            seen.text(out, unknown);
        }
        put_signed(out, delta);
        self.previous_ts = ts;
        out[at] = flags;
        Some(())
    }

    pub(crate) fn guard(
        &mut self,
        run: u64,
        window: u64,
        remaining: u64,
        first: Option<(&'a [u8], u64, u64)>,
        broken: bool,
    ) {
        let (out, seen) = (&mut self.out, &mut self.seen);
        seen.word(out, run);
        put(out, window);
        put(out, remaining);
        out.push(u8::from(first.is_some()) | (u8::from(broken) << 1));
        if let Some((tool, sig, result)) = first {
            seen.text(out, Some(tool));
            seen.word(out, sig);
            seen.word(out, result);
        }
    }

    pub(crate) fn warning(&mut self, key: u64, owner: u64, bucket: u64) {
        self.out.extend_from_slice(&key.to_le_bytes());
        self.seen.word(&mut self.out, owner);
        put(&mut self.out, bucket);
    }

    pub(crate) fn seen_id(&mut self, id: u64) {
        self.out.extend_from_slice(&id.to_le_bytes());
    }

    pub(crate) fn decision(&mut self, numbers: [u64; 4], detail: Option<&'a [u8]>, seq: i64) {
        for value in numbers {
            put(&mut self.out, value); // event, action, detector, count
        }
        self.seen.text(&mut self.out, detail);
        put_signed(&mut self.out, seq);
    }

    /// A parked event (its seq, then its JSON), or a pending one (`seq` None).
    pub(crate) fn waiting(&mut self, seq: Option<u64>, json: &[u8]) {
        if let Some(seq) = seq {
            put(&mut self.out, seq);
        }
        put(&mut self.out, json.len() as u64);
        self.out.extend_from_slice(json);
    }

    /// A skipped seq range (first, last).
    pub(crate) fn skipped(&mut self, first: u64, last: u64) {
        put(&mut self.out, first);
        put(&mut self.out, last);
    }

    /// A closed seq space: its incarnation key and next seq.
    pub(crate) fn retired(&mut self, incarnation: u64, next_seq: u64) {
        self.out.extend_from_slice(&incarnation.to_le_bytes());
        put(&mut self.out, next_seq);
    }

    /// The rules' trailer, last: the state's bytes.
    pub(crate) fn finish(mut self, rules: &[u8]) -> Vec<u8> {
        put(&mut self.out, rules.len() as u64);
        self.out.extend_from_slice(rules);
        self.seen.words.give_back();
        self.out
    }
}

fn compact(touched_ms: i64, last_event_ms: i64, body: &[u8]) -> Option<Vec<u8>> {
    let mut pack = Pack { data: body, pos: 0 };
    if pack.array()? != FIELDS {
        return None;
    }
    let (next_seq, verdict_floor, incarnation) = (pack.uint()?, pack.uint()?, pack.uint()?);
    // a record takes 20 bytes or more of the body, and holds two words or fewer
    let words = body.len() / 10 + 8;
    let mut out = V5::new(
        touched_ms,
        last_event_ms,
        next_seq,
        verdict_floor,
        incarnation,
        body.len() / 2 + 64,
        words,
    );

    let records = pack.array()?;
    out.count(records);
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
        out.record(tool, sig, run, call, result, unknown, pack.sint()?)?;
    }

    let guards = pack.map()?;
    out.count(guards);
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
        out.guard(run, window, remaining, first, pack.bool()?);
    }

    let warnings = pack.map()?;
    out.count(warnings);
    for _ in 0..warnings {
        let key = pack.uint()?;
        if pack.array()? != 2 {
            return None;
        }
        out.warning(key, pack.uint()?, pack.uint()?);
    }

    let seen_ids = pack.array()?;
    out.count(seen_ids);
    for _ in 0..seen_ids {
        out.seen_id(pack.uint()?);
    }

    let decisions = pack.array()?;
    out.count(decisions);
    for _ in 0..decisions {
        if pack.array()? != 6 {
            return None;
        }
        let numbers = [pack.uint()?, pack.uint()?, pack.uint()?, pack.uint()?];
        let detail = if pack.nil() { None } else { Some(pack.str()?) };
        out.decision(numbers, detail, pack.sint()?);
    }

    let parked = pack.map()?;
    out.count(parked);
    for _ in 0..parked {
        let seq = pack.uint()?;
        out.waiting(Some(seq), pack.bin()?);
    }

    let skipped = pack.array()?;
    out.count(skipped);
    for _ in 0..skipped {
        if pack.array()? != 2 {
            return None;
        }
        out.skipped(pack.uint()?, pack.uint()?);
    }

    let retired = pack.array()?;
    out.count(retired);
    for _ in 0..retired {
        if pack.array()? != 2 {
            return None;
        }
        out.retired(pack.uint()?, pack.uint()?);
    }

    let pending = pack.array()?;
    out.count(pending);
    for _ in 0..pending {
        out.waiting(None, pack.bin()?);
    }
    let rules = pack.bin()?;
    (pack.pos == body.len()).then(|| out.finish(rules))
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
            2 => self
                .words
                .get(usize::try_from(self.bytes.read()?).ok()?)
                .copied(),
            _ => None,
        }
    }
}

pub(crate) fn pack_text<S: Sink>(out: &mut S, text: Option<&[u8]>) {
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
        let call = if flags & HAS_CALL != 0 {
            state.bytes.read()?
        } else {
            0
        };
        let unknown = if flags & HAS_UNKNOWN != 0 {
            state.text()?
        } else {
            None
        };
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
