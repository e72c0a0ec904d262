"""What a native build says it was built from: native/build.rs stamps every build with
the digest of the Python the judge stands in for (``MIRRORED_DIGEST``), and an
installed wheel counts only beside the engine modules of that digest
(streams/engine/native.py; the wheel itself: tests/integration/test_native_wheel.py)."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from loopfuse.streams.engine import native as choice
from loopfuse.streams.local import native_engine


def test_a_build_carries_the_digest_of_the_python_beside_it(native: ModuleType) -> None:
    # build.rs reads MIRRORED from native.py and digests as mirrored_digest does
    assert choice.mirrored_digest() == native.MIRRORED_DIGEST


def test_the_digest_changes_with_any_mirrored_file(tmp_path: Path) -> None:
    engine_dir = tmp_path / "streams" / "engine"
    package = tmp_path
    for name in choice.MIRRORED:
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_bytes((choice.ENGINE_DIR.parent.parent / name).read_bytes())
    assert choice.mirrored_digest(engine_dir) == choice.mirrored_digest()
    seen = {choice.mirrored_digest()}
    for name in choice.MIRRORED:
        original = (package / name).read_bytes()
        (package / name).write_bytes(original + b"\n")
        seen.add(choice.mirrored_digest(engine_dir))
        (package / name).write_bytes(original)
    assert len(seen) == len(choice.MIRRORED) + 1


def _checkout_copy(tmp_path: Path) -> Path:
    """The mirrored Python and the build's stamp, copied byte for byte: a checkout whose
    build counts exactly when this one's does. Its engine folder."""
    package = choice.ENGINE_DIR.parent.parent
    for name in choice.MIRRORED:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes((package / name).read_bytes())
    engine_dir = tmp_path / "streams" / "engine"
    (engine_dir / choice.STAMP).write_bytes((choice.ENGINE_DIR / choice.STAMP).read_bytes())
    return engine_dir


def test_the_build_here_is_what_the_engine_runs(
    native: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(choice.PURE_ENV, raising=False)
    assert native_engine.mismatch() is None
    assert native_engine.mismatch(_checkout_copy(tmp_path)) is None


def test_a_comment_edited_in_a_mirrored_file_fails_the_check_not_only_warns(
    native: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(choice.PURE_ENV, raising=False)
    engine_dir = _checkout_copy(tmp_path)
    rules = tmp_path / "streams" / "engine" / "rules.py"
    rules.write_text(rules.read_text() + "# a comment\n")

    why = native_engine.mismatch(engine_dir)

    assert why is not None
    assert "does not match its sources" in why
