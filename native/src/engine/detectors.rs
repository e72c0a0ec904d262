//! The loop detectors: counters over a run's history and the decision table (spec 5-6),
//! detectors.py's, byte for byte in every Detection field.
//!
//! Everything here is computed *before* the current call is recorded, over the records
//! of the current run only. The counters take any slice of records or of references to
//! them (`Borrow<Record>`), so the whole history and a run's picked-out records are read
//! the same way without copying either.

use std::borrow::Borrow;
use std::fmt::Write;
use std::sync::Arc;

use super::config::ResolvedConfig;
use super::history::{Record, RunHistory};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    Warning,
    Critical,
}

impl Level {
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Warning => "warning",
            Level::Critical => "critical",
        }
    }
}

/// The detectors of the decision table, then the opt-in rules' (rules.rs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Detector {
    UnknownToolRepeat,
    GlobalCircuitBreaker,
    KnownPollNoProgress,
    PingPong,
    GenericRepeat,
    ToolLoopRunEnded,
    Cycle,
    RepeatedFailure,
    ArgumentChurn,
    RunCallCap,
    TokenBudget,
    CostBudget,
    IdenticalCalls,
}

impl Detector {
    pub fn as_str(self) -> &'static str {
        match self {
            Detector::UnknownToolRepeat => "unknown_tool_repeat",
            Detector::GlobalCircuitBreaker => "global_circuit_breaker",
            Detector::KnownPollNoProgress => "known_poll_no_progress",
            Detector::PingPong => "ping_pong",
            Detector::GenericRepeat => "generic_repeat",
            Detector::ToolLoopRunEnded => "tool_loop_run_ended",
            Detector::Cycle => "cycle",
            Detector::RepeatedFailure => "repeated_failure",
            Detector::ArgumentChurn => "argument_churn",
            Detector::RunCallCap => "run_call_cap",
            Detector::TokenBudget => "token_budget",
            Detector::CostBudget => "cost_budget",
            Detector::IdenticalCalls => "identical_calls",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Detection {
    pub level: Level,
    pub detector: Detector,
    pub count: usize,
    pub message: String,
    pub warning_key: String,
    pub paired_tool_name: Option<Arc<str>>,
    /// What the message names besides the tool (re-emission).
    pub detail: Option<Arc<str>>,
}

/// `count >= threshold` as Python compares two ints (a threshold may be 0 or less when
/// a ResolvedConfig is built by hand: then every count reaches it).
fn reaches(count: usize, threshold: i64) -> bool {
    count as i128 >= threshold as i128
}

/// The exact message texts of spec section 6 (detectors.py's `message_for`).
pub fn message_for(
    detector: Detector,
    level: Level,
    tool: &str,
    count: usize,
    detail: Option<&str>,
) -> String {
    let critical = level == Level::Critical;
    match detector {
        Detector::UnknownToolRepeat => {
            // `detail or tool`: an empty name is falsy in Python too
            let name = detail.filter(|name| !name.is_empty()).unwrap_or(tool);
            format!(
                "CRITICAL: attempted unavailable tool {name} {count} times. \
                 Stop retrying that missing tool and answer without it."
            )
        }
        Detector::GlobalCircuitBreaker => format!(
            "CRITICAL: {tool} has repeated identical no-progress outcomes {count} times. \
             Session execution blocked by global circuit breaker to prevent runaway loops."
        ),
        Detector::KnownPollNoProgress if critical => format!(
            "CRITICAL: Called {tool} with identical arguments and no progress {count} \
             times. This appears to be a stuck polling loop. Session execution blocked to \
             prevent resource waste."
        ),
        Detector::KnownPollNoProgress => format!(
            "WARNING: You have called {tool} {count} times with identical arguments and no \
             progress. Stop polling and either (1) increase wait time between checks, or (2) \
             report the task as failed if the process is stuck."
        ),
        Detector::PingPong if critical => format!(
            "CRITICAL: You are alternating between repeated tool-call patterns \
             ({count} consecutive calls) with no progress. This appears to be a stuck \
             ping-pong loop. Session execution blocked to prevent resource waste."
        ),
        Detector::PingPong => format!(
            "WARNING: You are alternating between repeated tool-call patterns \
             ({count} consecutive calls). This looks like a ping-pong loop; stop retrying \
             and report the task as failed."
        ),
        Detector::GenericRepeat if critical => format!(
            "CRITICAL: Called {tool} with identical arguments and identical outcomes \
             {count} times. Session execution blocked to prevent runaway loops."
        ),
        Detector::GenericRepeat => format!(
            "WARNING: You have called {tool} {count} times with identical arguments. If this \
             is not making progress, stop retrying and report the task as failed."
        ),
        // a rule's detection keeps its whole message as the detail
        _ => detail.unwrap_or_default().to_owned(),
    }
}

/// The post-compaction guard's abort message (spec section 7).
pub fn guard_message(tool: &str, count: i64, window: i64) -> String {
    format!(
        "CRITICAL: tool {tool} repeated {count} times with identical arguments and identical \
         results within {window} attempts after auto-compaction. The compaction did not \
         break the loop. Aborting to prevent runaway resource use."
    )
}

/// Consecutive newest records of this tool carrying one unknown-tool name, and the name.
pub fn unknown_tool_streak<'h, R: Borrow<Record>>(
    history: &'h [R],
    tool: &str,
) -> (usize, Option<&'h Arc<str>>) {
    let mut streak = 0;
    let mut name: Option<&Arc<str>> = None;
    for rec in history.iter().rev() {
        let rec = rec.borrow();
        let Some(unknown) = rec.unknown.as_ref().filter(|_| &*rec.tool == tool) else {
            break;
        };
        match name {
            None => name = Some(unknown),
            Some(first) if first != unknown => break,
            Some(_) => {}
        }
        streak += 1;
    }
    (streak, name)
}

/// Consecutive identical outcomes of this signature, and the newest one (0: none);
/// records without an outcome are skipped.
pub fn no_progress_streak<R: Borrow<Record>>(history: &[R], sig: u64) -> (usize, u64) {
    let mut streak = 0;
    let mut latest = 0;
    for rec in history.iter().rev() {
        let rec = rec.borrow();
        if rec.sig != sig || rec.result == 0 {
            continue;
        }
        if latest == 0 {
            latest = rec.result;
        } else if rec.result != latest {
            break;
        }
        streak += 1;
    }
    (streak, latest)
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PingPong<'h> {
    pub count: usize,
    pub paired_tool: Option<&'h Arc<str>>,
    pub paired_sig: u64,
    pub no_progress_evidence: bool,
}

const NO_PING_PONG: PingPong<'static> = PingPong {
    count: 0,
    paired_tool: None,
    paired_sig: 0,
    no_progress_evidence: false,
};

