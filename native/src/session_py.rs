//! The native fold's Python face: `Judge` (an engine's settings and its policies) and
//! `NativeState` (a session's state, held in Rust). `streams/engine/native_step.py`
//! wraps them behind the Python engine's API.
//!
//! An event reaches a step from its wire bytes (`Judge.step_raw`: the decoder's accept
//! pass, tokens and all, without a Python object), or, where that pass leaves the event
//! to the Python decoder, as the fields and tokens Python computed (`Judge.step_event`).
//! `step_raw` says None, before touching the state, for every event it leaves to
//! Python: then the caller decodes it and takes the other door.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple};

use crate::decode::{read_event, tokens, Kind, Usage, WireEvent, DEPTH_BOUNDS};
use crate::engine::config::ResolvedConfig;
use crate::engine::history::{shared_name, History, Record};
use crate::engine::rules::{
    Cap, IdenticalCalls, RepeatedFailure, RuleState, Rules, RunCaps, RunEnding,
};
use crate::engine::volatile::{TokenClass, VolatileResults};
use crate::json::parse_object;
use crate::output::write_payload;
use crate::session::{
    Asking, Body, Decision, Event, Guard, Output, Policies, Policy, Settings, State, Step,
};

/// Agent id -> policy, from the Python resolver; cleared when full (ids come from the
/// wire), as the Python engine's cache is.
struct PolicyCache {
    resolve: Py<PyAny>,
    enforce: bool,
    cache: HashMap<Option<String>, Arc<Policy>>,
    /// The agent of the last lookup and its policy.
    last: Option<(Option<String>, Arc<Policy>)>,
}

const CACHE_BOUND: usize = 10_000;

/// The cache while a step runs (it holds the GIL the resolver needs).
struct Resolver<'a, 'py> {
    resolve: &'a Py<PyAny>,
    enforce: bool,
    cache: &'a mut HashMap<Option<String>, Arc<Policy>>,
    last: &'a mut Option<(Option<String>, Arc<Policy>)>,
    py: Python<'py>,
}

impl Policies for Resolver<'_, '_> {
    fn policy(&mut self, agent_id: Option<&str>) -> PyResult<Arc<Policy>> {
        if let Some((last, policy)) = self.last.as_ref() {
            if last.as_deref() == agent_id {
                return Ok(policy.clone()); // a session's events are one agent's: no lookup
            }
        }
        let key = agent_id.map(str::to_owned);
        if let Some(policy) = self.cache.get(&key) {
            *self.last = Some((key, policy.clone()));
            return Ok(policy.clone());
        }
        // (config fields, the rules or None): native_step.py's _policy_values
        let (fields, rules): (ConfigFields, Option<RulesTuple>) =
            self.resolve.call1(self.py, (agent_id,))?.extract(self.py)?;
        let mut policy = Policy::new(config_of(fields), self.enforce);
        if let Some((
            ending,
            cycle,
            failure,
            churn,
            caps,
            fleet,
            exempt,
            tools,
            identical,
            volatile,
        )) = rules
        {
            for (tool, own) in tools {
                policy
                    .tools
                    .insert(tool, Arc::new(Policy::new(config_of(own), self.enforce)));
            }
            policy.rules = Some(Rules {
                run_ending: ending.map(|(enforced, criticals_per_run, blocked_streak)| RunEnding {
                    enforced,
                    criticals_per_run,
                    blocked_streak,
                }),
                cycle,
                repeated_failure: failure.map(
                    |(enforced, warning_threshold, critical_threshold)| RepeatedFailure {
                        enforced,
                        warning_threshold,
                        critical_threshold,
                    },
                ),
                argument_churn: churn,
                run_caps: caps.map(
                    |(enforced, calls, run_tokens, session_tokens, run_cost, session_cost)| {
                        let cap = |c: Option<(u128, f64)>| {
                            c.map(|(limit, warn_from)| Cap { limit, warn_from })
                        };
                        let cost = |c: Option<(f64, f64)>| {
                            c.map(|(limit, warn_from)| Cap { limit, warn_from })
                        };
                        RunCaps {
                            enforced,
                            max_tool_calls: cap(calls),
                            tokens_per_run: cap(run_tokens),
                            tokens_per_session: cap(session_tokens),
                            cost_per_run: cost(run_cost),
                            cost_per_session: cost(session_cost),
                        }
                    },
                ),
                fleet_breaker: fleet.map(|(enforced, action)| {
                    (enforced, if action == "block" { "block" } else { "warn" })
                }),
                exempt: exempt.into_iter().collect(),
                identical_calls: identical.map(
                    |(enforced, warning_threshold, critical_threshold)| IdenticalCalls {
                        enforced,
                        warning_threshold,
                        critical_threshold,
                    },
                ),
                volatile_results: volatile.map(|(tools, patterns)| {
                    Arc::new(VolatileResults {
                        tools: tools.map(|names| names.into_iter().collect()),
                        patterns: patterns
                            .into_iter()
                            .filter_map(|(prefix, name)| Some((prefix, TokenClass::named(&name)?)))
                            .collect(),
                    })
                }),
            });
        }
        let policy = Arc::new(policy);
        if self.cache.len() >= CACHE_BOUND {
            self.cache.clear();
        }
        self.cache.insert(key.clone(), policy.clone());
        *self.last = Some((key, policy.clone()));
        Ok(policy)
    }
}

