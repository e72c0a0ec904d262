"""The mypyc-compiled engine (``./dev build-engine``) judges exactly as the pure one.

Both run tests/support/engine_corpus.py in a subprocess of their own: the pure
engine from this checkout, the compiled one from a build in pytest's cache (kept
while the engine's sources are unchanged; building takes about a minute on two
cores). Verdicts, loop events, rejections, notices and state bytes must be equal
line for line.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from loopfuse.streams.engine import compiled as choice
from loopfuse.streams.local import compiled_engine

ROOT = Path(__file__).resolve().parents[2]


def _compiled_tree(cache_dir: Path) -> Path:
    """A copy of the package with the compiled engine built beside its sources."""
    tree = cache_dir / "tree"
    engine_dir = tree / "streams" / "engine"
    stamp = engine_dir / choice.STAMP
    fresh = choice.source_digest(ROOT / "streams" / "engine")
    if not stamp.exists() or stamp.read_text().strip() != fresh:
        shutil.rmtree(tree, ignore_errors=True)
        _refresh(tree)
        compiled_engine.build(tree)
    _refresh(tree)
    return tree


def _refresh(tree: Path) -> None:
    """Everything but the build is today's checkout: the package linked in as in the
    repository (loopfuse/ -> ../streams, ../schemas), the rest of streams/ and schemas/
    copied over (a changed engine source gives a new digest and so a new build)."""
    skip = shutil.ignore_patterns("__pycache__", "*.so", "*.pyd", choice.STAMP)
    for part in ("streams", "schemas"):
        shutil.copytree(ROOT / part, tree / part, ignore=skip, dirs_exist_ok=True)
    (tree / "loopfuse").mkdir(exist_ok=True)
    shutil.copy2(ROOT / "loopfuse" / "__init__.py", tree / "loopfuse" / "__init__.py")
    for part in ("streams", "schemas"):
        if not (tree / "loopfuse" / part).is_symlink():
            (tree / "loopfuse" / part).symlink_to(Path("..") / part)


def _corpus_run(pythonpath: list[Path], out: Path, *, pure: bool) -> list[bytes]:
    """The corpus's lines from the engine that ``pythonpath[0]`` holds (run from
    there: ``-m`` puts the working directory first on the path)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, pythonpath))}
    env.pop(choice.PURE_ENV, None)
    if pure:
        env[choice.PURE_ENV] = "1"
    subprocess.run(
        [sys.executable, "-W", "error::RuntimeWarning", "-m", "tests.support.engine_corpus",
         str(out)], env=env, cwd=pythonpath[0], check=True, timeout=300,
    )
    return out.read_bytes().splitlines()


def _compiled_or_skip(request: pytest.FixtureRequest) -> Path:
    missing = compiled_engine.compiler_missing()
    if missing is not None:
        pytest.skip(f"cannot build the compiled engine here: {missing}")
    return _compiled_tree(request.config.cache.mkdir("compiled-engine"))


@pytest.mark.timeout(600)
def test_the_compiled_engine_gives_the_pure_engines_outputs_and_states(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    tree = _compiled_or_skip(request)
    pure = _corpus_run([ROOT], tmp_path / "pure.txt", pure=True)
    compiled = _corpus_run([tree, ROOT], tmp_path / "compiled.txt", pure=False)
    assert (pure[0], compiled[0]) == (b"pure", b"compiled")
    assert len(pure) > 5_000
    for index, (expected, got) in enumerate(zip(pure[1:], compiled[1:], strict=True), 1):
        assert got == expected, f"line {index} differs"


@pytest.mark.timeout(600)
def test_a_build_that_no_longer_matches_its_sources_gives_way_to_the_pure_engine(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    tree = shutil.copytree(_compiled_or_skip(request), tmp_path / "tree", symlinks=True)
    probe = "import loopfuse.streams.engine as e, loopfuse.streams.engine.step as s; print(e.COMPILED, s.__file__)"

    env = {**os.environ, "PYTHONPATH": str(tree)}
    env.pop(choice.PURE_ENV, None)

    def engine_in_use() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", probe], cwd=tree, capture_output=True, text=True, check=True,
            env=env,
        )

    assert engine_in_use().stdout.startswith("True ")
    with (tree / "streams" / "engine" / "step.py").open("a") as source:
        source.write("\n# edited since the build\n")
    edited = engine_in_use()
    assert edited.stdout.startswith("False ") and edited.stdout.strip().endswith("step.py")
    assert "does not match its sources" in edited.stderr
