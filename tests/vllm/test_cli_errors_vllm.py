"""`--vllm` mistakes as a user meets them, with vLLM installed: one line that says what
vLLM refused, exit status 2 (the command line is wrong), no traceback, no vLLM usage text."""

from __future__ import annotations

import subprocess

import pytest

from tests.helpers.vllm_session import HOW_TO_RUN, ROOT, START_GUARD, vllm_env, vllm_python

USAGE = 2


def trioserve(*args: str) -> subprocess.CompletedProcess[str]:
    python = vllm_python()
    if python is None:
        pytest.skip(HOW_TO_RUN)
    return subprocess.run(
        [python, "-m", "trioserve", *args],
        capture_output=True,
        text=True,
        timeout=START_GUARD,
        stdin=subprocess.DEVNULL,
        env={**vllm_env(), "PYTHONPATH": str(ROOT / "src")},
    )


def the_error(result: subprocess.CompletedProcess[str]) -> str:
    """The one line that is the error (log lines of the start may come before it, vLLM's
    import among them)."""
    assert result.returncode == USAGE, result.stderr
    assert "Traceback" not in result.stderr and "usage:" not in result.stderr, result.stderr
    lines = result.stderr.splitlines()
    [line] = [line for line in lines if " ERROR " in line or ": error: " in line]
    return line


def test_a_bad_value_in_vllm_args_is_vllms_one_line_and_status_2():
    result = trioserve(
        "run", "--vllm", "org/model", "--port", "0", "--vllm-args", "--max-model-len abc"
    )
    line = the_error(result)
    # vLLM's own argparse message, as the direct path's launcher reduces it to one line.
    assert "argument --max-model-len: invalid" in line and "'abc'" in line, line
    assert "exited with code" not in result.stderr  # its line said it all


def test_an_engine_whose_model_directory_does_not_exist_is_one_line(tmp_path):
    missing = tmp_path / "no" / "model"
    line = the_error(trioserve("engine", "vllm", str(missing), "--bind", "tcp://127.0.0.1:0"))
    assert f"{missing}: no such directory, and not a Hugging Face model name" in line