/// config.py's ResolvedConfig fields, in order.
type ConfigFields = (
    Option<bool>,
    usize,
    i64,
    i64,
    i64,
    i64,
    bool,
    bool,
    bool,
    i64,
);
/// An int cap and the amount that warns, a cost cap and its.
type IntCap = Option<(u128, f64)>;
type CostCap = Option<(f64, f64)>;
/// rule_config.py's ResolvedRules as native_step.py's `_rules_values` gives them: run
/// ending, cycle, repeated failure, argument churn, run caps, the fleet breaker
/// (enforced, action), exempt tools and the configs of the tools with their own
/// thresholds, identical calls, and the volatile results' (tools in scope or None,
/// (prefix, token class) patterns).
type RulesTuple = (
    Option<(bool, u64, u64)>,
    Option<(bool, usize)>,
    Option<(bool, u64, u64)>,
    Option<bool>,
    Option<(bool, IntCap, IntCap, IntCap, CostCap, CostCap)>,
    Option<(bool, String)>,
    Vec<String>,
    Vec<(String, ConfigFields)>,
    Option<(bool, u64, u64)>,
    Option<VolatileTuple>,
);
type VolatileTuple = (Option<Vec<String>>, Vec<(String, String)>);

fn config_of(fields: ConfigFields) -> ResolvedConfig {
    ResolvedConfig {
        enabled: fields.0,
        history_size: fields.1,
        warning_threshold: fields.2,
        critical_threshold: fields.3,
        unknown_tool_threshold: fields.4,
        global_circuit_breaker_threshold: fields.5,
        generic_repeat: fields.6,
        known_poll_no_progress: fields.7,
        ping_pong: fields.8,
        guard_window_size: fields.9,
    }
}

#[pyclass(module = "loopfuse.streams.engine._native")]
pub struct Judge {
    settings: Settings,
    policies: PolicyCache,
    /// fingerprint.py's `unknown_tool_name` (its regular expressions are Python's).
    unknown_tool_name: Py<PyAny>,
    /// The tools broken fleet-wide, a live mapping (`set_breakers`), or None.
    breakers: Option<Py<PyAny>>,
    /// The configured provider send tools (`loopfuse.providerSendTools`).
    send_tools: HashSet<String>,
    /// `loopfuse.includePayloadsInLoopEvents`.
    include_payloads: bool,
}

/// step.py's MAX_LOOP_EVENT_ARGS_BYTES: larger args are published as null.
const MAX_LOOP_EVENT_ARGS_BYTES: usize = 65_536;

/// Bytes to and from Python as `bytes` (a `Vec<u8>` would go as a list of ints).
struct Payload(Vec<u8>);

impl<'py> IntoPyObject<'py> for Payload {
    type Target = PyBytes;
    type Output = Bound<'py, PyBytes>;
    type Error = std::convert::Infallible;

    fn into_pyobject(self, py: Python<'py>) -> Result<Self::Output, Self::Error> {
        Ok(PyBytes::new(py, &self.0))
    }
}

impl<'py> FromPyObject<'py> for Payload {
    fn extract_bound(value: &Bound<'py, PyAny>) -> PyResult<Self> {
        Ok(Payload(value.downcast::<PyBytes>()?.as_bytes().to_vec()))
    }
}

#[pyclass(module = "loopfuse.streams.engine._native")]
#[derive(Default)]
pub struct NativeState {
    pub state: State,
    /// Steps since replay last checkpointed it (not the state's: replay's bookkeeping).
    since_checkpoint: usize,
}

/// How a step's verdicts and loop events reach Python.
#[derive(Clone, Copy, PartialEq)]
enum Shape {
    /// ("verdict" | "loop_event", bytes), like the other outputs' tagged tuples
    Tagged,
    /// their bytes alone (replay writes them as they are)
    Bare,
    /// the worker's: ("verdict", bytes, action, detector, reply or None) and
    /// ("loop_event", bytes, detector, strike or None); a reply is (topic, partition,
    /// requester), a strike (tool, session hash as hex, ts)
    Routed,
}

fn outputs_to_python<'py>(py: Python<'py>, outputs: Vec<Output>) -> PyResult<Bound<'py, PyList>> {
    outputs_as(py, outputs, Shape::Tagged, &[])
}

fn outputs_as<'py>(
    py: Python<'py>,
    outputs: Vec<Output>,
    shape: Shape,
    asking: &[Asking],
) -> PyResult<Bound<'py, PyList>> {
    let list = PyList::empty(py);
    for output in outputs {
        let item = match output {
            Output::Verdict { bytes, .. } | Output::LoopEvent { bytes, .. }
                if shape == Shape::Bare =>
            {
                PyBytes::new(py, &bytes).into_any()
            }
            Output::Verdict {
                bytes,
                action,
                detector,
                route,
            } if shape == Shape::Routed => {
                let reply = route.map(|index| &asking[index].reply);
                ("verdict", PyBytes::new(py, &bytes), action, detector, reply)
                    .into_pyobject(py)?
                    .into_any()
            }
            Output::LoopEvent {
                bytes,
                detector,
                strike,
            } if shape == Shape::Routed => {
                let strike =
                    strike.map(|(tool, session, ts)| (tool, format!("{session:016x}"), ts));
                ("loop_event", PyBytes::new(py, &bytes), detector, strike)
                    .into_pyobject(py)?
                    .into_any()
            }
            Output::Verdict { bytes, .. } => ("verdict", PyBytes::new(py, &bytes))
                .into_pyobject(py)?
                .into_any(),
            Output::LoopEvent { bytes, .. } => ("loop_event", PyBytes::new(py, &bytes))
                .into_pyobject(py)?
                .into_any(),
            Output::Notice {
                level,
                message,
                session_key,
                run_id,
            } => ("notice", level, message, session_key, run_id)
                .into_pyobject(py)?
                .into_any(),
            Output::Rejection {
                code,
                reason,
                event_id,
            } => ("rejection", code, reason, event_id)
                .into_pyobject(py)?
                .into_any(),
        };
        list.append(item)?;
    }
    Ok(list)
}

