//! A tool result's outcome token, read from the wire tree (fingerprint.py's
//! `result_token` with no configured send tools; the caller uses it only for a tool that
//! is not one of them).
//!
//! The outcome is what decides "same outcome" (spec 3, branches 2-7): a few fields of
//! the result, cut and stripped as fingerprint.py cuts them. `None` where the Python
//! engine decides: an integer beyond 2**53 - 1 in it.

use crate::canonical::{write_object, write_string, write_value};
use crate::engine::volatile::VolatileResults;
use crate::json::Value;

/// The outcome, built of the wire tree's values and of the strings cut from them.
pub enum Outcome<'v, 'a> {
    Wire(&'v Value<'a>),
    Null,
    Bool(bool),
    Text(String),
    List(Vec<Outcome<'v, 'a>>),
    Map(Vec<(&'v str, Outcome<'v, 'a>)>),
}

const SEND_LIKE_MESSAGE_ACTIONS: [&str; 9] = [
    "send",
    "broadcast",
    "reply",
    "thread-reply",
    "sendWithEffect",
    "sendAttachment",
    "upload-file",
    "sticker",
    "poll",
];
const VOLATILE_SEND_KEYS: [&str; 18] = [
    "messageId",
    "message_id",
    "messageIds",
    "platformMessageId",
    "platformMessageIds",
    "fileId",
    "file_id",
    "fileKey",
    "pollId",
    "poll_id",
    "receipt",
    "runId",
    "idempotencyKey",
    "ts",
    "timestamp",
    "sentAt",
    "deliveredAt",
    "createdAt",
];

/// Python's `str.isspace` (Unicode White_Space plus U+001C..U+001F).
fn py_space(c: char) -> bool {
    matches!(c, '\t'..='\r' | '\x1c'..='\x1f' | ' ' | '\u{85}' | '\u{a0}' | '\u{1680}'
        | '\u{2000}'..='\u{200a}' | '\u{2028}' | '\u{2029}' | '\u{202f}' | '\u{205f}' | '\u{3000}')
}

/// Python's `str.strip()`.
fn py_strip(text: &str) -> &str {
    text.trim_matches(py_space)
}

fn string_or_none<'v, 'a>(value: Option<&'v Value<'a>>) -> Option<&'v str> {
    value.and_then(Value::as_str)
}

fn wire_or_null<'v, 'a>(value: Option<&'v Value<'a>>) -> Outcome<'v, 'a> {
    value.map_or(Outcome::Null, Outcome::Wire)
}

fn text_or_null<'v, 'a>(value: Option<&str>) -> Outcome<'v, 'a> {
    value.map_or(Outcome::Null, |text| Outcome::Text(text.to_owned()))
}

fn content_text(result: &Value<'_>) -> String {
    let Some(Value::Array(entries)) = result.get("content") else {
        return String::new();
    };
    let mut joined = String::new();
    let mut first = true;
    for entry in entries {
        if let (Some(Value::Str(_)), Some(Value::Str(text))) =
            (entry.get("type"), entry.get("text"))
        {
            if !first {
                joined.push('\n');
            }
            first = false;
            joined.push_str(text);
        }
    }
    py_strip(&joined).to_owned()
}

fn exec_outcome<'v, 'a>(details: Option<&'v Value<'a>>, text: &str) -> Option<Outcome<'v, 'a>> {
    let get = |name: &str| details.and_then(|d| d.get(name));
    let status = string_or_none(get("status"))?;
    let field = |name: &'v str, value: Outcome<'v, 'a>| (name, value);
    match status {
        "running" => Some(Outcome::Map(vec![
            field("status", Outcome::Text(status.to_owned())),
            field(
                "tail",
                Outcome::Text(string_or_none(get("tail")).unwrap_or("").to_owned()),
            ),
        ])),
        "completed" | "failed" => {
            let output = string_or_none(get("aggregated")).map_or("", py_strip);
            let exit_code = match get("exitCode") {
                Some(number @ (Value::Int(_) | Value::Float(_))) => Outcome::Wire(number),
                _ => Outcome::Null,
            };
            let timed_out = matches!(get("timedOut"), Some(Value::Bool(true)));
            Some(Outcome::Map(vec![
                field("status", Outcome::Text(status.to_owned())),
                field("exitCode", exit_code),
                field("timedOut", Outcome::Bool(timed_out)),
                field(
                    "output",
                    Outcome::Text(if output.is_empty() { text } else { output }.to_owned()),
                ),
            ]))
        }
        "approval-pending" | "approval-unavailable" => Some(Outcome::Map(vec![
            field("status", Outcome::Text(status.to_owned())),
            field("reason", text_or_null(string_or_none(get("reason")))),
            field("host", text_or_null(string_or_none(get("host")))),
            field(
                "command",
                Outcome::Text(string_or_none(get("command")).unwrap_or("").to_owned()),
            ),
            field(
                "warningText",
                Outcome::Text(string_or_none(get("warningText")).unwrap_or("").to_owned()),
            ),
        ])),
        _ => None,
    }
}

fn process_outcome<'v, 'a>(
    action: &str,
    details: Option<&'v Value<'a>>,
    text: String,
) -> Outcome<'v, 'a> {
    let fields: &[&'static str] = if action == "poll" {
        &["status", "exitCode", "exitSignal", "aggregated"]
    } else {
        &[
            "status",
            "totalLines",
            "totalChars",
            "truncated",
            "exitCode",
            "exitSignal",
        ]
    };
    let mut outcome = vec![("action", Outcome::Text(action.to_owned()))];
    for name in fields {
        outcome.push((name, wire_or_null(details.and_then(|d| d.get(name)))));
    }
    outcome.push(("text", Outcome::Text(text)));
    Outcome::Map(outcome)
}

fn is_message_object(value: &Value<'_>) -> bool {
    let is_str = |name| matches!(value.get(name), Some(Value::Str(_)));
    is_str("id")
        && is_str("text")
        && (is_str("direction")
            || is_str("senderId")
            || is_str("accountId")
            || matches!(value.get("conversation"), Some(Value::Object(_))))
}

fn strip_volatile_send_ids<'v, 'a>(value: &'v Value<'a>) -> Outcome<'v, 'a> {
    match value {
        Value::Array(items) => Outcome::List(items.iter().map(strip_volatile_send_ids).collect()),
        Value::Object(entries) => {
            let drop_id = is_message_object(value);
            Outcome::Map(
                entries
                    .iter()
                    .filter(|(key, _)| {
                        !(VOLATILE_SEND_KEYS.contains(&key.as_ref()) || drop_id && key == "id")
                    })
                    .map(|(key, child)| (key.as_ref(), strip_volatile_send_ids(child)))
                    .collect(),
            )
        }
        other => Outcome::Wire(other),
    }
}

/// fingerprint.py's `normalised_result`; `send_tool`: the tool is one of the configured
/// provider send tools (`providerSendTools`). None: nothing is recorded.
pub fn normalised_result<'v, 'a>(
    tool: &str,
    action: Option<&str>,
    result: &'v Value<'a>,
    send_tool: bool,
) -> Option<Outcome<'v, 'a>> {
    if !matches!(result, Value::Object(_)) {
        return if matches!(result, Value::Null) {
            None
        } else {
            Some(Outcome::Wire(result))
        };
    }
    let details = match result.get("details") {
        Some(object @ Value::Object(_)) => Some(object),
        _ => None,
    };
    let get = |name: &str| details.and_then(|d| d.get(name));
    if get("status").and_then(Value::as_str) == Some("blocked")
        && get("deniedReason").and_then(Value::as_str) == Some("tool-loop")
    {
        return None;
    }
    let text = content_text(result);
    if tool == "exec" {
        if let Some(outcome) = exec_outcome(details, &text) {
            return Some(outcome);
        }
    }
    if tool == "process" {
        if let Some(action @ ("poll" | "log")) = action {
            return Some(process_outcome(action, details, text));
        }
    }
    let send = send_tool
        || tool == "sessions_send"
        || (tool == "message" && action.is_some_and(|a| SEND_LIKE_MESSAGE_ACTIONS.contains(&a)));
    if send {
        return Some(match details {
            Some(details) => strip_volatile_send_ids(details),
            None => Outcome::Map(Vec::new()),
        });
    }
    let details = match details {
        Some(details) => Outcome::Wire(details),
        None => Outcome::Map(Vec::new()),
    };
    Some(Outcome::Map(vec![
        ("details", details),
        ("text", Outcome::Text(text)),
    ]))
}

pub fn write_outcome(out: &mut Vec<u8>, outcome: &Outcome<'_, '_>) -> Option<()> {
    match outcome {
        Outcome::Wire(value) => write_value(out, value)?,
        Outcome::Null => out.extend_from_slice(b"null"),
        Outcome::Bool(flag) => out.extend_from_slice(if *flag { b"true" } else { b"false" }),
        Outcome::Text(text) => write_string(out, text),
        Outcome::List(items) => {
            out.push(b'[');
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.push(b',');
                }
                write_outcome(out, item)?;
            }
            out.push(b']');
        }
        Outcome::Map(entries) => write_object(
            out,
            entries.iter().map(|(key, child)| (*key, child)).collect(),
            write_outcome,
        )?,
    }
    Some(())
}

