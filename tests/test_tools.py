"""Smoke runs of the measuring tools (seconds, no thresholds), so they cannot rot."""

from __future__ import annotations

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
