"""``loopfuse`` starts light: ``--help``, each subcommand's ``--help`` and a replay load
only what they use, not the Kafka client, Faust, the terminal library or the webhook
client (their imports were most of the command's 0.4 s start; docs/benchmarks.md).

Each command runs in a fresh interpreter, which then names the heavy packages it had
loaded: a set of modules, not a time, so a loaded machine cannot fail it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: Packages a start must not pay for unless the subcommand uses them.
HEAVY = ("aiokafka", "faust", "rich", "aiohttp", "prometheus_client", "pydantic")

#: Runs ``loopfuse ARGS`` as the console script does, then prints the heavy packages
#: loaded (on stderr's last line: stdout is the command's).
_PROBE = f"""
import json, sys
from loopfuse.streams.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
sys.stdout.flush()
loaded = sorted({{name.split(".")[0] for name in sys.modules}} & set({HEAVY!r}))
print(json.dumps({{"code": code, "loaded": loaded}}), file=sys.stderr)
"""


def loaded_by(*args: str) -> set[str]:
    """The heavy packages ``loopfuse ARGS`` loaded; it must have exited 0."""
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, *args],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    report = json.loads(done.stderr.strip().splitlines()[-1])
    assert report["code"] in (0, None), done.stderr
    return set(report["loaded"])


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        *(
            [command, "--help"]
            for command in ("replay", "worker", "broker", "demo", "audit", "tail", "notify")
        ),
        ["config", "check", "--help"],
    ],
    ids=lambda args: " ".join(args),
)
def test_help_loads_no_heavy_package(args: list[str]) -> None:
    assert loaded_by(*args) == set()


def test_a_replay_loads_no_kafka_client_faust_or_terminal_library(tmp_path: Path) -> None:
    # the engine's models (pydantic) and the fold's metrics come with the replay itself
    empty = tmp_path / "events.jsonl"
    empty.write_bytes(b"")
    assert not loaded_by("replay", str(empty)) & {"aiokafka", "faust", "rich", "aiohttp"}
