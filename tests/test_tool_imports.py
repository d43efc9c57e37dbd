"""The measuring tools in tools/ import each other without a circle, the library
(tools/toolkit) imports no program, and every tool imports as it runs."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ROOT / "tools"


def tool_modules() -> dict[str, Path]:
    """Every tool by the name it is imported as from tools/ (``bench``, ``toolkit.load``)."""
    modules = {path.stem: path for path in TOOLS.glob("*.py")}
    for path in (TOOLS / "toolkit").glob("*.py"):
        modules["toolkit" if path.stem == "__init__" else f"toolkit.{path.stem}"] = path
    return modules


def imported_tools(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The tools ``name`` imports, at the top or inside a function (a late import closes a
    circle as well): ``import loadgen``, ``from toolkit import load``, ``from tools import
    fuzz_runner``, ``from . import load``."""
    package = "toolkit" if name.startswith("toolkit") else ""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package if node.level else (node.module or "")
            if node.level and node.module:
                base = f"{package}.{node.module}"
            base = base.removeprefix("tools.").removeprefix("tools")
            targets = [f"{base}.{alias.name}".strip(".") for alias in node.names] + [base]
        else:
            continue
        for target in targets:
            target = target.removeprefix("tools.")
            if target in modules and target != name:
                found.add(target)
    return found


def test_the_tools_import_each_other_without_a_circle():
    modules = tool_modules()
    graph = {name: imported_tools(name, path, modules) for name, path in modules.items()}
    assert graph["bench_vllm"] >= {"bench_vllm_load", "toolkit.load"}  # the graph is read

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
    modules = tool_modules()
    for name, path in modules.items():
        if name.startswith("toolkit"):
            programs = {i for i in imported_tools(name, path, modules) if "toolkit" not in i}
            assert programs == set(), name


def test_every_tool_imports_as_it_runs():
    # A program is run from tools/ (``python tools/bench.py``: its siblings are top-level)
    # or from the root (``python -m tools.fuzz_http``); the child is given both.
    names = sorted(tool_modules())
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    script = "import importlib, sys\nfor name in sys.argv[1:]:\n    importlib.import_module(name)"
    result = subprocess.run(
        [sys.executable, "-c", script, *names],
        cwd=TOOLS,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
