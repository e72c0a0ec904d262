"""Build the native judge (``native/``, Rust with PyO3) beside the engine's sources.

``./dev test`` runs this where cargo is; a machine without it runs the pure engine.
Quiet when it works; cargo's output is kept in ``native/target/build.log`` and shown
when it fails. Skips the build while the stamp matches the sources.

    python -m loopfuse.streams.local.native_engine [--force] [--remove]
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

with warnings.catch_warnings():  # a stale build is what this is about to replace
    warnings.simplefilter("ignore", RuntimeWarning)
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="native_engine", description=__doc__)
    parser.add_argument("--force", action="store_true", help="build even when current")
    parser.add_argument("--remove", action="store_true", help="back to the pure engine")
    args = parser.parse_args(argv)
    if args.remove:
        remove()
        return 0
    return build(force=args.force)


if __name__ == "__main__":
    raise SystemExit(main())
