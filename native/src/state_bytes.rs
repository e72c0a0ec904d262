//! A native state as the bytes the Python engine writes for it: the format-4 body
//! (state_codec.py's `_Body`, one MessagePack array as msgspec writes it), so that a
//! native fold checkpoints without building a Python SessionState.
//!
//! msgspec's MessagePack is the smallest form of each value, as the state codec's
//! writers (state_codec.rs, which turn such a body into format 5) write it. A state with events waiting (parked or pending) is left to
//! Python: their JSON is msgspec's JSON of the Python event at rest, which this does not
//! write (they are rare, and short-lived).

use crate::session::State;
use crate::state_codec::{pack_array, pack_bin, pack_map, pack_sint, pack_str, pack_text, pack_uint};

fn pair(out: &mut Vec<u8>, first: i64, second: i64) {
    pack_array(out, 2);
    pack_sint(out, first);
    pack_sint(out, second);
}

/// The state's format-4 body, or None while events wait in it (left to Python).
pub fn v4_body(state: &State) -> Option<Vec<u8>> {
    if !state.parked.is_empty() || !state.pending.is_empty() {
        return None;
    }
    let mut out = Vec::with_capacity(64 + 48 * state.history.records().len());
    pack_array(&mut out, 13);
    pack_sint(&mut out, state.next_seq.map_or(0, |seq| seq + 1));
    pack_sint(&mut out, state.verdict_floor);
    pack_uint(&mut out, state.incarnation);
    let records = state.history.records();
    pack_array(&mut out, records.len());
    for rec in records {
        pack_array(&mut out, 7);
        pack_str(&mut out, rec.tool.as_bytes());
        pack_uint(&mut out, rec.sig);
        pack_uint(&mut out, rec.run);
        pack_uint(&mut out, u64::from(rec.call));
        pack_uint(&mut out, rec.result);
        pack_text(&mut out, rec.unknown.as_deref().map(str::as_bytes));
        pack_sint(&mut out, rec.ts);
    }
    pack_map(&mut out, state.guards.len());
    for (run, guard) in &state.guards {
        pack_uint(&mut out, *run);
        pack_array(&mut out, 4);
        pack_sint(&mut out, guard.window);
        pack_sint(&mut out, guard.remaining.max(0));
        match &guard.first {
            Some((tool, sig, result)) => {
                pack_array(&mut out, 3);
                pack_str(&mut out, tool.as_bytes());
                pack_uint(&mut out, *sig);
                pack_uint(&mut out, *result);
            }
            None => out.push(0xc0),
        }
        out.push(if guard.broken { 0xc3 } else { 0xc2 });
    }
    pack_map(&mut out, state.warnings.len());
    for (key, (run, bucket)) in &state.warnings {
        pack_uint(&mut out, *key);
        pack_array(&mut out, 2);
        pack_uint(&mut out, *run);
        pack_sint(&mut out, *bucket);
    }
    pack_array(&mut out, state.seen_ids.len());
    for id in &state.seen_ids {
        pack_uint(&mut out, *id);
    }
    pack_array(&mut out, state.decisions.len());
    for decision in &state.decisions {
        pack_array(&mut out, 6);
        pack_uint(&mut out, u64::from(decision.event));
        pack_uint(&mut out, u64::from(decision.action));
        pack_uint(&mut out, u64::from(decision.detector));
        pack_sint(&mut out, decision.count);
        pack_text(&mut out, decision.detail.as_deref().map(str::as_bytes));
        pack_sint(&mut out, decision.seq);
    }
    pack_map(&mut out, 0); // parked: none (above)
    pack_array(&mut out, state.skipped.len());
    for (first, last) in &state.skipped {
        pair(&mut out, *first, *last);
    }
    pack_array(&mut out, state.retired.len());
    for (incarnation, next_seq) in &state.retired {
        pack_array(&mut out, 2);
        pack_uint(&mut out, *incarnation);
        pack_sint(&mut out, *next_seq);
    }
    pack_array(&mut out, 0); // pending: none (above)
    pack_bin(&mut out, &state.rules);
    Some(out)
}
