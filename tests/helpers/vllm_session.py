"""The vLLM processes of the real-engine tests (tests/vllm/conftest.py starts them once a
session): which interpreter has vLLM, the model's options, a process and its log, and vLLM's
own figures read from its Prometheus metrics."""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import attrs

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
#: The reference server's tool-call options: vLLM's hermes parser, as the tool tests'
#: frontends have it (``--tool-call-parser hermes``), so both read the same calls.
REFERENCE_TOOL_PARSER = "hermes"
REFERENCE_TOOL_OPTIONS = ["--enable-auto-tool-choice", "--tool-call-parser", REFERENCE_TOOL_PARSER]
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


def vllm_cpus() -> set[int] | None:
    """The CPUs vLLM's processes run on: every CPU this process may use but one, which is
    left to the frontend under test and to the tests' clients (None with one CPU).

    While vLLM generates, its EngineCore and worker processes keep busy on every CPU they
    may use, and on a two-core machine they kept the rest off the CPU for seconds at a
    time: the frontend these tests run in-process sat runnable but unscheduled for up to
    8 s (its thread's run-queue wait in /proc/self/task/*/schedstat), and a process that
    only sleeps 10 ms in a loop for up to 7 s. A 4000-token answer then finished before
    the frontend could run to send its abort (or to notice a disconnect or a deadline),
    and the abort tests failed for a reason that is not the frontend's. With vLLM kept
    off one CPU, the longest wait measured was 29 ms.
    """
    cpus = sorted(os.sched_getaffinity(0))
    return set(cpus[:-1]) if len(cpus) > 1 else None


def start(python: str, args: list[str], log: Path) -> VllmProcess:
    cpus = vllm_cpus()
    # The child inherits the affinity of the thread that starts it, and vLLM's own
    # children inherit it from there; this thread gets its own back at once.
    own = os.sched_getaffinity(0)
    with log.open("wb") as out:
        if cpus is not None:
            os.sched_setaffinity(0, cpus)
        try:
            process = subprocess.Popen(
                [python, *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=vllm_env(),
                cwd=ROOT,
                start_new_session=True,  # the whole group (vLLM's EngineCore too) is stopped
            )
        finally:
            os.sched_setaffinity(0, own)
    return VllmProcess(process, log)


def answers(url: str) -> bool:
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
        """The shared engine's figures (vLLM's names, and the SDK's)."""
        return prometheus_figures(self.metrics_url)

    def reference_metrics(self) -> dict[str, float]:
        """``vllm serve``'s own figures, beside the engine's."""
        return prometheus_figures(self.reference_url + "/metrics")


def prometheus_figures(url: str) -> dict[str, float]:
    """The ``vllm:`` and ``trioserve_engine_`` figures of a Prometheus exposition:
    name{labels} -> value, the engine and model labels left out."""
    with urllib.request.urlopen(url, timeout=10) as response:
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


@attrs.define
class SecondEngine:
    address: str
    metrics_url: str

    def running(self) -> float:
        """vLLM's own running count, from this engine's metrics."""
        return prometheus_figures(self.metrics_url)["vllm:num_requests_running"]
