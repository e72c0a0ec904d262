//! Stamps a build with the digest of the Python the native judge stands in for
//! (`MIRRORED_DIGEST`), so that an installed wheel is used only beside the engine
//! modules it was built from. The files are streams/engine/native.py's `MIRRORED`,
//! read from there, and the digest is its `mirrored_digest`
//! (tests/unit/test_native_build.py holds a build's digest to it).

use std::path::Path;

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let listing = root.join("streams/engine/native.py");
    println!("cargo:rerun-if-changed={}", listing.display());
    let text = std::fs::read_to_string(&listing).unwrap_or_default();
    // the quoted names between `MIRRORED = (` and the tuple's closing line
    let names: Vec<&str> = text
        .split_once("\nMIRRORED = (")
        .and_then(|(_, rest)| rest.split_once("\n)"))
        .map(|(tuple, _)| tuple.split('"').skip(1).step_by(2).collect())
        .unwrap_or_default();
    // 64-bit FNV-1a over each file's name and bytes (a missing file counts as empty)
    let mut digest: u64 = 0xcbf2_9ce4_8422_2325;
    for name in names {
        let path = root.join(name);
        println!("cargo:rerun-if-changed={}", path.display());
        let data = std::fs::read(&path).unwrap_or_default();
        for byte in name.as_bytes().iter().chain(data.iter()) {
            digest = (digest ^ u64::from(*byte)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    println!("cargo:rustc-env=LOOPFUSE_MIRRORED_DIGEST={digest:016x}");
}