/// What `Judge.read` gives: the event, its session key, type, seq and ts.
type Read<'py> = (
    ReadEvent,
    Bound<'py, PyString>,
    &'static str,
    Option<i64>,
    i64,
);

/// An event the native decoder read (`Judge.read`), waiting for its step
/// (`Judge.step_read`), which takes it.
#[pyclass(module = "loopfuse.streams.engine._native")]
pub struct ReadEvent {
    event: Option<Event>,
}

/// `str.lower` of a name: ASCII here, anything else as Python lowers it.
fn lower(py: Python<'_>, text: &str) -> PyResult<String> {
    if text.is_ascii() {
        return Ok(text.to_ascii_lowercase());
    }
    PyString::new(py, text).call_method0("lower")?.extract()
}

impl Judge {
    /// An event from its wire bytes, or None where the Python decoder must decide (as
    /// `decode.event_fingerprints` says None): the read every native step starts with.
    fn wire_event(
        &mut self,
        py: Python<'_>,
        raw: &[u8],
        max_bytes: usize,
        max_depth: usize,
        max_identifier_bytes: usize,
    ) -> PyResult<Option<Event>> {
        if raw.is_empty() || raw.len() > max_bytes || !DEPTH_BOUNDS.contains(&max_depth) {
            return Ok(None);
        }
        let Some(entries) = parse_object(raw, max_depth) else {
            return Ok(None);
        };
        let Some(wire) = read_event(&entries, max_depth, max_identifier_bytes) else {
            return Ok(None);
        };
        self.event_of(py, &wire)
    }

    /// The event a step applies, from what the decoder's pass read of it.
    fn event_of(&mut self, py: Python<'_>, wire: &WireEvent<'_, '_>) -> PyResult<Option<Event>> {
        let volatile = match (wire.kind, wire.result_hash) {
            (Kind::ToolResult, None) => {
                self.volatile_for(py, wire.agent_id, wire.tool_name.unwrap_or(""))?
            }
            _ => None,
        };
        let (args_token, result_token, result_known) =
            tokens(wire, &self.send_tools, volatile.as_deref());
        let owned = |text: Option<&str>| text.map(str::to_owned);
        let body = match wire.kind {
            Kind::ToolCall => {
                let token = match (wire.args_hash, args_token) {
                    (Some(hash), _) => hash.to_owned(),
                    (None, Some(token)) => token,
                    (None, None) => return Ok(None), // args only Python writes canonically
                };
                // step.py's `_payload`: the raw args for the call's loop event, when
                // configured and within their bound
                let payload = match (self.include_payloads, wire.args) {
                    (true, Some(args)) => {
                        let mut out = Vec::new();
                        if !write_payload(&mut out, args) {
                            return Ok(None); // a float: orjson writes these args (output.rs)
                        }
                        (out.len() <= MAX_LOOP_EVENT_ARGS_BYTES).then_some(out)
                    }
                    _ => None,
                };
                Body::Call {
                    call_id: wire.call_id.unwrap_or("").to_owned(),
                    tool_name: wire.tool_name.unwrap_or("").to_owned(),
                    token,
                    action: action_of(wire),
                    payload,
                }
            }
            Kind::ToolResult => {
                let token = match (wire.args_hash, wire.args, args_token) {
                    (Some(hash), _, _) => Some(hash.to_owned()),
                    (None, Some(_), Some(token)) => Some(token),
                    (None, Some(_), None) => return Ok(None),
                    (None, None, _) => None,
                };
                let outcome = match wire.result_hash {
                    Some(hash) => Some(hash.to_owned()),
                    None if result_known => result_token,
                    None => return Ok(None), // an outcome only Python normalises
                };
                let mut unknown = match wire.unknown_tool {
                    Some(name) if !name.is_empty() => Some(lower(py, name)?),
                    _ => None,
                };
                if let (None, Some(error)) = (&unknown, wire.error_text) {
                    unknown = self.unknown_tool_name.call1(py, (error,))?.extract(py)?;
                }
                Body::Result {
                    call_id: wire.call_id.unwrap_or("").to_owned(),
                    tool_name: wire.tool_name.unwrap_or("").to_owned(),
                    token,
                    outcome,
                    unknown,
                    usage: wire.usage,
                    error: owned(wire.error_text),
                    failure: None,
                }
            }
            Kind::Compaction => Body::Compaction,
            Kind::RunEnded => Body::RunEnded,
        };
        Ok(Some(Event {
            event_id: wire.event_id.to_owned(),
            session_key: owned(wire.session_key),
            run_id: owned(wire.run_id),
            agent_id: owned(wire.agent_id),
            incarnation: owned(wire.incarnation),
            seq: wire.seq,
            ts: wire.ts,
            reply_to: wire
                .reply_to
                .map(|(t, p, r)| (t.to_owned(), p, r.to_owned())),
            body,
        }))
    }

    /// step.py's `_result_token`: the volatileResults rule of the agent, when it masks
    /// this tool's results.
    fn volatile_for(
        &mut self,
        py: Python<'_>,
        agent_id: Option<&str>,
        tool: &str,
    ) -> PyResult<Option<Arc<VolatileResults>>> {
        let policies = &mut self.policies;
        let mut resolver = Resolver {
            resolve: &policies.resolve,
            enforce: policies.enforce,
            cache: &mut policies.cache,
            last: &mut policies.last,
            py,
        };
        let policy = resolver.policy(agent_id)?;
        Ok(policy
            .rules
            .as_ref()
            .and_then(|rules| rules.volatile_results.clone())
            .filter(|rule| rule.applies(tool)))
    }

