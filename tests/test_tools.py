"""Smoke runs of the measuring tools (seconds, no thresholds), so they cannot rot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
TOOLS = Path(__file__).parent.parent / "tools"


def test_abort_latency_tool_runs_and_reports_both_kinds(tmp_path):
    out = tmp_path / "figures.json"
    result = subprocess.run(
        [
            sys.executable,
            str(TOOLS / "abort_latency.py"),
            "--count",
            "3",
            "--quiet",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "| streaming (SSE) | 3 |" in result.stdout
    assert "| non-streaming (JSON) | 3 |" in result.stdout
    assert out.exists()


def test_instruction_count_tool_runs_and_reports_both_frontends(tmp_path):
    out = tmp_path / "figures.json"
    result = subprocess.run(
        [
            sys.executable,
            str(TOOLS / "instructions.py"),
            "--requests",
            "6",
            "--warmup",
            "2",
            "--concurrency",
            "2",
            "--quiet",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    assert "| non-streaming (JSON), 16 tokens |" in result.stdout
    assert "| streaming (SSE), 16 tokens |" in result.stdout
    figures = json.loads(out.read_text())["results"]
    assert set(figures) == {"trioserve", "reference"}