pub fn ping_pong_streak<'h, R: Borrow<Record>>(history: &'h [R], sig: u64) -> PingPong<'h> {
    let Some(last) = history.last().map(Borrow::borrow) else {
        return NO_PING_PONG;
    };
    let earlier = &history[..history.len() - 1];
    // A signature of 0 counts as "no other side", as the Python's `if not other_sig`.
    let other_sig = earlier
        .iter()
        .rev()
        .map(|rec| rec.borrow().sig)
        .find(|&s| s != last.sig)
        .unwrap_or(0);
    if other_sig == 0 {
        return NO_PING_PONG;
    }
    let mut tail = 0;
    for rec in history.iter().rev() {
        if rec.borrow().sig != (if tail % 2 == 0 { last.sig } else { other_sig }) {
            break;
        }
        tail += 1;
    }
    if tail < 2 || sig != other_sig {
        return NO_PING_PONG;
    }
    let (mut result_last, mut result_other) = (0, 0);
    let mut evidence = true;
    for rec in &history[history.len() - tail..] {
        let rec = rec.borrow();
        if rec.result == 0 {
            evidence = false;
            break;
        }
        let side = if rec.sig == last.sig {
            &mut result_last
        } else {
            &mut result_other
        };
        if *side == 0 {
            *side = rec.result;
        } else if rec.result != *side {
            evidence = false;
            break;
        }
    }
    if result_last == 0 || result_other == 0 {
        evidence = false;
    }
    PingPong {
        count: tail + 1,
        paired_tool: Some(&last.tool),
        paired_sig: last.sig,
        no_progress_evidence: evidence,
    }
}

