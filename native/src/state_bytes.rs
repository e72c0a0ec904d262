//! A native state as the bytes the Python engine writes for it: the format-4 body
//! (state_codec.py's `_Body`, one MessagePack array as msgspec writes it), so that a
//! native fold checkpoints without building a Python SessionState.
//!
//! msgspec's MessagePack is the smallest form of each value: positive integers as
//! fixint, uint8..uint64, negative ones as negative fixint, int8..int64; strings as
//! fixstr, str8..str32; bytes as bin8..bin32; tuples and lists as arrays, dicts as maps
//! (in insertion order). A state with events waiting (parked or pending) is left to
//! Python: their JSON is msgspec's JSON of the Python event at rest, which this does not
//! write (they are rare, and short-lived).

use crate::session::State;

fn uint(out: &mut Vec<u8>, value: u64) {
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

fn int(out: &mut Vec<u8>, value: i64) {
    if value >= 0 {
        uint(out, value as u64);
    } else if value >= -32 {
        out.push(value as i8 as u8);
    } else if value >= i64::from(i8::MIN) {
        out.extend_from_slice(&[0xd0, value as i8 as u8]);
    } else if value >= i64::from(i16::MIN) {
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

fn header(out: &mut Vec<u8>, len: usize, fix: u8, fix_max: usize, wide: [u8; 2]) {
    if len < fix_max {
        out.push(fix | len as u8);
    } else if len <= 0xffff {
        out.push(wide[0]);
        out.extend_from_slice(&(len as u16).to_be_bytes());
    } else {
        out.push(wide[1]);
        out.extend_from_slice(&(len as u32).to_be_bytes());
    }
}

fn array(out: &mut Vec<u8>, len: usize) {
    header(out, len, 0x90, 16, [0xdc, 0xdd]);
}

fn map(out: &mut Vec<u8>, len: usize) {
    header(out, len, 0x80, 16, [0xde, 0xdf]);
}

fn string(out: &mut Vec<u8>, text: &str) {
    let len = text.len();
    if len < 32 {
        out.push(0xa0 | len as u8);
    } else if len <= 0xff {
        out.extend_from_slice(&[0xd9, len as u8]);
    } else if len <= 0xffff {
        out.push(0xda);
        out.extend_from_slice(&(len as u16).to_be_bytes());
    } else {
        out.push(0xdb);
        out.extend_from_slice(&(len as u32).to_be_bytes());
    }
    out.extend_from_slice(text.as_bytes());
}

fn opt_string(out: &mut Vec<u8>, text: Option<&str>) {
    match text {
        Some(text) => string(out, text),
        None => out.push(0xc0),
    }
}

fn binary(out: &mut Vec<u8>, data: &[u8]) {
    let len = data.len();
    if len <= 0xff {
        out.extend_from_slice(&[0xc4, len as u8]);
    } else if len <= 0xffff {
        out.push(0xc5);
        out.extend_from_slice(&(len as u16).to_be_bytes());
    } else {
        out.push(0xc6);
        out.extend_from_slice(&(len as u32).to_be_bytes());
    }
    out.extend_from_slice(data);
}

fn pair(out: &mut Vec<u8>, first: i64, second: i64) {
    array(out, 2);
    int(out, first);
    int(out, second);
}

/// The state's format-4 body, or None while events wait in it (left to Python).
pub fn v4_body(state: &State) -> Option<Vec<u8>> {
    if !state.parked.is_empty() || !state.pending.is_empty() {
        return None;
    }
    let mut out = Vec::with_capacity(64 + 48 * state.history.records().len());
    array(&mut out, 13);
    int(&mut out, state.next_seq.map_or(0, |seq| seq + 1));
    int(&mut out, state.verdict_floor);
    uint(&mut out, state.incarnation);
    let records = state.history.records();
    array(&mut out, records.len());
    for rec in records {
        array(&mut out, 7);
        string(&mut out, &rec.tool);
        uint(&mut out, rec.sig);
        uint(&mut out, rec.run);
        uint(&mut out, u64::from(rec.call));
        uint(&mut out, rec.result);
        opt_string(&mut out, rec.unknown.as_deref());
        int(&mut out, rec.ts);
    }
    map(&mut out, state.guards.len());
    for (run, guard) in &state.guards {
        uint(&mut out, *run);
        array(&mut out, 4);
        int(&mut out, guard.window);
        int(&mut out, guard.remaining.max(0));
        match &guard.first {
            Some((tool, sig, result)) => {
                array(&mut out, 3);
                string(&mut out, tool);
                uint(&mut out, *sig);
                uint(&mut out, *result);
            }
            None => out.push(0xc0),
        }
        out.push(if guard.broken { 0xc3 } else { 0xc2 });
    }
    map(&mut out, state.warnings.len());
    for (key, (run, bucket)) in &state.warnings {
        uint(&mut out, *key);
        array(&mut out, 2);
        uint(&mut out, *run);
        int(&mut out, *bucket);
    }
    array(&mut out, state.seen_ids.len());
    for id in &state.seen_ids {
        uint(&mut out, *id);
    }
    array(&mut out, state.decisions.len());
    for decision in &state.decisions {
        array(&mut out, 6);
        uint(&mut out, u64::from(decision.event));
        uint(&mut out, u64::from(decision.action));
        uint(&mut out, u64::from(decision.detector));
        int(&mut out, decision.count);
        opt_string(&mut out, decision.detail.as_deref());
        int(&mut out, decision.seq);
    }
    map(&mut out, 0); // parked: none (above)
    array(&mut out, state.skipped.len());
    for (first, last) in &state.skipped {
        pair(&mut out, *first, *last);
    }
    array(&mut out, state.retired.len());
    for (incarnation, next_seq) in &state.retired {
        array(&mut out, 2);
        uint(&mut out, *incarnation);
        int(&mut out, *next_seq);
    }
    array(&mut out, 0); // pending: none (above)
    binary(&mut out, &state.rules);
    Some(out)
}
