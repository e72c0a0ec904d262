//! loopfuse's native judge: canonical JSON (RFC 8785) and the 128-bit digests; an input
//! event's wire bytes validated and fingerprinted in one pass (`decode`); the session
//! fold over a state held in Rust (`session`, `session_py`), with the opt-in rules
//! (`engine`); verdicts and loop events written as the Python engine writes them
//! (`output`); a state's bytes written and read (`state_bytes`, `state_codec`).
//!
//! Every function answers only the common case and returns `None` for anything else
//! (integers beyond 2**53 - 1, lone surrogates, subclasses of the JSON types, tuples,
//! very deep values; for the decoder, every event it is not sure of), which the Python
//! engine then handles as it always did:
//! so the native path never decides an unusual case, and where it answers, it gives
//! the bytes the Python reference gives (tests/unit/test_native_identity.py).

mod canonical;
mod decode;
mod engine;
mod json;
mod outcome;
mod output;
mod session;
mod session_py;
mod state_bytes;
mod state_codec;

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString};

use canonical::{write_number, write_string, MAX_SAFE_INT};
use decode::hex128;

/// Deeper than this the Python path decides (a decoded event is at most 64 deep).
const MAX_DEPTH: usize = 256;

/// Appends the canonical JSON of `value`; `None` where the Python path must decide.
fn write_value(out: &mut Vec<u8>, value: &Bound<'_, PyAny>, depth: usize) -> Option<()> {
    if depth > MAX_DEPTH {
        return None;
    }
    if value.is_none() {
        out.extend_from_slice(b"null");
    } else if let Ok(text) = value.downcast_exact::<PyString>() {
        write_string(out, text.to_str().ok()?);
    } else if let Ok(flag) = value.downcast_exact::<PyBool>() {
        out.extend_from_slice(if flag.is_true() { b"true" } else { b"false" });
    } else if value.is_exact_instance_of::<PyInt>() {
        let number: i64 = value.extract().ok()?;
        if !(-MAX_SAFE_INT..=MAX_SAFE_INT).contains(&number) {
            return None;
        }
        out.extend_from_slice(number.to_string().as_bytes());
    } else if let Ok(number) = value.downcast_exact::<PyFloat>() {
        let number = number.value();
        if !number.is_finite() {
            return None; // the Python reference refuses it, with its own error
        }
        write_number(out, number);
    } else if let Ok(dict) = value.downcast_exact::<PyDict>() {
        let mut entries: Vec<(String, Bound<'_, PyAny>)> = Vec::with_capacity(dict.len());
        for (key, child) in dict.iter() {
            let key = key
                .downcast_exact::<PyString>()
                .ok()?
                .to_str()
                .ok()?
                .to_owned();
            entries.push((key, child));
        }
        // JCS orders keys by their UTF-16 code units.
        entries.sort_unstable_by(|a, b| a.0.encode_utf16().cmp(b.0.encode_utf16()));
        out.push(b'{');
        for (index, (key, child)) in entries.iter().enumerate() {
            if index > 0 {
                out.push(b',');
            }
            write_string(out, key);
            out.push(b':');
            write_value(out, child, depth + 1)?;
        }
        out.push(b'}');
    } else if let Ok(list) = value.downcast_exact::<PyList>() {
        out.push(b'[');
        for (index, child) in list.iter().enumerate() {
            if index > 0 {
                out.push(b',');
            }
            write_value(out, &child, depth + 1)?;
        }
        out.push(b']');
    } else {
        return None;
    }
    Some(())
}

fn canonical(value: &Bound<'_, PyAny>) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(128);
    write_value(&mut out, value, 1)?;
    Some(out)
}

/// RFC 8785 bytes of a JSON value, or None where the Python path decides.
#[pyfunction]
fn canonical_json<'py>(py: Python<'py>, value: &Bound<'py, PyAny>) -> Option<Bound<'py, PyBytes>> {
    canonical(value).map(|bytes| PyBytes::new(py, &bytes))
}

/// xxh3-128 hex of the canonical JSON of a value, or None where the Python path decides.
#[pyfunction]
fn canonical_digest(value: &Bound<'_, PyAny>) -> Option<String> {
    canonical(value).map(|bytes| hex128(&bytes))
}

/// xxh3-128 hex of some bytes (what xxhash.xxh3_128_hexdigest returns).
#[pyfunction]
fn digest(data: &[u8]) -> String {
    hex128(data)
}

#[pymodule]
fn _native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    // the Python this build stands in for (build.rs), checked before a wheel is used
    module.add("MIRRORED_DIGEST", env!("LOOPFUSE_MIRRORED_DIGEST"))?;
    module.add_function(wrap_pyfunction!(canonical_json, module)?)?;
    module.add_function(wrap_pyfunction!(canonical_digest, module)?)?;
    module.add_function(wrap_pyfunction!(digest, module)?)?;
    module.add_function(wrap_pyfunction!(decode::event_fingerprints, module)?)?;
    module.add_function(wrap_pyfunction!(decode::event_fields, module)?)?;
    module.add_function(wrap_pyfunction!(output::output_json, module)?)?;
    module.add_function(wrap_pyfunction!(output::payload_json, module)?)?;
    module.add_function(wrap_pyfunction!(state_codec::compact_state, module)?)?;
    module.add_function(wrap_pyfunction!(state_codec::expand_state, module)?)?;
    engine::py::register(module)?;
    session_py::register(module)?;
    Ok(())
}
