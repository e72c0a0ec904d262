//! A session's fold in Rust: step.py's `Engine.step` and `Engine.release` over a state
//! held here.
//!
//! Every config the engine takes is judged here (`streams/engine/native_step.py`'s
//! `native_for` decides, once per engine): the decision table, the opt-in rules, the post-compaction guard, ordering by `seq` with
//! parking, gaps and gateway incarnations, redeliveries, warning buckets. Each branch
//! below names the Python it mirrors; outputs are their published bytes
//! (`output.rs`), notices and rejections their fields. What only Python can say the
//! same way - a string's `repr` in a rejection's reason, the case folding of a
//! non-ASCII unknown-tool name, the regular expressions that find one in an error text
//! - is asked of Python through the GIL the step holds, on those rare paths only.

use std::collections::HashMap;
use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::PyString;

use crate::decode::{hex128_digits, Kind, Usage};
use crate::engine::config::ResolvedConfig;
use crate::engine::detectors::{
    detect_in_run, guard_message, message_for, Detection, Detector, Level,
};
use crate::engine::fingerprint::{
    hash32, hash64, is_known_poll, result_fingerprint, run_key, signature, ERROR_PREFIX,
};
use crate::engine::history::{shared_name, History, Record};
use crate::engine::rules::{self, Amount, Judgement as RulesJudgement, RuleState, Rules};
use crate::output::{write_loop_event, write_verdict, Judgement, LoopEventExtras, Setting};

// state.py's bounds
pub const MAX_WARNING_KEYS: usize = 256;
pub const MAX_SEEN_EVENT_IDS: usize = 32;
pub const MAX_DECISIONS: usize = 8;
pub const MAX_GUARDS: usize = 32;
pub const MAX_RETIRED_INCARNATIONS: usize = 8;
// step.py's
const WARNING_BUCKET_SIZE: i64 = 10;
const MAX_SKIPPED_RANGES: usize = 64;

/// What a call or a result carries, as the step reads it (and as it rests in the state:
/// raw args and results replaced by their tokens, as `Engine._at_rest` keeps them).
#[derive(Clone, Debug, PartialEq)]
pub enum Body {
    Call {
        call_id: String,
        tool_name: String,
        /// The args token (the gateway's `args_hash`, or the digest of the raw args).
        token: String,
        /// `action_of(args, args_action)`: args.action, or the gateway's hint.
        action: Option<String>,
        /// The raw args as its loop event publishes them (`includePayloadsInLoopEvents`,
        /// within MAX_LOOP_EVENT_ARGS_BYTES); None at rest, as the Python engine keeps
        /// no raw args there.
        payload: Option<Vec<u8>>,
    },
    Result {
        call_id: String,
        tool_name: String,
        /// The args token, None when the result carries no args.
        token: Option<String>,
        /// The outcome token, None when nothing is recorded (`_result_token`).
        outcome: Option<String>,
        /// The unknown-tool name (lowercase), from `unknown_tool` or the error text.
        unknown: Option<String>,
        usage: Option<Usage>,
        /// `ToolResult.error_text`, for the repeated-failure rule; None at rest (the
        /// Python engine's `_at_rest` drops the error too).
        error: Option<String>,
        /// At rest only: the failure identity of the error the result carried
        /// (state.py's `ResultAtRest.failure`), kept instead of its text.
        failure: Option<u64>,
    },
    Compaction,
    RunEnded,
}

/// An input event with its tokens: what a step applies, and what waits in the state.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    pub event_id: String,
    pub session_key: Option<String>,
    pub run_id: Option<String>,
    pub agent_id: Option<String>,
    pub incarnation: Option<String>,
    pub seq: Option<i64>,
    pub ts: i64,
    pub reply_to: Option<(String, i64, String)>,
    pub body: Body,
}

impl Event {
    /// InputEvent.key: the session key, else the run id.
    pub fn key(&self) -> &str {
        match (&self.session_key, &self.run_id) {
            (Some(key), _) if !key.is_empty() => key,
            (_, Some(run)) => run,
            _ => "",
        }
    }

    pub fn kind(&self) -> Kind {
        match self.body {
            Body::Call { .. } => Kind::ToolCall,
            Body::Result { .. } => Kind::ToolResult,
            Body::Compaction => Kind::Compaction,
            Body::RunEnded => Kind::RunEnded,
        }
    }

    fn call_id(&self) -> Option<&str> {
        match &self.body {
            Body::Call { call_id, .. } | Body::Result { call_id, .. } => Some(call_id),
            _ => None,
        }
    }

    fn tool_name(&self) -> Option<&str> {
        match &self.body {
            Body::Call { tool_name, .. } | Body::Result { tool_name, .. } => Some(tool_name),
            _ => None,
        }
    }

    /// state.py's `rest_size`: the identifiers' UTF-8 bytes of the event at rest, and 96.
    pub fn rest_size(&self) -> usize {
        let mut size = 96 + self.event_id.len();
        for text in [
            &self.session_key,
            &self.run_id,
            &self.agent_id,
            &self.incarnation,
        ]
        .into_iter()
        .flatten()
        {
            size += text.len();
        }
        match &self.body {
            Body::Call {
                call_id,
                tool_name,
                token,
                action,
                ..
            } => {
                size += call_id.len() + tool_name.len() + token.len();
                size += action.as_ref().map_or(0, String::len);
            }
            Body::Result {
                call_id,
                tool_name,
                token,
                outcome,
                unknown,
                ..
            } => {
                size += call_id.len() + tool_name.len();
                for text in [token, outcome, unknown].into_iter().flatten() {
                    size += text.len();
                }
            }
            _ => {}
        }
        size
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Guard {
    pub window: i64,
    pub remaining: i64,
    /// (tool, sig, result) of the first result after arming.
    pub first: Option<(Arc<str>, u64, u64)>,
    pub broken: bool,
}

/// The persisted action and detector codes (state_codec.py ACTIONS and DETECTORS).
pub const ACTIONS: [&str; 4] = ["allow", "warn", "block", "abort"];
pub const DETECTORS: [Option<&str>; 17] = [
    None,
    Some("unknown_tool_repeat"),
    Some("global_circuit_breaker"),
    Some("known_poll_no_progress"),
    Some("ping_pong"),
    Some("generic_repeat"),
    Some("compaction_loop_persisted"),
    Some("sequence_gap"),
    Some("tool_loop_run_ended"),
    Some("cycle"),
    Some("repeated_failure"),
    Some("argument_churn"),
    Some("run_call_cap"),
    Some("token_budget"),
    Some("cost_budget"),
    Some("fleet_tool_breaker"),
    Some("identical_calls"),
];

fn detector_code(name: &str) -> u8 {
    DETECTORS
        .iter()
        .position(|d| *d == Some(name))
        .expect("a known detector") as u8
}

#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    pub event: u32,
    /// Index into ACTIONS.
    pub action: u8,
    /// Index into DETECTORS.
    pub detector: u8,
    pub count: i64,
    pub detail: Option<String>,
    pub seq: i64,
}

/// state.py's SessionState, its serialised fields (insertion orders kept: they are
/// ages, and the state's bytes).
#[derive(Clone, Debug, Default)]
pub struct State {
    pub history: History,
    pub guards: Vec<(u64, Guard)>,
    pub warnings: Vec<(u64, (u64, i64))>,
    pub next_seq: Option<i64>,
    pub parked: Vec<(i64, Event)>,
    pub skipped: Vec<(i64, i64)>,
    pub seen_ids: Vec<u64>,
    pub decisions: Vec<Decision>,
    pub verdict_floor: i64,
    pub touched_ms: i64,
    pub last_event_ms: i64,
    pub incarnation: u64,
    pub retired: Vec<(u64, i64)>,
    pub pending: Vec<Event>,
    /// What the opt-in rules remember (rule_state.py's RuleState; empty: none).
    pub rules: RuleState,
}

impl State {
    fn parked_index(&self, seq: i64) -> Option<usize> {
        self.parked.iter().position(|(s, _)| *s == seq)
    }

