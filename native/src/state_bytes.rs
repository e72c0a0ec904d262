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
//! strings escaped as orjson escapes them (msgspec's are the same); a result's failure
//! identity (`ResultAtRest.failure`) after the fields it inherits. A usage report's
//! cost is a float, which msgspec writes in a form of its own (`1e16`): a state with
//! one waiting is left to Python.

use crate::decode::Usage;
use crate::output::{write_int, write_str};
use crate::session::{Body, Event, State};
use crate::state_codec::{
    pack_array, pack_bin, pack_map, pack_sint, pack_str, pack_text, pack_uint, Count, Pack, Sink,
    V5,
};

fn pair<S: Sink>(out: &mut S, first: i64, second: i64) {
    pack_array(out, 2);
    pack_sint(out, first);
    pack_sint(out, second);
}

/// What a state's bytes take besides its fields: the JSON of its waiting events, and
/// its rules' trailer. None when a waiting event has a usage cost (left to Python, see
/// above).
struct Written {
    parked: Vec<(i64, Vec<u8>)>,
    pending: Vec<Vec<u8>>,
    rules: Vec<u8>,
}

impl Written {
    fn of(state: &State) -> Option<Written> {
        let mut parked = Vec::with_capacity(state.parked.len());
        for (seq, event) in &state.parked {
            parked.push((*seq, event_json(event)?));
        }
        let mut pending = Vec::with_capacity(state.pending.len());
        for event in &state.pending {
            pending.push(event_json(event)?);
        }
        Some(Written {
            parked,
            pending,
            rules: state.rules.to_bytes(),
        })
    }
}

/// The head's size: version, touched_ms, last_event_ms.
const HEAD: usize = 17;

/// The state's format-4 body, or None when a waiting event has a usage cost (left to
/// Python, see above).
pub fn v4_body(state: &State) -> Option<Vec<u8>> {
    let written = Written::of(state)?;
    let mut out = Vec::with_capacity(64 + 48 * state.history.records().len());
    write_v4_body(&mut out, state, &written);
    Some(out)
}

/// The state's bytes as `state_codec.fit` writes them when nothing need be shed
/// (`encode_body` of its version-4 body): format 5, or version 4 where format 5 has no
/// room for a value (none the engine makes). None where Python's checkpoint must
/// write them: its version-4 bytes over `cap` (the cap is held to version 4's size,
/// whichever format is written, so both engines shed at the same events), or a waiting
/// event with a usage cost.
pub fn checkpoint(state: &State, cap: usize) -> Option<Vec<u8>> {
    let written = Written::of(state)?;
    if !written.fit(state, cap) {
        return None;
    }
    Some(write_v5(state, &written).unwrap_or_else(|| {
        let mut out = Vec::new();
        out.push(4);
        out.extend_from_slice(&state.touched_ms.to_le_bytes());
        out.extend_from_slice(&state.last_event_ms.to_le_bytes());
        write_v4_body(&mut out, state, &written);
        out
    }))
}

/// Whether the state's bytes fit `cap` as `checkpoint` measures them (false for a
/// waiting event with a usage cost: Python's to measure).
pub fn fits(state: &State, cap: usize) -> bool {
    Written::of(state).is_some_and(|written| written.fit(state, cap))
}

impl Written {
    /// Whether the state's version-4 bytes are `cap` or fewer: counted where a bound
    /// of them, a few additions, is over it (a state is some 1.5 kB, its cap 64 kB).
    fn fit(&self, state: &State, cap: usize) -> bool {
        if v4_bound(state, self) <= cap {
            return true;
        }
        let mut size = Count::default();
        write_v4_body(&mut size, state, self);
        HEAD + size.0 <= cap
    }
}

