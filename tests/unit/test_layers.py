"""The import rules between the package's layers (docs/development.md: the tree).

Layers only point down: schemas <- engine <- worker | gateway | ops <- cli. Every
``import`` in a module counts, at its top or inside a function, except under
``if TYPE_CHECKING:`` (types only, never run). The rules:

* the engine imports no Faust, no Kafka client and no I/O, and of the package only
  the schemas and itself;
* the gateway side (the client and the plugins) and the operator commands import no
  Faust, mode or RocksDB (the base install has none) and nothing of the worker;
* nothing but the CLI imports the local tooling (demo, simulator, broker launchers);
* nothing imports the CLI.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "loopfuse"

#: Third-party and standard modules that do I/O, run an event loop or read a clock.
IO = {
    "aiokafka",
    "aiohttp",
    "asyncio",
    "faust",
    "http",
    "mode",
    "rocksdict",
    "selectors",
    "socket",
    "ssl",
    "subprocess",
    "threading",
    "time",
    "urllib",
}
#: What only the worker's install ([worker] extra) has.
WORKER_ONLY = {"faust", "mode", "rocksdict"}

#: module prefix -> package modules it may import (besides its own layer)
ALLOWED: dict[str, tuple[str, ...]] = {
    "loopfuse.schemas": (),
    "loopfuse.streams": (),
    "loopfuse.streams.engine": ("loopfuse.schemas",),
    "loopfuse.streams.settings": ("loopfuse.schemas",),
    "loopfuse.streams.end_offsets": (),
    # why a client cannot connect (one line naming the setting): every edge that connects
    "loopfuse.streams.broker_access": (),
    "loopfuse.streams.gateway": (
        "loopfuse.schemas",
        "loopfuse.streams.engine",
        "loopfuse.streams.settings",
        "loopfuse.streams.broker_access",
    ),
    "loopfuse.integrations": (
        "loopfuse.schemas",
        "loopfuse.streams.engine",
        "loopfuse.streams.settings",
        "loopfuse.streams.gateway",
        "loopfuse.streams.broker_access",
    ),
    "loopfuse.streams.ops": (
        "loopfuse.schemas",
        "loopfuse.streams.engine",
        "loopfuse.streams.settings",
        "loopfuse.streams.end_offsets",
        "loopfuse.streams.broker_access",
    ),
    "loopfuse.streams.worker": (
        "loopfuse.schemas",
        "loopfuse.streams.engine",
        "loopfuse.streams.settings",
        "loopfuse.streams.end_offsets",
        "loopfuse.streams.broker_access",
    ),
    # offline replay: the session fold without Kafka
    "loopfuse.streams.replay": (
        "loopfuse.schemas",
        "loopfuse.streams.engine",
        "loopfuse.streams.worker.fold",
        "loopfuse.streams.worker.outgoing",
    ),
    "loopfuse.streams.local": (
        "loopfuse.schemas",
        "loopfuse.streams.engine",
        "loopfuse.streams.settings",
        "loopfuse.streams.end_offsets",
        "loopfuse.streams.gateway",
        "loopfuse.streams.worker",
        "loopfuse.streams.ops",
    ),
    "loopfuse.streams.cli": ("loopfuse",),
}
#: The base install (no [worker] extra) runs these: they may not import WORKER_ONLY.
BASE = (
    "loopfuse.schemas",
    "loopfuse.streams.engine",
    "loopfuse.streams.settings",
    "loopfuse.streams.end_offsets",
    "loopfuse.streams.broker_access",
    "loopfuse.streams.gateway",
    "loopfuse.integrations",
    "loopfuse.streams.ops",
    "loopfuse.streams.replay",
    "loopfuse.streams.cli",
    "loopfuse.streams.worker.fold",
    "loopfuse.streams.worker.outgoing",
    "loopfuse.streams.worker.processor",
    "loopfuse.streams.worker.progress",
)


def _modules() -> Iterator[tuple[str, Path]]:
    for folder, _, files in os.walk(PACKAGE, followlinks=True):
        for name in files:
            if name.endswith(".py"):
                path = Path(folder) / name
                parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
                if parts[-1] == "__init__":
                    parts = parts[:-1]
                yield ".".join(parts), path


def _type_checking_block(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")
    )


def imports_of(module: str, path: Path) -> set[str]:
    """Every module ``path`` imports when it runs (absolute names)."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if _type_checking_block(node):
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the module's package
                base = module.split(".")[: -node.level or None]
                if path.name == "__init__.py":
                    base = module.split(".")[: len(module.split(".")) - node.level + 1]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            found.add(prefix)
            found.update(f"{prefix}.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return found


def _layer(module: str) -> str:
    return max(
        (prefix for prefix in ALLOWED if module == prefix or module.startswith(prefix + ".")),
        key=len,
    )


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


MODULES = sorted(_modules())


def test_the_package_is_walked_through_its_links() -> None:
    names = {module for module, _ in MODULES}
    assert {
        "loopfuse.streams.engine.step",
        "loopfuse.streams.worker.app",
        "loopfuse.streams.gateway.client",
        "loopfuse.integrations.hermes.plugin",
        "loopfuse.schemas.events",
        "loopfuse.streams.ops.audit",
    } <= names
    assert all(_layer(module) for module in names if module != "loopfuse")


@pytest.mark.parametrize(
    ("module", "path"),
    [m for m in MODULES if m[0] != "loopfuse"],
    ids=[m[0] for m in MODULES if m[0] != "loopfuse"],
)
def test_imports_point_down(module: str, path: Path) -> None:
    layer = _layer(module)
    allowed = (layer, *ALLOWED[layer])
    imported = imports_of(module, path)
    wrong = sorted(
        name
        for name in imported
        if _under(name, "loopfuse")
        and not any(_under(name, prefix) for prefix in allowed)
        # a package's own name, imported for a submodule of an allowed one
        and not any(_under(prefix, name) for prefix in allowed)
    )
    assert wrong == [], f"{module} ({layer}) imports {wrong}"
    if layer == "loopfuse.streams.engine":
        io = sorted(name for name in imported if name.split(".")[0] in IO)
        assert io == [], f"the engine's {module} imports {io}"
    if any(_under(module, prefix) for prefix in BASE):
        heavy = sorted(name for name in imported if name.split(".")[0] in WORKER_ONLY)
        assert heavy == [], f"{module} runs on the base install but imports {heavy}"


def test_only_the_cli_imports_the_local_tooling() -> None:
    users = sorted(
        module
        for module, path in MODULES
        if not _under(module, "loopfuse.streams.local")
        and module != "loopfuse.streams.cli"
        and any(_under(name, "loopfuse.streams.local") for name in imports_of(module, path))
    )
    assert users == []


def test_the_rules_can_fail(tmp_path: Path) -> None:
    """A sample that breaks each rule is caught (the walker sees nested imports too)."""
    sample = tmp_path / "step.py"
    sample.write_text("def f():\n    import faust\n    from loopfuse.streams.local import demo\n")
    imported = imports_of("loopfuse.streams.engine.step", sample)
    assert {"faust", "loopfuse.streams.local.demo"} <= imported
    guarded = tmp_path / "typed.py"
    guarded.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import faust\n")
    assert "faust" not in imports_of("loopfuse.streams.gateway.typed", guarded)
