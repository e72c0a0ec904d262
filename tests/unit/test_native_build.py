"""What a native build says it was built from: native/build.rs stamps every build with
the digest of the Python the judge stands in for (``MIRRORED_DIGEST``), and an
installed wheel counts only beside the engine modules of that digest
(streams/engine/native.py; the wheel itself: tests/integration/test_native_wheel.py)."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from loopfuse.streams.engine import native as choice


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
