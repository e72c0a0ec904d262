//! A native state as the bytes the Python engine writes for it: the format-4 body
//! (state_codec.py's `_Body`, one MessagePack array as msgspec writes it), so that a
//! native fold checkpoints without building a Python SessionState.
//!
//! msgspec's MessagePack is the smallest form of each value, as the state codec's
//! writers (state_codec.rs, which turn such a body into format 5) write it. An event
//! waiting in the state (parked on a gap, or pending a restart) is kept as msgspec's
//! JSON of the Python event at rest (`state.encode_event` of `native_step._at_rest`):
//! the tag first, the fields in the struct's order (`__struct_fields__`: a subclass's own
//! before the keyword-only common ones), those at their default left out,
//! strings escaped as orjson escapes them (msgspec's are the same). A usage report's
//! cost is a float, which msgspec writes in a form of its own (`1e16`): a state with
//! one waiting is left to Python.

use crate::decode::Usage;
use crate::output::{write_int, write_str};
use crate::session::{Body, Event, State};
use crate::state_codec::{pack_array, pack_bin, pack_map, pack_sint, pack_str, pack_text, pack_uint, Pack};

fn pair(out: &mut Vec<u8>, first: i64, second: i64) {
    pack_array(out, 2);
    pack_sint(out, first);
    pack_sint(out, second);
}

/// The state's format-4 body, or None when a waiting event has a usage cost (left to
/// Python, see above).
pub fn v4_body(state: &State) -> Option<Vec<u8>> {
    let mut parked = Vec::with_capacity(state.parked.len());
    for (seq, event) in &state.parked {
        parked.push((*seq, event_json(event)?));
    }
    let mut pending = Vec::with_capacity(state.pending.len());
    for event in &state.pending {
        pending.push(event_json(event)?);
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
    pack_map(&mut out, parked.len());
    for (seq, json) in &parked {
        pack_sint(&mut out, *seq);
        pack_bin(&mut out, json);
    }
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
    pack_array(&mut out, pending.len());
    for json in &pending {
        pack_bin(&mut out, json);
    }
    pack_bin(&mut out, &state.rules.to_bytes());
    Some(out)
}

/// A waiting event's JSON as msgspec writes the Python event at rest, or None for a
/// usage cost (a float).
fn event_json(event: &Event) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(256);
    let tag: &[u8] = match event.body {
        Body::Call { .. } => b"tool_call",
        Body::Result { .. } => b"tool_result",
        Body::Compaction => b"compaction",
        Body::RunEnded => b"run_ended",
    };
    out.extend_from_slice(b"{\"type\":\"");
    out.extend_from_slice(tag);
    out.push(b'"');
    match &event.body {
        Body::Call { call_id, tool_name, token, action, .. } => {
            text_field(&mut out, "call_id", Some(call_id));
            text_field(&mut out, "tool_name", Some(tool_name));
            text_field(&mut out, "args_hash", Some(token));
            text_field(&mut out, "args_action", action.as_deref());
        }
        Body::Result { call_id, tool_name, token, outcome, unknown, usage, .. } => {
            text_field(&mut out, "call_id", Some(call_id));
            text_field(&mut out, "tool_name", Some(tool_name));
            text_field(&mut out, "args_hash", token.as_deref());
            if outcome.is_none() {
                // _at_rest: `result=None` (not its default, UNSET) when nothing is recorded
                name(&mut out, "result");
                out.extend_from_slice(b"null");
            }
            text_field(&mut out, "result_hash", outcome.as_deref());
            text_field(&mut out, "unknown_tool", unknown.as_deref());
            if let Some(usage) = usage {
                usage_field(&mut out, usage)?;
            }
        }
        Body::Compaction | Body::RunEnded => {}
    }
    text_field(&mut out, "event_id", Some(&event.event_id));
    text_field(&mut out, "session_key", event.session_key.as_deref());
    text_field(&mut out, "run_id", event.run_id.as_deref());
    text_field(&mut out, "agent_id", event.agent_id.as_deref());
    text_field(&mut out, "incarnation", event.incarnation.as_deref());
    int_field(&mut out, "seq", event.seq);
    int_field(&mut out, "ts", Some(event.ts));
    if let Some((topic, partition, requester)) = &event.reply_to {
        name(&mut out, "reply_to");
        out.push(b'{');
        out.extend_from_slice(b"\"topic\":");
        write_str(&mut out, topic);
        int_field(&mut out, "partition", Some(*partition));
        text_field(&mut out, "requester", Some(requester));
        out.push(b'}');
    }
    out.push(b'}');
    Some(out)
}

fn name(out: &mut Vec<u8>, field: &str) {
    out.push(b',');
    write_str(out, field);
    out.push(b':');
}

/// A field at its default (None) is left out (`omit_defaults`).
fn text_field(out: &mut Vec<u8>, field: &str, value: Option<&str>) {
    if let Some(value) = value {
        name(out, field);
        write_str(out, value);
    }
}

fn int_field(out: &mut Vec<u8>, field: &str, value: Option<i64>) {
    if let Some(value) = value {
        name(out, field);
        write_int(out, value);
    }
}

fn usage_field(out: &mut Vec<u8>, usage: &Usage) -> Option<()> {
    if usage.cost.is_some() {
        return None;
    }
    name(out, "usage");
    let start = out.len();
    out.push(b'{');
    int_field(out, "input_tokens", usage.input_tokens);
    int_field(out, "output_tokens", usage.output_tokens);
    int_field(out, "total_tokens", usage.total_tokens);
    // every field is written with a leading comma: the first one's goes
    if out.len() > start + 1 {
        out.remove(start + 1);
    }
    out.push(b'}');
    Some(())
}

