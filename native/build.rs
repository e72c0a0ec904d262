//! Stamps a build with the digest of the Python the native judge stands in for
//! (`MIRRORED_DIGEST`), so that an installed wheel is used only beside the engine
//! modules it was built from (streams/engine/native.py: `mirrored_digest`, the same
//! digest; tests/unit/test_native_build.py holds the two lists and digests equal).

use std::path::Path;

/// streams/engine/native.py's MIRRORED, in its order.
const MIRRORED: &[&str] = &[
    "streams/engine/canonical.py",
    "streams/engine/config.py",
    "streams/engine/detectors.py",
    "streams/engine/fingerprint.py",
    "streams/engine/history.py",
    "streams/engine/state.py",
    "streams/engine/step.py",
    "schemas/decode.py",
    "schemas/events.py",
    "streams/engine/state_codec.py",
];

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    // 64-bit FNV-1a over each file's name and bytes (a missing file counts as empty)
    let mut digest: u64 = 0xcbf2_9ce4_8422_2325;
    for name in MIRRORED {
        let path = root.join(name);
        println!("cargo:rerun-if-changed={}", path.display());
        let data = std::fs::read(&path).unwrap_or_default();
        for byte in name.as_bytes().iter().chain(data.iter()) {
            digest = (digest ^ u64::from(*byte)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    println!("cargo:rustc-env=LOOPFUSE_MIRRORED_DIGEST={digest:016x}");
}
