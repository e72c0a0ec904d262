//! Verdicts and loop events as published: the JSON `Verdict.to_json` and
//! `LoopEvent.to_json` write (orjson over the model's fields, in the model's order).
//!
//! The native fold's outputs are the Python engine's bytes: orjson's string escapes (the two-character forms for `\b \t \n \f \r`
//! and `\" \\`, `\u00XX` with lowercase hex for the other control characters, every
//! other character as its UTF-8, U+2028 and DEL included), `null` for a missing value,
//! integers in decimal. A loop event's raw `args` (only with
//! `includePayloadsInLoopEvents`) are the wire value written as orjson writes it (args
//! holding a float are left to orjson: `write_payload`); a fleet breaker's own loop
//! event (`fleet`) is the breaker's, written in Python.

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyInt, PyString};

use crate::json::Value;

/// Appends `text` as a JSON string, escaped as orjson escapes it: the escapes of
/// canonical JSON (the same set: two-character forms for `\b \t \n \f \r \" \\`,
/// `\u00XX` in lowercase hex for the other control characters), which finds the runs
/// to copy sixteen bytes at a time.
pub fn write_str(out: &mut Vec<u8>, text: &str) {
    crate::canonical::write_string(out, text);
}

/// Appends an integer in decimal, as JSON writes it (no allocation: outputs write
/// several per event).
pub fn write_int(out: &mut Vec<u8>, number: i64) {
    let mut digits = [0u8; 20];
    let mut rest = number.unsigned_abs();
    let mut start = digits.len();
    loop {
        start -= 1;
        digits[start] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    if number < 0 {
        out.push(b'-');
    }
    out.extend_from_slice(&digits[start..]);
}

fn write_opt_str(out: &mut Vec<u8>, text: Option<&str>) {
    match text {
        Some(text) => write_str(out, text),
        None => out.extend_from_slice(b"null"),
    }
}

fn write_opt_int(out: &mut Vec<u8>, number: Option<i64>) {
    match number {
        Some(number) => write_int(out, number),
        None => out.extend_from_slice(b"null"),
    }
}

/// A value of a loop event's `config` (ResolvedConfig.as_dict plus `enforce`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Setting {
    Null,
    Bool(bool),
    Int(i64),
}

/// The fields a verdict and a loop event share, in the models' order.
pub struct Judgement<'s> {
    /// `verdict_id` of a verdict, `event_id` of a loop event.
    pub id: &'s str,
    pub session_key: &'s str,
    pub run_id: Option<&'s str>,
    pub agent_id: Option<&'s str>,
    pub call_id: Option<&'s str>,
    pub seq: Option<i64>,
    pub incarnation: Option<&'s str>,
    pub tool_name: Option<&'s str>,
    pub action: &'s str,
    pub level: &'s str,
    pub detector: Option<&'s str>,
    pub count: i64,
    pub message: Option<&'s str>,
    pub args_hash: Option<&'s str>,
    pub paired_tool_name: Option<&'s str>,
    pub event_ts: i64,
    pub decided_ts: i64,
}

/// What a loop event has besides a judgement (its raw args left to Python).
pub struct LoopEventExtras<'s> {
    pub warning_key: Option<&'s str>,
    pub config: &'s [(&'s str, Setting)],
    pub enforced: bool,
    /// The call's raw args as published (`includePayloadsInLoopEvents`): their JSON as
    /// `write_payload` writes it, or None (null).
    pub args: Option<&'s [u8]>,
}

fn write_head(out: &mut Vec<u8>, kind: &str, id_field: &str, judgement: &Judgement<'_>) {
    out.extend_from_slice(b"{\"type\":");
    write_str(out, kind);
    out.push(b',');
    write_str(out, id_field);
    out.push(b':');
    write_str(out, judgement.id);
    let fields: [(&str, Option<&str>); 4] = [
        ("session_key", Some(judgement.session_key)),
        ("run_id", judgement.run_id),
        ("agent_id", judgement.agent_id),
        ("call_id", judgement.call_id),
    ];
    for (name, value) in fields {
        out.extend_from_slice(b",\"");
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b"\":");
        write_opt_str(out, value);
    }
    out.extend_from_slice(b",\"seq\":");
    write_opt_int(out, judgement.seq);
    let fields: [(&str, Option<&str>); 6] = [
        ("incarnation", judgement.incarnation),
        ("tool_name", judgement.tool_name),
        ("action", Some(judgement.action)),
        ("level", Some(judgement.level)),
        ("detector", judgement.detector),
        ("count", None),
    ];
    for (name, value) in fields {
        out.extend_from_slice(b",\"");
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b"\":");
        if name == "count" {
            write_int(out, judgement.count);
        } else {
            write_opt_str(out, value);
        }
    }
    for (name, value) in [
        ("message", judgement.message),
        ("args_hash", judgement.args_hash),
        ("paired_tool_name", judgement.paired_tool_name),
    ] {
        out.extend_from_slice(b",\"");
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b"\":");
        write_opt_str(out, value);
    }
}

