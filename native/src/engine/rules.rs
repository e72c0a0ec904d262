//! The opt-in rules in Rust: rules.py's logic, rule_state.py's tallies and
//! their bytes, over the resolved rules of rule_config.py (resolution stays in Python).
//!
//! Two things are left to the caller, who asks Python for them, because only Python
//! says them the same way: a failure's identity (`failure_identity`: Python's regular
//! expressions) and a cap's count and message (`_cap_detection`: Python's true division
//! of big ints and `{:.6g}`). Here a cap is only found ([`run_cap`]); the caller makes
//! its detection.

use std::collections::HashSet;
use std::sync::Arc;

use super::detectors::{Detection, Detector, Level};
use super::fingerprint::hash64;
use super::history::RunHistory;
use super::volatile::VolatileResults;

/// rule_state.py's bounds.
pub const MAX_RUN_TALLIES: usize = 32;
pub const MAX_FAILURE_STREAKS: usize = 64;
/// OpenClaw's MIN_STABLE_CALLS_PER_VARIANT (argument churn).
const MIN_STABLE_CALLS_PER_VARIANT: usize = 3;
/// rules.py's RUN_ENDED_NOTICE.
pub const RUN_ENDED_NOTICE: &str =
    "Ending this run: the model kept repeating a blocked tool call and made no progress.";

// -- resolved rules (rule_config.py's ResolvedRules) ------------------------------------

pub struct RunEnding {
    pub enforced: bool,
    pub criticals_per_run: u64,
    pub blocked_streak: u64,
}

pub struct RepeatedFailure {
    pub enforced: bool,
    pub warning_threshold: u64,
    pub critical_threshold: u64,
}

/// A cap and the amount that warns: `round(warn_at * cap, 9)`, as Python computed it.
#[derive(Clone, Copy)]
pub struct Cap<T> {
    pub limit: T,
    pub warn_from: f64,
}

pub struct RunCaps {
    pub enforced: bool,
    pub max_tool_calls: Option<Cap<u128>>,
    pub tokens_per_run: Option<Cap<u128>>,
    pub tokens_per_session: Option<Cap<u128>>,
    pub cost_per_run: Option<Cap<f64>>,
    pub cost_per_session: Option<Cap<f64>>,
}

#[derive(Default)]
pub struct Rules {
    pub run_ending: Option<RunEnding>,
    /// (enforced, max period)
    pub cycle: Option<(bool, usize)>,
    pub repeated_failure: Option<RepeatedFailure>,
    /// enforced
    pub argument_churn: Option<bool>,
    pub run_caps: Option<RunCaps>,
    /// The fleet breaker's (enforced, action): "warn" or "block" (the worker's overlay).
    pub fleet_breaker: Option<(bool, &'static str)>,
    pub identical_calls: Option<IdenticalCalls>,
    /// The result masking (read where a result's outcome token is taken).
    pub volatile_results: Option<Arc<VolatileResults>>,
    pub exempt: HashSet<String>,
}

pub struct IdenticalCalls {
    pub enforced: bool,
    pub warning_threshold: u64,
    pub critical_threshold: u64,
}

// -- what the rules remember (rule_state.py) ---------------------------------------------

#[derive(Clone, Debug, Default, PartialEq)]
pub struct RunTally {
    pub calls: u64,
    pub criticals: u64,
    pub blocked_streak: u64,
    /// Python's ints have no bound; 128 bits take 2^74 reports of the largest usage.
    pub tokens: u128,
    pub cost: f64,
}

/// RuleState: insertion orders are ages (the oldest dropped first), as dicts keep them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RuleState {
    pub runs: Vec<(u64, RunTally)>,
    /// ((run key, hash of the tool name), (error identity, consecutive count))
    pub failures: Vec<((u64, u64), (u64, u64))>,
    pub session_tokens: u128,
    pub session_cost: f64,
    /// (run key, (signature of its latest call, how many in a row)), oldest first
    pub identical: Vec<(u64, (u64, u64))>,
}