/// `{scope}:{kind}:{tool}:{args_token}` and, for an outcome, `:{latest:016x}`.
fn call_key(scope: &str, kind: &str, tool: &str, args_token: &str, latest: Option<u64>) -> String {
    let mut key =
        String::with_capacity(scope.len() + kind.len() + tool.len() + args_token.len() + 20);
    let _ = write!(key, "{scope}:{kind}:{tool}:{args_token}");
    if let Some(latest) = latest {
        let _ = write!(key, ":{latest:016x}");
    }
    key
}

/// The decision table of spec section 6: first match wins (detectors.py's `detect`).
///
/// `recent` is the number of records with this call's signature. When it is 0, every
/// counter but the unknown-tool streak is 0 too, which lets the common healthy call
/// skip the history scans.
#[allow(clippy::too_many_arguments)]
pub fn detect<R: Borrow<Record>>(
    history: &[R],
    tool: &str,
    sig: u64,
    args_token: &str,
    known_poll: bool,
    config: &ResolvedConfig,
    run: Option<&str>,
    recent: usize,
) -> Option<Detection> {
    if history.is_empty() {
        return None;
    }
    let scope = run.unwrap_or("");
    let (unknown_count, unknown_name) = unknown_tool_streak(history, tool);
    if reaches(unknown_count, config.unknown_tool_threshold) {
        let detector = Detector::UnknownToolRepeat;
        let name = unknown_name.map(|name| &**name);
        return Some(Detection {
            level: Level::Critical,
            detector,
            count: unknown_count,
            message: message_for(detector, Level::Critical, tool, unknown_count, name),
            // f-string of None (reached only by a threshold of 0 or less)
            warning_key: format!("{scope}:unknown-tool:{tool}:{}", name.unwrap_or("None")),
            paired_tool_name: None,
            detail: unknown_name.cloned(),
        });
    }
    if recent == 0 {
        return None;
    }
    let (streak, latest) = no_progress_streak(history, sig);
    let simple = |level: Level, detector: Detector, count: usize, warning_key: String| Detection {
        level,
        detector,
        count,
        message: message_for(detector, level, tool, count, None),
        warning_key,
        paired_tool_name: None,
        detail: None,
    };
    if reaches(streak, config.global_circuit_breaker_threshold) {
        let key = call_key(scope, "global", tool, args_token, Some(latest));
        return Some(simple(
            Level::Critical,
            Detector::GlobalCircuitBreaker,
            streak,
            key,
        ));
    }
    if known_poll && config.known_poll_no_progress && reaches(streak, config.warning_threshold) {
        let level = if reaches(streak, config.critical_threshold) {
            Level::Critical
        } else {
            Level::Warning
        };
        let key = call_key(scope, "poll", tool, args_token, Some(latest));
        return Some(simple(level, Detector::KnownPollNoProgress, streak, key));
    }
    if config.ping_pong {
        let pong = ping_pong_streak(history, sig);
        if reaches(pong.count, config.warning_threshold) {
            let level =
                if reaches(pong.count, config.critical_threshold) && pong.no_progress_evidence {
                    Level::Critical
                } else {
                    Level::Warning
                };
            let (low, high) = if sig <= pong.paired_sig {
                (sig, pong.paired_sig)
            } else {
                (pong.paired_sig, sig)
            };
            return Some(Detection {
                level,
                detector: Detector::PingPong,
                count: pong.count,
                message: message_for(Detector::PingPong, level, tool, pong.count, None),
                warning_key: format!("{scope}:pingpong:{low:016x}|{high:016x}"),
                paired_tool_name: pong.paired_tool.cloned(),
                detail: pong.paired_tool.cloned(),
            });
        }
    }
    if !known_poll && config.generic_repeat {
        if reaches(streak, config.critical_threshold) {
            let key = call_key(scope, "generic", tool, args_token, Some(latest));
            return Some(simple(
                Level::Critical,
                Detector::GenericRepeat,
                streak,
                key,
            ));
        }
        if reaches(recent, config.warning_threshold) {
            let key = call_key(scope, "generic", tool, args_token, None);
            return Some(simple(Level::Warning, Detector::GenericRepeat, recent, key));
        }
    }
    None
}