/// A state read natively from its bytes (format 4, or format 5 through its expansion to
/// version 4's body): the state `NativeEngine.from_python(state_codec.decode(data))`
/// builds, or None to leave the bytes to that route. It takes only what the Python
/// reader takes (msgspec's typed body, `_state_of_body`'s checks) and fits the native
/// state: any other form, a repeated map key (msgspec keeps the last), an event waiting
/// (msgspec's JSON of an event is the Python decoder's to check), older formats, and
/// corrupt bytes go to Python, which reads them or says why not.
pub fn read_state(data: &[u8]) -> Option<State> {
    const HEAD: usize = 17;
    if data.len() < HEAD {
        return None;
    }
    let expanded;
    let body = match data[0] {
        4 => &data[HEAD..],
        5 => {
            expanded = crate::state_codec::expand(data)?;
            &expanded[..]
        }
        _ => return None,
    };
    let touched_ms = i64::from_le_bytes(data[1..9].try_into().ok()?);
    let last_event_ms = i64::from_le_bytes(data[9..HEAD].try_into().ok()?);
    let mut body = Pack { data: body, pos: 0 };
    let state = read_body(&mut body, touched_ms, last_event_ms)?;
    (body.pos == body.data.len()).then_some(state)
}

fn text<'a>(pack: &mut Pack<'a>) -> Option<&'a str> {
    std::str::from_utf8(pack.str()?).ok()
}

fn optional_text(pack: &mut Pack<'_>) -> Option<Option<String>> {
    if pack.nil() {
        return Some(None);
    }
    Some(Some(text(pack)?.to_owned()))
}

/// An array of exactly `length` items (a msgspec tuple or array-like struct).
fn tuple(pack: &mut Pack<'_>, length: usize) -> Option<()> {
    (pack.array()? == length).then_some(())
}

fn int_pair(pack: &mut Pack<'_>) -> Option<(i64, i64)> {
    tuple(pack, 2)?;
    Some((pack.sint()?, pack.sint()?))
}

fn read_body(pack: &mut Pack<'_>, touched_ms: i64, last_event_ms: i64) -> Option<State> {
    use std::sync::Arc;

    use crate::engine::history::{History, Record};
    use crate::engine::rules::RuleState;
    use crate::session::{Decision, Guard, ACTIONS, DETECTORS};

    tuple(pack, 13)?;
    let next_seq = match pack.sint()? {
        0 => None,
        stored => Some(stored.checked_sub(1)?),
    };
    let verdict_floor = pack.sint()?;
    let incarnation = pack.uint()?;
    let count = pack.array()?;
    let mut records = Vec::with_capacity(count.min(4096));
    for _ in 0..count {
        tuple(pack, 7)?;
        let tool: Arc<str> = Arc::from(text(pack)?);
        let sig = pack.uint()?;
        let run = pack.uint()?;
        let call = u32::try_from(pack.uint()?).ok()?;
        let result = pack.uint()?;
        let unknown = optional_text(pack)?.map(Arc::from);
        records.push(Record { tool, sig, run, call, result, unknown, ts: pack.sint()? });
    }
    let mut guards: Vec<(u64, Guard)> = Vec::new();
    for _ in 0..pack.map()? {
        let run = pack.uint()?;
        if guards.iter().any(|(seen, _)| *seen == run) {
            return None;
        }
        tuple(pack, 4)?;
        let window = pack.sint()?;
        let remaining = pack.sint()?;
        let first = if pack.nil() {
            None
        } else {
            tuple(pack, 3)?;
            Some((Arc::from(text(pack)?), pack.uint()?, pack.uint()?))
        };
        guards.push((run, Guard { window, remaining, first, broken: pack.bool()? }));
    }
    let mut warnings: Vec<(u64, (u64, i64))> = Vec::new();
    for _ in 0..pack.map()? {
        let key = pack.uint()?;
        if warnings.iter().any(|(seen, _)| *seen == key) {
            return None;
        }
        tuple(pack, 2)?;
        warnings.push((key, (pack.uint()?, pack.sint()?)));
    }
    let mut seen_ids = Vec::new();
    for _ in 0..pack.array()? {
        seen_ids.push(pack.uint()?);
    }
    let mut decisions = Vec::new();
    for _ in 0..pack.array()? {
        tuple(pack, 6)?;
        let event = u32::try_from(pack.uint()?).ok()?;
        let action = u8::try_from(pack.uint()?).ok().filter(|a| usize::from(*a) < ACTIONS.len())?;
        let detector = u8::try_from(pack.uint()?).ok().filter(|d| usize::from(*d) < DETECTORS.len())?;
        let count = pack.sint()?;
        let detail = optional_text(pack)?;
        decisions.push(Decision { event, action, detector, count, detail, seq: pack.sint()? });
    }
    if pack.map()? != 0 {
        return None; // parked events: Python reads them
    }
    let mut skipped = Vec::new();
    for _ in 0..pack.array()? {
        skipped.push(int_pair(pack)?);
    }
    let mut retired = Vec::new();
    for _ in 0..pack.array()? {
        tuple(pack, 2)?;
        retired.push((pack.uint()?, pack.sint()?));
    }
    if pack.array()? != 0 {
        return None; // pending events: as parked ones
    }
    let rules = RuleState::from_bytes(pack.bin()?)?;
    Some(State {
        history: History::from_records(records),
        guards,
        warnings,
        next_seq,
        parked: Vec::new(),
        skipped,
        seen_ids,
        decisions,
        verdict_floor,
        touched_ms,
        last_event_ms,
        incarnation,
        retired,
        pending: Vec::new(),
        rules,
    })
}