    /// `event`, at rest (`Step::at_rest`), waits for the seqs before it.
    fn park(&mut self, seq: i64, event: Event) {
        self.parked.push((seq, event));
    }

    fn unpark(&mut self, seq: i64) -> Event {
        let index = self.parked_index(seq).expect("a parked seq");
        self.parked.remove(index).1
    }

    fn parked_times(&self) -> (i64, i64) {
        let mut stamps = self.parked.iter().map(|(_, e)| e.ts);
        let first = stamps.next().expect("some parked event");
        stamps.fold((first, first), |(lo, hi), ts| (lo.min(ts), hi.max(ts)))
    }

    fn waiting_bytes(&self) -> usize {
        self.parked
            .iter()
            .map(|(_, e)| e.rest_size())
            .sum::<usize>()
            + self.pending.iter().map(Event::rest_size).sum::<usize>()
    }
}

/// What a step gives out, in order.
pub enum Output {
    /// `route`: the index in `Step::asking` of the event whose reply it goes to.
    Verdict {
        bytes: Vec<u8>,
        action: &'static str,
        detector: Option<&'static str>,
        route: Option<usize>,
    },
    /// `strike`: the fleet breaker's strike of it (fleet.py's `strikes`), when it is one:
    /// (tool, hash64 of the session key, the time it counts at).
    LoopEvent {
        bytes: Vec<u8>,
        detector: &'static str,
        strike: Option<(String, u64, i64)>,
    },
    Notice {
        level: &'static str,
        message: String,
        session_key: String,
        run_id: Option<String>,
    },
    Rejection {
        code: &'static str,
        reason: String,
        event_id: String,
    },
}

/// An agent's config as loop events show it (ResolvedConfig.as_dict + enforce), and
/// its opt-in rules with the configs of the tools that have their own thresholds
/// (`ResolvedRules.for_tool`'s, rules not among them).
pub struct Policy {
    pub config: ResolvedConfig,
    pub shown: Vec<(&'static str, Setting)>,
    pub rules: Option<Rules>,
    pub tools: HashMap<String, Arc<Policy>>,
}

impl Policy {
    pub fn new(config: ResolvedConfig, enforce: bool) -> Self {
        let c = &config;
        let shown = vec![
            ("enabled", c.enabled.map_or(Setting::Null, Setting::Bool)),
            ("history_size", Setting::Int(c.history_size as i64)),
            ("warning_threshold", Setting::Int(c.warning_threshold)),
            ("critical_threshold", Setting::Int(c.critical_threshold)),
            (
                "unknown_tool_threshold",
                Setting::Int(c.unknown_tool_threshold),
            ),
            (
                "global_circuit_breaker_threshold",
                Setting::Int(c.global_circuit_breaker_threshold),
            ),
            ("generic_repeat", Setting::Bool(c.generic_repeat)),
            (
                "known_poll_no_progress",
                Setting::Bool(c.known_poll_no_progress),
            ),
            ("ping_pong", Setting::Bool(c.ping_pong)),
            ("guard_window_size", Setting::Int(c.guard_window_size)),
            ("enforce", Setting::Bool(enforce)),
        ];
        Policy {
            config,
            shown,
            rules: None,
            tools: HashMap::new(),
        }
    }
}

/// Where a step gets an agent's policy (the Python resolver, cached by the caller).
pub trait Policies {
    fn policy(&mut self, agent_id: Option<&str>) -> PyResult<Arc<Policy>>;
}

/// The engine's settings (Engine.__init__) and the Python it asks on rare paths.
pub struct Settings {
    pub enforce: bool,
    pub max_parked: usize,
    pub max_parked_bytes: usize,
    pub gap_timeout_ms: i64,
    /// rules.py's `failure_identity(error_text)`.
    pub failure_identity: Py<PyAny>,
    /// native_step.py's `cap_detection(level, detector, scope, used, cap, run)`:
    /// rules.py's `_cap_detection` as (count, message, warning key).
    pub cap_detection: Py<PyAny>,
}

/// xxh3-128 hex of some bytes (fingerprint.py's `digest`), on the stack.
fn digest(data: &[u8]) -> [u8; 32] {
    hex128_digits(data)
}

/// step.py's `run_scope`: run ids are compared trimmed; an empty one is no run id.
fn run_scope(run_id: Option<&str>) -> Option<&str> {
    let trimmed = run_id?.trim_matches(is_python_space);
    (!trimmed.is_empty()).then_some(trimmed)
}

/// The characters `str.strip()` removes (`str.isspace`: all 29 of them, checked over
/// every code point by tests/unit/test_native_step.py), which `char::is_whitespace`
/// does not quite match (it leaves out U+001C..U+001F).
pub fn is_python_space(c: char) -> bool {
    matches!(
        c,
        '\t' | '\n' | '\x0b' | '\x0c' | '\r' | '\x1c'..='\x1f' | ' ' | '\u{85}' | '\u{a0}'
            | '\u{1680}' | '\u{2000}'..='\u{200a}' | '\u{2028}' | '\u{2029}' | '\u{202f}'
            | '\u{205f}' | '\u{3000}'
    )
}

fn level_of_action(action: &str) -> &'static str {
    match action {
        "allow" => "none",
        "warn" => "warning",
        _ => "critical",
    }
}

pub struct Step<'a, P: Policies> {
    pub settings: &'a Settings,
    pub policies: &'a mut P,
    pub py: Python<'a>,
    pub out: Vec<Output>,
    /// The events a verdict of this step may answer that named a reply (the worker's
    /// routing, processor.py's `_asking`); empty where nobody routes.
    pub asking: Vec<Asking>,
    /// The tools broken fleet-wide (the worker's live `BreakerBoard.broken`), or None
    /// where no fleet breaker is configured.
    pub breakers: Option<&'a Py<PyAny>>,
}

