"""Whether this process uses the native judge (the Rust crate in ``native/``), and its module.

Two builds count. In a checkout, the native module (``_native``, built by
:mod:`loopfuse.streams.local.native_engine`, which ``./dev test`` runs where cargo is)
sits beside the engine's sources, git-ignored; it only counts while it matches its
sources: the build stamps the digest of the crate's files and of the Python it stands
in for, and a stale stamp means the pure engine. Where the package is installed (no
crate beside it to check a build by), the ``loopfuse-native`` wheel (``pip install
./native``: maturin) counts while the digest it was built with, of the Python it stands
in for (``MIRRORED_DIGEST``, native/build.rs), is that of the installed modules: the
wheel of another commit is refused with a warning. ``LOOPFUSE_PURE_ENGINE=1`` asks for
the pure engine. The native judge holds canonical
JSON and the 128-bit digests, an input event decoded, validated and fingerprinted from
its wire bytes, and the session fold with the opt-in rules; every native function
returns None for what it leaves to the Python code.
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
#: The module of the ``loopfuse-native`` wheel (native/pyproject.toml).
INSTALLED_MODULE = "loopfuse_native._native"
STAMP = "_native.digest"
PURE_ENV = "LOOPFUSE_PURE_ENGINE"
#: The crate's files a build is of, and the Python modules whose behaviour it reproduces,
#: relative to the package (a change to either makes a build stale until built again).
CRATE_FILES = ("Cargo.toml", "Cargo.lock", "build.rs", "pyproject.toml")
# (native/build.rs reads this tuple, one quoted name a line, to stamp a build)
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
    "streams/engine/state_codec/__init__.py",
    "streams/engine/state_codec/body.py",
    "streams/engine/state_codec/frozen.py",
    "streams/engine/state_codec/v4.py",
    "streams/engine/state_codec/v5.py",
    "streams/engine/state_codec/varint.py",
    "streams/engine/rules.py",
    "streams/engine/rule_state.py",
    "streams/engine/rule_config.py",
    "streams/engine/volatile.py",
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


def mirrored_digest(engine_dir: Path = ENGINE_DIR) -> str:
    """The digest of the Python the native judge stands in for, as native/build.rs
    computes it into a build (64-bit FNV-1a over each file's name and bytes, in
    ``MIRRORED`` order; a missing file counts as empty)."""
    package = engine_dir.parent.parent
    digest = 0xCBF29CE484222325
    for name in MIRRORED:
        path = package / name
        for data in (name.encode(), path.read_bytes() if path.exists() else b""):
            for byte in data:
                digest = ((digest ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{digest:016x}"


def load(engine_dir: Path = ENGINE_DIR, crate_dir: Path = CRATE_DIR) -> ModuleType | None:
    """The native module when it is built, current and wanted; else None (pure)."""
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        return None
    stamp = engine_dir / STAMP
    if not stamp.exists():
        return _installed(engine_dir)  # never built here: the wheel, if there is one
    expected = source_digest(crate_dir, engine_dir)
    if expected is None:
        return _installed(engine_dir)  # no crate here to check a build by
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
        warnings.warn(
            f"the native engine did not load ({exc}); using the pure engine",
            RuntimeWarning,
            stacklevel=2,
        )
        return None


def _installed(engine_dir: Path) -> ModuleType | None:
    """The ``loopfuse-native`` wheel's module when it is installed and built from the
    Python installed beside it; else None."""
    try:
        module = importlib.import_module(INSTALLED_MODULE)
    except ImportError:
        return None  # not installed: the usual case
    built_from = getattr(module, "MIRRORED_DIGEST", None)
    if built_from != mirrored_digest(engine_dir):
        warnings.warn(
            f"the installed loopfuse-native was built from other engine sources "
            f"({built_from}, these are {mirrored_digest(engine_dir)}); using the pure "
            "engine (pip install ./native from the same commit)",
            RuntimeWarning,
            stacklevel=3,
        )
        return None
    return module


#: The module this process uses, or None: read once, when the engine is imported.
NATIVE: ModuleType | None = load()
