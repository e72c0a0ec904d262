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
//! (Building the event's Python objects here as well was tried: msgspec builds them in
//! less than half the instructions this crate took through PyO3's dict and call API.)

use std::borrow::Cow;

use pyo3::prelude::*;
use xxhash_rust::xxh3::xxh3_128;

use crate::canonical::write_value;
use crate::json::{parse_object, Parsed, Value};
use crate::outcome::{normalised_result, write_outcome};

/// The largest integer a JavaScript gateway sends exactly (schemas/events.py MAX_WIRE_INT).
const MAX_WIRE_INT: i64 = (1 << 53) - 1;
/// 9999-12-31T23:59:59.999Z in epoch milliseconds (schemas/events.py MAX_EVENT_TS).
const MAX_EVENT_TS: i64 = 253_402_300_799_999;
const MAX_PARTITION: i64 = (1 << 31) - 1;
const MAX_REQUESTER_CHARS: usize = 255;
const MAX_TOPIC_CHARS: usize = 249;
/// Deeper bounds than this are left to the Python decoder (a bound of 1 or 2 is where
/// its first pass cannot tell a usage object's nesting from the event it built).
const DEPTH_BOUNDS: std::ops::RangeInclusive<usize> = 3..=1024;

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    ToolCall,
    ToolResult,
    Compaction,
    RunEnded,
}

/// The fields each kind has, besides `type` (the Structs' fields).
fn has_field(kind: Kind, name: &str) -> bool {
    let common = matches!(
        name,
        "event_id" | "session_key" | "run_id" | "agent_id" | "incarnation" | "seq" | "ts" | "reply_to"
    );
    let carrier = matches!(name, "call_id" | "tool_name" | "args" | "args_hash" | "args_action");
    common
        || match kind {
            Kind::ToolCall => carrier,
            Kind::ToolResult => {
                carrier
                    || matches!(name, "result" | "result_hash" | "error" | "unknown_tool" | "usage")
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
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let hash = xxh3_128(data);
    let digits: Vec<u8> = (0..32).rev().map(|nibble| HEX[((hash >> (nibble * 4)) & 0xf) as usize]).collect();
    String::from_utf8(digits).expect("hex digits are ASCII")
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
        && text.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// An event's tokens: (args token, result token, whether the result token is known).
type Tokens = (Option<String>, Option<String>, bool);

/// The event's tokens when the Python decoder would accept it through its msgspec pass
/// (the types and bounds of schemas/events.py, then `_as_the_models_would`,
/// `_nested_deeper` and the identifier bounds); None where the Python decoder decides.
fn check(
    entries: &[(Cow<'_, str>, Parsed<'_>)],
    max_depth: usize,
    max_identifier_bytes: usize,
) -> Option<Tokens> {
    let kind = match entries.iter().find(|(name, _)| name == "type")?.1.value.as_str()? {
        "tool_call" => Kind::ToolCall,
        "tool_result" => Kind::ToolResult,
        "compaction" => Kind::Compaction,
        "run_ended" => Kind::RunEnded,
        _ => return None,
    };
    let (mut event_id, mut ts, mut call_id, mut tool_name, mut keyed) = (false, false, false, None, false);
    let (mut args, mut args_hash, mut args_action) = (None, false, None);
    let (mut result, mut error, mut outcomes) = (None, None, 0);
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
                ("event_id", _) => event_id = true,
                ("call_id", _) => call_id = true,
                ("tool_name", _) => tool_name = text,
                ("session_key" | "run_id", Some(text)) if !text.is_empty() => keyed = true,
                ("args_hash", Some(_)) => args_hash = true,
                ("args_action", _) => args_action = text,
                ("result_hash", Some(_)) => outcomes += 1,
                _ => {}
            }
            continue;
        }
        match (name, value) {
            ("ts", _) => {
                wire_int(value, MAX_EVENT_TS)?;
                ts = true;
            }
            ("seq" | "reply_to" | "error" | "usage" | "reason", Value::Null) => {}
            ("seq", _) => {
                wire_int(value, MAX_WIRE_INT)?;
            }
            ("reply_to", Value::Object(fields)) => {
                // ReplyTo forbids unknown fields; none is read twice (see json.rs)
                if fields.len() != 3 {
                    return None;
                }
                let topic = value.get("topic")?.as_str()?;
                wire_int(value.get("partition")?, MAX_PARTITION)?;
                let requester = value.get("requester")?.as_str()?;
                let chars = requester.chars().count();
                if !is_topic_name(topic) || !(1..=MAX_REQUESTER_CHARS).contains(&chars) {
                    return None;
                }
            }
            ("args", _) => args = Some(value),
            ("result", _) => {
                result = Some(value);
                outcomes += 1;
            }
            ("error", Value::Str(text)) => {
                error = Some(text.as_ref());
                outcomes += 1;
            }
            ("error", Value::Object(fields)) => {
                // ErrorDetail ignores unknown fields, the models may not: not decided here
                if !fields.iter().all(|(key, _)| key == "message" || key == "name") {
                    return None;
                }
                let message = value.get("message")?.as_str()?;
                let detail_name = match value.get("name") {
                    None => None,
                    Some(name) => optional_str(name)?,
                };
                // ToolResult.error_text: the message, else the name, else "".
                error = Some(if message.is_empty() { detail_name.unwrap_or("") } else { message });
                outcomes += 1;
            }
            ("usage", Value::Object(fields)) => {
                for (field, count) in fields {
                    match (field.as_ref(), count) {
                        ("input_tokens" | "output_tokens" | "total_tokens" | "cost", Value::Null) => {}
                        ("input_tokens" | "output_tokens" | "total_tokens", _) => {
                            wire_int(count, MAX_WIRE_INT)?;
                        }
                        // msgspec reads an integer into a float field as that float
                        ("cost", Value::Int(number)) if (0..=MAX_WIRE_INT).contains(number) => {}
                        ("cost", Value::Float(number)) if *number >= 0.0 => {}
                        _ => return None, // Usage ignores unknown fields: not decided here
                    }
                }
            }
            ("reason", Value::Str(_)) => {}
            _ => return None,
        }
    }
    if !event_id || !ts || !keyed {
        return None; // required fields, and a session key or run id to scope it
    }
    let carrier = matches!(kind, Kind::ToolCall | Kind::ToolResult);
    if carrier && (!call_id || tool_name.is_none()) {
        return None;
    }
    // The exactly-one-of rules (the Python decoder's `_as_the_models_would`).
    match kind {
        Kind::ToolCall if args.is_some() == args_hash => return None,
        Kind::ToolResult if outcomes != 1 || (args.is_some() && args_hash) => return None,
        _ => {}
    }
    let args_token = args.and_then(canonical_token);
    let (mut result_token, mut result_known) = (None, false);
    if kind == Kind::ToolResult {
        if let Some(text) = error {
            result_token = Some(format!("error:{}", hex128(text.as_bytes())));
            result_known = true;
        } else if let (Some(result), Some(tool)) = (result, tool_name) {
            // fingerprint.py's action_of: args.action when args is an object, else the hint
            let action = match args {
                Some(args @ Value::Object(_)) => args.get("action").and_then(Value::as_str),
                _ => args_action,
            };
            match normalised_result(tool, action, result) {
                None => result_known = true,
                Some(outcome) => {
                    let mut out = Vec::with_capacity(256);
                    if write_outcome(&mut out, &outcome).is_some() {
                        result_token = Some(hex128(&out));
                        result_known = true;
                    }
                }
            }
        }
    }
    Some((args_token, result_token, result_known))
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
    check(&parse_object(raw, max_depth)?, max_depth, max_identifier_bytes)
}