/// An event that named a reply: what a verdict is matched on (processor.py's
/// `reply_route`: the call id and the incarnation) and the reply.
pub struct Asking {
    pub call_id: Option<String>,
    pub incarnation: Option<String>,
    pub reply: (String, i64, String),
}

impl Asking {
    /// processor.py's `_asking`: the waiting events (parked, then pending), then the
    /// event a step applies, each that named a reply.
    pub fn of(state: &State, event: Option<&Event>) -> Vec<Asking> {
        let waiting = state
            .parked
            .iter()
            .map(|(_, e)| e)
            .chain(state.pending.iter());
        waiting
            .chain(event)
            .filter_map(|e| {
                e.reply_to.as_ref().map(|reply| Asking {
                    call_id: e.call_id().map(str::to_owned),
                    incarnation: e.incarnation.clone(),
                    reply: reply.clone(),
                })
            })
            .collect()
    }
}

#[derive(Clone)]
struct Verdict<'e> {
    action: &'static str,
    level: &'static str,
    detector: Option<&'static str>,
    count: i64,
    message: Option<String>,
    token: Option<&'e str>,
    paired: Option<String>,
}

impl<'e> Verdict<'e> {
    fn allow(token: Option<&'e str>) -> Self {
        Verdict {
            action: "allow",
            level: "none",
            detector: None,
            count: 0,
            message: None,
            token,
            paired: None,
        }
    }

    /// A call's detection as a verdict: block for a critical, else warn.
    fn of(found: &Detection, token: &'e str) -> Self {
        let critical = found.level == Level::Critical;
        Verdict {
            action: if critical { "block" } else { "warn" },
            level: found.level.as_str(),
            detector: Some(found.detector.as_str()),
            count: found.count as i64,
            message: Some(found.message.clone()),
            token: Some(token),
            paired: found.paired_tool_name.as_deref().map(str::to_owned),
        }
    }
}

