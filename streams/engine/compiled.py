"""Which engine this process imports: the mypyc build beside the sources, or the pure one.

Run by ``loopfuse/streams/engine/__init__.py`` before any engine module is imported. A
build (``./dev build-engine``, :mod:`loopfuse.streams.local.compiled_engine`) only counts
while it matches its sources: the build stamps the digest of the sources it compiled, and
:func:`select` falls back to the pure modules when the stamp is missing or stale, or when
``LOOPFUSE_PURE_ENGINE=1`` asks for them.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

ENGINE_DIR = Path(__file__).resolve().parent
#: The engine modules mypyc compiles (everything but the package's __init__, which
#: must stay Python to choose between the two builds).
MODULES = (
    "canonical",
    "config",
    "detectors",
    "fingerprint",
    "fleet",
    "outputs",
    "rule_config",
    "rule_state",
    "rules",
    "state",
    "state_codec",
    "step",
)
#: Engine modules that stay Python even in a build: their msgspec Structs, which mypyc
#: would build without their class options. The compiled modules read those classes,
#: so a build is of them too (their sources are in its digest).
PURE_MODULES = ("history", "native")
#: The shared library every compiled module's shim loads, inside the package (not a
#: top-level module, which an editable install would not find).
GROUP = "loopfuse.streams.engine._compiled"
STAMP = "_compiled.digest"
#: Environment variable that forces the pure engine even when a build is there.
PURE_ENV = "LOOPFUSE_PURE_ENGINE"


def source_digest(engine_dir: Path = ENGINE_DIR) -> str:
    """What a build is of: the compiled modules' sources and the Python it ran on."""
    digest = hashlib.sha256(sys.implementation.cache_tag.encode())
    for name in (*MODULES, *PURE_MODULES):
        digest.update(name.encode())
        digest.update((engine_dir / f"{name}.py").read_bytes())
    return digest.hexdigest()


def built_modules(engine_dir: Path) -> list[Path]:
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    return [path for name in MODULES if (path := engine_dir / f"{name}{suffix}").exists()]


class _PureSources(importlib.abc.MetaPathFinder):
    """Imports the engine's modules from their .py files even where a build sits beside them."""

    def __init__(self, engine_dir: Path) -> None:
        self.engine_dir = engine_dir
        self.names = {f"loopfuse.streams.engine.{name}" for name in MODULES}

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.names:
            return None
        source = self.engine_dir / f"{fullname.rsplit('.', 1)[1]}.py"
        return importlib.util.spec_from_file_location(fullname, source)


def select(engine_dir: Path = ENGINE_DIR) -> bool:
    """Whether the compiled engine will be imported; if not, make sure the pure one is.

    Called before any engine module is imported. Without a build (the usual case)
    this looks for one file per module and returns.
    """
    present = built_modules(engine_dir)
    if not present:
        return False
    if os.environ.get(PURE_ENV, "") in ("", "0"):
        stamp = engine_dir / STAMP
        built = stamp.read_text().strip() if stamp.exists() else None
        # All or nothing: compiled modules rely on each other's native classes.
        if built == source_digest(engine_dir) and len(present) == len(MODULES):
            return True
        warnings.warn(
            "the compiled engine is incomplete or does not match its sources; using the "
            "pure engine (./dev build-engine builds it again)",
            RuntimeWarning,
            stacklevel=2,
        )
    sys.meta_path.insert(0, _PureSources(engine_dir))
    return False