impl RuleState {
    /// The run's tally, created (and the oldest dropped past the cap) if new.
    pub fn tally(&mut self, run: u64) -> &mut RunTally {
        let index = match self.runs.iter().position(|(key, _)| *key == run) {
            Some(index) => index,
            None => {
                self.runs.push((run, RunTally::default()));
                if self.runs.len() > MAX_RUN_TALLIES {
                    self.runs.remove(0);
                }
                self.runs.len() - 1
            }
        };
        &mut self.runs[index].1
    }

    pub fn run(&self, run: u64) -> Option<&RunTally> {
        self.runs
            .iter()
            .find(|(key, _)| *key == run)
            .map(|(_, tally)| tally)
    }

    pub fn failure(&self, key: (u64, u64)) -> Option<(u64, u64)> {
        self.failures
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, value)| *value)
    }

    pub fn note_failure(&mut self, key: (u64, u64), error: u64) {
        let previous = self
            .failures
            .iter()
            .position(|(k, _)| *k == key)
            .map(|i| self.failures.remove(i).1);
        let count = match previous {
            Some((identity, count)) if identity == error => count + 1,
            _ => 1,
        };
        self.failures.push((key, (error, count))); // re-inserted: the newest
        if self.failures.len() > MAX_FAILURE_STREAKS {
            self.failures.remove(0);
        }
    }

    /// How many calls of `sig` in a row the run has made, this one not counted.
    pub fn identical_streak(&self, run: u64, sig: u64) -> u64 {
        match self.identical.iter().find(|(key, _)| *key == run) {
            Some((_, (last, count))) if *last == sig => *count,
            _ => 0,
        }
    }

    pub fn note_call(&mut self, run: u64, sig: u64) {
        let count = self.identical_streak(run, sig) + 1;
        self.identical.retain(|(key, _)| *key != run);
        self.identical.push((run, (sig, count))); // re-inserted: the newest
        if self.identical.len() > MAX_RUN_TALLIES {
            self.identical.remove(0);
        }
    }

    pub fn end_streak(&mut self, key: (u64, u64)) {
        self.failures.retain(|(k, _)| *k != key);
    }

    pub fn forget_run(&mut self, run: u64) {
        self.runs.retain(|(key, _)| *key != run);
        self.failures.retain(|((key, _), _)| *key != run);
        self.identical.retain(|(key, _)| *key != run);
    }

    pub fn is_empty(&self) -> bool {
        self.runs.is_empty()
            && self.failures.is_empty()
            && self.session_tokens == 0
            && self.session_cost == 0.0
            && self.identical.is_empty()
    }

    /// The trailer's bytes (`encode_rule_state`), or none for an empty state
    /// (state_codec.py's `_rules_bytes`).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        if self.is_empty() {
            return out;
        }
        out.push(TRAILER_TAG);
        let version = if self.identical.is_empty() {
            TRAILER_VERSION
        } else {
            TRAILER_VERSION_STREAKS
        };
        put(&mut out, version as u128);
        put(&mut out, self.runs.len() as u128);
        for (run, tally) in &self.runs {
            out.extend_from_slice(&run.to_le_bytes());
            for value in [
                tally.calls as u128,
                tally.criticals as u128,
                tally.blocked_streak as u128,
                tally.tokens,
            ] {
                put(&mut out, value);
            }
            out.extend_from_slice(&tally.cost.to_le_bytes());
        }
        put(&mut out, self.failures.len() as u128);
        for ((run, tool), (error, count)) in &self.failures {
            for value in [run, tool, error] {
                out.extend_from_slice(&value.to_le_bytes());
            }
            put(&mut out, *count as u128);
        }
        put(&mut out, self.session_tokens);
        out.extend_from_slice(&self.session_cost.to_le_bytes());
        if !self.identical.is_empty() {
            put(&mut out, self.identical.len() as u128);
            for (run, (sig, count)) in &self.identical {
                out.extend_from_slice(&run.to_le_bytes());
                out.extend_from_slice(&sig.to_le_bytes());
                put(&mut out, *count as u128);
            }
        }
        out
    }

    /// A state from the trailer's bytes (`decode_rule_state`, the whole of them); empty
    /// bytes are no rule state. None for bytes it does not read.
    pub fn from_bytes(data: &[u8]) -> Option<RuleState> {
        let mut rules = RuleState::default();
        if data.is_empty() {
            return Some(rules);
        }
        let mut reader = Reader { data, pos: 0 };
        if reader.byte()? != TRAILER_TAG {
            return None;
        }
        let version = reader.uvarint()?;
        if version != TRAILER_VERSION as u128 && version != TRAILER_VERSION_STREAKS as u128 {
            return None;
        }
        for _ in 0..reader.uvarint()? {
            let run = reader.u64()?;
            let tally = RunTally {
                calls: reader.uvarint()?.try_into().ok()?,
                criticals: reader.uvarint()?.try_into().ok()?,
                blocked_streak: reader.uvarint()?.try_into().ok()?,
                tokens: reader.uvarint()?,
                cost: f64::from_bits(reader.u64()?),
            };
            rules.runs.push((run, tally));
        }
        for _ in 0..reader.uvarint()? {
            let key = (reader.u64()?, reader.u64()?);
            let error = reader.u64()?;
            rules
                .failures
                .push((key, (error, reader.uvarint()?.try_into().ok()?)));
        }
        rules.session_tokens = reader.uvarint()?;
        rules.session_cost = f64::from_bits(reader.u64()?);
        if version == TRAILER_VERSION_STREAKS as u128 {
            for _ in 0..reader.uvarint()? {
                let run = reader.u64()?;
                let sig = reader.u64()?;
                rules
                    .identical
                    .push((run, (sig, reader.uvarint()?.try_into().ok()?)));
            }
        }
        (reader.pos == data.len()).then_some(rules)
    }
}

