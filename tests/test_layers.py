"""The layers of docs/architecture.md, read from the code: no import cycle between modules,
and no layer importing what it must never know."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "trioserve"

#: (package, what it must never import): docs/architecture.md's table.
FORBIDDEN = [
    ("trioserve.protocol", ("trio", "zmq", "hypercorn", "trioserve.transport", "trioserve.http")),
    ("trioserve.transport", ("trioserve.protocol", "trioserve.http", "trioserve.engine")),
    # The engine client routes over the engine-link interface: it never imports a link,
    # nor the sockets links use.
    (
        "trioserve.engine",
        (
            "trioserve.http",
            "trioserve.server",
            "trioserve.links",
            "trioserve.transport",
            "zmq",
            "hypercorn",
        ),
    ),
    # Links import the engine client's interface, never the application above it.
    ("trioserve.links", ("trioserve.http", "trioserve.server", "hypercorn")),
    ("trioserve.http", ("trioserve.server", "trioserve.transport", "hypercorn", "zmq")),
    # The SDK is the library only: no engine of its own, no command line.
    (
        "trioserve.sdk",
        (
            "trioserve.http",
            "trioserve.server",
            "trioserve.engine",
            "trioserve.links",
            "hypercorn",
            "trioserve.engine_programs",
            "trioserve.cli",
        ),
    ),
    (
        "trioserve.engine_programs",
        (
            "trioserve.http",
            "trioserve.server",
            "trioserve.engine",
            "trioserve.links",
            "hypercorn",
            "trioserve.cli",
        ),
    ),
    (
        "trioserve.enginecore",
        (
            "trioserve.http",
            "trioserve.server",
            "trioserve.engine",
            "trioserve.links",
            "trioserve.text",
            "hypercorn",
        ),
    ),
    # The application reaches engines through the engine client alone.
    ("trioserve.http", ("trioserve.links",)),
    ("trioserve.ends", ("trioserve.",)),
    ("trioserve.errors", ("trioserve.",)),
    (
        "trioserve.text",
        ("trio", "zmq", "hypercorn", "httpx", "trioserve.http", "trioserve.engine")
        + ("trioserve.transport", "trioserve.server", "trioserve.sdk", "trioserve.protocol"),
    ),
    # Options written once: beneath the settings, knowing nothing of trioserve.
    ("trioserve.options", ("trioserve.",)),
]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> set[str]:
    """Every module ``path`` imports, at run time or for type checking alike."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            found.add(target)
            # "from . import x" and "from .pkg import module" name modules too.
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return found


def graph() -> dict[str, set[str]]:
    modules = {module_name(path): path for path in SRC.rglob("*.py")}
    edges = {}
    for name, path in modules.items():
        edges[name] = {target for target in imports_of(path) if target in modules} - {name}
    return edges


def test_no_import_cycle_between_modules():
    edges = graph()
    # A package's __init__ re-exporting its modules is not a cycle of the design.
    for name in edges:
        edges[name] = {t for t in edges[name] if not name.startswith(t + ".")}
    seen: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        seen[node] = 1
        for target in sorted(edges[node]):
            if seen.get(target) == 1:
                cycles.append([*path[path.index(target) :], target])
            elif target not in seen:
                visit(target, [*path, target])
        seen[node] = 2

    for node in sorted(edges):
        if node not in seen:
            visit(node, [node])
    assert cycles == [], "\n".join(" -> ".join(cycle) for cycle in cycles)


@pytest.mark.parametrize(("package", "forbidden"), FORBIDDEN)
def test_a_layer_never_imports_what_it_must_not_know(package, forbidden):
    offenders = []
    for path in SRC.rglob("*.py"):
        name = module_name(path)
        if name != package and not name.startswith(package + "."):
            continue
        for target in imports_of(path):
            if any(
                target == f or target.startswith(f if f.endswith(".") else f + ".")
                for f in forbidden
            ):
                offenders.append(f"{name} imports {target}")
    assert offenders == []
