"""Build the native judge (``native/``, Rust with PyO3) beside the engine's sources.

``./dev test`` runs this where cargo is; a machine without it runs the pure engine.
Quiet when it works; cargo's output is kept in ``native/target/build.log`` and shown
when it fails. Skips the build while the stamp matches the sources. Then it checks, in
a fresh interpreter, that the engine runs on the build: in a checkout a build that does
not count (a stale stamp with no cargo to rebuild, a module that does not load, one
stamped with other mirrored Python) would leave the suite on the pure engine with a
warning only, so it fails with the reason instead.

    python -m loopfuse.streams.local.native_engine [--force] [--remove] [--check]
"""

from __future__ import annotations

import argparse
import importlib.machinery
import os
import shutil
import subprocess
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

with warnings.catch_warnings():  # a stale build is what this is about to replace
    warnings.simplefilter("ignore", RuntimeWarning)
    from loopfuse.streams.engine import native as choice
    from loopfuse.streams.engine.native import CRATE_DIR, ENGINE_DIR, STAMP, source_digest

SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]
TARGET = ENGINE_DIR / f"_native{SUFFIX}"


def cargo_missing() -> str | None:
    """Why a build cannot run here, or None."""
    if shutil.which("cargo") is None:
        return "no cargo on the PATH"
    if source_digest() is None:
        return f"no crate at {CRATE_DIR}"
    return None


def remove() -> None:
    for path in (TARGET, ENGINE_DIR / STAMP):
        path.unlink(missing_ok=True)


def build(force: bool = False) -> int:
    why = cargo_missing()
    if why is not None:
        if not (ENGINE_DIR / STAMP).exists():  # else the check says what is wrong with it
            print(f"native engine not built ({why}): the pure engine runs", file=sys.stderr)
        return 0
    digest = source_digest()
    stamp = ENGINE_DIR / STAMP
    if not force and TARGET.exists() and stamp.exists() and stamp.read_text().strip() == digest:
        return 0
    remove()
    target_dir = CRATE_DIR / "target"
    target_dir.mkdir(exist_ok=True)
    log = target_dir / "build.log"
    env = {**os.environ, "PYO3_PYTHON": sys.executable}
    with log.open("wb") as out:
        done = subprocess.run(
            [
                "cargo",
                "build",
                "--release",
                "--locked",
                "--manifest-path",
                str(CRATE_DIR / "Cargo.toml"),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            check=False,
        )
    if done.returncode != 0:
        sys.stderr.write(log.read_text(errors="replace"))
        print(f"building the native engine failed (log above, also in {log})", file=sys.stderr)
        return done.returncode
    library = (
        target_dir
        / "release"
        / (
            "_native.dll"
            if os.name == "nt"
            else ("lib_native.dylib" if sys.platform == "darwin" else "lib_native.so")
        )
    )
    shutil.copyfile(library, TARGET)
    stamp.write_text(f"{digest}\n")
    return 0


def mismatch(engine_dir: Path = ENGINE_DIR, crate_dir: Path = CRATE_DIR) -> str | None:
    """Why the engine would not run on the native judge built in this checkout, or None
    (it does; or nothing is built here and there is no cargo to build it, so the pure
    engine is what was asked for; or ``LOOPFUSE_PURE_ENGINE`` asks for it; or there is
    no crate here, as in an installed package, whose wheel keeps its warning)."""
    if os.environ.get(choice.PURE_ENV, "") not in ("", "0"):
        return None
    if choice.source_digest(crate_dir, engine_dir) is None:
        return None
    stamp = engine_dir / STAMP
    if not stamp.exists():
        if shutil.which("cargo") is None:
            return None
        return f"nothing is built at {engine_dir} though cargo is here"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = choice.load(engine_dir, crate_dir)
    if module is None:
        said = "; ".join(str(warning.message) for warning in caught) or "the engine refused it"
        return f"the build at {engine_dir} does not count: {said}"
    built_from = getattr(module, "MIRRORED_DIGEST", None)
    if built_from != choice.mirrored_digest(engine_dir):
        return (
            f"the build says it mirrors Python of digest {built_from}, the Python here is "
            f"{choice.mirrored_digest(engine_dir)}: native/build.rs and "
            "streams/engine/native.py's MIRRORED disagree on the mirrored files"
        )
    return None


def check() -> int:
    """Exit status 0 when the engine runs on the build here, else 1 with the reason."""
    why = mismatch()
    if why is None:
        return 0
    print(
        f"the native judge does not match this checkout: {why}.\n"
        "The tests would run on the pure engine only: build it again where cargo is "
        "(python -m loopfuse.streams.local.native_engine --force), or remove it (--remove) "
        "to test the pure engine on purpose.",
        file=sys.stderr,
    )
    return 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="native_engine", description=__doc__)
    parser.add_argument("--force", action="store_true", help="build even when current")
    parser.add_argument("--remove", action="store_true", help="back to the pure engine")
    parser.add_argument(
        "--check", action="store_true", help="only check that the engine runs on the build"
    )
    args = parser.parse_args(argv)
    if args.remove:
        remove()
        return 0
    if args.check:
        return check()
    built = build(force=args.force)
    if built != 0:
        return built
    # A fresh interpreter: this one imported the engine, and maybe a build, before it.
    return subprocess.run(
        [sys.executable, "-m", "loopfuse.streams.local.native_engine", "--check"], check=False
    ).returncode


if __name__ == "__main__":
    raise SystemExit(main())
