"""The engine compiled with mypyc: an optional build, and the choice of it at import.

The pure-Python engine is always there and always correct; ``./dev build-engine``
(``python -m streams.compiled_engine``) compiles the same modules with mypyc (shipped
with mypy; needs a C compiler and the Python headers) into extension modules beside
them, which Python then imports instead. A build only counts while it matches its
sources: the build stamps the digest of the sources it compiled, and
:func:`select` (run by ``streams/engine/__init__.py`` before any engine module is
imported) falls back to the pure modules when the stamp is missing or stale, or
when ``LOOPFUSE_PURE_ENGINE=1`` asks for them.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

ENGINE_DIR = Path(__file__).resolve().parent / "engine"
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
PURE_MODULES = ("history",)
#: The shared library every compiled module's shim loads, inside the package (not a
#: top-level module, which an editable install would not find).
GROUP = "streams.engine._compiled"
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


def _built_modules(engine_dir: Path) -> list[Path]:
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    return [path for name in MODULES if (path := engine_dir / f"{name}{suffix}").exists()]


class _PureSources(importlib.abc.MetaPathFinder):
    """Imports the engine's modules from their .py files even where a build sits beside them."""

    def __init__(self, engine_dir: Path) -> None:
        self.engine_dir = engine_dir
        self.names = {f"streams.engine.{name}" for name in MODULES}

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
    built_modules = _built_modules(engine_dir)
    if not built_modules:
        return False
    if os.environ.get(PURE_ENV, "") in ("", "0"):
        stamp = engine_dir / STAMP
        built = stamp.read_text().strip() if stamp.exists() else None
        # All or nothing: compiled modules rely on each other's native classes.
        if built == source_digest(engine_dir) and len(built_modules) == len(MODULES):
            return True
        warnings.warn(
            "the compiled engine is incomplete or does not match its sources; using the "
            "pure engine (./dev build-engine builds it again)",
            RuntimeWarning,
            stacklevel=2,
        )
    sys.meta_path.insert(0, _PureSources(engine_dir))
    return False


def compiler_missing() -> str | None:
    """Why a build cannot run here, or None."""
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        return f"no C compiler ({compiler!r} not found)"
    include = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not include.exists():
        return f"no Python headers ({include} not found)"
    if importlib.util.find_spec("mypyc") is None:
        return "mypyc is not installed (it comes with mypy: pip install mypy)"
    if importlib.util.find_spec("setuptools") is None:
        return "setuptools is not installed (mypyc builds with it)"
    return None


def build(target: Path, *, quiet: bool = True) -> None:
    """Compile the engine into ``target`` (a directory holding ``streams/engine``).

    mypyc compiles in a scratch directory of its own (setuptools would otherwise
    read the project's pyproject.toml and build the whole project); the extension
    modules and the stamp are then copied beside the sources in ``target``.
    """
    engine_dir = target / "streams" / "engine"
    with tempfile.TemporaryDirectory(prefix="loopfuse-mypyc-") as scratch:
        work = Path(scratch)
        # mypyc type-checks what it compiles, so the scratch tree holds what the
        # engine imports of the project too (schemas).
        shutil.copytree(target / "schemas", work / "schemas",
                        ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.json"))
        (work / "streams").mkdir()
        (work / "streams" / "__init__.py").write_bytes(
            (target / "streams" / "__init__.py").read_bytes()
        )
        shutil.copytree(engine_dir, work / "streams" / "engine",
                        ignore=shutil.ignore_patterns("__pycache__", "*.so", STAMP))
        script = (
            "from setuptools import setup\n"
            "from mypyc.build import mypycify\n"
            f"setup(name='loopfuse-engine', ext_modules=mypycify({_sources()!r}, "
            f"group_name={GROUP!r}), script_args=['build_ext', '--inplace'])\n"
        )
        result = subprocess.run(
            [sys.executable, "-c", script], cwd=work, capture_output=quiet, text=True,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"mypyc build failed:\n{(result.stdout or '')[-4000:]}{result.stderr or ''}"
            )
        for old in [*_built_modules(engine_dir), *engine_dir.glob("_compiled__mypyc.*")]:
            old.unlink()
        for built in (work / "streams" / "engine").iterdir():
            if built.suffix in (".so", ".pyd"):
                shutil.copy2(built, engine_dir / built.name)
    (engine_dir / STAMP).write_text(source_digest(engine_dir) + "\n")


def remove(target: Path) -> None:
    """Delete a build from ``target``: the pure engine is imported again."""
    engine_dir = target / "streams" / "engine"
    for path in [*_built_modules(engine_dir), *engine_dir.glob("_compiled__mypyc.*"),
                 engine_dir / STAMP]:
        path.unlink(missing_ok=True)


def _sources() -> list[str]:
    return [
        "--strict", "--ignore-missing-imports",
        *(f"streams/engine/{name}.py" for name in MODULES),
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--remove", action="store_true", help="delete the build instead")
    opts = parser.parse_args(argv)
    root = ENGINE_DIR.parent.parent
    if opts.remove:
        remove(root)
        print("compiled engine removed; the pure engine is used")
        return 0
    missing = compiler_missing()
    if missing is not None:
        print(f"cannot build the compiled engine: {missing}; the pure engine is used",
              file=sys.stderr)
        return 1
    build(root, quiet=False)
    print(f"compiled engine built in {root / 'streams' / 'engine'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