impl<P: Policies> Step<'_, P> {
    // -- ordering and idempotence (Engine._step) ------------------------------------

    pub fn step(
        &mut self,
        state: &mut State,
        event: Event,
        now_ms: i64,
        watermark_ms: Option<i64>,
    ) -> PyResult<()> {
        let Some(seq) = event.seq else {
            let event_hash = hash64(&event.event_id);
            if state.seen_ids.contains(&event_hash) {
                self.redeliver(state, &event, now_ms, true)?;
                return Ok(());
            }
            state.seen_ids.push(event_hash);
            if state.seen_ids.len() > MAX_SEEN_EVENT_IDS {
                state.seen_ids.remove(0);
            }
            return self.apply(state, &event, now_ms);
        };
        let incarnation = incarnation_key(event.incarnation.as_deref());
        if incarnation != state.incarnation {
            if state.next_seq.is_none() && state.parked.is_empty() {
                state.incarnation = incarnation;
            } else {
                self.other_seq_space(state, event, incarnation, now_ms, watermark_ms)?;
                return Ok(());
            }
        }
        let expected = state.next_seq.unwrap_or(0);
        if seq < expected {
            if take_skipped(&mut state.skipped, seq) {
                self.apply(state, &event, now_ms)?;
            } else {
                self.redeliver(state, &event, now_ms, true)?;
            }
        } else if state.parked_index(seq).is_some() {
            // the same early event again: already waiting
        } else if seq > expected {
            state.next_seq = Some(expected);
            touch(state, &event, now_ms);
            state.park(seq, self.at_rest(event)?);
            self.release_gaps(state, now_ms, watermark_ms)?;
        } else {
            self.apply(state, &event, now_ms)?;
            state.next_seq = Some(seq + 1);
            if !state.parked.is_empty() {
                self.drain(state, now_ms)?;
            }
        }
        if !state.pending.is_empty() {
            self.open_pending(state, now_ms, watermark_ms)?;
        }
        Ok(())
    }

    /// Engine.release: what waits and may go now that the input moved on.
    pub fn release(
        &mut self,
        state: &mut State,
        now_ms: i64,
        watermark_ms: Option<i64>,
    ) -> PyResult<()> {
        if !state.pending.is_empty() {
            self.open_pending(state, now_ms, watermark_ms)?;
        }
        if !state.parked.is_empty() {
            self.release_gaps(state, now_ms, watermark_ms)?;
        }
        Ok(())
    }

    fn other_seq_space(
        &mut self,
        state: &mut State,
        event: Event,
        incarnation: u64,
        now_ms: i64,
        watermark_ms: Option<i64>,
    ) -> PyResult<()> {
        let seq = event.seq.expect("a numbered event");
        if let Some(index) = state
            .retired
            .iter()
            .position(|(closed, _)| *closed == incarnation)
        {
            if seq < state.retired[index].1 {
                self.redeliver(state, &event, now_ms, false)?;
            } else {
                state.retired[index].1 = seq + 1;
                self.apply(state, &event, now_ms)?;
            }
            return Ok(());
        }
        if state
            .pending
            .iter()
            .any(|w| w.seq == Some(seq) && incarnation_key(w.incarnation.as_deref()) == incarnation)
        {
            return Ok(()); // the same early event again
        }
        touch(state, &event, now_ms);
        state.pending.push(self.at_rest(event)?);
        self.open_pending(state, now_ms, watermark_ms)
    }

    fn open_pending(
        &mut self,
        state: &mut State,
        now_ms: i64,
        watermark_ms: Option<i64>,
    ) -> PyResult<()> {
        while !state.pending.is_empty() {
            let incarnation = incarnation_key(state.pending[0].incarnation.as_deref());
            let opening: Vec<usize> = (0..state.pending.len())
                .filter(|&i| {
                    incarnation_key(state.pending[i].incarnation.as_deref()) == incarnation
                })
                .collect();
            let started = opening
                .iter()
                .map(|&i| state.pending[i].ts)
                .min()
                .expect("one")
                .min(now_ms);
            let crowded = state.parked.len() + state.pending.len() >= self.settings.max_parked
                || state.waiting_bytes() > self.settings.max_parked_bytes;
            if let Some(watermark) = watermark_ms {
                if watermark.min(now_ms) < started && !crowded {
                    return Ok(());
                }
            }
            while !state.parked.is_empty() {
                self.give_up_gap(state, now_ms)?;
            }
            state
                .retired
                .push((state.incarnation, state.next_seq.unwrap_or(0)));
            if state.retired.len() > MAX_RETIRED_INCARNATIONS {
                let excess = state.retired.len() - MAX_RETIRED_INCARNATIONS;
                state.retired.drain(..excess);
            }
            for decision in &mut state.decisions {
                decision.seq = -1; // seqs of a closed space say nothing about the new one
            }
            state.incarnation = incarnation;
            state.next_seq = Some(0);
            state.skipped.clear();
            state.verdict_floor = 0;
            // `e not in opening` compares by value in Python: equal events leave together
            let pending = std::mem::take(&mut state.pending);
            let (opened, rest): (Vec<Event>, Vec<Event>) = pending
                .into_iter()
                .partition(|e| incarnation_key(e.incarnation.as_deref()) == incarnation);
            state.pending = rest;
            for event in opened {
                if let Some(seq) = event.seq {
                    // a dict assignment: a seq parked twice keeps its first place
                    match state.parked_index(seq) {
                        Some(index) => state.parked[index].1 = event,
                        None => state.park(seq, event),
                    }
                }
            }
            self.drain(state, now_ms)?;
            if !state.parked.is_empty() {
                self.release_gaps(state, now_ms, watermark_ms)?;
            }
        }
        Ok(())
    }

    fn drain(&mut self, state: &mut State, now_ms: i64) -> PyResult<()> {
        while let Some(next) = state.next_seq {
            if state.parked_index(next).is_none() {
                break;
            }
            let event = state.unpark(next);
            self.apply(state, &event, now_ms)?;
            state.next_seq = Some(next + 1);
        }
        Ok(())
    }

    fn release_gaps(
        &mut self,
        state: &mut State,
        now_ms: i64,
        watermark_ms: Option<i64>,
    ) -> PyResult<()> {
        while !state.parked.is_empty()
            && (state.parked.len() >= self.settings.max_parked
                || state.waiting_bytes() > self.settings.max_parked_bytes
                || waited_event_time(state, watermark_ms, now_ms) >= self.settings.gap_timeout_ms)
        {
            self.give_up_gap(state, now_ms)?;
        }
        Ok(())
    }

    fn give_up_gap(&mut self, state: &mut State, now_ms: i64) -> PyResult<()> {
        let first_parked = state.parked.iter().map(|(s, _)| *s).min().expect("parked");
        let expected = state.next_seq.unwrap_or(0);
        let missing = first_parked - expected;
        state.skipped.push((expected, first_parked - 1));
        if state.skipped.len() > MAX_SKIPPED_RANGES {
            let excess = state.skipped.len() - MAX_SKIPPED_RANGES;
            state.skipped.drain(..excess);
        }
        let index = state.parked_index(first_parked).expect("parked");
        let trigger = &state.parked[index].1;
        let policy = self.policies.policy(trigger.agent_id.as_deref())?;
        let message = format!(
            "WARNING: gave up waiting for {missing} missing event(s) of this session (seq \
             {expected}..{}); continuing without them.",
            first_parked - 1
        );
        let judgement = Verdict {
            action: "allow",
            level: "warning",
            detector: Some("sequence_gap"),
            count: missing,
            message: Some(message),
            token: None,
            paired: None,
        };
        let bytes = self.loop_event(
            trigger, &policy, &judgement, None, None, None, now_ms, None, None,
        );
        self.out.push(Output::LoopEvent {
            bytes,
            detector: "sequence_gap",
            strike: None,
        });
        state.next_seq = Some(first_parked);
        self.drain(state, now_ms)
    }

    /// An event as it waits in the state (`Engine._at_rest`): no raw args, and an error's
    /// failure identity instead of its text.
    fn at_rest(&self, mut event: Event) -> PyResult<Event> {
        match &mut event.body {
            Body::Result { error, failure, .. } => {
                if let Some(text) = error.take() {
                    *failure = Some(self.failure_identity(&text)?);
                }
            }
            Body::Call { payload, .. } => *payload = None,
            _ => {}
        }
        Ok(event)
    }

    /// rules.py's `failure_identity(error_text)`: its regular expressions are Python's.
    fn failure_identity(&self, error: &str) -> PyResult<u64> {
        self.settings
            .failure_identity
            .call1(self.py, (error,))?
            .extract(self.py)
    }

    fn redeliver(
        &mut self,
        state: &mut State,
        event: &Event,
        now_ms: i64,
        vouch_allow: bool,
    ) -> PyResult<()> {
        let Body::Call {
            tool_name, token, ..
        } = &event.body
        else {
            return Ok(());
        };
        let event_hash = hash32(&event.event_id);
        if let Some(decision) = state.decisions.iter().find(|d| d.event == event_hash) {
            let action = ACTIONS[usize::from(decision.action)];
            let detector = DETECTORS[usize::from(decision.detector)];
            let level = level_of_action(action);
            let message = match detector {
                None => None,
                Some(name) => Some(redelivered_message(
                    name,
                    level,
                    tool_name,
                    decision.count,
                    decision.detail.as_deref(),
                )?),
            };
            let paired = if detector == Some("ping_pong") {
                decision.detail.clone()
            } else {
                None
            };
            let verdict = Verdict {
                action: static_action(action),
                level,
                detector,
                count: decision.count,
                message,
                token: Some(token),
                paired,
            };
            self.push_verdict(event, &verdict, now_ms)?;
            return Ok(());
        }
        if vouch_allow && event.seq.is_some_and(|seq| seq >= state.verdict_floor) {
            self.push_verdict(event, &Verdict::allow(Some(token)), now_ms)?;
        }
        Ok(())
    }

    // -- applying events (Engine._apply) ----------------------------------------------

    fn apply(&mut self, state: &mut State, event: &Event, now_ms: i64) -> PyResult<()> {
        touch(state, event, now_ms);
        match &event.body {
            Body::Call { .. } => self.on_tool_call(state, event, now_ms),
            Body::Result { .. } => self.on_tool_result(state, event, now_ms),
            Body::Compaction => self.on_compaction(state, event),
            Body::RunEnded => {
                let run = run_key(run_scope(event.run_id.as_deref()));
                state.guards.retain(|(key, _)| *key != run);
                state.warnings.retain(|(_, (owner, _))| *owner != run);
                state.rules.forget_run(run);
                Ok(())
            }
        }
    }

    fn on_tool_call(&mut self, state: &mut State, event: &Event, now_ms: i64) -> PyResult<()> {
        let Body::Call {
            call_id,
            tool_name: tool,
            token,
            action,
            payload,
        } = &event.body
        else {
            unreachable!()
        };
        let policy = self.policies.policy(event.agent_id.as_deref())?;
        let run = run_scope(event.run_id.as_deref());
        let run_hash = run_key(run);
        let sig = signature(tool, token);
        // exempt tools are never judged, others may have their own thresholds
        let mut shown = &policy;
        if let Some(rules) = &policy.rules {
            if rules.exempt.contains(tool.as_str()) {
                self.push_verdict(event, &Verdict::allow(Some(token)), now_ms)?;
                return Ok(());
            }
            if let Some(own) = policy.tools.get(tool.as_str()) {
                shown = own;
            }
        }
        let config = &shown.config;
        let mut detection: Option<Detection> = None;
        let view = config
            .detection_on()
            .then(|| state.history.run_history(run_hash));
        if let Some(view) = &view {
            let recent = state.history.recent_count(sig, view);
            let known_poll = recent > 0 && is_known_poll(tool, action.as_deref());
            detection = detect_in_run(view, tool, sig, token, known_poll, config, run, recent);
        }
        let mut enforce = self.settings.enforce;
        let mut judgement: Option<RulesJudgement> = None;
        if let Some(rules) = &policy.rules {
            // a rule may take over the verdict
            let critical = detection
                .as_ref()
                .is_some_and(|d| d.level == Level::Critical);
            let capped = match (&rules.run_caps, critical) {
                (Some(caps), false) => {
                    match rules::run_cap(caps, state.rules.run(run_hash), &state.rules) {
                        Some(hit) => Some(self.cap_detection(&hit, run)?),
                        None => None,
                    }
                }
                _ => None,
            };
            let judged = rules::judge(
                rules,
                &state.rules,
                view.as_ref(),
                tool,
                sig,
                config.warning_threshold,
                config.critical_threshold,
                run,
                run_hash,
                capped,
                detection,
                enforce,
            );
            detection = judged.detection.clone();
            enforce = judged.enforce;
            judgement = Some(judged);
        }
        drop(view);
        let critical = detection
            .as_ref()
            .is_some_and(|d| d.level == Level::Critical);
        if config.recording_on() && !(critical && enforce) {
            let call_hash = if call_id.is_empty() {
                0
            } else {
                hash32(call_id)
            };
            let record = Record {
                tool: shared_name(tool),
                sig,
                run: run_hash,
                call: call_hash,
                result: 0,
                unknown: None,
                ts: event.ts,
            };
            state.history.append(record, config.history_size);
        }
        // what the detection says (the loop event's), and the verdict: it, when enforced
        let mut judged = detection.as_ref().map(|found| Verdict::of(found, token));
        if let (Some(judged), Some(j)) = (&mut judged, &judgement) {
            if critical && j.ends_run {
                judged.action = "abort"; // a cap's own loop event says abort (its verdict blocks)
            }
        }
        let verdict = match (&detection, enforce) {
            (Some(found), true) => Verdict::of(found, token),
            _ => Verdict::allow(Some(token)),
        };
        self.push_verdict(event, &verdict, now_ms)?;
        if verdict.action != "allow" {
            let found = detection.as_ref().expect("a detection");
            state.decisions.push(Decision {
                event: hash32(&event.event_id),
                action: ACTIONS
                    .iter()
                    .position(|a| *a == verdict.action)
                    .expect("an action") as u8,
                detector: detector_code(found.detector.as_str()),
                count: found.count as i64,
                detail: found.detail.as_deref().map(str::to_owned),
                seq: event.seq.unwrap_or(-1),
            });
            if state.decisions.len() > MAX_DECISIONS {
                let forgotten = state.decisions.remove(0);
                if forgotten.seq >= 0 {
                    state.verdict_floor = state.verdict_floor.max(forgotten.seq + 1);
                }
            }
        }
        if let Some(found) = &detection {
            if critical || warning_rises(state, found, run) {
                let judged = judged.as_ref().expect("the detection's");
                let bytes = self.loop_event(
                    event,
                    shown,
                    judged,
                    Some(found.warning_key.as_str()),
                    Some(call_id),
                    Some(tool),
                    now_ms,
                    Some(enforce),
                    payload.as_deref(),
                );
                self.push_loop_event(event, bytes, judged, Some(tool), now_ms);
            }
        }
        if let (Some(rules), Some(judgement)) = (&policy.rules, &judgement) {
            self.apply_rules(
                state, event, shown, rules, run, run_hash, sig, token, judgement, now_ms,
            )?;
        }
        Ok(())
    }

    /// step.py's `_apply_rules`, after a call's verdict: rules only reported, tallies,
    /// run endings. A run ends with an `abort` verdict beside the call's `block`.
    #[allow(clippy::too_many_arguments)]
    fn apply_rules(
        &mut self,
        state: &mut State,
        event: &Event,
        shown: &Policy,
        rules: &Rules,
        run: Option<&str>,
        run_hash: u64,
        sig: u64,
        token: &str,
        judgement: &RulesJudgement,
        now_ms: i64,
    ) -> PyResult<()> {
        let (call_id, tool) = (event.call_id(), event.tool_name());
        for shadow in &judgement.shadows {
            if shadow.level == Level::Critical || warning_rises(state, shadow, run) {
                let reported = Verdict::of(shadow, token);
                let bytes = self.loop_event(
                    event,
                    shown,
                    &reported,
                    Some(shadow.warning_key.as_str()),
                    call_id,
                    tool,
                    now_ms,
                    Some(false),
                    None,
                );
                self.push_loop_event(event, bytes, &reported, tool, now_ms);
            }
        }
        let Some(ending) = rules::after_call(rules, &mut state.rules, run_hash, sig, judgement)
        else {
            return Ok(());
        };
        let abort = Verdict {
            action: "abort",
            level: "critical",
            detector: Some(ending.detector.as_str()),
            count: ending.count as i64,
            message: Some(ending.message),
            token: Some(token),
            paired: None,
        };
        if ending.enforced {
            self.push_verdict(event, &abort, now_ms)?;
        }
        if ending.detector == Detector::ToolLoopRunEnded {
            let bytes = self.loop_event(
                event,
                shown,
                &abort,
                None,
                call_id,
                tool,
                now_ms,
                Some(ending.enforced),
                None,
            );
            self.push_loop_event(event, bytes, &abort, tool, now_ms);
        }
        Ok(())
    }

    /// A cap's detection, its count and message as rules.py's `_cap_detection` makes them.
    fn cap_detection(&self, hit: &rules::CapHit, run: Option<&str>) -> PyResult<Detection> {
        let py = self.py;
        let amount = |amount: Amount| -> PyResult<Py<PyAny>> {
            Ok(match amount {
                Amount::Int(value) => value.into_pyobject(py)?.into_any().unbind(),
                Amount::Float(value) => value.into_pyobject(py)?.into_any().unbind(),
            })
        };
        let args = (
            hit.level.as_str(),
            hit.detector.as_str(),
            hit.scope,
            amount(hit.used)?,
            amount(hit.cap)?,
            run,
        );
        let (count, message, key): (usize, String, String) =
            self.settings.cap_detection.call1(py, args)?.extract(py)?;
        Ok(rules::cap_detection(hit, count, message, key))
    }

    fn on_tool_result(&mut self, state: &mut State, event: &Event, now_ms: i64) -> PyResult<()> {
        let Body::Result {
            call_id,
            tool_name: tool,
            token,
            outcome,
            unknown,
            usage,
            error,
            failure,
        } = &event.body
        else {
            unreachable!()
        };
        let policy = self.policies.policy(event.agent_id.as_deref())?;
        let run = run_scope(event.run_id.as_deref());
        let run_hash = run_key(run);
        if let Some(rules) = &policy.rules {
            // rules.py's on_result: spend and failure identity; an exempt
            // tool is never counted
            if let (Some(_), Some(usage)) = (&rules.run_caps, usage) {
                let tokens = match usage.total_tokens {
                    Some(total) => total as u128,
                    None => {
                        usage.input_tokens.unwrap_or(0) as u128
                            + usage.output_tokens.unwrap_or(0) as u128
                    }
                };
                // `usage.cost or 0.0`: a cost of -0.0 counts as 0.0
                let cost = usage.cost.filter(|c| *c != 0.0).unwrap_or(0.0);
                rules::spend(&mut state.rules, run_hash, tokens, cost);
            }
            if rules.exempt.contains(tool.as_str()) {
                return Ok(());
            }
            if rules.repeated_failure.is_some() {
                let key = (run_hash, hash64(tool));
                // rules.py's `failure_of`: from the error's text, from what was kept of it
                // at rest, or from a gateway's hashed error token
                let failure = match (error, failure, outcome) {
                    (Some(error), _, _) => Some(self.failure_identity(error)?),
                    (None, Some(identity), _) => Some(*identity),
                    (None, None, Some(token)) if token.starts_with(ERROR_PREFIX) => {
                        Some(hash64(token))
                    }
                    _ => None,
                };
                match failure {
                    Some(identity) => state.rules.note_failure(key, identity),
                    None if outcome.is_some() => state.rules.end_streak(key), // a success ends the streak
                    None => {}
                }
            }
        }
        if !policy.config.recording_on() {
            return Ok(());
        }
        let Some(outcome) = outcome else {
            return Ok(());
        };
        let result = result_fingerprint(outcome);
        let call_hash = if call_id.is_empty() {
            0
        } else {
            hash32(call_id)
        };
        let mut sig = token.as_deref().map_or(0, |token| signature(tool, token));
        let unknown: Option<Arc<str>> = unknown.as_deref().map(Arc::from);
        let records = state.history.records();
        let found = records.iter().enumerate().rev().find(|(_, rec)| {
            rec.run == run_hash
                && rec.result == 0
                && &*rec.tool == tool.as_str()
                && (call_hash == 0 || rec.call == call_hash)
                && (sig == 0 || rec.sig == sig)
        });
        match found {
            Some((index, rec)) => {
                let record = Record {
                    tool: rec.tool.clone(),
                    sig: rec.sig,
                    run: run_hash,
                    call: 0,
                    result,
                    unknown,
                    ts: rec.ts,
                };
                sig = rec.sig;
                state.history.replace(index, record);
            }
            None => {
                if sig == 0 {
                    let shown = PyString::new(self.py, call_id).repr()?.to_str()?.to_owned();
                    self.out.push(Output::Rejection {
                        code: "orphan_result",
                        reason: format!(
                            "tool_result for call {shown} carries no args and no pending call with that id is in the session history"
                        ),
                        event_id: event.event_id.clone(),
                    });
                    return Ok(());
                }
                let record = Record {
                    tool: shared_name(tool),
                    sig,
                    run: run_hash,
                    call: 0,
                    result,
                    unknown,
                    ts: event.ts,
                };
                state.history.append(record, policy.config.history_size);
            }
        }
        let Some(index) = state.guards.iter().position(|(key, _)| *key == run_hash) else {
            return Ok(());
        };
        let guard = &mut state.guards[index].1;
        guard.remaining -= 1;
        match &guard.first {
            None => guard.first = Some((shared_name(tool), sig, result)),
            Some((first_tool, first_sig, first_result)) => {
                if !(&**first_tool == tool.as_str() && *first_sig == sig && *first_result == result)
                {
                    guard.broken = true;
                }
            }
        }
        let repeats = guard.window - guard.remaining;
        if !guard.broken && repeats >= guard.window {
            let window = guard.window;
            state.guards.remove(index);
            let message = guard_message(tool, repeats, window);
            let judgement = Verdict {
                action: "abort",
                level: "critical",
                detector: Some("compaction_loop_persisted"),
                count: repeats,
                message: Some(message),
                token: token.as_deref(),
                paired: None,
            };
            if self.settings.enforce {
                self.push_verdict(event, &judgement, now_ms)?;
            }
            let bytes = self.loop_event(
                event,
                &policy,
                &judgement,
                None,
                Some(call_id),
                Some(tool),
                now_ms,
                None,
                None,
            );
            self.push_loop_event(event, bytes, &judgement, Some(tool), now_ms);
        } else if guard.remaining <= 0 {
            state.guards.remove(index);
        }
        Ok(())
    }

    fn on_compaction(&mut self, state: &mut State, event: &Event) -> PyResult<()> {
        let policy = self.policies.policy(event.agent_id.as_deref())?;
        if !policy.config.recording_on() {
            return Ok(());
        }
        let run = run_scope(event.run_id.as_deref());
        let guard_key = run_key(run);
        let window = policy.config.guard_window_size;
        state.guards.retain(|(key, _)| *key != guard_key);
        state.guards.push((
            guard_key,
            Guard {
                window,
                remaining: window,
                first: None,
                broken: false,
            },
        ));
        if state.guards.len() > MAX_GUARDS {
            state.guards.remove(0);
        }
        self.out.push(Output::Notice {
            level: "info",
            message: format!("post-compaction guard armed for {window} attempts"),
            session_key: event.key().to_owned(),
            run_id: run.map(str::to_owned),
        });
        Ok(())
    }

    // -- outputs -----------------------------------------------------------------------

    fn push_verdict(&mut self, event: &Event, verdict: &Verdict<'_>, now_ms: i64) -> PyResult<()> {
        let raised = self.fleet_overlay(event, verdict)?;
        let verdict = raised.as_ref().unwrap_or(verdict);
        let bytes = self.verdict(event, verdict, now_ms);
        let route = if self.asking.is_empty() {
            None
        } else {
            // processor.py's reply_route: the first asking event with the verdict's call
            // id and incarnation (a verdict carries its event's)
            let (call_id, incarnation) = (event.call_id(), event.incarnation.as_deref());
            self.asking.iter().position(|a| {
                a.call_id.as_deref() == call_id && a.incarnation.as_deref() == incarnation
            })
        };
        self.out.push(Output::Verdict {
            bytes,
            action: verdict.action,
            detector: verdict.detector,
            route,
        });
        Ok(())
    }

    /// fleet.py's `overlay` of one verdict: a call's `allow` or `warn` raised to the
    /// breaker's action while its tool is broken fleet-wide, where the agent's rules put
    /// an enforced `fleetBreaker` in force and do not exempt the tool. The state is not
    /// touched (a redelivered call is overlaid again with what is known then).
    fn fleet_overlay<'e>(
        &mut self,
        event: &Event,
        verdict: &Verdict<'e>,
    ) -> PyResult<Option<Verdict<'e>>> {
        let (Some(breakers), Some(tool)) = (self.breakers, event.tool_name()) else {
            return Ok(None);
        };
        let policy = self.policies.policy(event.agent_id.as_deref())?;
        let Some(rules) = &policy.rules else {
            return Ok(None);
        };
        let Some((true, action)) = rules.fleet_breaker else {
            return Ok(None);
        };
        if rules.exempt.contains(tool) || rank(action) <= rank(verdict.action) {
            return Ok(None);
        }
        let breaker = breakers.bind(self.py).call_method1("get", (tool,))?;
        if breaker.is_none() || event.ts >= breaker.getattr("until_ts")?.extract::<i64>()? {
            return Ok(None);
        }
        let sessions: i64 = breaker.getattr("sessions")?.extract()?;
        let window: i64 = breaker.getattr("window_seconds")?.extract()?;
        let name: String = breaker.getattr("tool_name")?.extract()?;
        Ok(Some(Verdict {
            action,
            level: level_of_action(action),
            detector: Some("fleet_tool_breaker"),
            count: sessions,
            message: Some(breaker_message(action, &name, sessions, window)),
            token: verdict.token,
            paired: None,
        }))
    }

    fn push_loop_event(
        &mut self,
        event: &Event,
        bytes: Vec<u8>,
        judgement: &Verdict<'_>,
        tool: Option<&str>,
        now_ms: i64,
    ) {
        let detector = judgement.detector.expect("a loop event's detector");
        // fleet.py's `strikes`: a critical, an unknown-tool streak or a failure identity
        let striking = judgement.level == "critical"
            || matches!(detector, "unknown_tool_repeat" | "repeated_failure");
        let strike = match tool {
            Some(tool) if striking && detector != "fleet_tool_breaker" => {
                // a gateway clock running ahead counts as now (processor.py's tool_strikes)
                Some((tool.to_owned(), hash64(event.key()), event.ts.min(now_ms)))
            }
            _ => None,
        };
        self.out.push(Output::LoopEvent {
            bytes,
            detector,
            strike,
        });
    }

    fn verdict(&self, event: &Event, verdict: &Verdict<'_>, now_ms: i64) -> Vec<u8> {
        // verdict_id: f"{session}\x1f{run or ''}\x1f{call_id or ''}\x1f{action}[\x1f{incarnation}]"
        let mut text = Vec::with_capacity(160);
        text.extend_from_slice(event.key().as_bytes());
        text.push(0x1f);
        text.extend_from_slice(event.run_id.as_deref().unwrap_or("").as_bytes());
        text.push(0x1f);
        text.extend_from_slice(event.call_id().unwrap_or("").as_bytes());
        text.push(0x1f);
        text.extend_from_slice(verdict.action.as_bytes());
        if let Some(incarnation) = &event.incarnation {
            text.push(0x1f);
            text.extend_from_slice(incarnation.as_bytes());
        }
        let digits = digest(&text);
        let id = std::str::from_utf8(&digits).expect("hex digits");
        let judgement = Judgement {
            id,
            session_key: event.key(),
            run_id: event.run_id.as_deref(),
            agent_id: event.agent_id.as_deref(),
            call_id: event.call_id(),
            seq: event.seq,
            incarnation: event.incarnation.as_deref(),
            tool_name: event.tool_name(),
            action: verdict.action,
            level: verdict.level,
            detector: verdict.detector,
            count: verdict.count,
            message: verdict.message.as_deref(),
            args_hash: verdict.token,
            paired_tool_name: verdict.paired.as_deref(),
            event_ts: event.ts,
            decided_ts: now_ms,
        };
        let mut out = Vec::with_capacity(512);
        write_verdict(&mut out, &judgement);
        out
    }

    #[allow(clippy::too_many_arguments)]
    fn loop_event(
        &self,
        event: &Event,
        policy: &Policy,
        verdict: &Verdict<'_>,
        warning_key: Option<&str>,
        call_id: Option<&str>,
        tool_name: Option<&str>,
        now_ms: i64,
        enforced: Option<bool>,
        args: Option<&[u8]>,
    ) -> Vec<u8> {
        let detector = verdict.detector.expect("a loop event's detector");
        let text = format!(
            "{}\x1f{}\x1f{}\x1f{}",
            event.key(),
            event.event_id,
            detector,
            verdict.count
        );
        let digits = digest(text.as_bytes());
        let id = std::str::from_utf8(&digits).expect("hex digits");
        let judgement = Judgement {
            id,
            session_key: event.key(),
            run_id: event.run_id.as_deref(),
            agent_id: event.agent_id.as_deref(),
            call_id,
            seq: event.seq,
            incarnation: event.incarnation.as_deref(),
            tool_name,
            action: verdict.action,
            level: verdict.level,
            detector: Some(detector),
            count: verdict.count,
            message: verdict.message.as_deref(),
            args_hash: verdict.token,
            paired_tool_name: verdict.paired.as_deref(),
            event_ts: event.ts,
            decided_ts: now_ms,
        };
        let extras = LoopEventExtras {
            warning_key,
            config: &policy.shown,
            enforced: enforced.unwrap_or(self.settings.enforce),
            args,
        };
        let mut out = Vec::with_capacity(768);
        write_loop_event(&mut out, &judgement, &extras);
        out
    }
}

