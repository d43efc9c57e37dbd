"""Smoke runs of the measuring tools (seconds, no thresholds), so they cannot rot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

pytestmark = pytest.mark.integration
TOOLS = Path(__file__).parent.parent / "tools"


def run_tool(name: str, out: Path, *args: str, timeout: float) -> str:
    """Run ``tools/<name>`` quietly with its figures written to ``out``; its stdout."""
    result = subprocess.run(
        [sys.executable, str(TOOLS / name), *args, "--quiet", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_abort_latency_tool_runs_and_reports_both_kinds(tmp_path):
    out = tmp_path / "figures.json"
    stdout = run_tool("abort_latency.py", out, "--count", "3", timeout=120)
    assert "| streaming (SSE) | 3 |" in stdout
    assert "| non-streaming (JSON) | 3 |" in stdout
    assert out.exists()


def test_instruction_count_tool_runs_and_reports_both_frontends(tmp_path):
    out = tmp_path / "figures.json"
    args = ("--requests", "6", "--warmup", "2", "--concurrency", "2")
    stdout = run_tool("instructions.py", out, *args, timeout=600)
    assert "| non-streaming (JSON), 16 tokens |" in stdout
    assert "| streaming (SSE), 16 tokens |" in stdout
    figures = json.loads(out.read_text())["results"]
    assert set(figures) == {"trioserve", "reference"}


def test_wakeup_tool_runs_and_reports_every_transport(tmp_path):
    out = tmp_path / "figures.json"
    stdout = run_tool("wakeups.py", out, "--count", "5", "--gaps", "0,1", timeout=120)
    rows = ("TCP loopback", "ZeroMQ DEALER-ROUTER", "ZeroMQ, the caller parked in trio")
    assert all(f"| {row} |" in stdout for row in rows)
    figures = json.loads(out.read_text())["results"]
    assert set(figures) == set(rows)
    assert all(set(cells) == {"0", "1"} for cells in figures.values())


def test_a_capacity_only_bench_run_writes_its_own_section_not_the_main_table(tmp_path):
    sys.path.insert(0, str(TOOLS))
    try:
        import bench
    finally:
        sys.path.remove(str(TOOLS))
    doc = tmp_path / "benchmarks.md"
    main_table = f"{bench.BEGIN}\nthe main table\n{bench.END}"
    doc.write_text(
        f"# B\n\n{main_table}\n\n### Capacity\n\n{bench.CAPACITY_BEGIN}\nold\n"
        f"{bench.CAPACITY_END}\n"
    )
    for scenarios, text in ((["capacity"], "new capacity"), (["json", "capacity"], "new main")):
        begin, end = bench.markers(SimpleNamespace(scenarios=scenarios))
        bench.write_docs(doc, f"{begin}\n{text}\n{end}", begin, end)
        if text == "new capacity":
            assert main_table in doc.read_text()  # the main table survives a capacity run
    written = doc.read_text()
    assert f"{bench.BEGIN}\nnew main\n{bench.END}" in written
    assert f"{bench.CAPACITY_BEGIN}\nnew capacity\n{bench.CAPACITY_END}" in written
