"""The docs stay true: README.md and docs/*.md name every worker setting and command,
their links resolve, and their shell examples use commands, flags and modules that
exist; the examples that can run here (offline, on files in the repository) run."""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import json
import re
import shlex
import subprocess
import sys
import unicodedata
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

from loopfuse.streams.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]
#: every Markdown file whose links are checked: the docs and the OpenClaw package's README
LINKED = [*DOCS, ROOT / "integrations" / "openclaw" / "README.md"]
SHELL_LANGUAGES = {"sh", "bash", "console", "shell"}


def read(path: Path) -> str:
    return path.read_text()


def where(path: Path, line: int) -> str:
    return f"{path.relative_to(ROOT)}:{line}"


# -- markdown ---------------------------------------------------------------------------

FENCE = re.compile(r"^\s*(```+|~~~+)\s*([\w+-]*)")


def fenced_blocks(text: str) -> Iterator[tuple[str, int, list[str]]]:
    """(language, line number of the first line, lines) of each fenced code block."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        fence, language = opening.group(1), opening.group(2).lower()
        body: list[str] = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i])
            i += 1
        yield language, i - len(body) + 1, body
        i += 1


def prose(text: str) -> str:
    """The text with fenced code blocks blanked out (line numbers kept)."""
    lines = text.splitlines()
    for _, first, body in fenced_blocks(text):
        for n in range(first - 2, first + len(body)):
            if 0 <= n < len(lines):
                lines[n] = ""
    return "\n".join(lines)


INLINE_CODE = re.compile(r"(`+)(.+?)\1", re.S)


def inline_code(text: str) -> Iterator[tuple[int, str]]:
    """(line number, content) of each inline code span outside fenced blocks."""
    body = prose(text)
    for span in INLINE_CODE.finditer(body):
        yield body.count("\n", 0, span.start()) + 1, " ".join(span.group(2).split())


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: rendered text, lower case, punctuation dropped."""
    rendered = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links: their text
    rendered = re.sub(r"<[^>]+>", "", rendered).replace("`", "").replace("**", "")
    kept = "".join(
        c
        for c in rendered.strip().lower()
        if c.isalnum() or c in "-_ " or unicodedata.category(c).startswith("M")
    )
    return kept.replace(" ", "-")


def anchors(text: str) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    for line in prose(text).splitlines():
        heading = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading:
            base = slug(heading.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    found |= set(re.findall(r"<a\s+(?:id|name)=\"([^\"]+)\"", text))
    return found


LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def links(text: str) -> Iterator[tuple[int, str]]:
    body = INLINE_CODE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), prose(text))
    for link in LINK.finditer(body):
        yield body.count("\n", 0, link.start()) + 1, link.group(1)
    for n, line in enumerate(body.splitlines(), 1):
        reference = re.match(r"\s*\[[^\]]+\]:\s*(\S+)", line)
        if reference:
            yield n, reference.group(1)


# -- shell examples ----------------------------------------------------------------------


def shell_commands(text: str) -> Iterator[tuple[int, list[str]]]:
    """Each command of each line of the shell blocks, as tokens (comments, prompts,
    variable assignments and redirections dropped; `&&`, `;` and `|` split commands)."""
    for language, first, body in fenced_blocks(text):
        if language not in SHELL_LANGUAGES:
            continue
        joined: list[tuple[int, str]] = []
        for n, line in enumerate(body, first):
            if joined and joined[-1][1].endswith("\\"):
                joined[-1] = (joined[-1][0], joined[-1][1][:-1] + " " + line)
            else:
                joined.append((n, line))
        for n, line in joined:
            line = re.sub(r"^\s*\$\s+", "", line)
            lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
            lexer.whitespace_split = True
            command: list[str] = []
            skip_next = False
            for token in [*lexer, ";"]:
                if skip_next:
                    skip_next = False
                elif token in {"&&", "||", ";", "|", "&"}:
                    if command:
                        yield n, command
                    command = []
                elif token in {">", ">>", "<", "2>", ">&"}:
                    skip_next = True
                elif not command and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", token):
                    continue  # an environment assignment before the command
                else:
                    command.append(token)


def inline_commands(text: str) -> Iterator[tuple[int, list[str]]]:
    """Inline code that shows a command line, placeholders and all: loopfuse, ./dev,
    python, pytest or a benchmark script (not a message that starts with the word:
    those end a sentence)."""
    command = re.compile(r"(\.venv/bin/)?(loopfuse|python3?|pytest) |\./dev |bench/\w+\.py( |$)")
    for n, span in inline_code(text):
        if command.match(span) and not re.search(r"[.;,]( |$)", span):
            if span.startswith("bench/"):
                span = f"python {span}"
            yield n, span.replace("\\|", " ").replace("[", " ").replace("]", " ").split()


def options(parser: argparse.ArgumentParser) -> set[str]:
    return {flag for action in parser._actions for flag in action.option_strings}


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser] | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return None


def flag_problems(tokens: list[str], known: set[str]) -> list[str]:
    flags = [t.split("=", 1)[0] for t in tokens if t.startswith("-") and t != "-"]
    return [f"unknown flag {flag}" for flag in flags if flag not in known]


