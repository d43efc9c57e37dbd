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
  model and options: the reference the parity tests compare with.

Each test starts its own trioserve frontend in-process, connected to the shared engine.
"""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

from tests.processes import free_port

ROOT = Path(__file__).resolve().parents[2]
PYTHON_ENV = "TRIOSERVE_VLLM_PYTHON"
HOW_TO_RUN = (
    "vLLM is not installed: `bash tools/install_vllm_cpu.sh .venv-vllm`, then "
    f"`{PYTHON_ENV}=.venv-vllm/bin/python pytest tests/vllm` (docs/engines.md)"
)
MODEL = "tiny"
#: The same vLLM options for the engine and the reference server.
VLLM_OPTIONS = [
    "--served-model-name",
    MODEL,
    "--max-model-len",
    "4096",
    "--enforce-eager",
    "--dtype",
    "float32",
    "--max-num-seqs",
    "64",
]
#: Seconds of frontend silence before the session's engine reclaims its requests, and of
#: engine silence before a test's frontend gives up on it: generous, since two cores
#: running vLLM next to the tests can starve either side for seconds.
FRONTEND_TIMEOUT = 10.0
#: Seconds a vLLM process may take to start (a guard against hangs, not a measurement).
START_GUARD = 600.0


def vllm_python() -> str | None:
    named = os.environ.get(PYTHON_ENV)
    if named:
        return os.path.abspath(named)
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    return None


def vllm_env() -> dict[str, str]:
    return {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB: plenty for the tiny model
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "PYTHONUNBUFFERED": "1",
    }


@attrs.define
class VllmProcess:
    process: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, ready: object, what: str) -> None:
        deadline = time.monotonic() + START_GUARD
        while not ready():  # type: ignore[operator]
            if self.process.poll() is not None:
                raise RuntimeError(f"{what} exited:\n{self.output()[-4000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not start:\n{self.output()[-4000:]}")
            time.sleep(0.5)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


def start(python: str, args: list[str], log: Path) -> VllmProcess:
    with log.open("wb") as out:
        process = subprocess.Popen(
            [python, *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=vllm_env(),
            cwd=ROOT,
            start_new_session=True,  # the whole group (vLLM's EngineCore too) is stopped
        )
    return VllmProcess(process, log)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status == 200
    except OSError:
        return False


@attrs.define
class Vllm:
    """The session's vLLM processes."""

    python: str
    model_dir: Path
    engine: VllmProcess
    #: The engine's ZeroMQ address, for frontends.
    address: str
    #: vLLM's own Prometheus metrics of the engine process.
    metrics_url: str
    reference: VllmProcess
    reference_url: str

    def metrics(self) -> dict[str, float]:
        """vLLM's figures, read from its own Prometheus exposition: name{labels} -> value."""
        with urllib.request.urlopen(self.metrics_url, timeout=10) as response:
            text = response.read().decode()
        figures: dict[str, float] = {}
        for line in text.splitlines():
            match = re.match(
                r"^((?:vllm:|trioserve_engine_)[a-z_:]+)(\{[^}]*\})? ([0-9.eE+-]+|NaN)$", line
            )
            if match:
                labels = re.sub(r',?engine="\d+"|,?model_name="[^"]*"', "", match[2] or "")
                labels = "" if labels in ("{}", "") else "{" + labels.strip("{},") + "}"
                key = match[1] + labels
                figures[key] = figures.get(key, 0.0) + float(match[3])
        return figures


@pytest.fixture(scope="session")
def vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Vllm]:
    python = vllm_python()
    if python is None:
        pytest.skip(HOW_TO_RUN)
    where = tmp_path_factory.mktemp("vllm")
    model_dir = where / "tiny-llama"
    subprocess.run(
        [python, str(ROOT / "tools" / "tiny_llama.py"), str(model_dir)],
        check=True,
        capture_output=True,
        env=vllm_env(),
        timeout=START_GUARD,
    )
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
        + ["--host", "127.0.0.1", "--port", str(reference_port), *VLLM_OPTIONS],
        where / "reference.log",
    )
    try:
        engine.wait_for(lambda: "vLLM engine serving" in engine.output(), "the vLLM engine")
        reference_url = f"http://127.0.0.1:{reference_port}"
        reference.wait_for(lambda: _answers(reference_url + "/health"), "vLLM's API server")
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


@attrs.define
class SecondEngine:
    address: str
    metrics_url: str

    def running(self) -> float:
        """vLLM's own running count, from this engine's metrics."""
        with urllib.request.urlopen(self.metrics_url, timeout=10) as response:
            text = response.read().decode()
        match = re.search(r"^vllm:num_requests_running\{[^}]*\} ([0-9.]+)$", text, re.M)
        assert match, text[:500]
        return float(match[1])


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