    /// One of replay's lines (`replay_step`): (its session key, outputs, whether its
    /// state needs Python's checkpoint now), or None for a line left to Python.
    fn replay_one<'py>(
        &mut self,
        py: Python<'py>,
        states: &Bound<'py, PyDict>,
        raw: &[u8],
        limits: &ReplayLimits,
    ) -> PyResult<Option<Replayed<'py>>> {
        let Some(event) = self.wire_event(
            py,
            raw,
            limits.max_bytes,
            limits.max_depth,
            limits.max_identifier_bytes,
        )?
        else {
            return Ok(None);
        };
        let key = PyString::new(py, event.key());
        let state: Bound<'py, NativeState> = match states.get_item(&key)? {
            Some(state) => state.downcast_into::<NativeState>()?,
            None => {
                let state = Bound::new(py, NativeState::default())?;
                states.set_item(&key, &state)?;
                state
            }
        };
        let ts = event.ts;
        let mut held = state.borrow_mut();
        let outputs = self.run(py, &mut held.state, Some(event), ts, None)?;
        let due = held.counted(limits.checkpoint_every, limits.max_state_bytes);
        Ok(Some((key, outputs, due)))
    }

    fn run(
        &mut self,
        py: Python<'_>,
        state: &mut State,
        event: Option<Event>,
        now_ms: i64,
        watermark_ms: Option<i64>,
    ) -> PyResult<Vec<Output>> {
        Ok(self
            .run_routed(py, state, event, now_ms, watermark_ms, false)?
            .0)
    }

    /// A step; `routed`: with the events its verdicts may answer (`Asking::of`).
    fn run_routed(
        &mut self,
        py: Python<'_>,
        state: &mut State,
        event: Option<Event>,
        now_ms: i64,
        watermark_ms: Option<i64>,
        routed: bool,
    ) -> PyResult<(Vec<Output>, Vec<Asking>)> {
        let asking = if routed {
            Asking::of(state, event.as_ref())
        } else {
            Vec::new()
        };
        let Judge {
            settings,
            policies,
            breakers,
            ..
        } = self;
        let mut resolver = Resolver {
            resolve: &policies.resolve,
            enforce: policies.enforce,
            cache: &mut policies.cache,
            last: &mut policies.last,
            py,
        };
        let mut step = Step {
            settings,
            policies: &mut resolver,
            py,
            out: Vec::new(),
            asking,
            breakers: breakers.as_ref(),
        };
        match event {
            Some(event) => step.step(state, event, now_ms, watermark_ms)?,
            None => step.release(state, now_ms, watermark_ms)?,
        }
        Ok((step.out, step.asking))
    }

    /// A routed step's state and outputs (Shape::Routed).
    fn step_routed<'py>(
        &mut self,
        py: Python<'py>,
        state: Option<Py<NativeState>>,
        event: Option<Event>,
        now_ms: i64,
        watermark_ms: Option<i64>,
    ) -> PyResult<(Py<NativeState>, Bound<'py, PyList>)> {
        let state = match state {
            Some(state) => state,
            None => Py::new(py, NativeState::default())?,
        };
        let (outputs, asking) = {
            let mut held = state.borrow_mut(py);
            self.run_routed(py, &mut held.state, event, now_ms, watermark_ms, true)?
        };
        let outputs = outputs_as(py, outputs, Shape::Routed, &asking)?;
        Ok((state, outputs))
    }
}

/// fingerprint.py's `action_of(args, args_action)`: args.action when args is an
/// object (a string, else None), the gateway's hint when args is not an object.
fn action_of(wire: &WireEvent<'_, '_>) -> Option<String> {
    match wire.args {
        Some(args @ crate::json::Value::Object(_)) => args
            .get("action")
            .and_then(|a| a.as_str())
            .map(str::to_owned),
        _ => wire.args_action.map(str::to_owned),
    }
}

/// Why `Judge.replay_lines` stopped (streams/replay.py reads these).
const REPLAY_DONE: u8 = 0;
const REPLAY_LEFT: u8 = 1;
const REPLAY_FAILED: u8 = 2;
const REPLAY_CHECKPOINT: u8 = 3;

/// A replayed line: its session key, its outputs, whether its state needs Python's checkpoint.
type Replayed<'py> = (Bound<'py, PyString>, Vec<Output>, bool);

/// The bounds replay judges lines within (`Judge.replay_step`'s arguments).
struct ReplayLimits {
    max_bytes: usize,
    max_depth: usize,
    max_identifier_bytes: usize,
    checkpoint_every: usize,
    max_state_bytes: usize,
}

type StepResult<'py> = Option<(Py<NativeState>, Bound<'py, PyList>)>;
/// (session key, outputs, whether Python's checkpoint is due)
type ReplayStep<'py> = (Bound<'py, PyString>, Bound<'py, PyList>, bool);

#[pymethods]
impl Judge {
    /// `resolve(agent_id)` gives config.py's ResolvedConfig fields and the agent's rules
    /// (`RulesTuple`, or None) as a tuple; `failure_identity` and `cap_detection` are
    /// what the rules ask Python (`Settings`).
    #[new]
    #[allow(clippy::too_many_arguments)]
    fn new(
        resolve: Py<PyAny>,
        unknown_tool_name: Py<PyAny>,
        failure_identity: Py<PyAny>,
        cap_detection: Py<PyAny>,
        send_tools: Vec<String>,
        include_payloads: bool,
        enforce: bool,
        max_parked: usize,
        max_parked_bytes: usize,
        gap_timeout_ms: i64,
    ) -> Self {
        Judge {
            settings: Settings {
                enforce,
                max_parked,
                max_parked_bytes,
                gap_timeout_ms,
                failure_identity,
                cap_detection,
            },
            policies: PolicyCache {
                resolve,
                enforce,
                cache: HashMap::new(),
                last: None,
            },
            unknown_tool_name,
            breakers: None,
            send_tools: send_tools.into_iter().collect(),
            include_payloads,
        }
    }