fn write_clocks(out: &mut Vec<u8>, judgement: &Judgement<'_>) {
    out.extend_from_slice(b",\"event_ts\":");
    write_int(out, judgement.event_ts);
    out.extend_from_slice(b",\"decided_ts\":");
    write_int(out, judgement.decided_ts);
    out.push(b'}');
}

/// A verdict's published JSON (`Verdict.to_json`).
pub fn write_verdict(out: &mut Vec<u8>, judgement: &Judgement<'_>) {
    write_head(out, "verdict", "verdict_id", judgement);
    write_clocks(out, judgement);
}

/// A session's loop event's published JSON (`LoopEvent.to_json`, no args, no fleet).
pub fn write_loop_event(
    out: &mut Vec<u8>,
    judgement: &Judgement<'_>,
    extras: &LoopEventExtras<'_>,
) {
    write_head(out, "loop_event", "event_id", judgement);
    out.extend_from_slice(b",\"warning_key\":");
    write_opt_str(out, extras.warning_key);
    out.extend_from_slice(b",\"config\":{");
    for (index, (name, value)) in extras.config.iter().enumerate() {
        if index > 0 {
            out.push(b',');
        }
        write_str(out, name);
        out.push(b':');
        match value {
            Setting::Null => out.extend_from_slice(b"null"),
            Setting::Bool(flag) => out.extend_from_slice(if *flag { b"true" } else { b"false" }),
            Setting::Int(number) => write_int(out, *number),
        }
    }
    out.extend_from_slice(b"},\"enforced\":");
    out.extend_from_slice(if extras.enforced { b"true" } else { b"false" });
    out.extend_from_slice(b",\"args\":");
    out.extend_from_slice(extras.args.unwrap_or(b"null"));
    write_clocks(out, judgement);
}

/// A value read from the wire as orjson writes the Python value it decodes to (the
/// Python engine's `orjson.dumps(event.args)`): no spaces, keys in wire order (the
/// reader takes no key twice), strings escaped as orjson escapes them. False, the bytes
/// then unfinished, where it holds a float: orjson's shortest digits are not always
/// Rust's (562949953421312.2 against ...3), so such args are written by orjson.
pub fn write_payload(out: &mut Vec<u8>, value: &Value<'_>) -> bool {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(flag) => out.extend_from_slice(if *flag { b"true" } else { b"false" }),
        Value::Int(number) => write_int(out, *number),
        Value::Float(_) => return false,
        Value::Str(text) => write_str(out, text),
        Value::Array(items) => {
            out.push(b'[');
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.push(b',');
                }
                if !write_payload(out, item) {
                    return false;
                }
            }
            out.push(b']');
        }
        Value::Object(entries) => {
            out.push(b'{');
            for (index, (key, item)) in entries.iter().enumerate() {
                if index > 0 {
                    out.push(b',');
                }
                write_str(out, key);
                out.push(b':');
                if !write_payload(out, item) {
                    return false;
                }
            }
            out.push(b'}');
        }
    }
    true
}

/// `write_payload`'s bytes of the value under "v" in a JSON object, or None where the
/// reader leaves the text to Python. For tests (tests/unit/test_native_output.py).
#[pyfunction]
pub fn payload_json<'py>(py: Python<'py>, raw: &[u8]) -> Option<Bound<'py, PyBytes>> {
    let entries = crate::json::parse_object(raw, 64)?;
    let (_, parsed) = entries.iter().find(|(key, _)| key == "v")?;
    let mut out = Vec::new();
    write_payload(&mut out, &parsed.value).then(|| PyBytes::new(py, &out))
}

// -- for the tests: a model's fields (its __dict__) written by the functions above -----

