//! An input event's wire bytes checked and fingerprinted in one pass, in Rust.
//!
//! The accept path of loopfuse.schemas.decode: this says "sure" only of bytes the Python
//! decoder accepts through its msgspec pass - read by msgspec into the event, which its
//! checks then let through - and computes the event's args and result tokens from the
//! same bytes, where the engine would otherwise walk the decoded payload again. For
//! anything else - every rejection, and whatever that pass leaves to the pydantic models
//! (RFC 3339 `ts`, unknown fields, duplicate keys, big integers, lone surrogates, deep
//! nesting, oversized identifiers) - it returns None and the Python decoder decides and
//! words it as it always did. So rejections and their reasons stay the Python
//! decoder's, byte for byte, and the event is msgspec's, as before.
//!
//! `read_event` gives the event's fields as a `WireEvent` borrowing the parsed bytes:
//! what a native step reads of an event without any Python object; `event_fields` shows it to the tests, which compare it with msgspec's event.
//!
//! (Building the event's Python objects here as well was tried: msgspec builds them in
//! less than half the instructions this crate took through PyO3's dict and call API.)

use std::borrow::Cow;
use std::collections::HashSet;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use xxhash_rust::xxh3::xxh3_128;

use crate::canonical::write_value;
use crate::engine::volatile::VolatileResults;
use crate::json::{parse_object, Parsed, Value};
use crate::outcome::{normalised_result, write_masked, write_outcome};

/// The largest integer a JavaScript gateway sends exactly (schemas/events.py MAX_WIRE_INT).
const MAX_WIRE_INT: i64 = (1 << 53) - 1;
/// 9999-12-31T23:59:59.999Z in epoch milliseconds (schemas/events.py MAX_EVENT_TS).
const MAX_EVENT_TS: i64 = 253_402_300_799_999;
const MAX_PARTITION: i64 = (1 << 31) - 1;
const MAX_REQUESTER_CHARS: usize = 255;
const MAX_TOPIC_CHARS: usize = 249;
/// Deeper bounds than this are left to the Python decoder (a bound of 1 or 2 is where
/// its first pass cannot tell a usage object's nesting from the event it built).
pub const DEPTH_BOUNDS: std::ops::RangeInclusive<usize> = 3..=1024;

#[derive(Clone, Copy, PartialEq, Debug)]
pub enum Kind {
    ToolCall,
    ToolResult,
    Compaction,
    RunEnded,
}

/// The fields each kind has, besides `type` (the Structs' fields).
fn has_field(kind: Kind, name: &str) -> bool {
    let common = matches!(
        name,
        "event_id"
            | "session_key"
            | "run_id"
            | "agent_id"
            | "incarnation"
            | "seq"
            | "ts"
            | "reply_to"
    );
    let carrier = matches!(
        name,
        "call_id" | "tool_name" | "args" | "args_hash" | "args_action"
    );
    common
        || match kind {
            Kind::ToolCall => carrier,
            Kind::ToolResult => {
                carrier
                    || matches!(
                        name,
                        "result" | "result_hash" | "error" | "unknown_tool" | "usage"
                    )
            }
            Kind::Compaction => name == "reason",
            Kind::RunEnded => false,
        }
}

/// The fields that identify something, bounded in UTF-8 bytes (IDENTIFIER_FIELDS).
fn is_identifier(name: &str) -> bool {
    matches!(
        name,
        "event_id"
            | "session_key"
            | "run_id"
            | "agent_id"
            | "incarnation"
            | "call_id"
            | "tool_name"
            | "args_hash"
            | "args_action"
            | "result_hash"
            | "unknown_tool"
    )
}

/// xxh3-128 as 32 lowercase hex digits (what xxhash.xxh3_128_hexdigest returns), written
/// by hand: `format!` took twenty times the instructions of the hash of a short text.
pub fn hex128(data: &[u8]) -> String {
    String::from_utf8(hex128_digits(data).to_vec()).expect("hex digits are ASCII")
}

/// `hex128` on the stack (a verdict's id is written, never kept).
pub fn hex128_digits(data: &[u8]) -> [u8; 32] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let hash = xxh3_128(data);
    let mut digits = [0u8; 32];
    for (index, digit) in digits.iter_mut().enumerate() {
        *digit = HEX[((hash >> ((31 - index) * 4)) & 0xf) as usize];
    }
    digits
}

fn canonical_token(value: &Value<'_>) -> Option<String> {
    let mut out = Vec::with_capacity(128);
    write_value(&mut out, value)?;
    Some(hex128(&out))
}

/// A string field that may be null: Some(None) for null, None where the type is wrong.
fn optional_str<'v>(value: &'v Value<'_>) -> Option<Option<&'v str>> {
    match value {
        Value::Null => Some(None),
        Value::Str(text) => Some(Some(text)),
        _ => None,
    }
}

