"""Whether this process uses the native judge (the Rust crate in ``native/``), and its module.

The native module (``_native``, built by :mod:`loopfuse.streams.local.native_engine`,
which ``./dev test`` runs where cargo is) sits beside the engine's sources, git-ignored.
It only counts while it matches its sources: the build stamps the digest of the crate's
files and of the Python it stands in for, and :func:`load` gives None (the pure engine)
when the stamp is missing or stale, when the crate's sources are not there to check it
against, or when ``LOOPFUSE_PURE_ENGINE=1`` asks for the pure engine. Issue 27: canonical
JSON and the 128-bit digests (stage 1), an input event decoded, validated and
fingerprinted from its wire bytes (stage 2); every native function returns None for what
it leaves to the Python code.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import sys
import warnings
from pathlib import Path
from types import ModuleType

ENGINE_DIR = Path(__file__).resolve().parent
CRATE_DIR = ENGINE_DIR.parent.parent / "native"
MODULE = "loopfuse.streams.engine._native"
STAMP = "_native.digest"
PURE_ENV = "LOOPFUSE_PURE_ENGINE"
#: The crate's files a build is of, and the Python modules whose behaviour it reproduces,
#: relative to the package (a change to either makes a build stale until built again).
CRATE_FILES = ("Cargo.toml", "Cargo.lock")
MIRRORED = (
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
)


def source_digest(crate_dir: Path = CRATE_DIR, engine_dir: Path = ENGINE_DIR) -> str | None:
    """What a build is of, or None where the crate's sources are not here."""
    if not (crate_dir / "Cargo.toml").exists():
        return None
    digest = hashlib.sha256(sys.implementation.cache_tag.encode())
    sources = [crate_dir / name for name in CRATE_FILES]
    sources += sorted((crate_dir / "src").rglob("*.rs"))
    package = engine_dir.parent.parent
    sources += [package / name for name in MIRRORED]
    for path in sources:
        digest.update(path.name.encode())
        digest.update(path.read_bytes() if path.exists() else b"")
    return digest.hexdigest()


def load(engine_dir: Path = ENGINE_DIR, crate_dir: Path = CRATE_DIR) -> ModuleType | None:
    """The native module when it is built, current and wanted; else None (pure)."""
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        return None
    stamp = engine_dir / STAMP
    if not stamp.exists():
        return None  # never built here: the usual case without cargo
    expected = source_digest(crate_dir, engine_dir)
    if expected is None:
        return None  # a copy of the engine without the crate: nothing to check a build by
    if stamp.read_text().strip() != expected:
        warnings.warn(
            "the native engine does not match its sources; using the pure engine "
            "(./dev test builds it again where cargo is)",
            RuntimeWarning,
            stacklevel=2,
        )
        return None
    try:
        return importlib.import_module(MODULE)
    except ImportError as exc:
        warnings.warn(f"the native engine did not load ({exc}); using the pure engine",
                      RuntimeWarning, stacklevel=2)
        return None


#: The module this process uses, or None: read once, when the engine is imported.
NATIVE: ModuleType | None = load()
