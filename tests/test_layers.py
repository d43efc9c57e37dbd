"""The layers of docs/architecture.md, read from the code: no import cycle between modules,
each layer importing only the trioserve layers its row allows, and none importing the
third-party libraries it must never know."""

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


#: What each layer may import of trioserve, and nothing else: an allow-list, so a new edge
#: between layers is a decision written here (and in docs/architecture.md), not an accident.
#: ``trioserve`` itself is the package's ``__init__`` (its version). Every top-level module
#: and package has a row; a new one fails the test until it is given its row.
ALLOWED: dict[str, set[str]] = {
    "trioserve": set(),
    "trioserve.errors": set(),
    "trioserve.ends": set(),
    "trioserve.options": set(),
    "trioserve.logs": set(),
    "trioserve.terminal_client": set(),
    "trioserve.metrics": {"trioserve.ends"},
    "trioserve.protocol": {"trioserve.errors"},
    "trioserve.transport": {"trioserve.errors"},
    "trioserve.text": {"trioserve.errors"},
    "trioserve.enginecore": {"trioserve.errors", "trioserve.transport"},
    "trioserve.config": {"trioserve.options", "trioserve.text"},
    "trioserve.sdk": {"trioserve.errors", "trioserve.protocol", "trioserve.transport"},
    # The shared vLLM engine is an SDK backend over EngineCore's client and the text layer.
    "trioserve.engine_programs": {
        "trioserve.enginecore",
        "trioserve.errors",
        "trioserve.options",
        "trioserve.protocol",
        "trioserve.sdk",
        "trioserve.text",
        "trioserve.transport",
    },
    "trioserve.engine": {
        "trioserve",
        "trioserve.ends",
        "trioserve.errors",
        "trioserve.metrics",
        "trioserve.protocol",
    },
    "trioserve.links": {
        "trioserve",
        "trioserve.ends",
        "trioserve.engine",
        "trioserve.enginecore",
        "trioserve.errors",
        "trioserve.metrics",
        "trioserve.protocol",
        "trioserve.text",
        "trioserve.transport",
    },
    "trioserve.http": {
        "trioserve",
        "trioserve.config",
        "trioserve.ends",
        "trioserve.engine",
        "trioserve.errors",
        "trioserve.metrics",
        "trioserve.protocol",
        "trioserve.text",
    },
    "trioserve.server": {
        "trioserve",
        "trioserve.config",
        "trioserve.ends",
        "trioserve.engine",
        "trioserve.errors",
        "trioserve.http",
        "trioserve.links",
        "trioserve.metrics",
        "trioserve.transport",
    },
    # The command line assembles everything.
    "trioserve.cli": {
        "trioserve",
        "trioserve.config",
        "trioserve.engine",
        "trioserve.engine_programs",
        "trioserve.enginecore",
        "trioserve.errors",
        "trioserve.http",
        "trioserve.links",
        "trioserve.logs",
        "trioserve.options",
        "trioserve.server",
        "trioserve.terminal_client",
        "trioserve.text",
        "trioserve.transport",
    },
    "trioserve.__main__": {"trioserve.cli"},
}


def layer_of(module: str) -> str:
    """The top-level module or package ``module`` belongs to (``trioserve.http.app`` ->
    ``trioserve.http``)."""
    return ".".join(module.split(".")[:2])


def disallowed(edges: dict[str, set[str]]) -> list[str]:
    """The imports in ``edges`` that cross into a layer their own layer's row does not list."""
    return sorted(
        f"{name} imports {target}"
        for name, targets in edges.items()
        for target in targets
        if layer_of(target) != layer_of(name) and layer_of(target) not in ALLOWED[layer_of(name)]
    )


def test_a_layer_imports_only_the_layers_it_is_allowed():
    edges = graph()
    missing = sorted({layer_of(name) for name in edges} - ALLOWED.keys())
    assert missing == [], "give each new layer its row in ALLOWED"
    assert disallowed(edges) == []


def test_the_allow_list_catches_an_edge_it_does_not_list():
    # The check itself: the wire protocol reaching up into the HTTP layer is refused;
    # imports within a layer, and the listed ones, are not.
    edges = {
        "trioserve.protocol.codec": {"trioserve.http.app", "trioserve.protocol.messages"},
        "trioserve.http.app": {"trioserve.engine.client"},
    }
    assert disallowed(edges) == ["trioserve.protocol.codec imports trioserve.http.app"]