/// fleet.py's `_RANK`.
fn rank(action: &str) -> u8 {
    match action {
        "allow" => 0,
        "warn" => 1,
        "block" => 2,
        _ => 3,
    }
}

/// fleet.py's `breaker_message`: what a call to a broken tool is told.
fn breaker_message(action: &str, tool: &str, sessions: i64, window_seconds: i64) -> String {
    let seen = format!("{sessions} sessions hit a loop on {tool} within {window_seconds} s");
    if action == "block" {
        format!(
            "CRITICAL: {tool} is failing across the fleet ({seen}). Calls to it are blocked fleet-wide until the \
             failures stop: do not retry it; change approach or report the task as failed."
        )
    } else {
        format!("WARNING: {tool} is failing across the fleet ({seen}). Avoid retrying it; change approach or report the task as failed.")
    }
}

fn static_action(action: &str) -> &'static str {
    ACTIONS
        .iter()
        .find(|a| **a == action)
        .copied()
        .expect("an action")
}

/// detectors.py's `message_for` for a remembered decision (a redelivered call).
fn redelivered_message(
    detector: &str,
    level: &str,
    tool: &str,
    count: i64,
    detail: Option<&str>,
) -> PyResult<String> {
    let table = match detector {
        "unknown_tool_repeat" => Some(Detector::UnknownToolRepeat),
        "global_circuit_breaker" => Some(Detector::GlobalCircuitBreaker),
        "known_poll_no_progress" => Some(Detector::KnownPollNoProgress),
        "ping_pong" => Some(Detector::PingPong),
        "generic_repeat" => Some(Detector::GenericRepeat),
        _ => None,
    };
    match table {
        Some(detector) => {
            let level = if level == "critical" {
                Level::Critical
            } else {
                Level::Warning
            };
            Ok(message_for(
                detector,
                level,
                tool,
                count.max(0) as usize,
                detail,
            ))
        }
        // a rule's decision keeps its whole message as the detail
        None => match detail {
            Some(detail) => Ok(detail.to_owned()),
            None => Err(pyo3::exceptions::PyValueError::new_err(format!(
                "no message for detector '{detector}'"
            ))),
        },
    }
}