/// At least the size of the state's version-4 bytes: each value at its widest
/// MessagePack form (an int 9 bytes, a string's or a collection's header 5).
fn v4_bound(state: &State, written: &Written) -> usize {
    const INT: usize = 9;
    const HEADER: usize = 5;
    let text = |text: Option<&str>| HEADER + text.map_or(0, str::len);
    let mut size = HEAD + HEADER + 3 * INT;
    size += HEADER
        + state
            .history
            .records()
            .iter()
            .map(|rec| HEADER + text(Some(&rec.tool)) + 5 * INT + text(rec.unknown.as_deref()))
            .sum::<usize>();
    size += HEADER
        + state
            .guards
            .iter()
            .map(|(_, guard)| {
                5 * INT + 3 * HEADER + 1 + guard.first.as_ref().map_or(0, |(tool, _, _)| tool.len())
            })
            .sum::<usize>();
    size += HEADER + state.warnings.len() * (HEADER + 3 * INT);
    size += HEADER + state.seen_ids.len() * INT;
    size += HEADER
        + state
            .decisions
            .iter()
            .map(|d| HEADER + 5 * INT + text(d.detail.as_deref()))
            .sum::<usize>();
    size += HEADER
        + written
            .parked
            .iter()
            .map(|(_, json)| INT + HEADER + json.len())
            .sum::<usize>();
    size += HEADER + state.skipped.len() * (HEADER + 2 * INT);
    size += HEADER + state.retired.len() * (HEADER + 2 * INT);
    size += HEADER
        + written
            .pending
            .iter()
            .map(|json| HEADER + json.len())
            .sum::<usize>();
    size + HEADER + written.rules.len()
}

/// Format 5 straight from the state, the bytes `compact` makes of its version-4 body;
/// None where that gives None (a value format 5 has no room for).
fn write_v5<'a>(state: &'a State, written: &'a Written) -> Option<Vec<u8>> {
    let unsigned = |value: i64| u64::try_from(value).ok();
    let next_seq = match state.next_seq {
        Some(seq) => unsigned(seq.checked_add(1)?)?,
        None => 0,
    };
    let records = state.history.records();
    let mut out = V5::new(
        state.touched_ms,
        state.last_event_ms,
        next_seq,
        unsigned(state.verdict_floor)?,
        state.incarnation,
        64 + 24 * records.len() + written.rules.len(),
        2 * records.len() + 3 * state.guards.len() + state.warnings.len() + 2,
    );
    out.count(records.len());
    for rec in records {
        let unknown = rec.unknown.as_deref().map(str::as_bytes);
        out.record(
            rec.tool.as_bytes(),
            rec.sig,
            rec.run,
            u64::from(rec.call),
            rec.result,
            unknown,
            rec.ts,
        )?;
    }
    out.count(state.guards.len());
    for (run, guard) in &state.guards {
        let first = guard
            .first
            .as_ref()
            .map(|(tool, sig, result)| (tool.as_bytes(), *sig, *result));
        out.guard(
            *run,
            unsigned(guard.window)?,
            unsigned(guard.remaining.max(0))?,
            first,
            guard.broken,
        );
    }
    out.count(state.warnings.len());
    for (key, (owner, bucket)) in &state.warnings {
        out.warning(*key, *owner, unsigned(*bucket)?);
    }
    out.count(state.seen_ids.len());
    for id in &state.seen_ids {
        out.seen_id(*id);
    }
    out.count(state.decisions.len());
    for d in &state.decisions {
        let numbers = [
            u64::from(d.event),
            u64::from(d.action),
            u64::from(d.detector),
            unsigned(d.count)?,
        ];
        out.decision(numbers, d.detail.as_deref().map(str::as_bytes), d.seq);
    }
    out.count(written.parked.len());
    for (seq, json) in &written.parked {
        out.waiting(Some(unsigned(*seq)?), json);
    }
    out.count(state.skipped.len());
    for (first, last) in &state.skipped {
        out.skipped(unsigned(*first)?, unsigned(*last)?);
    }
    out.count(state.retired.len());
    for (incarnation, next_seq) in &state.retired {
        out.retired(*incarnation, unsigned(*next_seq)?);
    }
    out.count(written.pending.len());
    for json in &written.pending {
        out.waiting(None, json);
    }
    Some(out.finish(&written.rules))
}