fn wire_int(value: &Value<'_>, max: i64) -> Option<i64> {
    match value {
        Value::Int(number) if (0..=max).contains(number) => Some(*number),
        _ => None,
    }
}

fn is_topic_name(text: &str) -> bool {
    (1..=MAX_TOPIC_CHARS).contains(&text.len())
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// An event's tokens: (args token, result token, whether the result token is known).
pub type Tokens = (Option<String>, Option<String>, bool);

/// Usage as the wire gives it (schemas/events.py Usage): counts and a cost.
#[derive(Clone, Copy, Default, PartialEq, Debug)]
pub struct Usage {
    pub input_tokens: Option<i64>,
    pub output_tokens: Option<i64>,
    pub total_tokens: Option<i64>,
    pub cost: Option<f64>,
}

/// An input event the Python decoder accepts through its msgspec pass, its fields
/// borrowed from the parsed bytes: what a native step reads of it (the msgspec event's
/// fields, with ToolResult.error_text already taken from `error`).
pub struct WireEvent<'v, 'a> {
    pub kind: Kind,
    pub event_id: &'v str,
    pub session_key: Option<&'v str>,
    pub run_id: Option<&'v str>,
    pub agent_id: Option<&'v str>,
    pub incarnation: Option<&'v str>,
    pub seq: Option<i64>,
    pub ts: i64,
    /// (topic, partition, requester)
    pub reply_to: Option<(&'v str, i64, &'v str)>,
    pub call_id: Option<&'v str>,
    pub tool_name: Option<&'v str>,
    /// The raw args, when sent (None: not sent; JSON null is `Some(Value::Null)`).
    pub args: Option<&'v Value<'a>>,
    pub args_hash: Option<&'v str>,
    pub args_action: Option<&'v str>,
    /// The raw result, when sent (JSON null is `Some(Value::Null)`).
    pub result: Option<&'v Value<'a>>,
    pub result_hash: Option<&'v str>,
    pub error_text: Option<&'v str>,
    pub unknown_tool: Option<&'v str>,
    pub usage: Option<Usage>,
    pub reason: Option<&'v str>,
}

impl WireEvent<'_, '_> {
    /// The session key: history scope and Kafka message key (InputEvent.key).
    pub fn key(&self) -> &str {
        match (self.session_key, self.run_id) {
            (Some(key), _) if !key.is_empty() => key,
            (_, Some(run)) => run,
            _ => "",
        }
    }
}

fn usage_count(value: &Value<'_>) -> Option<Option<i64>> {
    match value {
        Value::Null => Some(None),
        _ => Some(Some(wire_int(value, MAX_WIRE_INT)?)),
    }
}

/// The event when the Python decoder would accept it through its msgspec pass (the
/// types and bounds of schemas/events.py, then `_as_the_models_would`, `_nested_deeper`
/// and the identifier bounds); None where the Python decoder decides.
pub fn read_event<'v, 'a>(
    entries: &'v [(Cow<'a, str>, Parsed<'a>)],
    max_depth: usize,
    max_identifier_bytes: usize,
) -> Option<WireEvent<'v, 'a>> {
    let kind = match entries
        .iter()
        .find(|(name, _)| name == "type")?
        .1
        .value
        .as_str()?
    {
        "tool_call" => Kind::ToolCall,
        "tool_result" => Kind::ToolResult,
        "compaction" => Kind::Compaction,
        "run_ended" => Kind::RunEnded,
        _ => return None,
    };
    let mut event = WireEvent {
        kind,
        event_id: "",
        session_key: None,
        run_id: None,
        agent_id: None,
        incarnation: None,
        seq: None,
        ts: 0,
        reply_to: None,
        call_id: None,
        tool_name: None,
        args: None,
        args_hash: None,
        args_action: None,
        result: None,
        result_hash: None,
        error_text: None,
        unknown_tool: None,
        usage: None,
        reason: None,
    };
    let (mut has_event_id, mut has_ts, mut has_call_id, mut keyed) = (false, false, false, false);
    let mut outcomes = 0;
    for (name, parsed) in entries {
        let name = name.as_ref();
        if name == "type" {
            continue;
        }
        if !has_field(kind, name) || parsed.depth > max_depth - 1 {
            return None; // an unknown field, or nesting for the Python decoder to judge
        }
        let value = &parsed.value;
        if is_identifier(name) {
            let text = optional_str(value)?;
            if text.is_some_and(|text| text.len() > max_identifier_bytes) {
                return None;
            }
            match (name, text) {
                ("event_id" | "incarnation" | "tool_name", Some("")) => return None,
                ("event_id" | "call_id" | "tool_name", None) => return None,
                ("event_id", Some(text)) => {
                    has_event_id = true;
                    event.event_id = text;
                }
                ("call_id", _) => {
                    has_call_id = true;
                    event.call_id = text;
                }
                ("tool_name", _) => event.tool_name = text,
                ("session_key", _) => {
                    keyed |= text.is_some_and(|text| !text.is_empty());
                    event.session_key = text;
                }
                ("run_id", _) => {
                    keyed |= text.is_some_and(|text| !text.is_empty());
                    event.run_id = text;
                }
                ("agent_id", _) => event.agent_id = text,
                ("incarnation", _) => event.incarnation = text,
                ("args_hash", _) => event.args_hash = text,
                ("args_action", _) => event.args_action = text,
                ("result_hash", _) => {
                    outcomes += usize::from(text.is_some());
                    event.result_hash = text;
                }
                ("unknown_tool", _) => event.unknown_tool = text,
                _ => {}
            }
            continue;
        }
        match (name, value) {
            ("ts", _) => {
                event.ts = wire_int(value, MAX_EVENT_TS)?;
                has_ts = true;
            }
            ("seq" | "reply_to" | "error" | "usage" | "reason", Value::Null) => {}
            ("seq", _) => event.seq = Some(wire_int(value, MAX_WIRE_INT)?),
            ("reply_to", Value::Object(fields)) => {
                // ReplyTo forbids unknown fields; none is read twice (see json.rs)
                if fields.len() != 3 {
                    return None;
                }
                let topic = value.get("topic")?.as_str()?;
                let partition = wire_int(value.get("partition")?, MAX_PARTITION)?;
                let requester = value.get("requester")?.as_str()?;
                let chars = requester.chars().count();
                if !is_topic_name(topic) || !(1..=MAX_REQUESTER_CHARS).contains(&chars) {
                    return None;
                }
                event.reply_to = Some((topic, partition, requester));
            }
            ("args", _) => event.args = Some(value),
            ("result", _) => {
                event.result = Some(value);
                outcomes += 1;
            }
            ("error", Value::Str(text)) => {
                event.error_text = Some(text.as_ref());
                outcomes += 1;
            }
            ("error", Value::Object(fields)) => {
                // ErrorDetail ignores unknown fields, the models may not: not decided here
                if !fields
                    .iter()
                    .all(|(key, _)| key == "message" || key == "name")
                {
                    return None;
                }
                let message = value.get("message")?.as_str()?;
                let detail_name = match value.get("name") {
                    None => None,
                    Some(name) => optional_str(name)?,
                };
                // ToolResult.error_text: the message, else the name, else "".
                event.error_text = Some(if message.is_empty() {
                    detail_name.unwrap_or("")
                } else {
                    message
                });
                outcomes += 1;
            }
            ("usage", Value::Object(fields)) => {
                let mut usage = Usage::default();
                for (field, count) in fields {
                    match (field.as_ref(), count) {
                        ("input_tokens", _) => usage.input_tokens = usage_count(count)?,
                        ("output_tokens", _) => usage.output_tokens = usage_count(count)?,
                        ("total_tokens", _) => usage.total_tokens = usage_count(count)?,
                        ("cost", Value::Null) => {}
                        // msgspec reads an integer into a float field as that float
                        ("cost", Value::Int(number)) if (0..=MAX_WIRE_INT).contains(number) => {
                            usage.cost = Some(*number as f64);
                        }
                        ("cost", Value::Float(number)) if *number >= 0.0 => {
                            usage.cost = Some(*number);
                        }
                        _ => return None, // Usage ignores unknown fields: not decided here
                    }
                }
                event.usage = Some(usage);
            }
            ("reason", Value::Str(text)) => event.reason = Some(text.as_ref()),
            _ => return None,
        }
    }
    if !has_event_id || !has_ts || !keyed {
        return None; // required fields, and a session key or run id to scope it
    }
    let carrier = matches!(kind, Kind::ToolCall | Kind::ToolResult);
    if carrier && (!has_call_id || event.tool_name.is_none()) {
        return None;
    }
    // The exactly-one-of rules (the Python decoder's `_as_the_models_would`).
    let args_hash = event.args_hash.is_some();
    match kind {
        Kind::ToolCall if event.args.is_some() == args_hash => return None,
        Kind::ToolResult if outcomes != 1 || (event.args.is_some() && args_hash) => return None,
        _ => {}
    }
    Some(event)
}

/// The event's args and result tokens, as fingerprint.py computes them from the event;
/// `send_tools`: the configured provider send tools (an engine's), or none.
/// An event's tokens; `mask`: the volatileResults rule in force for its tool, whose
/// masking the result token is taken after.
pub fn tokens(
    event: &WireEvent<'_, '_>,
    send_tools: &HashSet<String>,
    mask: Option<&VolatileResults>,
) -> Tokens {
    let args_token = event.args.and_then(canonical_token);
    let (mut result_token, mut result_known) = (None, false);
    if event.kind == Kind::ToolResult {
        if let Some(text) = event.error_text {
            let digest = match mask {
                Some(rule) => hex128(rule.mask(text).as_bytes()),
                None => hex128(text.as_bytes()),
            };
            result_token = Some(format!("error:{digest}"));
            result_known = true;
        } else if let (Some(result), Some(tool)) = (event.result, event.tool_name) {
            // fingerprint.py's action_of: args.action when args is an object, else the hint
            let action = match event.args {
                Some(args @ Value::Object(_)) => args.get("action").and_then(Value::as_str),
                _ => event.args_action,
            };
            match normalised_result(tool, action, result, send_tools.contains(tool)) {
                None => result_known = true,
                Some(outcome) => {
                    let mut out = Vec::with_capacity(256);
                    let written = match mask {
                        Some(rule) => write_masked(&mut out, &outcome, rule),
                        None => write_outcome(&mut out, &outcome),
                    };
                    if written.is_some() {
                        result_token = Some(hex128(&out));
                        result_known = true;
                    }
                }
            }
        }
    }
    (args_token, result_token, result_known)
}

/// An event's tokens - `(args token or None, result token or None, whether the result
/// token is known)` - when the Python decoder would accept its wire bytes through its
/// msgspec pass; None where the Python decoder must decide (every rejection among it).
#[pyfunction]
pub fn event_fingerprints(
    raw: &[u8],
    max_bytes: usize,
    max_depth: usize,
    max_identifier_bytes: usize,
) -> Option<Tokens> {
    if raw.is_empty() || raw.len() > max_bytes || !DEPTH_BOUNDS.contains(&max_depth) {
        return None;
    }
    let entries = parse_object(raw, max_depth)?;
    // no send tools: the Python engine takes these tokens only for other tools
    Some(tokens(
        &read_event(&entries, max_depth, max_identifier_bytes)?,
        &HashSet::new(),
        None,
    ))
}

/// The fields a native step reads of an event (`WireEvent`), as a dict, when the
/// Python decoder would accept its bytes through its msgspec pass; else None. For
/// tests: they compare it with the msgspec event (tests/unit/test_native_decode.py).
#[pyfunction]
pub fn event_fields<'py>(
    py: Python<'py>,
    raw: &[u8],
    max_bytes: usize,
    max_depth: usize,
    max_identifier_bytes: usize,
) -> PyResult<Option<Bound<'py, PyDict>>> {
    if raw.is_empty() || raw.len() > max_bytes || !DEPTH_BOUNDS.contains(&max_depth) {
        return Ok(None);
    }
    let Some(entries) = parse_object(raw, max_depth) else {
        return Ok(None);
    };
    let Some(event) = read_event(&entries, max_depth, max_identifier_bytes) else {
        return Ok(None);
    };
    let canonical = |value: Option<&Value<'_>>| {
        value.and_then(|value| {
            let mut out = Vec::new();
            write_value(&mut out, value).map(|()| out)
        })
    };
    let fields = PyDict::new(py);
    let kind = match event.kind {
        Kind::ToolCall => "tool_call",
        Kind::ToolResult => "tool_result",
        Kind::Compaction => "compaction",
        Kind::RunEnded => "run_ended",
    };
    fields.set_item("type", kind)?;
    fields.set_item("event_id", event.event_id)?;
    fields.set_item("session_key", event.session_key)?;
    fields.set_item("run_id", event.run_id)?;
    fields.set_item("agent_id", event.agent_id)?;
    fields.set_item("incarnation", event.incarnation)?;
    fields.set_item("seq", event.seq)?;
    fields.set_item("ts", event.ts)?;
    fields.set_item("reply_to", event.reply_to)?;
    fields.set_item("key", event.key())?;
    if matches!(event.kind, Kind::ToolCall | Kind::ToolResult) {
        fields.set_item("call_id", event.call_id)?;
        fields.set_item("tool_name", event.tool_name)?;
        fields.set_item("args", canonical(event.args).map(|b| PyBytes::new(py, &b)))?;
        fields.set_item("args_hash", event.args_hash)?;
        fields.set_item("args_action", event.args_action)?;
    }
    if event.kind == Kind::ToolResult {
        fields.set_item(
            "result",
            canonical(event.result).map(|b| PyBytes::new(py, &b)),
        )?;
        fields.set_item("result_hash", event.result_hash)?;
        fields.set_item("error_text", event.error_text)?;
        fields.set_item("unknown_tool", event.unknown_tool)?;
        fields.set_item(
            "usage",
            event
                .usage
                .map(|u| (u.input_tokens, u.output_tokens, u.total_tokens, u.cost)),
        )?;
    }
    if event.kind == Kind::Compaction {
        fields.set_item("reason", event.reason)?;
    }
    Ok(Some(fields))
}
