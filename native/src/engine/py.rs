//! The PyO3 layer over the engine's core, for the differential tests and the benchmark
//! only: Python `Record`s (msgspec structs) and a `ResolvedConfig` read by attribute,
//! the Detection handed back as a tuple.
//!
//! Like every native function, each returns None for what it does not take: a string
//! with a lone surrogate (a Rust `str` cannot hold one; Python hashes it with
//! "surrogatepass"), or an int out of a record field's range. So `detect_history`
//! answers `()` for "no detection", never None.

use std::sync::Arc;
use std::time::Instant;

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyInt, PyString, PyTuple};

use super::config::ResolvedConfig;
use super::detectors::{detect, guard_message, Detection};
use super::fingerprint;
use super::history::{History, Record};
use super::volatile::{TokenClass, VolatileResults};

/// A Python str as UTF-8, or None for one with a lone surrogate (or not a str).
fn text(value: &Bound<'_, PyAny>) -> Option<Arc<str>> {
    Some(Arc::from(value.downcast::<PyString>().ok()?.to_str().ok()?))
}

fn optional_text(value: &Bound<'_, PyAny>) -> Option<Option<Arc<str>>> {
    if value.is_none() {
        return Some(None);
    }
    text(value).map(Some)
}

/// An int threshold as Python compares it: beyond i64 it is reached by no count (or by
/// every one), as i64::MAX (i64::MIN) is. None for what is not an int.
fn threshold(value: &Bound<'_, PyAny>) -> PyResult<Option<i64>> {
    if !value.is_instance_of::<PyInt>() {
        return Ok(None);
    }
    if let Ok(number) = value.extract::<i64>() {
        return Ok(Some(number));
    }
    Ok(Some(if value.gt(0)? { i64::MAX } else { i64::MIN }))
}

fn record(value: &Bound<'_, PyAny>) -> PyResult<Option<Record>> {
    let py = value.py();
    // interned: a name made into a Python str once, not at every record's every field
    let tool = text(&value.getattr(intern!(py, "tool"))?);
    let unknown = optional_text(&value.getattr(intern!(py, "unknown"))?);
    let (Some(tool), Some(unknown)) = (tool, unknown) else {
        return Ok(None);
    };
    let (Ok(sig), Ok(run), Ok(call), Ok(result), Ok(ts)) = (
        value.getattr(intern!(py, "sig"))?.extract::<u64>(),
        value.getattr(intern!(py, "run"))?.extract::<u64>(),
        value.getattr(intern!(py, "call"))?.extract::<u32>(),
        value.getattr(intern!(py, "result"))?.extract::<u64>(),
        value.getattr(intern!(py, "ts"))?.extract::<i64>(),
    ) else {
        return Ok(None);
    };
    Ok(Some(Record {
        tool,
        sig,
        run,
        call,
        result,
        unknown,
        ts,
    }))
}

fn records(values: &Bound<'_, PyAny>) -> PyResult<Option<Vec<Record>>> {
    let mut out = Vec::new();
    for value in values.try_iter()? {
        match record(&value?)? {
            Some(rec) => out.push(rec),
            None => return Ok(None),
        }
    }
    Ok(Some(out))
}

/// The fields of a Python ResolvedConfig the core reads (by name, not by position).
fn config<'py>(value: &Bound<'py, PyAny>) -> PyResult<Option<ResolvedConfig>> {
    let py = value.py();
    let field = |name: &Bound<'py, PyString>| value.getattr(name);
    let enabled = field(intern!(py, "enabled"))?;
    let enabled = if enabled.is_none() {
        None
    } else {
        Some(enabled.is_truthy()?)
    };
    let thresholds = [
        threshold(&field(intern!(py, "warning_threshold"))?)?,
        threshold(&field(intern!(py, "critical_threshold"))?)?,
        threshold(&field(intern!(py, "unknown_tool_threshold"))?)?,
        threshold(&field(intern!(py, "global_circuit_breaker_threshold"))?)?,
        threshold(&field(intern!(py, "guard_window_size"))?)?,
    ];
    let [Some(warning), Some(critical), Some(unknown), Some(breaker), Some(window)] = thresholds
    else {
        return Ok(None);
    };
    let Ok(history_size) = field(intern!(py, "history_size"))?.extract::<usize>() else {
        return Ok(None);
    };
    Ok(Some(ResolvedConfig {
        enabled,
        history_size,
        warning_threshold: warning,
        critical_threshold: critical,
        unknown_tool_threshold: unknown,
        global_circuit_breaker_threshold: breaker,
        generic_repeat: field(intern!(py, "generic_repeat"))?.is_truthy()?,
        known_poll_no_progress: field(intern!(py, "known_poll_no_progress"))?.is_truthy()?,
        ping_pong: field(intern!(py, "ping_pong"))?.is_truthy()?,
        guard_window_size: window,
    }))
}

