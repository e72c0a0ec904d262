"""README.md names the two commands and every CLI command; docs/configuration.md every
worker setting."""

from pathlib import Path

from loopfuse.streams.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
CONFIGURATION = (ROOT / "docs" / "configuration.md").read_text()


def test_every_setting_is_documented() -> None:
    missing = [name for name in Settings.model_fields if f"LOOPFUSE_{name.upper()}" not in CONFIGURATION]
    assert missing == []


def test_quickstart_gives_the_two_commands_that_ci_uses() -> None:
    assert "./dev demo" in README and "./dev test" in README
    ci = (Path(__file__).resolve().parents[2] / ".ci" / "run").read_text()
    assert "./dev test" in ci


def test_every_command_is_in_the_commands_table() -> None:
    from loopfuse.streams.cli import build_parser

    commands = next(
        action for action in build_parser()._actions if action.dest == "command"
    ).choices
    assert commands
    missing = [name for name in commands if f"| `loopfuse {name}" not in README]
    assert missing == []
