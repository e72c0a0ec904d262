//! The loop-detection settings in force for one agent: the fields of config.py's
//! `ResolvedConfig` that the detectors, the history and the guard read.
//!
//! Thresholds are `i64` rather than unsigned: Python compares them as plain ints, so a
//! threshold of 0 (a ResolvedConfig built by hand, never by `resolve_config`) makes a
//! counter of 0 match, and the Rust must decide that case the same way.

/// config.py's `ResolvedConfig`, after merge and clamping (resolution stays in Python).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResolvedConfig {
    /// None: not set anywhere (detection off, recording and guard on).
    pub enabled: Option<bool>,
    pub history_size: usize,
    pub warning_threshold: i64,
    pub critical_threshold: i64,
    pub unknown_tool_threshold: i64,
    pub global_circuit_breaker_threshold: i64,
    pub generic_repeat: bool,
    pub known_poll_no_progress: bool,
    pub ping_pong: bool,
    pub guard_window_size: i64,
}

impl Default for ResolvedConfig {
    /// The defaults of config.py (DEFAULT_*), detection not set anywhere.
    fn default() -> Self {
        ResolvedConfig {
            enabled: None,
            history_size: 30,
            warning_threshold: 10,
            critical_threshold: 20,
            unknown_tool_threshold: 10,
            global_circuit_breaker_threshold: 30,
            generic_repeat: true,
            known_poll_no_progress: true,
            ping_pong: true,
            guard_window_size: 3,
        }
    }
}

impl ResolvedConfig {
    pub fn detection_on(&self) -> bool {
        self.enabled == Some(true)
    }

    /// Calls and results are recorded, and the guard runs, unless explicitly off.
    pub fn recording_on(&self) -> bool {
        self.enabled != Some(false)
    }
}
