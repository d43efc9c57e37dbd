"""``python -m tools.bench_curve`` runs (a seconds-long smoke run; no thresholds: its figures are
docs/benchmarks.md's)."""

from __future__ import annotations

import json
import subprocess

from tools.toolkit.processes import ROOT, tool_command


def test_the_curve_benchmark_measures_both_mechanisms(tmp_path):
    out = tmp_path / "figures.json"
    done = subprocess.run(
        [
            *tool_command("bench_curve"),
            *("--rounds", "1", "--duration", "0.5", "--warmup", "0.2", "--handshakes", "3"),
            *("--concurrency", "2", "--streams", "4", "--no-pin", "--json", str(out)),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    figures = json.loads(out.read_text())
    for name in ("null", "curve"):
        assert len(figures["handshakes"][name]) == 1
        (run,) = figures["requests"][name]
        assert run["errors"] == 0 and run["streams_failed"] == 0
    assert "curve:" in done.stdout
