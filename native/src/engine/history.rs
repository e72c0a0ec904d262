//! One call of a session's history (history.py's `Record`) and the views detection
//! reads (state.py's `run_history` and `recent_count`).
//!
//! Python keeps the run set and the signature counts as lazy caches, recomputed when a
//! trim may have changed them; here they are counts kept exact on every change, so the
//! views need only `&self` and a view can be held while the counts are read.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// Tool names kept (a fleet has some dozens; they come from the wire, so the set is
/// cleared when it reaches this many, and names made after share again).
const MAX_SHARED_NAMES: usize = 4_096;

thread_local! {
    static SHARED_NAMES: RefCell<HashSet<Arc<str>>> = RefCell::new(HashSet::new());
}

/// A tool name as records keep it: one `Arc` per name, shared by every record and
/// session that names the tool. A state's checkpoint then tells a name met before by
/// its pointer, without reading the bytes of each record's own copy (which, scattered
/// over the heap, missed the cache for most records).
pub fn shared_name(text: &str) -> Arc<str> {
    SHARED_NAMES.with(|names| {
        let mut names = names.borrow_mut();
        if let Some(name) = names.get(text) {
            return Arc::clone(name);
        }
        if names.len() >= MAX_SHARED_NAMES {
            names.clear();
        }
        let name: Arc<str> = Arc::from(text);
        names.insert(Arc::clone(&name));
        name
    })
}

/// Immutable like the Python one: a result replaces its call's record. Names are shared
/// (`Arc<str>`, `shared_name`): every record of a tool holds one tool name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub tool: Arc<str>,
    /// Call signature: tool name + args fingerprint.
    pub sig: u64,
    /// run_key of the (scoped) run id: 0 for none; compared, never shown.
    pub run: u64,
    /// 32-bit hash of the call id while the result is pending, else 0.
    pub call: u32,
    /// 64-bit result fingerprint, 0 = no result yet.
    pub result: u64,
    /// Unknown-tool name carried by the result.
    pub unknown: Option<Arc<str>>,
    /// Event time, epoch ms.
    pub ts: i64,
}

/// The records detection may see: those of the current run. Borrowed whole in the
/// common case (one run per session history), else the run's records picked out.
pub enum RunHistory<'a> {
    Whole(&'a [Record]),
    Of(Vec<&'a Record>),
}

impl RunHistory<'_> {
    pub fn len(&self) -> usize {
        match self {
            RunHistory::Whole(records) => records.len(),
            RunHistory::Of(records) => records.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn get(&self, index: usize) -> Option<&Record> {
        match self {
            RunHistory::Whole(records) => records.get(index),
            RunHistory::Of(records) => records.get(index).copied(),
        }
    }
}

/// A session's rolling history, oldest first, with how many of its records carry each
/// run key and each signature.
#[derive(Clone, Debug, Default)]
pub struct History {
    records: Vec<Record>,
    runs: HashMap<u64, usize>,
    sig_counts: HashMap<u64, usize>,
}

fn count_in(counts: &mut HashMap<u64, usize>, key: u64) {
    *counts.entry(key).or_insert(0) += 1;
}

fn count_out(counts: &mut HashMap<u64, usize>, key: u64) {
    if let Some(left) = counts.get_mut(&key) {
        *left -= 1;
        if *left == 0 {
            counts.remove(&key);
        }
    }
}

impl History {
    pub fn new() -> Self {
        History::default()
    }

    /// A history read back from a session's state (already trimmed when written).
    pub fn from_records(records: Vec<Record>) -> Self {
        let mut history = History {
            records,
            ..History::default()
        };
        for rec in &history.records {
            count_in(&mut history.runs, rec.run);
            count_in(&mut history.sig_counts, rec.sig);
        }
        history
    }

    pub fn records(&self) -> &[Record] {
        &self.records
    }

    /// The records of the current run (its run_key), as state.py's `run_history`.
    pub fn run_history(&self, run: u64) -> RunHistory<'_> {
        if self.runs.len() == 1 && self.runs.contains_key(&run) {
            return RunHistory::Whole(&self.records);
        }
        RunHistory::Of(self.records.iter().filter(|rec| rec.run == run).collect())
    }

    /// Records with this signature in `view` (a run's view of this history).
    pub fn recent_count(&self, sig: u64, view: &RunHistory<'_>) -> usize {
        match view {
            RunHistory::Whole(_) => self.sig_counts.get(&sig).copied().unwrap_or(0),
            RunHistory::Of(records) => records.iter().filter(|rec| rec.sig == sig).count(),
        }
    }

    /// Add a record and trim the history oldest-first to `history_size`.
    pub fn append(&mut self, record: Record, history_size: usize) {
        count_in(&mut self.runs, record.run);
        count_in(&mut self.sig_counts, record.sig);
        self.records.push(record);
        let excess = self.records.len().saturating_sub(history_size);
        for rec in self.records.drain(..excess) {
            count_out(&mut self.runs, rec.run);
            count_out(&mut self.sig_counts, rec.sig);
        }
    }

    /// Put `record` in place of the one at `index` (a call's record taking its result):
    /// the same signature and run, so no count changes.
    pub fn replace(&mut self, index: usize, record: Record) {
        let old = &mut self.records[index];
        debug_assert!(old.sig == record.sig && old.run == record.run);
        *old = record;
    }
}
