"""The mypyc-compiled engine judges exactly as the pure one (streams.compiled_engine).

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

from streams import compiled_engine

ROOT = Path(__file__).resolve().parents[2]


def _compiled_tree(cache_dir: Path) -> Path:
    """A copy of the engine's sources with the compiled engine built beside them."""
    tree = cache_dir / "tree"
    engine_dir = tree / "streams" / "engine"
    stamp = engine_dir / compiled_engine.STAMP
    fresh = compiled_engine.source_digest(ROOT / "streams" / "engine")
    if not stamp.exists() or stamp.read_text().strip() != fresh:
        shutil.rmtree(tree, ignore_errors=True)
        shutil.copytree(ROOT / "streams" / "engine", engine_dir,
                        ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.pyd",
                                                      compiled_engine.STAMP))
        shutil.copytree(ROOT / "schemas", tree / "schemas")
        _refresh(tree)
        compiled_engine.build(tree)
    _refresh(tree)
    return tree


def _refresh(tree: Path) -> None:
    """What is not compiled is always today's: the schemas, the engine's __init__ and
    the module that chooses the engine."""
    shutil.rmtree(tree / "schemas")
    shutil.copytree(ROOT / "schemas", tree / "schemas",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("__init__.py", "compiled_engine.py", "engine/__init__.py"):
        shutil.copy2(ROOT / "streams" / name, tree / "streams" / name)


def _corpus_run(pythonpath: list[Path], out: Path, *, pure: bool) -> list[bytes]:
    """The corpus's lines from the engine that ``pythonpath[0]`` holds (run from
    there: ``-m`` puts the working directory first on the path)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, pythonpath))}
    env.pop(compiled_engine.PURE_ENV, None)
    if pure:
        env[compiled_engine.PURE_ENV] = "1"
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
    tree = shutil.copytree(_compiled_or_skip(request), tmp_path / "tree")
    probe = "import streams.engine as e, streams.engine.step as s; print(e.COMPILED, s.__file__)"

    env = {**os.environ, "PYTHONPATH": str(tree)}
    env.pop(compiled_engine.PURE_ENV, None)

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
