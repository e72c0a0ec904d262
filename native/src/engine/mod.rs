//! The engine's pure core in Rust (issue 27, stage 3): the history views, the resolved
//! config the detectors read, the call fingerprints and the decision table, each
//! byte-identical to its Python module (streams/engine/history.py and state.py,
//! config.py, fingerprint.py, detectors.py).
//!
//! Nothing here knows PyO3: the native engine of the next stage calls it on records it
//! holds itself. `py` is the thin layer the differential tests and the benchmark drive
//! (tests/unit/test_native_detectors.py, bench/detectors.py).

// The native engine of the next stage calls the core's views and helpers (History's
// append and replace, the config's switches); until then only tests reach some of them.
#![allow(dead_code)]

pub mod config;
pub mod detectors;
pub mod fingerprint;
pub mod history;
pub mod py;
pub mod rules;
pub mod volatile;