def loopfuse_problems(tokens: list[str]) -> list[str]:
    """A loopfuse command line against the CLI's own parser: each subcommand exists and
    each flag is one of the (sub)command it follows (values may be placeholders)."""
    from loopfuse.streams.cli import build_parser

    parser = build_parser()
    i = 0
    while (choices := subcommands(parser)) is not None:
        while i < len(tokens) and tokens[i].startswith("-"):
            if tokens[i] not in options(parser):
                return [f"unknown flag {tokens[i]}"]
            i += 1
        if i == len(tokens):
            return [] if i > 0 else ["no subcommand"]
        if tokens[i] not in choices:
            return [f"unknown command {tokens[i]!r}"]
        parser = choices[tokens[i]]
        i += 1
    return flag_problems(tokens[i:], options(parser))


@cache
def script_flags(path: Path) -> frozenset[str]:
    """The flags an argparse script defines (``add_argument("--x", ...)``)."""
    flags = {"-h", "--help"}
    for node in ast.walk(ast.parse(path.read_text())):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "add_argument"
        ):
            continue
        names = [
            a.value
            for a in node.args
            if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.startswith("-")
        ]
        flags.update(names)
        for keyword in node.keywords:
            if keyword.arg == "action" and "BooleanOptional" in ast.unparse(keyword.value):
                flags.update("--no-" + n[2:] for n in names if n.startswith("--"))
    return frozenset(flags)


@cache
def dev_commands() -> frozenset[str]:
    """The subcommands of the ./dev script's case statement."""
    script = (ROOT / "dev").read_text()
    case = script[script.index('case "$cmd" in') : script.index("esac")]
    return frozenset(re.findall(r"^\s+([a-z][a-z-]*)\)", case, re.M))


def path_problems(tokens: list[str]) -> list[str]:
    paths = [t.split("::")[0] for t in tokens if not t.startswith("-") and "/" in t]
    return [f"no such path {p}" for p in paths if not (ROOT / p).exists()]


def command_problems(tokens: list[str]) -> list[str]:
    program = tokens[0].removeprefix(".venv/bin/")
    rest = tokens[1:]
    if program == "loopfuse":
        return loopfuse_problems(rest)
    if program == "./dev":
        if not rest or rest[0] not in dev_commands():
            return [f"./dev has no command {rest[:1]}"]
        if rest[0] == "demo":  # ./dev demo runs loopfuse demo "$@"
            return loopfuse_problems(rest)
        return path_problems(rest[1:])  # ./dev test: pytest's arguments
    if program in {"python", "python3"}:
        if rest[:1] == ["-m"]:
            spec = importlib.util.find_spec(rest[1])
            if spec is None or spec.origin is None:
                return [f"no module {rest[1]}"]
            return flag_problems(rest[2:], set(script_flags(Path(spec.origin))))
        script = ROOT / rest[0]
        if not script.is_file():
            return [f"no such script {rest[0]}"]
        return flag_problems(rest[1:], set(script_flags(script)))
    if program == "pytest":
        return path_problems(rest)
    return []  # pip, docker, npm, cd, gateways' own commands: not ours to check


def all_commands() -> Iterator[tuple[str, list[str]]]:
    for doc in DOCS:
        text = read(doc)
        for n, tokens in [*shell_commands(text), *inline_commands(text)]:
            yield where(doc, n), tokens


# -- what the docs must name --------------------------------------------------------------


def test_every_setting_is_documented() -> None:
    configuration = read(ROOT / "docs" / "configuration.md")
    missing = [n for n in Settings.model_fields if f"LOOPFUSE_{n.upper()}" not in configuration]
    assert missing == []


def test_quickstart_gives_the_two_commands_that_ci_uses() -> None:
    readme = read(README)
    assert "./dev demo" in readme and "./dev test" in readme
    assert "./dev test" in (ROOT / ".ci" / "run").read_text()


def test_every_command_is_in_the_commands_table() -> None:
    from loopfuse.streams.cli import build_parser

    commands = subcommands(build_parser())
    assert commands
    missing = [name for name in commands if f"| `loopfuse {name}" not in read(README)]
    assert missing == []


def test_every_input_event_type_is_in_the_wire_format() -> None:
    from loopfuse.schemas.events import IDENTIFIERS_OF

    wire = read(ROOT / "docs" / "wire-format.md")
    types = [event.__struct_config__.tag for event in IDENTIFIERS_OF]
    assert len(types) == 4
    assert [t for t in types if f"| `{t}` |" not in wire] == []


def test_the_readme_leads_to_every_doc() -> None:
    linked = {target.split("#")[0] for _, target in links(read(README))}
    assert [d.name for d in DOCS[1:] if f"docs/{d.name}" not in linked] == []


# -- links ---------------------------------------------------------------------------------


