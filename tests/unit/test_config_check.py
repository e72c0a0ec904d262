"""``loopfuse config check``: the config each agent gets, and a bad file named by key path."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from loopfuse.streams.cli import main

CONFIG = """{
  tools: { loopDetection: { enabled: true, warningThreshold: 15, criticalThreshold: 20 } },
  agents: { list: [
    { id: "eager", tools: { loopDetection: { warningThreshold: 25, detectors: { pingPong: false } } } },
    { id: "plain" },
  ] },
  loopfuse: { enforce: false },
}"""


def _rows(text: str, heading: str) -> dict[str, tuple[str, str]]:
    """key -> (value, from) of the table printed under ``heading``."""
    block = text.split(heading, 1)[1].split("\n\n", 1)[0]
    rows = {}
    for line in block.splitlines():
        cells = [c.strip() for c in re.split(r"[│┃]", line) if c.strip()]
        if len(cells) == 3 and cells[0] != "key":
            rows[cells[0]] = (cells[1], cells[2])
    return rows


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "openclaw.json5"
    path.write_text(CONFIG)
    return path


def test_every_agent_after_merge_and_clamping(
    config_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["config", "check", str(config_file)]) == 0
    out = capsys.readouterr().out

    assert "enforce: false (shadow mode" in out
    glob = _rows(out, "global: tools.loopDetection")
    assert glob["warningThreshold"] == ("15", "global")
    assert glob["historySize"] == ("30", "default")
    eager = _rows(out, "agent eager")
    # 25 from the agent over the global 20: critical is clamped above warning.
    assert eager["warningThreshold"] == ("25", "agent")
    assert eager["criticalThreshold"] == ("26", "clamped (set: 20)")
    assert eager["globalCircuitBreakerThreshold"] == ("30", "default")
    assert eager["detectors.pingPong"] == ("false", "agent")
    assert eager["detectors.genericRepeat"] == ("true", "default")
    assert _rows(out, "agent plain")["warningThreshold"] == ("15", "global")


def test_one_agent(config_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "check", str(config_file), "--agent", "plain"]) == 0
    out = capsys.readouterr().out
    assert "agent plain" in out and "agent eager" not in out and "global:" not in out

    assert main(["config", "check", str(config_file), "--agent", "nobody"]) == 0
    out = capsys.readouterr().out
    assert "agent nobody (not in agents.list: gets the global config)" in out
    assert _rows(out, "agent nobody")["warningThreshold"] == ("15", "global")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '{agents: {list: [{id: "a", tools: {loopDetection: {typo: 1}}}]}}',
            "agents.list[0].tools.loopDetection.typo: unknown key",
        ),
        (
            "{tools: {loopDetection: {historySize: 0}}}",
            "tools.loopDetection.historySize: must be a positive integer (got 0)",
        ),
        ("{tools: ", "not valid JSON/JSON5"),
    ],
)
def test_invalid_file_exits_2_naming_the_key_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    path = tmp_path / "bad.json5"
    path.write_text(text)
    assert main(["config", "check", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("loopfuse config check: invalid config: ")
    assert message in captured.err


def test_the_volatile_results_and_identical_calls_rules_are_shown(
    capsys: pytest.CaptureFixture[str],
) -> None:
    root = Path(__file__).resolve().parents[2] / "examples" / "rules"
    assert main(["config", "check", str(root / "volatile-results.json5")]) == 0
    assert "rule volatileResults: masking results of exec, 1 pattern(s) of its own" in (
        capsys.readouterr().out
    )
    assert main(["config", "check", str(root / "identical-calls.json5")]) == 0
    assert (
        "rule identicalCalls: enforced (warningThreshold=3, criticalThreshold=5)"
        in capsys.readouterr().out
    )