/// state.py's `incarnation_key`.
pub fn incarnation_key(incarnation: Option<&str>) -> u64 {
    incarnation.map_or(0, |text| hash64(text) | 1)
}

/// step.py's `_touch`.
fn touch(state: &mut State, event: &Event, now_ms: i64) {
    state.touched_ms = now_ms;
    let event_ms = event.ts.min(now_ms);
    if event_ms > state.last_event_ms {
        state.last_event_ms = event_ms;
    }
}

/// step.py's `_waited_event_time`.
fn waited_event_time(state: &State, watermark_ms: Option<i64>, now_ms: i64) -> i64 {
    let (first, last) = state.parked_times();
    let mut reached = last.min(now_ms);
    if let Some(watermark) = watermark_ms {
        if watermark < reached {
            reached = watermark;
        }
    }
    reached - first.min(now_ms)
}

/// step.py's `_take_skipped`.
fn take_skipped(skipped: &mut Vec<(i64, i64)>, seq: i64) -> bool {
    let Some(index) = skipped
        .iter()
        .position(|(first, last)| *first <= seq && seq <= *last)
    else {
        return false;
    };
    let (first, last) = skipped[index];
    let mut pieces = Vec::with_capacity(2);
    if seq > first {
        pieces.push((first, seq - 1));
    }
    if seq < last {
        pieces.push((seq + 1, last));
    }
    skipped.splice(index..=index, pieces);
    if skipped.len() > MAX_SKIPPED_RANGES {
        let excess = skipped.len() - MAX_SKIPPED_RANGES;
        skipped.drain(..excess);
    }
    true
}

/// step.py's `_warning_rises`: a warning once per bucket of 10 per warning key.
fn warning_rises(state: &mut State, detection: &Detection, run: Option<&str>) -> bool {
    let key = hash64(&detection.warning_key);
    let bucket = detection.count as i64 / WARNING_BUCKET_SIZE;
    let index = state.warnings.iter().position(|(k, _)| *k == key);
    let last = index.map_or(0, |i| state.warnings[i].1 .1);
    if bucket <= last {
        return false;
    }
    let value = (run_key(run), bucket);
    match index {
        Some(i) => state.warnings[i].1 = value, // an existing key keeps its age (JS Map)
        None => {
            state.warnings.push((key, value));
            if state.warnings.len() > MAX_WARNING_KEYS {
                state.warnings.remove(0);
            }
        }
    }
    true
}
