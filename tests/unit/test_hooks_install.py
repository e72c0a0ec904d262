"""``loopfuse hooks install|uninstall`` on a temporary HOME (and project): the agent's
settings are merged, never clobbered; installing twice changes nothing; uninstall
takes out exactly what install put in; a file that is not JSON is left alone."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from loopfuse.streams.cli import main

#: A user's own settings, which must survive install and uninstall byte for byte.
CLAUDE_SETTINGS: dict[str, Any] = {
    "model": "opus",
    "permissions": {"allow": ["Bash(npm test:*)"]},
    "hooks": {
        "PreToolUse": [
            {"matcher": "Bash", "hooks": [{"type": "command", "command": "~/bin/guard.sh"}]}
        ],
        "Notification": [{"hooks": [{"type": "command", "command": "notify-send claude"}]}],
    },
}
GEMINI_SETTINGS: dict[str, Any] = {
    "security": {"auth": {"selectedType": "gemini-api-key"}},
    "model": {"disableLoopDetection": False},
    "hooks": {
        "BeforeTool": [{"matcher": "write_file", "hooks": [{"type": "command", "command": "lint"}]}]
    },
}


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    (tmp_path / "project").mkdir()
    monkeypatch.chdir(tmp_path / "project")
    return tmp_path / "home"


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    status = main(["hooks", *args])
    return status, capsys.readouterr().out


def load(path: Path) -> Any:
    return json.loads(path.read_text())


def test_install_on_a_clean_home_writes_each_agents_file(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for agent in ("claude", "codex", "gemini"):
        status, out = run(capsys, "install", agent)
        assert status == 0 and "added the loopfuse hook to" in out
    claude = load(home / ".claude" / "settings.json")
    assert set(claude["hooks"]) == {
        "PreToolUse",
        "PostToolUse",
        "PostToolUseFailure",
        "PostCompact",
        "Stop",
        "SessionEnd",
    }
    [group] = claude["hooks"]["PreToolUse"]
    assert group == {
        "hooks": [
            {
                "type": "http",
                "url": "http://127.0.0.1:7311/claude",
                "timeout": 30,
                "headers": {"X-Loopfuse-Hooks": "1"},
            }
        ]
    }
    codex = load(home / ".codex" / "hooks.json")
    assert set(codex["hooks"]) == {"PreToolUse", "PostToolUse", "PostCompact", "Stop"}
    [hook] = codex["hooks"]["PreToolUse"][0]["hooks"]
    assert hook["type"] == "command" and hook["timeout"] == 30
    assert "http://127.0.0.1:7311/codex" in hook["command"] and "exit 2" not in hook["command"]
    assert hook["command"].endswith(
        """|| echo '{"systemMessage": "the loopfuse hooks service is unreachable: the call """
        """runs by the fail-open policy"}' # loopfuse-hooks"""
    )
    gemini = load(home / ".gemini" / "settings.json")
    assert set(gemini["hooks"]) == {"BeforeTool", "AfterTool", "SessionEnd"}  # not PreCompress
    [hook] = gemini["hooks"]["BeforeTool"][0]["hooks"]
    assert hook["timeout"] == 30_000 and hook["name"] == "loopfuse"
    assert (home / ".claude" / "settings.json").stat().st_mode & 0o777 == 0o600