/// `detect` over a run's view of the history, whichever form it has.
#[allow(clippy::too_many_arguments)]
pub fn detect_in_run(
    view: &RunHistory<'_>,
    tool: &str,
    sig: u64,
    args_token: &str,
    known_poll: bool,
    config: &ResolvedConfig,
    run: Option<&str>,
    recent: usize,
) -> Option<Detection> {
    match view {
        RunHistory::Whole(records) => detect(
            records, tool, sig, args_token, known_poll, config, run, recent,
        ),
        RunHistory::Of(records) => detect(
            records, tool, sig, args_token, known_poll, config, run, recent,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::fingerprint::{result_fingerprint, signature};
    use crate::engine::history::History;

    fn rec(tool: &str, sig: u64, result: u64) -> Record {
        Record {
            tool: Arc::from(tool),
            sig,
            run: 0,
            call: 0,
            result,
            unknown: None,
            ts: 0,
        }
    }

    #[test]
    fn ten_identical_calls_warn_then_twenty_identical_outcomes_block() {
        let config = ResolvedConfig::default();
        let sig = signature("read", "t");
        let ok = result_fingerprint("ok");
        let history: Vec<Record> = (0..10).map(|_| rec("read", sig, 0)).collect();
        let found = detect(&history, "read", sig, "t", false, &config, Some("r1"), 10).unwrap();
        assert_eq!(
            (found.level, found.detector, found.count),
            (Level::Warning, Detector::GenericRepeat, 10)
        );
        assert_eq!(found.warning_key, "r1:generic:read:t");
        let history: Vec<Record> = (0..20).map(|_| rec("read", sig, ok)).collect();
        let found = detect(&history, "read", sig, "t", false, &config, None, 20).unwrap();
        assert_eq!(found.level, Level::Critical);
        assert_eq!(found.warning_key, format!(":generic:read:t:{ok:016x}"));
        assert_eq!(
            found.message,
            "CRITICAL: Called read with identical arguments and identical outcomes 20 times. \
             Session execution blocked to prevent runaway loops."
        );
    }

    #[test]
    fn ping_pong_names_the_other_tool_and_sorts_its_key() {
        let config = ResolvedConfig::default();
        let history: Vec<Record> = (0..9)
            .map(|i| {
                if i % 2 == 0 {
                    rec("a", 7, 3)
                } else {
                    rec("b", 5, 9)
                }
            })
            .collect();
        // last is "a" (sig 7); the call is of the other side, sig 5
        let found = detect(&history, "b", 5, "t", false, &config, None, 4).unwrap();
        assert_eq!((found.detector, found.count), (Detector::PingPong, 10));
        assert_eq!(found.paired_tool_name.as_deref(), Some("a"));
        assert_eq!(
            found.warning_key,
            ":pingpong:0000000000000005|0000000000000007"
        );
    }

    #[test]
    fn a_view_of_one_run_counts_only_its_records() {
        let mut history = History::new();
        for run in [1, 2, 1, 1] {
            history.append(
                Record {
                    run,
                    ..rec("a", 7, 0)
                },
                3,
            );
        }
        let view = history.run_history(1);
        assert!(matches!(view, RunHistory::Of(_)));
        assert_eq!((view.len(), history.recent_count(7, &view)), (2, 2));
        history.append(
            Record {
                run: 1,
                ..rec("a", 7, 0)
            },
            3,
        );
        let view = history.run_history(1);
        assert!(matches!(view, RunHistory::Whole(_)));
        assert_eq!(history.recent_count(7, &view), 3);
    }
}
