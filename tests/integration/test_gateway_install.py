"""A gateway's install, as a new user makes it: ``pip install "loopfuse[hermes]"`` beside
``hermes-agent==0.19.0`` in one pip run, into an empty virtualenv.

It must resolve with no conflict, add one import name (``loopfuse``) and no Faust, run
``loopfuse replay`` exactly as the development install does, say in one line what
``loopfuse worker`` needs, and pass the Hermes plugin's tests (which run only here:
hermes-agent pins croniter 6, Faust's mode needs croniter < 6, so the two never share
a virtualenv). The plugin's tests use the session's broker and a worker from the
development install (``LOOPFUSE_WORKER_PYTHON``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import KafkaBroker

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1200)]

ROOT = Path(__file__).resolve().parents[2]
HERMES = "hermes-agent==0.19.0"
FIXTURES = ROOT / "tests" / "fixtures"
#: What the Hermes plugin's tests need beyond the two installs (hermes-agent brings pyyaml).
TEST_TOOLS = ("pytest>=8,<10", "pytest-timeout>=2.3,<3", "pytest-asyncio>=0.23,<2")


@dataclass
class GatewayVenv:
    root: Path
    pip_output: str
    pip_status: int

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    def run(self, *args: str | Path, **kwargs: object) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(a) for a in args],
            capture_output=True,
            text=True,
            check=False,
            timeout=600,
            **kwargs,  # type: ignore[call-overload]
        )


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> GatewayVenv:
    root = tmp_path_factory.mktemp("gateway") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True, timeout=120)
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env.pop("PYTHONPATH", None)
    # One pip run: what a user types. (pip reports a conflict it cannot avoid as
    # "ResolutionImpossible", or after installing as "... has requirement ..., but you
    # have ...".)
    pip = subprocess.run(
        [
            str(root / "bin" / "python"),
            "-m",
            "pip",
            "install",
            f"{ROOT}[hermes]",
            HERMES,
            *TEST_TOOLS,
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=1000,
        env=env,
    )
    return GatewayVenv(root, pip.stdout + pip.stderr, pip.returncode)


def test_loopfuse_and_hermes_agent_resolve_together_in_one_pip_run(gateway: GatewayVenv) -> None:
    assert gateway.pip_status == 0, gateway.pip_output[-3000:]
    for symptom in ("ResolutionImpossible", "dependency conflicts", "but you have", "incompatible"):
        assert symptom not in gateway.pip_output, gateway.pip_output[-3000:]
    check = gateway.run(gateway.python, "-m", "pip", "check")
    assert check.returncode == 0, check.stdout + check.stderr


def test_the_base_install_has_one_import_name_and_no_faust(gateway: GatewayVenv) -> None:
    probe = gateway.run(
        gateway.python,
        "-c",
        "\n".join(
            [
                "import importlib.metadata as m, importlib.util as u",
                "files = m.files('loopfuse') or []",
                "tops = {f.parts[0] for f in files if f.parts[0] != '..'",
                "        and not f.parts[0].endswith('.dist-info')}",
                "print(sorted(tops))",
                "print([n for n in ('faust', 'mode', 'rocksdict', 'croniter') if u.find_spec(n)])",
                "import loopfuse.streams.gateway.client, loopfuse.integrations.hermes",
                "print(loopfuse.__file__)",
            ]
        ),
        cwd="/",
    )
    assert probe.returncode == 0, probe.stderr
    tops, worker_modules, where = probe.stdout.splitlines()
    assert tops == "['loopfuse']"
    # croniter is hermes-agent's own (6.x): only Faust's stack is absent
    assert worker_modules in ("[]", "['croniter']")
    assert where.startswith(str(gateway.root))


def test_replay_on_the_base_install_gives_the_development_installs_bytes(
    gateway: GatewayVenv, tmp_path: Path
) -> None:
    events = FIXTURES / "polling_loop.jsonl"
    config = FIXTURES / "small.json5"
    base = gateway.run(
        gateway.root / "bin" / "loopfuse", "replay", "--config", config, events, cwd=tmp_path
    )
    dev = subprocess.run(
        [
            sys.executable,
            "-m",
            "loopfuse.streams.cli",
            "replay",
            "--config",
            str(config),
            str(events),
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    assert base.returncode == 0, base.stderr
    assert base.stdout == dev.stdout and '"action":"block"' in base.stdout


def test_the_worker_on_the_base_install_says_in_one_line_what_to_install(
    gateway: GatewayVenv, tmp_path: Path
) -> None:
    worker = gateway.run(gateway.root / "bin" / "loopfuse", "worker", cwd=tmp_path)
    assert worker.returncode == 2
    assert worker.stderr.strip().splitlines() == [
        "loopfuse worker: needs the worker's dependencies (Faust, RocksDB): "
        'pip install "loopfuse[worker]"'
    ]


def test_the_hermes_plugins_tests_and_its_agent_loop_pass_on_the_base_install(
    gateway: GatewayVenv, kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    # The tests without the checkout's loopfuse/ beside them: the installed copy is used.
    work = tmp_path / "work"
    shutil.copytree(ROOT / "tests", work / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(ROOT / "pyproject.toml", work / "pyproject.toml")  # pytest's settings
    env = {
        **os.environ,
        "LOOPFUSE_TEST_BROKER": kafka_broker.bootstrap,
        "LOOPFUSE_TEST_BROKER_KIND": kafka_broker.kind,
        "LOOPFUSE_WORKER_PYTHON": sys.executable,
    }
    env.pop("PYTHONPATH", None)
    run = gateway.run(
        gateway.python,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "tests/integration/test_hermes_plugin.py",
        "tests/e2e/test_hermes_agent_loop.py",
        cwd=work,
        env=env,
    )
    summary = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else run.stderr
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    passed = re.search(r"(\d+) passed", summary)
    assert passed and int(passed.group(1)) >= 15, summary
    assert not re.search(r"skipped|failed|error", summary), summary


def test_the_wheel_holds_one_top_level_package(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        check=True,
        timeout=600,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("loopfuse-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert tops == {"loopfuse", f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}.dist-info"}
    assert "loopfuse/schemas/verdict.schema.json" in names
    assert "loopfuse/streams/engine/step.py" in names
    assert "loopfuse/integrations/hermes/plugin.py" in names
    # `loopfuse broker --kafka` from an installed copy: the pom and the broker's settings
    assert {
        "loopfuse/streams/local/kafka/pom.xml",
        "loopfuse/streams/local/kafka/broker.properties",
    } <= set(names)
    assert not any(name.startswith("loopfuse/tests") or "/node_modules/" in name for name in names)