fn opt_str(fields: &Bound<'_, PyDict>, name: &str) -> PyResult<Option<String>> {
    match fields.get_item(name)? {
        Some(value) if !value.is_none() => {
            Ok(Some(value.downcast::<PyString>()?.to_str()?.to_owned()))
        }
        _ => Ok(None),
    }
}

fn opt_int(fields: &Bound<'_, PyDict>, name: &str) -> PyResult<Option<i64>> {
    match fields.get_item(name)? {
        Some(value) if !value.is_none() => Ok(Some(value.extract()?)),
        _ => Ok(None),
    }
}

/// The published JSON of a verdict's or a session loop event's fields (a model's
/// `__dict__`), written natively; None for what is left to Python (a loop event's raw
/// args or fleet, a config value that is not null, a bool or an int). For tests:
/// tests/unit/test_native_output.py compares it with the model's `to_json`.
#[pyfunction]
pub fn output_json<'py>(
    py: Python<'py>,
    fields: &Bound<'py, PyDict>,
) -> PyResult<Option<Bound<'py, PyBytes>>> {
    // Strings are copied out first, then borrowed by the judgement.
    const NAMES: [&str; 11] = [
        "session_key",
        "run_id",
        "agent_id",
        "call_id",
        "incarnation",
        "tool_name",
        "action",
        "level",
        "detector",
        "message",
        "args_hash",
    ];
    let kind: String = fields
        .get_item("type")?
        .map_or(Ok(String::new()), |v| v.extract())?;
    let id_field = if kind == "verdict" {
        "verdict_id"
    } else {
        "event_id"
    };
    let mut texts: Vec<Option<String>> = Vec::with_capacity(16);
    for name in [id_field]
        .iter()
        .chain(NAMES.iter())
        .chain(["paired_tool_name", "warning_key"].iter())
    {
        texts.push(opt_str(fields, name)?);
    }
    let get = |index: usize| -> Option<&str> { texts[index].as_deref() };
    let judgement = Judgement {
        id: get(0).unwrap_or(""),
        session_key: get(1).unwrap_or(""),
        run_id: get(2),
        agent_id: get(3),
        call_id: get(4),
        seq: opt_int(fields, "seq")?,
        incarnation: get(5),
        tool_name: get(6),
        action: get(7).unwrap_or(""),
        level: get(8).unwrap_or(""),
        detector: get(9),
        count: opt_int(fields, "count")?.unwrap_or(0),
        message: get(10),
        args_hash: get(11),
        paired_tool_name: get(12),
        event_ts: opt_int(fields, "event_ts")?.unwrap_or(0),
        decided_ts: opt_int(fields, "decided_ts")?.unwrap_or(0),
    };
    let mut out = Vec::with_capacity(512);
    if kind == "verdict" {
        write_verdict(&mut out, &judgement);
        return Ok(Some(PyBytes::new(py, &out)));
    }
    let left_to_python = |name: &str| -> PyResult<bool> {
        Ok(fields.get_item(name)?.is_some_and(|value| !value.is_none()))
    };
    if kind != "loop_event" || left_to_python("args")? || left_to_python("fleet")? {
        return Ok(None);
    }
    let Some(config) = fields.get_item("config")? else {
        return Ok(None);
    };
    let config = config.downcast::<PyDict>()?;
    let mut names: Vec<String> = Vec::with_capacity(config.len());
    let mut values: Vec<Setting> = Vec::with_capacity(config.len());
    for (name, value) in config.iter() {
        names.push(name.downcast::<PyString>()?.to_str()?.to_owned());
        values.push(if value.is_none() {
            Setting::Null
        } else if let Ok(flag) = value.downcast_exact::<PyBool>() {
            Setting::Bool(flag.is_true())
        } else if value.is_exact_instance_of::<PyInt>() {
            Setting::Int(value.extract()?)
        } else {
            return Ok(None);
        });
    }
    let settings: Vec<(&str, Setting)> = names.iter().map(String::as_str).zip(values).collect();
    let enforced = fields
        .get_item("enforced")?
        .map_or(Ok(true), |v| v.extract())?;
    let extras = LoopEventExtras {
        warning_key: get(13),
        config: &settings,
        enforced,
        args: None,
    };
    write_loop_event(&mut out, &judgement, &extras);
    Ok(Some(PyBytes::new(py, &out)))
}