const TRAILER_TAG: u8 = 0x52;
const TRAILER_VERSION: u8 = 1;
/// rule_state.py's: the identical-call streaks at the end (version 1 without any).
const TRAILER_VERSION_STREAKS: u8 = 2;

/// state_codec.py's `_uvarint` (LEB128), to 128 bits.
fn put(out: &mut Vec<u8>, mut value: u128) {
    while value >= 0x80 {
        out.push((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn byte(&mut self) -> Option<u8> {
        let byte = *self.data.get(self.pos)?;
        self.pos += 1;
        Some(byte)
    }

    fn u64(&mut self) -> Option<u64> {
        let bytes = self.data.get(self.pos..self.pos + 8)?;
        self.pos += 8;
        Some(u64::from_le_bytes(bytes.try_into().ok()?))
    }

    fn uvarint(&mut self) -> Option<u128> {
        let mut value: u128 = 0;
        let mut shift = 0;
        loop {
            let byte = self.byte()?;
            if shift >= 128 || (shift > 121 && (byte & 0x7f) >> (128 - shift) != 0) {
                return None; // beyond 128 bits
            }
            value |= ((byte & 0x7f) as u128) << shift;
            if byte & 0x80 == 0 {
                return Some(value);
            }
            shift += 7;
        }
    }
}

// -- judging a call (RuleBook.judge) -------------------------------------------------------

/// What the rules make of one call, on top of the decision table's detection.
pub struct Judgement {
    pub detection: Option<Detection>,
    pub enforce: bool,
    /// `detection` is a cap at its limit: the run is aborted too.
    pub ends_run: bool,
    /// Rules only reported.
    pub shadows: Vec<Detection>,
}

/// A cap reached, or past its warning amount: what `_cap_detection` is called with.
pub struct CapHit {
    pub level: Level,
    pub detector: Detector,
    pub scope: &'static str,
    pub used: Amount,
    pub cap: Amount,
}

/// An amount as Python holds it: calls and tokens are ints, costs floats.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Amount {
    Int(u128),
    Float(f64),
}

/// `int >= float` as Python compares them: exactly.
fn int_reaches(value: u128, bound: f64) -> bool {
    if bound.is_nan() {
        return false;
    }
    if bound <= 0.0 {
        return true;
    }
    if bound >= 2f64.powi(128) {
        return false;
    }
    value >= bound.ceil() as u128
}

/// `_run_cap`: the first cap reached (critical), else the first past its warning amount.
pub fn run_cap(caps: &RunCaps, tally: Option<&RunTally>, rules: &RuleState) -> Option<CapHit> {
    let calls = tally.map_or(0, |t| t.calls as u128) + 1; // this call included
    let run_tokens = tally.map_or(0, |t| t.tokens);
    let run_cost = tally.map_or(0.0, |t| t.cost);
    let mut warning: Option<CapHit> = None;
    let mut check =
        |detector: Detector, scope: &'static str, used: Amount, cap: Amount, warn_from: f64| {
            let (over, warns) = match (used, cap) {
                (Amount::Int(used), Amount::Int(cap)) if detector == Detector::RunCallCap => {
                    (used > cap, int_reaches(used, warn_from))
                }
                (Amount::Int(used), Amount::Int(cap)) => {
                    (used >= cap, int_reaches(used, warn_from))
                }
                (Amount::Float(used), Amount::Float(cap)) => (used >= cap, used >= warn_from),
                _ => unreachable!("an amount and its cap are of one kind"),
            };
            if over {
                return Some(CapHit {
                    level: Level::Critical,
                    detector,
                    scope,
                    used,
                    cap,
                });
            }
            if warning.is_none() && warns {
                warning = Some(CapHit {
                    level: Level::Warning,
                    detector,
                    scope,
                    used,
                    cap,
                });
            }
            None
        };
    let ints = [
        (Detector::RunCallCap, "run", calls, caps.max_tool_calls),
        (
            Detector::TokenBudget,
            "run",
            run_tokens,
            caps.tokens_per_run,
        ),
        (
            Detector::TokenBudget,
            "session",
            rules.session_tokens,
            caps.tokens_per_session,
        ),
    ];
    for (detector, scope, used, cap) in ints {
        if let Some(cap) = cap {
            if let Some(hit) = check(
                detector,
                scope,
                Amount::Int(used),
                Amount::Int(cap.limit),
                cap.warn_from,
            ) {
                return Some(hit);
            }
        }
    }
    let floats = [
        ("run", run_cost, caps.cost_per_run),
        ("session", rules.session_cost, caps.cost_per_session),
    ];
    for (scope, used, cap) in floats {
        if let Some(cap) = cap {
            if let Some(hit) = check(
                Detector::CostBudget,
                scope,
                Amount::Float(used),
                Amount::Float(cap.limit),
                cap.warn_from,
            ) {
                return Some(hit);
            }
        }
    }
    warning
}

/// `RuleBook.judge`: enforced rule criticals beat the table's warnings; rule warnings
/// fill its gaps. `capped`: `run_cap`'s detection (the caller made it); `history`: the
/// run's records, read only where detection is on (`config.detection_on`).
#[allow(clippy::too_many_arguments)]
pub fn judge(
    rules: &Rules,
    state: &RuleState,
    history: Option<&RunHistory<'_>>,
    tool: &str,
    sig: u64,
    warning_threshold: i64,
    critical_threshold: i64,
    run: Option<&str>,
    run_hash: u64,
    capped: Option<Detection>,
    detection: Option<Detection>,
    enforce: bool,
) -> Judgement {
    let plain = |detection, shadows| Judgement {
        detection,
        enforce,
        ends_run: false,
        shadows,
    };
    if detection
        .as_ref()
        .is_some_and(|d| d.level == Level::Critical)
    {
        return plain(detection, Vec::new());
    }
    let mut found: Vec<(Detection, bool, bool)> = Vec::new(); // (detection, enforced, ends run)
    if let (Some(caps), Some(capped)) = (&rules.run_caps, capped) {
        let critical = capped.level == Level::Critical;
        found.push((capped, caps.enforced, critical));
    }
    if let Some(rule) = &rules.repeated_failure {
        if let Some((identity, count)) = state.failure((run_hash, hash64(tool))) {
            if count >= rule.warning_threshold {
                let level = if count >= rule.critical_threshold {
                    Level::Critical
                } else {
                    Level::Warning
                };
                let key = format!("{}:failure:{tool}:{identity:016x}", run.unwrap_or(""));
                found.push((
                    rule_detection(
                        level,
                        Detector::RepeatedFailure,
                        count as usize,
                        failure_message(level, tool, count),
                        key,
                    ),
                    rule.enforced,
                    false,
                ));
            }
        }
    }
    if let Some(rule) = &rules.identical_calls {
        // like the failure streak: the calls already made, judged on the next one
        let count = state.identical_streak(run_hash, sig);
        if count >= rule.warning_threshold {
            let level = if count >= rule.critical_threshold {
                Level::Critical
            } else {
                Level::Warning
            };
            let key = format!("{}:identical:{sig:016x}", run.unwrap_or(""));
            found.push((
                rule_detection(
                    level,
                    Detector::IdenticalCalls,
                    count as usize,
                    identical_message(level, tool, count),
                    key,
                ),
                rule.enforced,
                false,
            ));
        }
    }
    if let Some(history) = history {
        if let Some((enforced, max_period)) = rules.cycle {
            if let Some(cycle) = cycle(
                history,
                sig,
                warning_threshold,
                critical_threshold,
                max_period,
                run,
            ) {
                found.push((cycle, enforced, false));
            }
        }
        if let Some(enforced) = rules.argument_churn {
            let (count, variants) = argument_churn_streak(history, tool, sig);
            if reaches(count, warning_threshold) {
                let message = format!(
                    "WARNING: {tool} has cycled through {variants} repeated argument patterns with the same stable \
                     outcome {count} times. Continued churn is treated as stalled run activity, but this tool call \
                     remains allowed."
                );
                let key = format!("{}:argument-churn:{tool}", run.unwrap_or(""));
                found.push((
                    rule_detection(Level::Warning, Detector::ArgumentChurn, count, message, key),
                    enforced,
                    false,
                ));
            }
        }
    }
    if found.is_empty() {
        return plain(detection, Vec::new());
    }
    // Effective: the first enforced rule critical, else the table's warning, else the
    // first enforced rule warning. Rules that are not enforced are reported.
    let mut chosen = found
        .iter()
        .position(|f| f.1 && f.0.level == Level::Critical);
    if chosen.is_none() && detection.is_none() {
        chosen = found.iter().position(|f| f.1);
    }
    let mut shadows = Vec::new();
    let mut effective = None;
    for (index, (found, enforced, ends_run)) in found.into_iter().enumerate() {
        if Some(index) == chosen {
            effective = Some((found.clone(), ends_run));
        }
        if !enforced {
            shadows.push(found);
        }
    }
    match effective {
        None => plain(detection, shadows),
        Some((chosen, ends_run)) => Judgement {
            detection: Some(chosen),
            enforce: true,
            ends_run,
            shadows,
        },
    }
}

/// A run to abort (`RunEnd`): the verdict's and loop event's fields.
pub struct RunEnd {
    pub detector: Detector,
    pub count: usize,
    pub message: String,
    pub enforced: bool,
}

/// `RuleBook.after_call`: count the call; the run to abort when this call ends it.
pub fn after_call(
    rules: &Rules,
    state: &mut RuleState,
    run_hash: u64,
    sig: u64,
    judgement: &Judgement,
) -> Option<RunEnd> {
    if rules.identical_calls.is_some() {
        state.note_call(run_hash, sig);
    }
    let tally = state.tally(run_hash);
    tally.calls += 1;
    let detection = judgement.detection.as_ref();
    if let (Some(found), true) = (detection, judgement.ends_run) {
        return Some(RunEnd {
            detector: found.detector,
            count: found.count,
            message: found.message.clone(),
            enforced: true,
        });
    }
    let ending = rules.run_ending.as_ref()?;
    // A critical counts when it blocked the call, or, while the run ending itself is
    // only reported, when it would have: a shadow ends nothing it did not block.
    let critical = detection.filter(|d| d.level == Level::Critical);
    let Some(found) = critical.filter(|_| judgement.enforce || !ending.enforced) else {
        tally.blocked_streak = 0;
        return None;
    };
    tally.criticals += 1;
    tally.blocked_streak += 1;
    let count = if tally.criticals >= ending.criticals_per_run {
        tally.criticals
    } else if tally.blocked_streak >= ending.blocked_streak {
        tally.blocked_streak
    } else {
        return None;
    };
    Some(RunEnd {
        detector: Detector::ToolLoopRunEnded,
        count: count as usize,
        message: format!("{} {RUN_ENDED_NOTICE}", found.message),
        enforced: ending.enforced && judgement.enforce,
    })
}

/// `RuleBook.on_result`'s counting of spend: a result's usage, while run caps are on.
pub fn spend(state: &mut RuleState, run_hash: u64, tokens: u128, cost: f64) {
    let tally = state.tally(run_hash);
    tally.tokens += tokens;
    tally.cost += cost;
    state.session_tokens += tokens;
    state.session_cost += cost;
}

// -- the rules' detectors -----------------------------------------------------------------

/// `count >= threshold` as Python compares two ints.
fn reaches(count: usize, threshold: i64) -> bool {
    count as i128 >= threshold as i128
}

fn rule_detection(
    level: Level,
    detector: Detector,
    count: usize,
    message: String,
    warning_key: String,
) -> Detection {
    // The whole message is the detail: a redelivered call gets it back (message_for).
    let detail = Some(std::sync::Arc::from(message.as_str()));
    Detection {
        level,
        detector,
        count,
        message,
        warning_key,
        paired_tool_name: None,
        detail,
    }
}

/// A rule's detection from `_cap_detection`'s count, message and key (Python's).
pub fn cap_detection(
    hit: &CapHit,
    count: usize,
    message: String,
    warning_key: String,
) -> Detection {
    rule_detection(hit.level, hit.detector, count, message, warning_key)
}

fn failure_message(level: Level, tool: &str, count: u64) -> String {
    if level == Level::Critical {
        format!(
            "CRITICAL: {tool} failed {count} times in a row with the same error. Session execution blocked to \
             prevent runaway loops."
        )
    } else {
        format!(
            "WARNING: {tool} failed {count} times in a row with the same error. Stop retrying it; change approach \
             or report the task as failed."
        )
    }
}

fn identical_message(level: Level, tool: &str, count: u64) -> String {
    if level == Level::Critical {
        format!(
            "CRITICAL: You have called {tool} {count} times in a row with identical arguments. Session execution \
             blocked to prevent runaway loops."
        )
    } else {
        format!(
            "WARNING: You have called {tool} {count} times in a row with identical arguments. If this is not making \
             progress, stop retrying and report the task as failed."
        )
    }
}

/// Not a repeat of a shorter pattern (ABAB is ping-pong, AAA generic repeat).
fn primitive(pattern: &[u64]) -> bool {
    let size = pattern.len();
    !(1..size).any(|d| size.is_multiple_of(d) && (0..size).all(|i| pattern[i] == pattern[i % d]))
}

/// `cycle_streak`: (count, no-progress evidence) of a cycle of `period` that `sig` continues.
pub fn cycle_streak(history: &RunHistory<'_>, sig: u64, period: usize) -> (usize, bool) {
    let size = history.len();
    if size < period {
        return (0, false);
    }
    let at = |index: usize| history.get(index).expect("a record of the run");
    let sigs: Vec<u64> = (size - period..size).map(|i| at(i).sig).collect();
    if sig != sigs[0] || !primitive(&sigs) {
        return (0, false);
    }
    let mut tail = period;
    while tail < size && at(size - 1 - tail).sig == sigs[period - 1 - tail % period] {
        tail += 1;
    }
    let mut results = vec![0u64; period];
    let mut evidence = true;
    for index in 0..tail {
        let rec = at(size - 1 - index);
        let slot = (period - 1 - index % period) % period;
        if rec.result == 0 || (results[slot] != 0 && rec.result != results[slot]) {
            evidence = false;
            break;
        }
        results[slot] = rec.result;
    }
    (tail + 1, evidence)
}

fn cycle(
    history: &RunHistory<'_>,
    sig: u64,
    warning_threshold: i64,
    critical_threshold: i64,
    max_period: usize,
    run: Option<&str>,
) -> Option<Detection> {
    let mut best = (0, false, 0);
    for period in 3..=max_period {
        let (count, evidence) = cycle_streak(history, sig, period);
        if count > best.0 {
            best = (count, evidence, period);
        }
    }
    let (count, evidence, period) = best;
    if !reaches(count, warning_threshold) {
        return None;
    }
    let critical = reaches(count, critical_threshold) && evidence;
    let level = if critical {
        Level::Critical
    } else {
        Level::Warning
    };
    let size = history.len();
    let mut members: Vec<u64> = (size.saturating_sub(period)..size)
        .map(|i| history.get(i).expect("a record").sig)
        .collect();
    members.sort_unstable();
    members.dedup();
    let key = members
        .iter()
        .map(|m| format!("{m:016x}"))
        .collect::<Vec<_>>()
        .join("|");
    let message = if critical {
        format!(
            "CRITICAL: You are repeating a cycle of {period} tool-call patterns ({count} consecutive calls) with no \
             progress. This appears to be a stuck loop. Session execution blocked to prevent resource waste."
        )
    } else {
        format!(
            "WARNING: You are repeating a cycle of {period} tool-call patterns ({count} consecutive calls). This \
             looks like a loop; stop retrying and report the task as failed."
        )
    };
    Some(rule_detection(
        level,
        Detector::Cycle,
        count,
        message,
        format!("{}:cycle:{key}", run.unwrap_or("")),
    ))
}

/// `argument_churn_streak`: (count, variants) of OpenClaw's no-progress argument churn,
/// else (0, 0).
pub fn argument_churn_streak(history: &RunHistory<'_>, tool: &str, sig: u64) -> (usize, usize) {
    let size = history.len();
    let records: Vec<_> = (0..size)
        .map(|i| history.get(i).expect("a record"))
        .collect();
    let mut no_progress = Vec::with_capacity(size);
    let mut seen: Vec<(u64, Vec<u64>)> = Vec::new(); // sig -> results seen
    for rec in &records {
        let index = match seen.iter().position(|(s, _)| *s == rec.sig) {
            Some(index) => index,
            None => {
                seen.push((rec.sig, Vec::new()));
                seen.len() - 1
            }
        };
        let results = &mut seen[index].1;
        no_progress.push(rec.result != 0 && results.contains(&rec.result));
        if rec.result != 0 && !results.contains(&rec.result) {
            results.push(rec.result);
        }
    }
    let mut outcomes: Vec<(u64, (u64, usize))> = Vec::new(); // sig -> (result, count), in insertion order
    for index in (0..size).rev() {
        let rec = records[index];
        if &*rec.tool != tool {
            break;
        }
        if rec.result == 0 {
            continue;
        }
        if !no_progress[index] {
            break;
        }
        match outcomes.iter_mut().find(|(s, _)| *s == rec.sig) {
            Some((_, (result, _))) if *result != rec.result => break,
            Some((_, (_, count))) => *count += 1,
            None => outcomes.push((rec.sig, (rec.result, 1))),
        }
    }
    let total: usize = outcomes.iter().map(|(_, (_, count))| count).sum();
    let stable: Vec<(u64, usize)> = outcomes
        .iter()
        .map(|(_, value)| *value)
        .filter(|(_, count)| *count >= MIN_STABLE_CALLS_PER_VARIANT)
        .collect();
    let current = outcomes
        .iter()
        .find(|(s, _)| *s == sig)
        .map(|(_, value)| *value);
    let churn = stable.len() > 1
        && stable.iter().map(|(_, count)| count).sum::<usize>() == total
        && stable.iter().all(|(result, _)| *result == stable[0].0)
        && current.is_some_and(|(_, count)| count >= MIN_STABLE_CALLS_PER_VARIANT);
    if churn {
        (total, stable.len())
    } else {
        (0, 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_int_reaches_a_float_as_python_compares_them() {
        assert!(int_reaches(7, 7.0));
        assert!(!int_reaches(6, 6.000000000000001));
        assert!(int_reaches(9_007_199_254_740_993, 9_007_199_254_740_992.0));
        assert!(!int_reaches(u128::MAX, f64::INFINITY));
    }

    #[test]
    fn rule_state_bytes_round_trip() {
        let mut state = RuleState::default();
        spend(&mut state, 5, 1 << 70, 0.25);
        state.note_failure((5, 9), 3);
        state.note_failure((5, 9), 3);
        state.note_call(5, 7);
        state.note_call(5, 7);
        assert_eq!(state.identical_streak(5, 7), 2);
        let bytes = state.to_bytes();
        assert_eq!(RuleState::from_bytes(&bytes), Some(state));
        assert!(RuleState::default().to_bytes().is_empty());
    }
}
