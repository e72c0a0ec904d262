"""``./dev build-engine``: compile the engine with mypyc, or remove the build.

The pure-Python engine is always there and always correct; this compiles the same
modules with mypyc (shipped with mypy; needs a C compiler and the Python headers) into
extension modules beside them, which Python then imports instead (the choice at import
is :mod:`loopfuse.streams.engine.compiled`).
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Sequence
from pathlib import Path

from loopfuse.streams.engine.compiled import (
    ENGINE_DIR,
    GROUP,
    MODULES,
    STAMP,
    built_modules,
    source_digest,
)


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
    read the project's pyproject.toml and build the whole project), laid out as the
    ``loopfuse`` package so the modules get their installed names; the extension
    modules and the stamp are then copied beside the sources in ``target``.
    """
    engine_dir = target / "streams" / "engine"
    with tempfile.TemporaryDirectory(prefix="loopfuse-mypyc-") as scratch:
        package = Path(scratch) / "loopfuse"
        package.mkdir()
        (package / "__init__.py").write_text("")
        # mypyc type-checks what it compiles, so the scratch tree holds what the
        # engine imports of the project too (schemas).
        shutil.copytree(target / "schemas", package / "schemas",
                        ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.json"))
        (package / "streams").mkdir()
        (package / "streams" / "__init__.py").write_bytes(
            (target / "streams" / "__init__.py").read_bytes()
        )
        shutil.copytree(engine_dir, package / "streams" / "engine",
                        ignore=shutil.ignore_patterns("__pycache__", "*.so", STAMP))
        script = (
            "from setuptools import setup\n"
            "from mypyc.build import mypycify\n"
            f"setup(name='loopfuse-engine', ext_modules=mypycify({_sources()!r}, "
            f"group_name={GROUP!r}), script_args=['build_ext', '--inplace'])\n"
        )
        result = subprocess.run(
            [sys.executable, "-c", script], cwd=scratch, capture_output=quiet, text=True,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"mypyc build failed:\n{(result.stdout or '')[-4000:]}{result.stderr or ''}"
            )
        for old in [*built_modules(engine_dir), *engine_dir.glob("_compiled__mypyc.*")]:
            old.unlink()
        for built in (package / "streams" / "engine").iterdir():
            if built.suffix in (".so", ".pyd"):
                shutil.copy2(built, engine_dir / built.name)
    (engine_dir / STAMP).write_text(source_digest(engine_dir) + "\n")


def remove(target: Path) -> None:
    """Delete a build from ``target``: the pure engine is imported again."""
    engine_dir = target / "streams" / "engine"
    for path in [*built_modules(engine_dir), *engine_dir.glob("_compiled__mypyc.*"),
                 engine_dir / STAMP]:
        path.unlink(missing_ok=True)


def _sources() -> list[str]:
    return [
        "--strict", "--ignore-missing-imports",
        *(f"loopfuse/streams/engine/{name}.py" for name in MODULES),
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--remove", action="store_true", help="delete the build instead")
    opts = parser.parse_args(argv)
    root = ENGINE_DIR.parents[1]
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
