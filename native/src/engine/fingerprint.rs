//! The 64-bit fingerprints inside session state (fingerprint.py and state.py's
//! `run_key`), so that a native engine computes a call's signature itself.
//!
//! Python hashes the UTF-8 of its strings with "surrogatepass"; a Rust `str` holds no
//! lone surrogate, so every string reaching here is one whose bytes are plain UTF-8 and
//! the hashes agree (the PyO3 layer declines the others).

use xxhash_rust::xxh3::xxh3_64;

pub const ERROR_PREFIX: &str = "error:";

/// A token or id (ours or a gateway's opaque hash string) as a 64-bit int for state.
pub fn hash64(token: &str) -> u64 {
    xxh3_64(token.as_bytes())
}

/// The low 32 bits of `hash64` (pending call ids, remembered verdicts).
pub fn hash32(text: &str) -> u32 {
    hash64(text) as u32
}

/// Call signature inside state: tool name + args fingerprint (`f"{tool}\x00{token}"`).
pub fn signature(tool: &str, args_token: &str) -> u64 {
    let mut joined = Vec::with_capacity(tool.len() + 1 + args_token.len());
    joined.extend_from_slice(tool.as_bytes());
    joined.push(0);
    joined.extend_from_slice(args_token.as_bytes());
    xxh3_64(&joined)
}

/// A result token as a non-zero 64-bit int whose low bit says "error": so an error
/// never equals a success exactly, not just with overwhelming probability.
pub fn result_fingerprint(token: &str) -> u64 {
    let value = hash64(token);
    if token.starts_with(ERROR_PREFIX) {
        return value | 1;
    }
    match value & !1 {
        0 => 2,
        even => even,
    }
}

/// A run id (already scoped) as a non-zero 64-bit int; 0 for no run id.
pub fn run_key(run: Option<&str>) -> u64 {
    run.map_or(0, |run| hash64(run) | 1)
}

/// `command_status`, or `process` with args.action poll or log (spec section 6).
pub fn is_known_poll(tool: &str, action: Option<&str>) -> bool {
    tool == "command_status" || (tool == "process" && matches!(action, Some("poll" | "log")))
}