    /// The tools broken fleet-wide, as the worker keeps them current (a mapping of tool
    /// name to fleet.py's ToolBreaker, read at every verdict the overlay may raise).
    #[pyo3(signature = (breakers=None))]
    fn set_breakers(&mut self, breakers: Option<Py<PyAny>>) {
        self.breakers = breakers;
    }

    /// The Python it holds, for the garbage collector: the resolver is usually a bound
    /// method of the object holding this Judge (native_step.NativeEngine), a cycle.
    fn __traverse__(&self, visit: pyo3::PyVisit<'_>) -> Result<(), pyo3::PyTraverseError> {
        visit.call(&self.policies.resolve)?;
        visit.call(&self.settings.failure_identity)?;
        visit.call(&self.settings.cap_detection)?;
        if let Some(breakers) = &self.breakers {
            visit.call(breakers)?;
        }
        visit.call(&self.unknown_tool_name)
    }

    fn __clear__(&mut self) {
        // the callables cannot be dropped (not Options): the policies go, which is what
        // holds the engine's configs; the collector breaks the cycle at the other end
        self.policies.cache.clear();
        self.policies.last = None;
        self.breakers = None;
    }

    /// One event from its wire bytes: (state, outputs), the state changed in place (a
    /// new one for None); None, the state untouched, for an event left to Python.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (state, raw, now_ms, watermark_ms, max_bytes, max_depth, max_identifier_bytes))]
    fn step_raw<'py>(
        &mut self,
        py: Python<'py>,
        state: Option<Py<NativeState>>,
        raw: &[u8],
        now_ms: i64,
        watermark_ms: Option<i64>,
        max_bytes: usize,
        max_depth: usize,
        max_identifier_bytes: usize,
    ) -> PyResult<StepResult<'py>> {
        let Some(event) = self.wire_event(py, raw, max_bytes, max_depth, max_identifier_bytes)?
        else {
            return Ok(None);
        };
        let state = match state {
            Some(state) => state,
            None => Py::new(py, NativeState::default())?,
        };
        let outputs = {
            let mut held = state.borrow_mut(py);
            self.run(py, &mut held.state, Some(event), now_ms, watermark_ms)?
        };
        Ok(Some((state, outputs_to_python(py, outputs)?)))
    }

    /// Replay's step (streams/replay.py): one event from its wire bytes, its time as the
    /// clock and no watermark, its session's state looked up in and kept in `states`
    /// (session key -> NativeState). (session key, outputs - verdicts and loop events
    /// as their bytes, the others tagged -, whether the state needs Python's
    /// checkpoint), or None for an event left to Python (`states` untouched). Every
    /// `checkpoint_every` steps of a session its bytes are written here; only a state
    /// that does not fit `max_state_bytes`, or holds a waiting event with a usage cost,
    /// needs Python's.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (states, raw, max_bytes, max_depth, max_identifier_bytes, checkpoint_every, max_state_bytes))]
    fn replay_step<'py>(
        &mut self,
        py: Python<'py>,
        states: &Bound<'py, PyDict>,
        raw: &[u8],
        max_bytes: usize,
        max_depth: usize,
        max_identifier_bytes: usize,
        checkpoint_every: usize,
        max_state_bytes: usize,
    ) -> PyResult<Option<ReplayStep<'py>>> {
        let limits = ReplayLimits {
            max_bytes,
            max_depth,
            max_identifier_bytes,
            checkpoint_every,
            max_state_bytes,
        };
        let Some((key, outputs, due)) = self.replay_one(py, states, raw, &limits)? else {
            return Ok(None);
        };
        Ok(Some((key, outputs_as(py, outputs, Shape::Bare, &[])?, due)))
    }

    /// Replay's steps over lines of a file (streams/replay.py), from `lines[start]` on,
    /// each line's trailing CRs and LFs left out, as `replay_step` takes them one by one
    /// but without a call from Python for each (that call and its loop were a third of
    /// the offline path). (outputs, next, stop, value): verdicts and loop events as
    /// their bytes, notices as `replay_step` gives them, a rejection as ("rejection",
    /// code, reason, the line's index); then why it stopped at `lines[next]`: `DONE`
    /// (no line left), `LEFT` (a line the Python decoder must read: not stepped),
    /// `FAILED` (its step raised `value`: the session as the step left it),
    /// `CHECKPOINT` (`lines[next - 1]`'s session, `value` its key, needs Python's
    /// checkpoint before the next step).
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (states, lines, start, max_bytes, max_depth, max_identifier_bytes, checkpoint_every, max_state_bytes))]
    fn replay_lines<'py>(
        &mut self,
        py: Python<'py>,
        states: &Bound<'py, PyDict>,
        lines: &Bound<'py, PyList>,
        start: usize,
        max_bytes: usize,
        max_depth: usize,
        max_identifier_bytes: usize,
        checkpoint_every: usize,
        max_state_bytes: usize,
    ) -> PyResult<(Bound<'py, PyList>, usize, u8, Option<PyObject>)> {
        let limits = ReplayLimits {
            max_bytes,
            max_depth,
            max_identifier_bytes,
            checkpoint_every,
            max_state_bytes,
        };
        let out = PyList::empty(py);
        for index in start..lines.len() {
            let line = lines.get_item(index)?;
            let raw = line.downcast::<PyBytes>()?.as_bytes();
            let end = raw
                .iter()
                .rposition(|b| !matches!(b, b'\r' | b'\n'))
                .map_or(0, |last| last + 1);
            let (key, outputs, due) = match self.replay_one(py, states, &raw[..end], &limits) {
                Ok(Some(stepped)) => stepped,
                Ok(None) => return Ok((out, index, REPLAY_LEFT, None)),
                // an Exception is the line's (its dead letter); anything else (a
                // KeyboardInterrupt) stops the replay, as it would any Python code
                Err(error) if error.is_instance_of::<pyo3::exceptions::PyException>(py) => {
                    return Ok((
                        out,
                        index,
                        REPLAY_FAILED,
                        Some(error.into_value(py).into_any()),
                    ));
                }
                Err(error) => return Err(error),
            };
            for output in outputs {
                let item = match output {
                    Output::Verdict { bytes, .. } | Output::LoopEvent { bytes, .. } => {
                        PyBytes::new(py, &bytes).into_any()
                    }
                    Output::Notice {
                        level,
                        message,
                        session_key,
                        run_id,
                    } => ("notice", level, message, session_key, run_id)
                        .into_pyobject(py)?
                        .into_any(),
                    Output::Rejection { code, reason, .. } => ("rejection", code, reason, index)
                        .into_pyobject(py)?
                        .into_any(),
                };
                out.append(item)?;
            }
            if due {
                return Ok((
                    out,
                    index + 1,
                    REPLAY_CHECKPOINT,
                    Some(key.into_any().unbind()),
                ));
            }
        }
        Ok((out, lines.len(), REPLAY_DONE, None))
    }

    /// One event Python decoded (`step_raw` left it to Python), as native_step.py's
    /// `_event_values` gives it with its tokens.
    #[pyo3(signature = (state, event, now_ms, watermark_ms))]
    fn step_event<'py>(
        &mut self,
        py: Python<'py>,
        state: Option<Py<NativeState>>,
        event: &Bound<'py, PyTuple>,
        now_ms: i64,
        watermark_ms: Option<i64>,
    ) -> PyResult<(Py<NativeState>, Bound<'py, PyList>)> {
        let event = event_from_tuple(event)?;
        let state = match state {
            Some(state) => state,
            None => Py::new(py, NativeState::default())?,
        };
        let outputs = {
            let mut held = state.borrow_mut(py);
            self.run(py, &mut held.state, Some(event), now_ms, watermark_ms)?
        };
        Ok((state, outputs_to_python(py, outputs)?))
    }

    /// The worker's read of an event from its wire bytes: (the event, ready for
    /// `step_read`, session key, type, seq, ts), or None for an event left to Python
    /// (as `step_raw` says None).
    #[pyo3(signature = (raw, max_bytes, max_depth, max_identifier_bytes))]
    fn read<'py>(
        &mut self,
        py: Python<'py>,
        raw: &[u8],
        max_bytes: usize,
        max_depth: usize,
        max_identifier_bytes: usize,
    ) -> PyResult<Option<Read<'py>>> {
        let Some(event) = self.wire_event(py, raw, max_bytes, max_depth, max_identifier_bytes)?
        else {
            return Ok(None);
        };
        let key = PyString::new(py, event.key());
        let kind = match event.kind() {
            Kind::ToolCall => "tool_call",
            Kind::ToolResult => "tool_result",
            Kind::Compaction => "compaction",
            Kind::RunEnded => "run_ended",
        };
        let (seq, ts) = (event.seq, event.ts);
        Ok(Some((ReadEvent { event: Some(event) }, key, kind, seq, ts)))
    }

    /// The worker's step of an event `read` gave: (state, outputs as Shape::Routed).
    #[pyo3(signature = (state, event, now_ms, watermark_ms))]
    fn step_read<'py>(
        &mut self,
        py: Python<'py>,
        state: Option<Py<NativeState>>,
        event: &Bound<'py, ReadEvent>,
        now_ms: i64,
        watermark_ms: Option<i64>,
    ) -> PyResult<(Py<NativeState>, Bound<'py, PyList>)> {
        let Some(event) = event.borrow_mut().event.take() else {
            return Err(pyo3::exceptions::PyValueError::new_err(
                "this event was stepped already",
            ));
        };
        self.step_routed(py, state, Some(event), now_ms, watermark_ms)
    }

    /// `step_event` for the worker: outputs as Shape::Routed.
    #[pyo3(signature = (state, event, now_ms, watermark_ms))]
    fn step_event_routed<'py>(
        &mut self,
        py: Python<'py>,
        state: Option<Py<NativeState>>,
        event: &Bound<'py, PyTuple>,
        now_ms: i64,
        watermark_ms: Option<i64>,
    ) -> PyResult<(Py<NativeState>, Bound<'py, PyList>)> {
        let event = event_from_tuple(event)?;
        self.step_routed(py, state, Some(event), now_ms, watermark_ms)
    }

    /// `release` for the worker: outputs as Shape::Routed.
    #[pyo3(signature = (state, now_ms, watermark_ms))]
    fn release_routed<'py>(
        &mut self,
        py: Python<'py>,
        state: Py<NativeState>,
        now_ms: i64,
        watermark_ms: Option<i64>,
    ) -> PyResult<Bound<'py, PyList>> {
        Ok(self
            .step_routed(py, Some(state), None, now_ms, watermark_ms)?
            .1)
    }

    /// Engine.release: what waits in the state and may go now.
    #[pyo3(signature = (state, now_ms, watermark_ms))]
    fn release<'py>(
        &mut self,
        py: Python<'py>,
        state: Py<NativeState>,
        now_ms: i64,
        watermark_ms: Option<i64>,
    ) -> PyResult<Bound<'py, PyList>> {
        let outputs = {
            let mut held = state.borrow_mut(py);
            self.run(py, &mut held.state, None, now_ms, watermark_ms)?
        };
        outputs_to_python(py, outputs)
    }
}

