//! The engine's pure core in Rust: the history views, the resolved config the
//! detectors read, the call fingerprints, the decision table, the opt-in rules and the
//! masking of volatile results, each byte-identical to its Python module
//! (streams/engine/history.py and state.py, config.py, fingerprint.py, detectors.py,
//! rules.py, volatile.py).
//!
//! Nothing here knows PyO3 but `py`: the session fold (`crate::session`) calls the core
//! on records it holds itself; `py` is the thin layer the differential tests and the
//! benchmark drive (tests/unit/test_native_detectors.py, bench/detectors.py).

pub mod config;
pub mod detectors;
pub mod fingerprint;
pub mod history;
pub mod py;
pub mod rules;
pub mod volatile;