def test_every_relative_link_resolves() -> None:
    broken = []
    for doc in LINKED:
        text = read(doc)
        for n, target in links(text):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                continue
            path_part, _, fragment = target.partition("#")
            path = (doc.parent / path_part).resolve() if path_part else doc
            if not path.exists():
                broken.append(f"{where(doc, n)}: {target}: no such file")
            elif fragment and path.suffix == ".md" and fragment not in anchors(read(path)):
                broken.append(f"{where(doc, n)}: {target}: no such anchor")
    assert broken == []


def test_anchors_are_githubs() -> None:
    assert slug("Worker settings (`LOOPFUSE_*` environment variables)") == (
        "worker-settings-loopfuse_-environment-variables"
    )
    assert slug("Rules beyond OpenClaw's detector (`loopfuse.rules`, opt-in)") == (
        "rules-beyond-openclaws-detector-loopfuserules-opt-in"
    )
    assert anchors("# A\n## A\n```sh\n# not a heading\n```\n") == {"a", "a-1"}


# -- shell examples -------------------------------------------------------------------------


def test_shell_examples_use_commands_and_flags_that_exist() -> None:
    problems = [
        f"{place}: {' '.join(tokens)}: {problem}"
        for place, tokens in all_commands()
        for problem in command_problems(tokens)
    ]
    assert problems == []


def test_the_checks_see_the_examples() -> None:
    programs = [tokens[0].removeprefix(".venv/bin/") for _, tokens in all_commands()]
    assert {"loopfuse", "./dev", "python", "pytest"} <= set(programs)
    assert programs.count("loopfuse") >= 20


@pytest.mark.parametrize(
    "line, problem",
    [
        ("loopfuse replay --confg x.json5 e.jsonl", "unknown flag --confg"),
        ("loopfuse replay -v e.jsonl", "unknown flag -v"),
        ("loopfuse config chek FILE", "unknown command 'chek'"),
        ("./dev lnit", "./dev has no command ['lnit']"),
        ("./dev demo --kafak", "unknown flag --kafak"),
        ("python -m loopfuse.streams.nope", "no module loopfuse.streams.nope"),
        ("python bench/stream.py --no-curvee", "unknown flag --no-curvee"),
    ],
)
def test_a_wrong_example_is_caught(line: str, problem: str) -> None:
    [(_, tokens)] = shell_commands(f"```sh\n{line}   # a comment\n```\n")
    assert command_problems(tokens) == [problem]


def test_placeholders_and_booleans_pass() -> None:
    for line in [
        "loopfuse -v broker --kafka --data-dir D --port N",
        "loopfuse replay --no-progress -",
        "python bench/stream.py --no-curve",
        "LOOPFUSE_LONG=1 .venv/bin/pytest -s tests/reliability",
    ]:
        [(_, tokens)] = shell_commands(f"```sh\n{line}\n```\n")
        assert command_problems(tokens) == [], line


def loopfuse_command() -> list[str]:
    script = Path(sys.executable).with_name("loopfuse")
    return [str(script)] if script.exists() else [sys.executable, "-m", "loopfuse.streams.cli"]


def runnable_examples() -> list[tuple[str, list[str]]]:
    """The docs' replay and config check examples whose files are in the repository."""
    found: dict[tuple[str, ...], str] = {}
    for place, tokens in all_commands():
        if tokens[0].removeprefix(".venv/bin/") != "loopfuse":
            continue
        args = tokens[1:]
        if args[:1] == ["replay"] or args[:2] == ["config", "check"]:
            files = [t for t in args[1:] if not t.startswith("-") and t not in {"check"}]
            if files and all((ROOT / f).is_file() for f in files):
                found.setdefault(tuple(args), place)
    return [(place, list(args)) for args, place in found.items()]


def test_the_cli_help_runs() -> None:
    shown = subprocess.run(
        [*loopfuse_command(), "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert shown.returncode == 0, shown.stderr
    from loopfuse.streams.cli import build_parser

    assert all(name in shown.stdout for name in subcommands(build_parser()) or {})


def test_the_examples_that_can_run_here_run() -> None:
    examples = runnable_examples()
    assert {args[0] for _, args in examples} == {"replay", "config"}
    for place, args in examples:
        ran = subprocess.run(
            [*loopfuse_command(), *args], cwd=ROOT, capture_output=True, text=True, timeout=60
        )
        assert ran.returncode == 0, f"{place}: loopfuse {' '.join(args)}: {ran.stderr}"
        assert ran.stdout.strip(), place
        if args[0] == "replay":
            kinds = {json.loads(line)["type"] for line in ran.stdout.splitlines()}
            assert kinds <= {"verdict", "loop_event", "dead_letter"} and "verdict" in kinds


def test_python_examples_import_what_exists() -> None:
    missing = []
    for doc in DOCS:
        for language, first, body in fenced_blocks(read(doc)):
            if language != "python":
                continue
            tree = compile(
                "\n".join(body),
                str(doc),
                "exec",
                flags=ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT,
            )
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module:
                    module = importlib.import_module(node.module)
                    missing += [
                        f"{where(doc, first)}: {node.module}.{a.name}"
                        for a in node.names
                        if not hasattr(module, a.name)
                    ]
    assert missing == []