def test_a_populated_home_keeps_its_settings_through_install_and_uninstall(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    claude_file = home / ".claude" / "settings.json"
    gemini_file = home / ".gemini" / "settings.json"
    claude_file.parent.mkdir()
    gemini_file.parent.mkdir()
    claude_file.write_text(json.dumps(CLAUDE_SETTINGS, indent=4))
    gemini_file.write_text(json.dumps(GEMINI_SETTINGS))
    claude_file.chmod(0o640)
    for agent in ("claude", "gemini"):
        assert run(capsys, "install", agent, "--fail-closed")[0] == 0
    claude = load(claude_file)
    assert claude["model"] == "opus" and claude["permissions"] == CLAUDE_SETTINGS["permissions"]
    assert claude["hooks"]["Notification"] == CLAUDE_SETTINGS["hooks"]["Notification"]
    mine, ours = claude["hooks"]["PreToolUse"]
    assert mine == CLAUDE_SETTINGS["hooks"]["PreToolUse"][0]
    assert ours["hooks"][0]["onFailure"] == "block"
    # only the pre-tool hook fails closed: a Stop hook that blocked would keep Claude going
    assert "onFailure" not in claude["hooks"]["Stop"][0]["hooks"][0]
    command = load(gemini_file)["hooks"]["BeforeTool"][1]["hooks"][0]["command"]
    assert command.startswith("curl -sSf ") and "|| { echo " in command and "exit 2; }" in command
    assert claude_file.stat().st_mode & 0o777 == 0o640
    for agent in ("claude", "gemini"):
        status, out = run(capsys, "uninstall", agent)
        assert status == 0 and "removed the loopfuse hook from" in out
    assert load(claude_file) == CLAUDE_SETTINGS
    assert load(gemini_file) == GEMINI_SETTINGS
    status, out = run(capsys, "uninstall", "claude")
    assert status == 0 and "no loopfuse hooks, nothing changed" in out


def test_install_is_idempotent_and_a_changed_install_replaces_its_entry(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run(capsys, "install", "codex")
    first = (home / ".codex" / "hooks.json").read_text()
    status, out = run(capsys, "install", "codex")
    assert status == 0 and "already installed, nothing changed" in out
    assert (home / ".codex" / "hooks.json").read_text() == first
    status, out = run(capsys, "install", "codex", "--fail-closed", "--url", "http://127.0.0.1:9000")
    assert "replaced the loopfuse hook of PreToolUse" in out
    hooks = load(home / ".codex" / "hooks.json")["hooks"]
    assert [len(groups) for groups in hooks.values()] == [1, 1, 1, 1]
    assert "127.0.0.1:9000/codex || {" in hooks["PreToolUse"][0]["hooks"][0]["command"]
    run(capsys, "uninstall", "codex")
    assert load(home / ".codex" / "hooks.json") == {}


def test_project_settings_are_the_projects(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run(capsys, "install", "claude", "--project", "--token-env", "LOOPFUSE_HOOKS_TOKEN")
    assert not (home / ".claude").exists()
    [hook] = load(Path(".claude/settings.json"))["hooks"]["PreToolUse"][0]["hooks"]
    assert hook["headers"]["Authorization"] == "Bearer $LOOPFUSE_HOOKS_TOKEN"
    assert hook["allowedEnvVars"] == ["LOOPFUSE_HOOKS_TOKEN"]
    run(capsys, "uninstall", "claude", "--project")
    assert load(Path(".claude/settings.json")) == {}


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", '{"hooks": []}', "\udcff"])
def test_a_file_that_cannot_be_merged_is_left_alone(
    home: Path, capsys: pytest.CaptureFixture[str], content: str
) -> None:
    path = home / ".gemini" / "settings.json"
    path.parent.mkdir()
    path.write_bytes(content.encode("utf-8", "surrogateescape"))
    for command in ("install", "uninstall"):
        assert main(["hooks", command, "gemini"]) == 2
        err = capsys.readouterr().err
        assert f"loopfuse hooks {command}: {path}" in err and "left as it is" in err
    assert path.read_bytes() == content.encode("utf-8", "surrogateescape")


def test_the_unit_runs_hooks_serve(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["hooks", "unit", "--", "--fail-closed", "codex"]) == 0
    unit = capsys.readouterr().out
    assert "[Service]" in unit and "Restart=always" in unit
    assert "hooks serve -- --fail-closed codex" not in unit
    assert "hooks serve --fail-closed codex" in unit
    assert main(["hooks", "unit", "--launchd"]) == 0
    assert "<key>KeepAlive</key>" in capsys.readouterr().out