/// Version 4's body (msgspec's MessagePack of state_codec.py's `_Body`), written or counted.
fn write_v4_body<S: Sink>(out: &mut S, state: &State, written: &Written) {
    pack_array(out, 13);
    pack_sint(out, state.next_seq.map_or(0, |seq| seq + 1));
    pack_sint(out, state.verdict_floor);
    pack_uint(out, state.incarnation);
    let records = state.history.records();
    pack_array(out, records.len());
    for rec in records {
        pack_array(out, 7);
        pack_str(out, rec.tool.as_bytes());
        pack_uint(out, rec.sig);
        pack_uint(out, rec.run);
        pack_uint(out, u64::from(rec.call));
        pack_uint(out, rec.result);
        pack_text(out, rec.unknown.as_deref().map(str::as_bytes));
        pack_sint(out, rec.ts);
    }
    pack_map(out, state.guards.len());
    for (run, guard) in &state.guards {
        pack_uint(out, *run);
        pack_array(out, 4);
        pack_sint(out, guard.window);
        pack_sint(out, guard.remaining.max(0));
        match &guard.first {
            Some((tool, sig, result)) => {
                pack_array(out, 3);
                pack_str(out, tool.as_bytes());
                pack_uint(out, *sig);
                pack_uint(out, *result);
            }
            None => out.push(0xc0),
        }
        out.push(if guard.broken { 0xc3 } else { 0xc2 });
    }
    pack_map(out, state.warnings.len());
    for (key, (run, bucket)) in &state.warnings {
        pack_uint(out, *key);
        pack_array(out, 2);
        pack_uint(out, *run);
        pack_sint(out, *bucket);
    }
    pack_array(out, state.seen_ids.len());
    for id in &state.seen_ids {
        pack_uint(out, *id);
    }
    pack_array(out, state.decisions.len());
    for decision in &state.decisions {
        pack_array(out, 6);
        pack_uint(out, u64::from(decision.event));
        pack_uint(out, u64::from(decision.action));
        pack_uint(out, u64::from(decision.detector));
        pack_sint(out, decision.count);
        pack_text(out, decision.detail.as_deref().map(str::as_bytes));
        pack_sint(out, decision.seq);
    }
    pack_map(out, written.parked.len());
    for (seq, json) in &written.parked {
        pack_sint(out, *seq);
        pack_bin(out, json);
    }
    pack_array(out, state.skipped.len());
    for (first, last) in &state.skipped {
        pair(out, *first, *last);
    }
    pack_array(out, state.retired.len());
    for (incarnation, next_seq) in &state.retired {
        pack_array(out, 2);
        pack_uint(out, *incarnation);
        pack_sint(out, *next_seq);
    }
    pack_array(out, written.pending.len());
    for json in &written.pending {
        pack_bin(out, json);
    }
    pack_bin(out, &written.rules);
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
        Body::Call {
            call_id,
            tool_name,
            token,
            action,
            ..
        } => {
            text_field(&mut out, "call_id", Some(call_id));
            text_field(&mut out, "tool_name", Some(tool_name));
            text_field(&mut out, "args_hash", Some(token));
            text_field(&mut out, "args_action", action.as_deref());
        }
        Body::Result {
            call_id,
            tool_name,
            token,
            outcome,
            unknown,
            usage,
            failure,
            ..
        } => {
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
            if let Some(failure) = failure {
                name(&mut out, "failure"); // state.py's ResultAtRest: after the fields it inherits
                out.extend_from_slice(failure.to_string().as_bytes());
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

    use crate::engine::history::{shared_name, History, Record};
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
        let tool = shared_name(text(pack)?);
        let sig = pack.uint()?;
        let run = pack.uint()?;
        let call = u32::try_from(pack.uint()?).ok()?;
        let result = pack.uint()?;
        let unknown = optional_text(pack)?.map(Arc::from);
        records.push(Record {
            tool,
            sig,
            run,
            call,
            result,
            unknown,
            ts: pack.sint()?,
        });
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
            Some((shared_name(text(pack)?), pack.uint()?, pack.uint()?))
        };
        guards.push((
            run,
            Guard {
                window,
                remaining,
                first,
                broken: pack.bool()?,
            },
        ));
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
        let action = u8::try_from(pack.uint()?)
            .ok()
            .filter(|a| usize::from(*a) < ACTIONS.len())?;
        let detector = u8::try_from(pack.uint()?)
            .ok()
            .filter(|d| usize::from(*d) < DETECTORS.len())?;
        let count = pack.sint()?;
        let detail = optional_text(pack)?;
        decisions.push(Decision {
            event,
            action,
            detector,
            count,
            detail,
            seq: pack.sint()?,
        });
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