// -- a state's and an event's plain values, both ways (native_step.py builds and reads
//    the Python SessionState from them) --------------------------------------------------

/// (kind, event_id, session_key, run_id, agent_id, incarnation, seq, ts, reply_to)
type EventHead = (
    String,
    String,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<i64>,
    i64,
    Option<(String, i64, String)>,
);
/// (call_id, tool_name, args token, action (a call) or outcome (a result), unknown, usage,
/// error text (a result), the args' JSON for the loop event (a call), the failure
/// identity at rest (a result); the text and the JSON None at rest, the identity None
/// but at rest)
type EventBody = (
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<(Option<i64>, Option<i64>, Option<i64>, Option<f64>)>,
    Option<String>,
    Option<Payload>,
    Option<u64>,
);
type EventTuple = (EventHead, EventBody);

fn event_to_tuple(event: &Event) -> EventTuple {
    let (kind, body): (&str, EventBody) = match &event.body {
        Body::Call {
            call_id,
            tool_name,
            token,
            action,
            payload,
        } => {
            let payload = payload.clone().map(Payload);
            (
                "tool_call",
                (
                    Some(call_id.clone()),
                    Some(tool_name.clone()),
                    Some(token.clone()),
                    action.clone(),
                    None,
                    None,
                    None,
                    payload,
                    None,
                ),
            )
        }
        Body::Result {
            call_id,
            tool_name,
            token,
            outcome,
            unknown,
            usage,
            error,
            failure,
        } => (
            "tool_result",
            (
                Some(call_id.clone()),
                Some(tool_name.clone()),
                token.clone(),
                outcome.clone(),
                unknown.clone(),
                usage.map(|u| (u.input_tokens, u.output_tokens, u.total_tokens, u.cost)),
                error.clone(),
                None,
                *failure,
            ),
        ),
        Body::Compaction => (
            "compaction",
            (None, None, None, None, None, None, None, None, None),
        ),
        Body::RunEnded => (
            "run_ended",
            (None, None, None, None, None, None, None, None, None),
        ),
    };
    let head = (
        kind.to_owned(),
        event.event_id.clone(),
        event.session_key.clone(),
        event.run_id.clone(),
        event.agent_id.clone(),
        event.incarnation.clone(),
        event.seq,
        event.ts,
        event.reply_to.clone(),
    );
    (head, body)
}

