"""Smoke runs of the measuring tools (seconds, no thresholds), so they cannot rot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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