/// One call to judge: everything `detect` takes besides the history.
struct Call {
    tool: Arc<str>,
    sig: u64,
    args_token: Arc<str>,
    known_poll: bool,
    config: ResolvedConfig,
    run: Option<Arc<str>>,
    recent: usize,
}

impl Call {
    #[allow(clippy::too_many_arguments)]
    fn read(
        tool: &Bound<'_, PyAny>,
        sig: &Bound<'_, PyAny>,
        args_token: &Bound<'_, PyAny>,
        known_poll: &Bound<'_, PyAny>,
        config_value: &Bound<'_, PyAny>,
        run: &Bound<'_, PyAny>,
        recent: &Bound<'_, PyAny>,
    ) -> PyResult<Option<Call>> {
        let (Some(tool), Some(args_token), Some(run)) =
            (text(tool), text(args_token), optional_text(run))
        else {
            return Ok(None);
        };
        let (Ok(sig), Ok(recent)) = (sig.extract::<u64>(), recent.extract::<usize>()) else {
            return Ok(None);
        };
        let Some(config) = config(config_value)? else {
            return Ok(None);
        };
        Ok(Some(Call {
            tool,
            sig,
            args_token,
            known_poll: known_poll.is_truthy()?,
            config,
            run,
            recent,
        }))
    }

    fn detect(&self, history: &[Record]) -> Option<Detection> {
        detect(
            history,
            &self.tool,
            self.sig,
            &self.args_token,
            self.known_poll,
            &self.config,
            self.run.as_deref(),
            self.recent,
        )
    }
}

/// detectors.detect over Python records: the Detection's fields (level, detector,
/// count, message, warning_key, paired_tool_name, detail) as a tuple, `()` for none,
/// None where an input is not one the core takes.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn detect_history<'py>(
    py: Python<'py>,
    records_value: &Bound<'py, PyAny>,
    tool: &Bound<'py, PyAny>,
    sig: &Bound<'py, PyAny>,
    args_token: &Bound<'py, PyAny>,
    known_poll: &Bound<'py, PyAny>,
    config_value: &Bound<'py, PyAny>,
    run: &Bound<'py, PyAny>,
    recent: &Bound<'py, PyAny>,
) -> PyResult<Option<Bound<'py, PyTuple>>> {
    let Some(history) = records(records_value)? else {
        return Ok(None);
    };
    let Some(call) = Call::read(tool, sig, args_token, known_poll, config_value, run, recent)?
    else {
        return Ok(None);
    };
    let Some(found) = call.detect(&history) else {
        return Ok(Some(PyTuple::empty(py)));
    };
    let fields = (
        found.level.as_str(),
        found.detector.as_str(),
        found.count,
        found.message,
        found.warning_key,
        found.paired_tool_name.as_deref(),
        found.detail.as_deref(),
    );
    Ok(Some(fields.into_pyobject(py)?))
}

/// Nanoseconds per call of the core's `detect` on these records, converted once
/// (bench/detectors.py: the cost without the PyO3 layer). None as `detect_history`.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn time_detect_history(
    records_value: &Bound<'_, PyAny>,
    tool: &Bound<'_, PyAny>,
    sig: &Bound<'_, PyAny>,
    args_token: &Bound<'_, PyAny>,
    known_poll: &Bound<'_, PyAny>,
    config_value: &Bound<'_, PyAny>,
    run: &Bound<'_, PyAny>,
    recent: &Bound<'_, PyAny>,
    iterations: u32,
) -> PyResult<Option<f64>> {
    let Some(history) = records(records_value)? else {
        return Ok(None);
    };
    let Some(call) = Call::read(tool, sig, args_token, known_poll, config_value, run, recent)?
    else {
        return Ok(None);
    };
    let start = Instant::now();
    for _ in 0..iterations {
        std::hint::black_box(call.detect(std::hint::black_box(&history)));
    }
    Ok(Some(
        start.elapsed().as_nanos() as f64 / f64::from(iterations.max(1)),
    ))
}