fn event_from_tuple(tuple: &Bound<'_, PyAny>) -> PyResult<Event> {
    let (head, b): EventTuple = tuple.extract()?;
    let body = match head.0.as_str() {
        "tool_call" => Body::Call {
            call_id: b.0.unwrap_or_default(),
            tool_name: b.1.unwrap_or_default(),
            token: b.2.unwrap_or_default(),
            action: b.3,
            payload: b.7.map(|p| p.0),
        },
        "tool_result" => Body::Result {
            call_id: b.0.unwrap_or_default(),
            tool_name: b.1.unwrap_or_default(),
            token: b.2,
            outcome: b.3,
            unknown: b.4,
            usage: b
                .5
                .map(|(input_tokens, output_tokens, total_tokens, cost)| Usage {
                    input_tokens,
                    output_tokens,
                    total_tokens,
                    cost,
                }),
            error: b.6,
            failure: b.8,
        },
        "compaction" => Body::Compaction,
        "run_ended" => Body::RunEnded,
        other => {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "no event type {other:?}"
            )))
        }
    };
    Ok(Event {
        event_id: head.1,
        session_key: head.2,
        run_id: head.3,
        agent_id: head.4,
        incarnation: head.5,
        seq: head.6,
        ts: head.7,
        reply_to: head.8,
        body,
    })
}

type RecordTuple = (String, u64, u64, u32, u64, Option<String>, i64);
type GuardTuple = (u64, i64, i64, Option<(String, u64, u64)>, bool);
type DecisionTuple = (u32, u8, u8, i64, Option<String>, i64);

#[pymethods]
impl NativeState {
    #[new]
    fn new() -> Self {
        NativeState::default()
    }

    /// Replay counts a step of this session: whether Python's checkpoint is due now
    /// (every `checkpoint_every` steps, the state written natively, and only one over
    /// `max_state_bytes` or with events waiting left to `state_codec.fit`).
    fn counted(&mut self, checkpoint_every: usize, max_state_bytes: usize) -> bool {
        self.since_checkpoint += 1;
        if self.since_checkpoint < checkpoint_every {
            return false;
        }
        self.since_checkpoint = 0;
        !crate::state_bytes::fits(&self.state, max_state_bytes)
    }

    #[getter]
    fn touched_ms(&self) -> i64 {
        self.state.touched_ms
    }

    #[getter]
    fn last_event_ms(&self) -> i64 {
        self.state.last_event_ms
    }

    /// Whether events wait (on a gap, or for a restarted gateway's seq space).
    #[getter]
    fn waiting(&self) -> bool {
        !self.state.parked.is_empty() || !self.state.pending.is_empty()
    }

    #[getter]
    fn has_pending(&self) -> bool {
        !self.state.pending.is_empty()
    }

    /// The state's format-4 body as the Python engine writes it (state_bytes.rs), or
    /// None where a waiting event has a usage cost (left to Python).
    fn v4_body<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyBytes>> {
        crate::state_bytes::v4_body(&self.state).map(|body| PyBytes::new(py, &body))
    }