/// `write_outcome` with every string masked by the volatileResults rule (object keys
/// stay): fingerprint.py's `mask_value` before `canonical_digest`.
pub fn write_masked(
    out: &mut Vec<u8>,
    outcome: &Outcome<'_, '_>,
    rule: &VolatileResults,
) -> Option<()> {
    match outcome {
        Outcome::Wire(value) => write_value_masked(out, value, rule)?,
        Outcome::Text(text) => write_string(out, &rule.mask(text)),
        Outcome::List(items) => {
            out.push(b'[');
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.push(b',');
                }
                write_masked(out, item, rule)?;
            }
            out.push(b']');
        }
        Outcome::Map(entries) => write_object(
            out,
            entries.iter().map(|(key, child)| (*key, child)).collect(),
            |out, child| write_masked(out, child, rule),
        )?,
        Outcome::Null | Outcome::Bool(_) => write_outcome(out, outcome)?,
    }
    Some(())
}

fn write_value_masked(out: &mut Vec<u8>, value: &Value<'_>, rule: &VolatileResults) -> Option<()> {
    match value {
        Value::Str(text) => write_string(out, &rule.mask(text)),
        Value::Array(items) => {
            out.push(b'[');
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.push(b',');
                }
                write_value_masked(out, item, rule)?;
            }
            out.push(b']');
        }
        Value::Object(entries) => write_object(
            out,
            entries
                .iter()
                .map(|(key, child)| (key.as_ref(), child))
                .collect(),
            |out, child| write_value_masked(out, child, rule),
        )?,
        _ => write_value(out, value)?,
    }
    Some(())
}
