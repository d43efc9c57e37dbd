"""Smoke run of the benchmark (``python -m tools.bench --quick``): it runs and reports every figure.

No thresholds: timings belong to the tool's output, not to tests. This only keeps the
measuring instrument (tools.bench, tools.loadgen and tools.toolkit.load,
tools.reference_server) from rotting.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import time

import pytest

from tests.helpers.waiting import HANG_GUARD
from tools.toolkit.processes import ROOT, tool_command
from tools.toolkit.procfs import process_tree, rss_bytes

pytestmark = pytest.mark.integration


def test_bench_quick_reports_every_figure(tmp_path):
    out = tmp_path / "bench.json"
    docs = tmp_path / "benchmarks.md"
    docs.write_text("# Benchmarks\n\nSome text that must survive.\n")
    result = subprocess.run(
        [
            *tool_command("bench"),
            "--quick",
            "--json",
            str(out),
            "--write-docs",
            str(docs),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    figures = json.loads(out.read_text())
    assert figures["failures"] == []
    assert [check["case"] for check in figures["byte_check"]], "the byte comparison ran"
    labels = {"trioserve", "reference"}
    expected = {
        "json_c1_rps",
        "json_c32_rps",
        "json_c1_p99",
        "ttft_added_p50",
        "rss_idle",
        "rss_per_stream",
        "idle_aborted_s",
    }
    assert expected <= set(figures["figures"])
    assert any(key.startswith("stream_") and key.endswith("_cpu_ev") for key in figures["figures"])
    for key, figure in figures["figures"].items():
        assert set(figure["values"]) == labels, key
        for label, series in figure["values"].items():
            assert len(series) == 1, (key, label)
            assert not math.isnan(series[0]), f"{key} missing for {label}"
    assert "loadgen_cpu_pct" in figures["load_side_worst"]

    # The markdown table names every figure, and --write-docs kept the rest of the file.
    for figure in figures["figures"].values():
        assert figure["label"] in result.stdout
    text = docs.read_text()
    assert text.startswith("# Benchmarks\n\nSome text that must survive.\n")
    assert text.count("<!-- bench:begin -->") == 1
    assert text.count("<!-- bench:end -->") == 1


def test_bench_compares_worker_counts_without_the_reference(tmp_path):
    """``--workers``: one frontend per worker count, the last the baseline, the CPU cap
    and the CPU figures over each frontend's whole process tree."""
    out = tmp_path / "bench.json"
    result = subprocess.run(
        [
            *tool_command("bench"),
            "--quick",
            "--no-pin",
            "--no-reference",
            "--scenarios",
            "json,capacity",
            "--trioserve-args",
            "--workers 2",
            "--trioserve-args",
            "--workers 1",
            "--json",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert figures["failures"] == []
    labels = {"trioserve --workers 2", "trioserve --workers 1"}
    for key in ("json_c32_rps", "capacity"):
        assert set(figures["figures"][key]["values"]) == labels
    assert "the baseline is `trioserve --workers 1`" in result.stdout
    assert "| trioserve --workers 2 / trioserve --workers 1 |" in result.stdout


def test_a_frontends_process_tree_holds_its_workers():
    # sh, its sleep, and another sh with a sleep of its own: four processes.
    parent = subprocess.Popen(["sh", "-c", "sleep 30 & sh -c 'sleep 30 & wait' & wait"])
    try:
        deadline = time.monotonic() + HANG_GUARD  # until the last one has started
        while len(tree := process_tree(parent.pid)) < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert tree[0] == parent.pid and len(set(tree)) == 4
        assert rss_bytes(parent.pid) > rss_bytes(tree[-1])
    finally:
        for pid in reversed(process_tree(parent.pid)):
            with contextlib.suppress(ProcessLookupError):  # a sleep whose sh was killed
                os.kill(pid, signal.SIGKILL)
        parent.wait()
