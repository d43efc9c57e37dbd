"""A smoke run of ``python -m tools.bench_routing`` (seconds, no thresholds), so it cannot rot."""

from __future__ import annotations

import json
import subprocess

import pytest

from tools.toolkit.processes import ROOT, tool_command

pytestmark = pytest.mark.integration


def test_the_routing_bench_runs_both_policies_and_reports_their_ratios(tmp_path):
    out, doc = tmp_path / "figures.json", tmp_path / "bench.md"
    doc.write_text("# Benchmarks\n")
    args = ["--engines", "2", "--sessions", "3", "--turns", "2", "--concurrency", "2"]
    args += ["--ttft-ms", "20", "--rounds", "1", "--quiet", "--json", str(out)]
    result = subprocess.run(
        [*tool_command("bench_routing"), *args, "--write-docs", str(doc)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "| hit rate (requests that found part of their prompt cached) |" in result.stdout
    runs = json.loads(out.read_text())["runs"]
    assert set(runs) == {"least-load", "affinity"}
    assert all(run[0]["requests"] == 6 for run in runs.values())
    text = doc.read_text()
    assert "<!-- bench-routing:begin -->" in text and "--json" not in text