type RecordFields = (String, u64, u64, u32, u64, Option<String>, i64);

/// The records appended one by one to a history of `history_size`, then its view for
/// `run` (a run_key) and the count of `sig` in it: state.py's append, run_history and
/// recent_count. None as `detect_history`.
#[pyfunction]
fn history_view(
    records_value: &Bound<'_, PyAny>,
    history_size: usize,
    run: u64,
    sig: u64,
) -> PyResult<Option<(Vec<RecordFields>, usize)>> {
    let Some(appended) = records(records_value)? else {
        return Ok(None);
    };
    let mut history = History::new();
    for rec in appended {
        history.append(rec, history_size);
    }
    let view = history.run_history(run);
    let recent = history.recent_count(sig, &view);
    let fields = (0..view.len())
        .filter_map(|index| view.get(index))
        .map(|rec| {
            let unknown = rec.unknown.as_deref().map(str::to_owned);
            (
                rec.tool.to_string(),
                rec.sig,
                rec.run,
                rec.call,
                rec.result,
                unknown,
                rec.ts,
            )
        })
        .collect();
    Ok(Some((fields, recent)))
}

/// fingerprint.py's `signature`, `hash64`, `hash32`, `result_fingerprint`, state.py's
/// `run_key` and fingerprint.py's `is_known_poll` (None for a lone surrogate).
#[pyfunction]
fn signature(tool: &Bound<'_, PyAny>, args_token: &Bound<'_, PyAny>) -> Option<u64> {
    Some(fingerprint::signature(&text(tool)?, &text(args_token)?))
}

#[pyfunction]
fn hash64(token: &Bound<'_, PyAny>) -> Option<u64> {
    Some(fingerprint::hash64(&text(token)?))
}

#[pyfunction]
fn hash32(token: &Bound<'_, PyAny>) -> Option<u32> {
    Some(fingerprint::hash32(&text(token)?))
}

#[pyfunction]
fn result_fingerprint(token: &Bound<'_, PyAny>) -> Option<u64> {
    Some(fingerprint::result_fingerprint(&text(token)?))
}

#[pyfunction]
fn run_key(run: &Bound<'_, PyAny>) -> Option<u64> {
    Some(fingerprint::run_key(optional_text(run)?.as_deref()))
}

#[pyfunction]
fn is_known_poll(tool: &Bound<'_, PyAny>, action: &Bound<'_, PyAny>) -> Option<bool> {
    Some(fingerprint::is_known_poll(
        &text(tool)?,
        optional_text(action)?.as_deref(),
    ))
}

/// detectors.py's `guard_message` (None for a lone surrogate in the tool name).
#[pyfunction(name = "guard_message")]
fn guard_message_of(tool: &Bound<'_, PyAny>, count: i64, window: i64) -> Option<String> {
    Some(guard_message(&text(tool)?, count, window))
}

/// volatile.py's `mask_text` (None for a lone surrogate, or an unknown token class).
#[pyfunction]
fn mask_volatile(text_value: &Bound<'_, PyAny>, patterns: Vec<(String, String)>) -> Option<String> {
    let mut rule = VolatileResults::default();
    for (prefix, name) in patterns {
        rule.patterns.push((prefix, TokenClass::named(&name)?));
    }
    Some(rule.mask(&text(text_value)?))
}

pub fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_function(wrap_pyfunction!(mask_volatile, module)?)?;
    module.add_function(wrap_pyfunction!(detect_history, module)?)?;
    module.add_function(wrap_pyfunction!(time_detect_history, module)?)?;
    module.add_function(wrap_pyfunction!(history_view, module)?)?;
    module.add_function(wrap_pyfunction!(signature, module)?)?;
    module.add_function(wrap_pyfunction!(hash64, module)?)?;
    module.add_function(wrap_pyfunction!(hash32, module)?)?;
    module.add_function(wrap_pyfunction!(result_fingerprint, module)?)?;
    module.add_function(wrap_pyfunction!(run_key, module)?)?;
    module.add_function(wrap_pyfunction!(is_known_poll, module)?)?;
    module.add_function(wrap_pyfunction!(guard_message_of, module)?)?;
    Ok(())
}
