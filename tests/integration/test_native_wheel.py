"""The native judge as a wheel (``pip install ./native``: maturin), as an installed
worker gets it: built here, it loads beside the engine modules it was built from and
judges the benchmark workload byte for byte as the checkout's build does; beside
changed modules (another commit's) it is refused with a warning, for the pure engine.

Builds the wheel (pip fetches maturin into an isolated build environment; cargo
compiles the crate into native/target, which the checkout's build shares), so it skips
only where there is no cargo.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from loopfuse.streams.engine import native as choice

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(600)

#: Run in a child process with the unpacked wheel first on sys.path: argv[1] is a copy
#: of the engine's mirrored modules (no build beside them), argv[2] "same" or "changed".
CHILD = r"""
import sys, warnings
from pathlib import Path
sys.path.insert(0, sys.argv[3])
from loopfuse.streams.engine import native as choice
engine_dir = Path(sys.argv[1]) / "streams" / "engine"
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    module = choice.load(engine_dir=engine_dir, crate_dir=Path(sys.argv[1]) / "native")
if sys.argv[2] == "changed":
    assert module is None, module
    assert any("built from other engine sources" in str(w.message) for w in caught), caught
    print("refused")
    sys.exit(0)
assert module is not None and module.__name__ == "loopfuse_native._native", module
assert module.__file__.startswith(sys.argv[3]), module.__file__

from bench.engine import build_workload
from loopfuse.schemas import parse_config
from loopfuse.streams.engine import Engine
from loopfuse.streams.engine.native_step import native_for
from loopfuse.streams.replay import _replay_native
from loopfuse.streams.worker.outgoing import Limits
from loopfuse.schemas.decode import DEFAULT_MAX_EVENT_BYTES

lines = build_workload(40, 30, 3)
config = parse_config({"tools": {"loopDetection": {"enabled": True}}})
limits = Limits()
checkout = native_for(Engine(config))
wheel = native_for(Engine(config))
wheel.judge = wheel.judge_from(module)
assert type(wheel.judge) is not type(checkout.judge)
got = list(_replay_native(iter(lines), wheel, DEFAULT_MAX_EVENT_BYTES, limits))
want = list(_replay_native(iter(lines), checkout, DEFAULT_MAX_EVENT_BYTES, limits))
assert len(got) > len(lines) // 2, len(got)
assert got == want
print(f"judged {len(lines)} events into {len(got)} outputs, the same bytes")
"""


@pytest.fixture(scope="module")
def wheel_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("cargo") is None:
        pytest.skip("no cargo here: the wheel cannot be built")
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "-q",
            "-w",
            str(out),
            str(ROOT / "native"),
        ],
        check=True,
        timeout=540,
        cwd=ROOT,
    )
    (wheel,) = out.glob("loopfuse_native-*.whl")
    unpacked = out / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(unpacked)
    return unpacked


def _engine_copy(into: Path, change: bool) -> Path:
    """The mirrored modules as an installed package has them (no crate, no build)."""
    for name in choice.MIRRORED:
        target = into / name
        target.parent.mkdir(parents=True, exist_ok=True)
        data = (choice.ENGINE_DIR.parent.parent / name).read_bytes()
        target.write_bytes(data + b"# another commit\n" if change else data)
    return into


@pytest.mark.parametrize("sources", ["same", "changed"])
def test_the_wheel_judges_as_the_checkout_s_build_beside_its_own_sources(
    wheel_dir: Path, tmp_path: Path, sources: str
) -> None:
    package = _engine_copy(tmp_path / "installed", change=sources == "changed")
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(package), sources, str(wheel_dir)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    print(done.stdout.strip())
    assert ("refused" if sources == "changed" else "the same bytes") in done.stdout