    /// The state's bytes as `state_codec.fit` writes them, format 5 straight from the
    /// native state (state_bytes.rs's `checkpoint`), or None where Python's checkpoint
    /// must write them: over `cap` (held to version 4's size, as `fit` holds it), or a
    /// waiting event with a usage cost.
    fn checkpoint<'py>(&self, py: Python<'py>, cap: usize) -> Option<Bound<'py, PyBytes>> {
        crate::state_bytes::checkpoint(&self.state, cap).map(|data| PyBytes::new(py, &data))
    }

    /// A state read natively from its bytes (state_bytes.rs's `read_state`), or None
    /// where the Python reader must read them (native_step.py's `NativeEngine.read`).
    #[staticmethod]
    fn read(data: &[u8]) -> Option<NativeState> {
        crate::state_bytes::read_state(data).map(|state| NativeState {
            state,
            since_checkpoint: 0,
        })
    }

    /// The state's plain values, in SessionState's field order (native_step.py).
    fn export<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let s = &self.state;
        let history: Vec<RecordTuple> = s
            .history
            .records()
            .iter()
            .map(|r| {
                (
                    r.tool.to_string(),
                    r.sig,
                    r.run,
                    r.call,
                    r.result,
                    r.unknown.as_deref().map(str::to_owned),
                    r.ts,
                )
            })
            .collect();
        let guards: Vec<GuardTuple> = s
            .guards
            .iter()
            .map(|(run, g)| {
                (
                    *run,
                    g.window,
                    g.remaining,
                    g.first.as_ref().map(|(t, a, b)| (t.to_string(), *a, *b)),
                    g.broken,
                )
            })
            .collect();
        let warnings: Vec<(u64, u64, i64)> =
            s.warnings.iter().map(|(k, (r, b))| (*k, *r, *b)).collect();
        let parked: Vec<(i64, EventTuple)> = s
            .parked
            .iter()
            .map(|(seq, e)| (*seq, event_to_tuple(e)))
            .collect();
        let decisions: Vec<DecisionTuple> = s
            .decisions
            .iter()
            .map(|d| {
                (
                    d.event,
                    d.action,
                    d.detector,
                    d.count,
                    d.detail.clone(),
                    d.seq,
                )
            })
            .collect();
        let pending: Vec<EventTuple> = s.pending.iter().map(event_to_tuple).collect();
        // two tuples: PyO3 converts tuples of up to 12
        let order = (
            history,
            guards,
            warnings,
            s.next_seq,
            parked,
            s.skipped.clone(),
            s.seen_ids.clone(),
            decisions,
        );
        let rest = (
            s.verdict_floor,
            s.touched_ms,
            s.last_event_ms,
            s.incarnation,
            s.retired.clone(),
            pending,
            PyBytes::new(py, &s.rules.to_bytes()),
        );
        (order, rest).into_pyobject(py)
    }

    /// A state from the plain values `export` gives (read back from the state's bytes).
    #[staticmethod]
    fn import_values(values: &Bound<'_, PyTuple>) -> PyResult<NativeState> {
        let (order, rest) = (values.get_item(0)?, values.get_item(1)?);
        let get = |index: usize| {
            if index < 8 {
                order.get_item(index)
            } else {
                rest.get_item(index - 8)
            }
        };
        let history: Vec<RecordTuple> = get(0)?.extract()?;
        let records = history
            .into_iter()
            .map(|(tool, sig, run, call, result, unknown, ts)| Record {
                tool: shared_name(&tool),
                sig,
                run,
                call,
                result,
                unknown: unknown.as_deref().map(Arc::from),
                ts,
            })
            .collect();
        let guards: Vec<GuardTuple> = get(1)?.extract()?;
        let warnings: Vec<(u64, u64, i64)> = get(2)?.extract()?;
        let mut parked = Vec::new();
        for item in get(4)?.try_iter()? {
            let item = item?;
            let seq: i64 = item.get_item(0)?.extract()?;
            parked.push((seq, event_from_tuple(&item.get_item(1)?)?));
        }
        let decisions: Vec<DecisionTuple> = get(7)?.extract()?;
        let mut pending = Vec::new();
        for item in get(13)?.try_iter()? {
            pending.push(event_from_tuple(&item?)?);
        }
        let state = State {
            history: History::from_records(records),
            guards: guards
                .into_iter()
                .map(|(run, window, remaining, first, broken)| {
                    (
                        run,
                        Guard {
                            window,
                            remaining,
                            first: first.map(|(t, a, b)| (shared_name(&t), a, b)),
                            broken,
                        },
                    )
                })
                .collect(),
            warnings: warnings.into_iter().map(|(k, r, b)| (k, (r, b))).collect(),
            next_seq: get(3)?.extract()?,
            parked,
            skipped: get(5)?.extract()?,
            seen_ids: get(6)?.extract()?,
            decisions: decisions
                .into_iter()
                .map(|(event, action, detector, count, detail, seq)| Decision {
                    event,
                    action,
                    detector,
                    count,
                    detail,
                    seq,
                })
                .collect(),
            verdict_floor: get(8)?.extract()?,
            touched_ms: get(9)?.extract()?,
            last_event_ms: get(10)?.extract()?,
            incarnation: get(11)?.extract()?,
            retired: get(12)?.extract()?,
            pending,
            rules: {
                let bytes: Vec<u8> = get(14)?.extract()?;
                RuleState::from_bytes(&bytes).ok_or_else(|| {
                    pyo3::exceptions::PyValueError::new_err("unreadable rule state")
                })?
            },
        };
        Ok(NativeState {
            state,
            since_checkpoint: 0,
        })
    }
}

pub fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<Judge>()?;
    module.add_class::<NativeState>()?;
    module.add_class::<ReadEvent>()?;
    Ok(())
}
