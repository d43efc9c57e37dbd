"""The measuring tools are a package (``tools``) whose modules import each other without a
circle, whose library (``tools.toolkit``) imports no program, and whose every module imports
by its dotted name from the repository's root, as ``python -m tools.NAME`` runs it, with no
edit of ``sys.path``."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ROOT / "tools"


def tool_modules() -> dict[str, Path]:
    """Every module of the package by its dotted name (``tools.bench``,
    ``tools.toolkit.load``; a package by its own: ``tools.toolkit``)."""
    modules = {}
    for path in TOOLS.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def imported_tools(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of ``tools`` that ``name`` imports, at the top or inside a function (a
    late import closes a circle as well): ``from tools import loadgen``, ``from
    tools.toolkit import load``, ``from . import load``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}".strip(".")
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        found |= {target for target in targets if target in modules and target != name}
    return found - {"tools"}


def import_graph() -> dict[str, set[str]]:
    modules = tool_modules()
    return {name: imported_tools(name, path, modules) for name, path in modules.items()}


def test_the_tools_import_each_other_without_a_circle():
    graph = import_graph()
    assert graph["tools.bench_vllm"] >= {"tools.bench_vllm_load", "tools.toolkit.processes"}
    assert graph["tools.toolkit.load"] >= {"tools.toolkit.procfs"}  # relative imports read

    def circle_from(name: str, path: list[str]) -> list[str] | None:
        for imported in sorted(graph[name]):
            if imported in path:
                return [*path[path.index(imported) :], imported]
            found = circle_from(imported, [*path, imported])
            if found:
                return found
        return None

    circles = [c for name in sorted(graph) if (c := circle_from(name, [name]))]
    assert circles == []


def test_the_toolkit_imports_no_program():
    for name, imported in import_graph().items():
        if name.startswith("tools.toolkit"):
            programs = {i for i in imported if not i.startswith("tools.toolkit")}
            assert programs == set(), name


def test_no_tool_edits_sys_path():
    for name, path in tool_modules().items():
        assert "sys.path" not in path.read_text(), name


def test_every_tool_imports_by_its_dotted_name_from_the_root():
    # As ``python -m tools.NAME`` finds it: from the root (the current directory), with
    # nothing of tools/ on the path.
    names = sorted(tool_modules())
    script = "import importlib, sys\nfor name in sys.argv[1:]:\n    importlib.import_module(name)"
    result = subprocess.run(
        [sys.executable, "-c", script, *names],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
