"""trioserve in front of vLLM against vLLM's own API server: CPU per token, TTFT, throughput,
abort latency.

Two sides, started once and driven in alternation for ``--rounds`` rounds (A B, then B A):

- A, trioserve: ``trioserve run --engine ADDRESS`` (the frontend) and ``trioserve engine
  vllm MODEL --bind ADDRESS --metrics-port PORT [vLLM options]`` (the engine adapter: vLLM's
  ``AsyncLLM`` in a process of its own, which renders, tokenizes, detokenizes);
- B, vLLM: ``python -m vllm.entrypoints.openai.api_server --model MODEL [vLLM options]``
  (FastAPI + uvicorn + ``AsyncLLM`` in one process; access log off).

Both with the same model and the same vLLM options, from ``--vllm-python``. Each top
process starts vLLM's EngineCore as a child (the scheduler; on CPU it starts a Worker, the
model, as its own child; Python's multiprocessing adds a resource tracker).

Pinning (with ``taskset`` available and 2+ cores): once both sides are up, every thread of
the processes that are not the model (A: the frontend and the adapter; B: the API server)
goes to core 0, and every thread of their descendants (EngineCore, Worker, resource
tracker) to core 1, where vLLM's OpenMP threads are bound too
(``VLLM_CPU_OMP_THREADS_BIND=1``): the model has core 1 alone. The load generator and this
script run on core 0 (their CPU is measured and reported): on core 1, vLLM's Worker starved
them for seconds at a time.

Figures (each the median over rounds with its range, and A/B per round):

- CPU per token of everything that is not the model: utime + stime (/proc/PID/stat, all
  threads) of A's frontend + adapter, or of B's API server, over a measuring window,
  divided by the tokens vLLM generated meanwhile (``vllm:generation_tokens_total`` from
  each side's own Prometheus metrics, read at both ends of the window). The descendants
  (the model) are measured too and reported apart, never counted;
- non-streaming requests/s and latency at c=32 and c=256 (``--json-tokens`` tokens per
  answer), streaming tokens/s at c=32 and c=256 streams (``--stream-tokens`` per answer,
  next answer on the same connection): ``tools/loadgen.py``'s ``json`` and ``stream``
  modes, every request with ``ignore_eos`` and ``temperature`` 0 so that each answer has
  its full length and both sides generate the same tokens;
- TTFT at c=1: one streaming request at a time, each side alone (the sides' Workers share
  the model's core: in turns, one Worker still spinning after its request delayed the
  other's); time to the first ``data:`` event. vLLM's own view of the same requests (its
  ``vllm:time_to_first_token_seconds`` histogram: from ``AsyncLLM`` taking the request to
  its output processor holding the first token) gives the mean TTFT of the engine alone,
  and what each side adds to it;
- abort latency: a request is generating (SSE: its first event read; JSON: vLLM counts it
  running), the client closes its connection (FIN), and vLLM's ``vllm:num_requests_running``
  is polled until it drops to 0: the time from the close to the first poll that sees 0
  (resolution: one scrape, reported).

Goals, as ratios trioserve / vLLM in one run: CPU per token at most 0.5, TTFT p50 at most
1.0, non-streaming requests/s at c=32 at least 1.5.

    python tools/bench_vllm.py --vllm-python /work/vl/venv/bin/python --model /work/vl/tiny
    python tools/bench_vllm.py --quick --json figures.json      # about 3 minutes
    python tools/bench.py --vllm [the options above]             # the same

All traffic is on 127.0.0.1; every step is bounded in time; every process this script starts
is in a process group of its own, killed at the end (and sent SIGTERM if the script dies).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import math
import os
import re
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

TOOLS = Path(__file__).resolve().parent
sys.path.insert(0, str(TOOLS))

import bench  # noqa: E402  (tools/bench.py: processes, pinning, reporting)
import loadgen  # noqa: E402  (tools/loadgen.py: the load generator and its parsers)

BEGIN, END = "<!-- bench-vllm:begin -->", "<!-- bench-vllm:end -->"
SERVER_CORE, MODEL_CORE = bench.FRONTEND_CORE, bench.LOAD_CORE
#: The load generator and this script share the non-model processes' core: vLLM's Worker
#: starves whatever else runs on its core (a load generator there was not scheduled for
#: seconds at a time while a request generated), and the model should have its core alone.
LOAD_CORE = SERVER_CORE
A, B = "trioserve", "vLLM API server"
GENERATED = "vllm:generation_tokens_total"
RUNNING = "vllm:num_requests_running"
TTFT_SUM, TTFT_COUNT = (
    "vllm:time_to_first_token_seconds_sum",
    "vllm:time_to_first_token_seconds_count",
)
METRIC_RE = re.compile(r"^(vllm:[a-z_:]+)(?:\{[^}]*\})? (\S+)$", re.M)
#: vLLM options both sides get unless ``--vllm-args`` says otherwise.
VLLM_ARGS = "--served-model-name tiny --max-model-len 4096 --enforce-eager --dtype float32"
#: Goals: (figure key, the ratio trioserve / vLLM must be at most (True) or at least.)
GOALS = {"cpu_per_token": (0.5, True), "ttft_p50": (1.0, True), "json_c32_rps": (1.5, False)}


# -- processes ------------------------------------------------------------------------------


def _child_setup() -> None:
    bench._raise_fd_limit()
    # Started on every core (this script's pinning is not theirs); pinned once up.
    os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))
    # SIGTERM to the child when this script dies, however it dies.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def spawn(name: str, command: list[str], workdir: Path, env: dict[str, str]) -> bench.Proc:
    """``command`` in a process group of its own (so that its descendants end with it)."""
    log_path = workdir / f"{name.replace(' ', '_')}-{uuid.uuid4().hex[:6]}.log"
    with open(log_path, "wb") as log_file:
        popen = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env={**env, "PYTHONUNBUFFERED": "1"},
            preexec_fn=_child_setup,
            start_new_session=True,
        )
    return bench.Proc(name, popen, log_path)


def stop_group(proc: bench.Proc, grace: float = 30) -> None:
    """SIGTERM (vLLM then shuts its EngineCore down), then SIGKILL to whatever is left of
    the process group this script started it in."""
    if proc.popen.poll() is None:
        proc.popen.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.popen.wait(grace)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.popen.wait(10)


def group_gone(pgid: int, timeout: float = 10) -> bool:
    """Whether no live process (zombies aside) is left in process group ``pgid``."""
    deadline = time.monotonic() + timeout
    while True:
        left = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                with contextlib.suppress(OSError, IndexError, ValueError):
                    fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
                    if int(fields[2]) == pgid and fields[0] != "Z":
                        left.append(entry)
        if not left or time.monotonic() > deadline:
            return not left
        time.sleep(0.2)


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def comm(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/comm").read_text().strip()
    return "?"


def pin_threads(pid: int, core: int) -> None:
    """Every thread of ``pid`` to ``core`` (threads it starts later inherit it)."""
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                os.sched_setaffinity(int(tid), {core})


def scrape(url: str) -> dict[str, float]:
    """vLLM's Prometheus figures, each summed over its label sets (one retry)."""
    try:
        with urllib.request.urlopen(url, timeout=30) as reply:
            text = reply.read().decode()
    except OSError:
        with urllib.request.urlopen(url, timeout=30) as reply:
            text = reply.read().decode()
    out: dict[str, float] = {}
    for name, value in METRIC_RE.findall(text):
        out[name] = out.get(name, 0.0) + float(value)
    return out


@dataclass
class Side:
    label: str
    procs: list[bench.Proc]
    url: str = ""
    metrics_url: str = ""
    counted: dict[str, int] = field(default_factory=dict)  # the non-model processes
    names: dict[int, str] = field(default_factory=dict)  # their pid -> comm
    model: dict[int, str] = field(default_factory=dict)  # their descendants: pid -> comm

    def alive(self) -> bool:
        return all(proc.popen.poll() is None for proc in self.procs)

    def log_tails(self) -> str:
        return "\n".join(f"--- {p.name}:\n{p.log_tail(1500)}" for p in self.procs)


def wait_ready(side: Side, model: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not side.alive():
            break
        with contextlib.suppress(OSError, ValueError):
            status, _ = chat(side.url, model, {"max_tokens": 2}, timeout=30)
            if status == 200:
                return
        time.sleep(0.5)
    raise RuntimeError(f"{side.label} is not answering:\n{side.log_tails()}")


def chat(url: str, model: str, extra: dict, timeout: float = 30) -> tuple[int, dict]:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": loadgen.PROMPT}],
        "temperature": 0,
        **extra,
    }
    request = urllib.request.Request(
        url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, {}


def start_sides(args: argparse.Namespace, pin: bool, workdir: Path) -> list[Side]:
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(args.kv_cache_gib)}
    if pin:
        env["VLLM_CPU_OMP_THREADS_BIND"] = str(MODEL_CORE)
    py = args.vllm_python
    vllm_args = shlex.split(args.vllm_args)
    address = f"tcp://127.0.0.1:{bench.free_port()}"
    metrics_port, api_port = bench.free_port(), bench.free_port()
    adapter = spawn(
        "adapter",
        [py, "-m", "trioserve", "engine", "vllm", args.model, "--bind", address]
        + ["--metrics-port", str(metrics_port), *vllm_args],
        workdir,
        env,
    )
    api = spawn(
        "api-server",
        [py, "-m", "vllm.entrypoints.openai.api_server", "--model", args.model, *vllm_args]
        + ["--host", "127.0.0.1", "--port", str(api_port), "--disable-uvicorn-access-log"],
        workdir,
        env,
    )
    a = Side(A, [adapter], metrics_url=f"http://127.0.0.1:{metrics_port}/metrics")
    b = Side(B, [api], url=f"http://127.0.0.1:{api_port}")
    b.metrics_url = b.url + "/metrics"
    bench.wait_for_log(adapter, re.compile("vLLM engine serving"), args.start_timeout)
    frontend = spawn(
        "frontend",
        [py, "-m", "trioserve", "run", "--engine", address, "--host", "127.0.0.1", "--port", "0"]
        + ["--max-concurrent-requests", str(max(args.json_levels + args.stream_levels) + 64)],
        workdir,
        env,
    )
    a.procs.insert(0, frontend)
    a.url = bench.wait_for_log(frontend, bench.URL_RE, 60).group(1)
    for side in (a, b):
        wait_ready(side, served_name(args), args.start_timeout)
    a.counted = {"frontend": frontend.pid, "adapter": adapter.pid}
    b.counted = {"frontend": api.pid}
    for side in (a, b):
        for pid in side.counted.values():
            side.names[pid] = comm(pid)
            side.model.update({child: comm(child) for child in descendants(pid)})
            if pin:
                pin_threads(pid, SERVER_CORE)
        if pin:
            for child in side.model:
                pin_threads(child, MODEL_CORE)
    return [a, b]


# -- the load generator's process ------------------------------------------------------------


def loadgen_child(spec: dict) -> dict:
    """Runs in a process of its own, pinned with the load: ``tools/loadgen.py``'s modes with
    vLLM's request body and a meter that also reads vLLM's token counter."""
    mode = spec["mode"]
    if mode == "ttft":
        return run_ttft(spec)
    if mode == "abort":
        return run_abort(spec)
    make_request = loadgen.chat_request

    def chat_request(host: str, body: dict) -> bytes:
        # The mock's knobs out; every answer its full length, the same tokens on both sides.
        body = {k: v for k, v in body.items() if not k.startswith("mock_")}
        body.update(model=spec["model"], ignore_eos=True, temperature=0)
        return make_request(host, body)

    class VllmMeter(loadgen.CpuMeter):
        """CPU of the side's processes, each by name, and the tokens vLLM generated."""

        def __init__(self, _frontend: int | None, _engine: int | None) -> None:
            super().__init__(None, None)
            self.pids = {**spec["counted"], "loadgen": os.getpid()}
            self.pids.update({f"model:{pid}": int(pid) for pid in spec["model_pids"]})
            self._before: dict[str, float] = {}

        def start(self) -> None:  # the scrapes stay outside the CPU window
            self._before = scrape(spec["metrics_url"])
            super().start()

        def stop(self) -> float:
            wall = super().stop()
            after = scrape(spec["metrics_url"])
            r = self.result
            tokens = after.get(GENERATED, 0.0) - self._before.get(GENERATED, 0.0)
            server = sum(r[f"{name}_cpu_s"] for name in spec["counted"])
            model = sum(r[f"model:{pid}_cpu_s"] for pid in spec["model_pids"])
            r.update(
                generated_tokens=tokens,
                tokens_per_s=tokens / wall,
                server_cpu_s=server,
                server_cpu_pct=100 * server / wall,
                model_cpu_pct=100 * model / wall,
                server_cpu_us_per_token=1e6 * server / tokens if tokens else math.nan,
                **{
                    f"{name}_cpu_us_per_token": 1e6 * r[f"{name}_cpu_s"] / tokens
                    if tokens
                    else math.nan
                    for name in spec["counted"]
                },
            )
            return wall

    loadgen.chat_request = chat_request
    loadgen.CpuMeter = VllmMeter  # type: ignore[misc]
    host, port = spec["url"].removeprefix("http://").rsplit(":", 1)
    ns = argparse.Namespace(
        host=host,
        port=int(port),
        duration=spec["duration"],
        warmup=spec["warmup"],
        frontend_pid=None,
        engine_pid=None,
        progress=False,
        concurrency=spec.get("level", 1),
        streams=spec.get("level", 1),
        max_tokens=spec["tokens"],
        stream_tokens=spec["tokens"],
        rate=0.0,
    )
    import uvloop

    runner = loadgen.run_json if mode == "json" else loadgen.run_stream
    return uvloop.run(runner(ns))


def _stream_body(model: str, max_tokens: int) -> dict:
    return {
        "model": model,
        "messages": [{"role": "user", "content": loadgen.PROMPT}],
        "stream": True,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0,
    }


def run_ttft(spec: dict) -> dict:
    """One request at a time on a keep-alive connection to each target in turn (the bench
    gives one target a run); vLLM's TTFT histogram read before and after."""
    targets = spec["targets"]
    socks, requests = [], []
    via: list[list[float]] = [[] for _ in targets]
    before: list[dict[str, float]] = []
    try:
        for target in targets:
            host, port = target["url"].removeprefix("http://").rsplit(":", 1)
            sock = socket.create_connection((host, int(port)), timeout=30)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            socks.append(sock)
            body = _stream_body(spec["model"], spec["tokens"])
            requests.append(loadgen.chat_request(f"{host}:{port}", body))
        for i in range(spec["warmup"] + spec["count"]):
            if i == spec["warmup"]:
                before = [scrape(t["metrics_url"]) for t in targets]
            order = range(len(targets)) if i % 2 == 0 else reversed(range(len(targets)))
            for k in order:
                first = loadgen._first_token(socks[k], requests[k])
                if i >= spec["warmup"]:
                    via[k].append(first)
        after = [scrape(t["metrics_url"]) for t in targets]
    finally:
        for sock in socks:
            sock.close()
    out = {}
    for k, target in enumerate(targets):
        count = after[k].get(TTFT_COUNT, 0) - before[k].get(TTFT_COUNT, 0)
        engine_mean = (after[k].get(TTFT_SUM, 0) - before[k].get(TTFT_SUM, 0)) / count
        mean = statistics.fmean(via[k])
        out[target["label"]] = {
            "count": len(via[k]),
            "engine_count": count,
            "p50_ms": loadgen.percentile(via[k], 50) * 1000,
            "p99_ms": loadgen.percentile(via[k], 99) * 1000,
            "mean_ms": mean * 1000,
            "engine_mean_ms": engine_mean * 1000,
            "added_mean_ms": (mean - engine_mean) * 1000,
        }
    return out


def _running(metrics_url: str) -> float:
    return scrape(metrics_url).get(RUNNING, math.nan)


def _wait_running(metrics_url: str, done: Callable[[float], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not done(_running(metrics_url)):
        if time.monotonic() > deadline:
            raise RuntimeError(f"vLLM's running count stuck at {_running(metrics_url)}")
        time.sleep(0.01)


def run_abort(spec: dict) -> dict:
    """One request at a time: make it generate, close the connection, time until vLLM's
    running count is 0 again."""
    metrics_url = spec["metrics_url"]
    host, port = spec["url"].removeprefix("http://").rsplit(":", 1)
    out: dict = {}
    scrapes: list[float] = []
    for stream in (True, False):
        latencies = []
        for _ in range(spec["count"]):
            _wait_running(metrics_url, lambda n: n == 0, 30)
            body = _stream_body(spec["model"], spec["tokens"])
            body["stream"] = stream
            sock = socket.create_connection((host, int(port)), timeout=30)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                sock.sendall(loadgen.chat_request(f"{host}:{port}", body))
                data = b""
                if stream:  # generating: its first event is here
                    while b"data: " not in data:
                        chunk = sock.recv(65536)
                        if not chunk:
                            raise RuntimeError("closed before the first event")
                        data += chunk
                try:
                    _wait_running(metrics_url, lambda n: n >= 1, 30)
                except RuntimeError as exc:
                    sock.settimeout(1)
                    with contextlib.suppress(OSError):
                        data = sock.recv(2000)
                    raise RuntimeError(f"{exc}; the server sent: {data[:600]!r}") from None
                # Drain what arrived, so that the close sends a FIN (unread data: an RST).
                sock.setblocking(False)
                with contextlib.suppress(BlockingIOError):
                    while sock.recv(1 << 20):
                        pass
            finally:
                t0 = time.perf_counter()
                sock.close()
            deadline = t0 + 30
            while True:
                t = time.perf_counter()
                running = _running(metrics_url)
                scrapes.append(time.perf_counter() - t)
                if running == 0:
                    latencies.append(time.perf_counter() - t0)
                    break
                if t > deadline:
                    raise RuntimeError("vLLM still runs an aborted request after 30 s")
                time.sleep(spec["poll_s"])
        which = "sse" if stream else "json"
        out[f"{which}_p50_ms"] = loadgen.percentile(latencies, 50) * 1000
        out[f"{which}_p99_ms"] = loadgen.percentile(latencies, 99) * 1000
        out[f"{which}_max_ms"] = max(latencies) * 1000
        out[f"{which}_count"] = len(latencies)
    out["scrape_p50_ms"] = loadgen.percentile(scrapes, 50) * 1000
    return out


def run_child(spec: dict, pin: bool, progress: bench.Progress, status: str, timeout: float) -> dict:
    command = [
        *bench.pin_prefix(LOAD_CORE, pin),
        sys.executable,
        str(Path(__file__).resolve()),
        "_loadgen",
        json.dumps(spec),
    ]
    return bench.run_json_tool(command, progress, status, timeout, "the load child")


# -- the plan -------------------------------------------------------------------------------


@dataclass
class Plan:
    rounds: int
    json_levels: list[int]
    stream_levels: list[int]
    json_tokens: int
    stream_tokens: int
    json_duration: float
    json_warmup: float
    stream_duration: float
    stream_warmup: float
    ttft_count: int
    ttft_warmup: int
    ttft_tokens: int
    abort_count: int
    abort_poll_ms: float

    def load_steps(self) -> list[tuple[str, int]]:
        return [("json", c) for c in self.json_levels] + [("stream", n) for n in self.stream_levels]


def build_plan(args: argparse.Namespace) -> Plan:
    quick = args.quick
    return Plan(
        rounds=1 if quick else args.rounds,
        json_levels=args.json_levels,
        stream_levels=args.stream_levels,
        json_tokens=args.json_tokens,
        stream_tokens=args.stream_tokens,
        json_duration=1.5 if quick else args.duration,
        json_warmup=0.5 if quick else 2.0,
        stream_duration=1.5 if quick else args.duration,
        stream_warmup=0.5 if quick else 3.0,
        ttft_count=15 if quick else args.ttft_count,
        ttft_warmup=3 if quick else 10,
        ttft_tokens=4,
        abort_count=3 if quick else args.abort_count,
        abort_poll_ms=2.0,
    )


def measure_round(
    r: int, plan: Plan, sides: list[Side], pin: bool, progress: bench.Progress, model: str
) -> tuple[dict[str, dict[str, dict]], list[str]]:
    results: dict[str, dict[str, dict]] = {side.label: {} for side in sides}
    failures: list[str] = []
    order = sides if r % 2 == 0 else sides[::-1]

    def record(side: Side, step: str, result: dict, summary: str) -> None:
        results[side.label][step] = result
        if "error" in result:
            summary = f"FAILED: {result['error']}"
            failures.append(f"round {r + 1}, {side.label}, {step}: {result['error']}")
        progress.note(f"round {r + 1} {side.label:<16} {step}: {summary}")

    for kind, level in plan.load_steps():
        for side in order:
            if not side.alive():
                record(side, f"{kind}:{level}", {"error": "a process exited"}, "")
                continue
            json_step = kind == "json"
            spec = {
                "mode": kind,
                "level": level,
                "model": model,
                "url": side.url,
                "metrics_url": side.metrics_url,
                "counted": side.counted,
                "model_pids": list(side.model),
                "tokens": plan.json_tokens if json_step else plan.stream_tokens,
                "duration": plan.json_duration if json_step else plan.stream_duration,
                "warmup": plan.json_warmup if json_step else plan.stream_warmup,
            }
            status = f"round {r + 1}/{plan.rounds}: {kind} {level} · {side.label}"
            timeout = 180 + 3 * (spec["duration"] + spec["warmup"])
            result = run_child(spec, pin, progress, status, timeout)
            record(side, f"{kind}:{level}", result, summarize(kind, result))
    # TTFT: one side after the other, each alone. Not in turns request by request: both
    # sides' Workers share the model's core, and a Worker spins on it for a while after its
    # request, so a request to the other side right after waits for that.
    for side in order:
        if not side.alive():
            record(side, "ttft", {"error": "a process exited"}, "")
            continue
        spec = {
            "mode": "ttft",
            "model": model,
            "tokens": plan.ttft_tokens,
            "count": plan.ttft_count,
            "warmup": plan.ttft_warmup,
            "targets": [{"label": side.label, "url": side.url, "metrics_url": side.metrics_url}],
        }
        timeout = 120 + (plan.ttft_count + plan.ttft_warmup) * 2.0
        status = f"round {r + 1}/{plan.rounds}: ttft · {side.label}"
        result = run_child(spec, pin, progress, status, timeout)
        one = result.get(side.label, {"error": result.get("error", "not measured")})
        record(side, "ttft", one, summarize("ttft", one))
    for side in order:
        spec = {
            "mode": "abort",
            "model": model,
            "url": side.url,
            "metrics_url": side.metrics_url,
            "tokens": 3000,
            "count": plan.abort_count,
            "poll_s": plan.abort_poll_ms / 1000,
        }
        status = f"round {r + 1}/{plan.rounds}: abort · {side.label}"
        result = run_child(spec, pin, progress, status, 120 + plan.abort_count * 4 * 10)
        record(side, "abort", result, summarize("abort", result))
    return results, failures


def summarize(kind: str, result: dict) -> str:
    if "error" in result:
        return ""
    if kind in ("json", "stream"):
        rate = (
            f"{result['rps']:.1f} req/s, p50 {result['p50_ms']:.0f} ms"
            if kind == "json"
            else f"ITL p50 {result['itl_p50_ms']:.0f} ms"
        )
        return (
            f"{rate}, {result['tokens_per_s']:.0f} tokens/s, "
            f"{result['server_cpu_us_per_token']:.0f} µs CPU/token "
            f"(non-model {result['server_cpu_pct']:.0f}%, model {result['model_cpu_pct']:.0f}% "
            f"of a core; core 0 {result['cpu0_busy_pct']:.0f}%, core 1 "
            f"{result['cpu1_busy_pct']:.0f}%, others {result['other_cpu_pct']:.0f}%)"
        )
    if kind == "ttft":
        return (
            f"p50 {result['p50_ms']:.1f} ms, mean {result['mean_ms']:.1f} ms, vLLM's own "
            f"mean {result['engine_mean_ms']:.1f} ms (+{result['added_mean_ms']:.1f} ms)"
        )
    return (
        f"SSE p50 {result['sse_p50_ms']:.1f} ms (max {result['sse_max_ms']:.1f}), JSON p50 "
        f"{result['json_p50_ms']:.1f} ms (max {result['json_max_ms']:.1f}); a scrape takes "
        f"{result['scrape_p50_ms']:.1f} ms"
    )


# -- figures and report ---------------------------------------------------------------------


@dataclass
class Row:
    key: str
    label: str
    unit: str
    digits: int
    value: Callable[[dict[str, dict]], float]  # one side's results of one round -> figure


def _get(step: str, name: str, scale: float = 1.0) -> Callable[[dict[str, dict]], float]:
    def value(results: dict[str, dict]) -> float:
        result = results.get(step) or {}
        if "error" in result or result.get(name) is None:
            return math.nan
        return float(result[name]) * scale

    return value


def _pooled(plan: Plan, part: str) -> Callable[[dict[str, dict]], float]:
    """µs of CPU per generated token over every load window of a round; ``part``: the
    non-model processes together ("server") or one of A's two ("frontend", "adapter")."""
    steps = [f"{kind}:{level}" for kind, level in plan.load_steps()]

    def value(results: dict[str, dict]) -> float:
        got = [results.get(step) or {} for step in steps]
        if any("error" in r or not r for r in got):
            return math.nan
        if part != "server" and "adapter_cpu_s" not in got[0]:
            return math.nan  # a part of trioserve's: vLLM's API server is one process
        tokens = sum(r["generated_tokens"] for r in got)
        return 1e6 * sum(r[f"{part}_cpu_s"] for r in got) / tokens if tokens else math.nan

    return value


def rows(plan: Plan) -> list[Row]:
    out = [
        Row(
            "cpu_per_token",
            "CPU per generated token, non-model processes, the load windows pooled",
            "µs",
            1,
            _pooled(plan, "server"),
        ),
        Row(
            "cpu_per_token_frontend",
            "… of which trioserve's frontend",
            "µs",
            1,
            _pooled(plan, "frontend"),
        ),
        Row(
            "cpu_per_token_adapter",
            "… of which the engine adapter",
            "µs",
            1,
            _pooled(plan, "adapter"),
        ),
    ]
    for kind, level in plan.load_steps():
        what = "non-streaming" if kind == "json" else "streaming"
        out.append(
            Row(
                f"cpu_per_token_{kind}_c{level}",
                f"CPU per token, {what} c={level}",
                "µs",
                1,
                _get(f"{kind}:{level}", "server_cpu_us_per_token"),
            )
        )
    for c in plan.json_levels:
        step = f"json:{c}"
        out += [
            Row(
                f"json_c{c}_rps", f"non-streaming c={c}: requests/s", "req/s", 1, _get(step, "rps")
            ),
            Row(
                f"json_c{c}_p50", f"non-streaming c={c}: latency p50", "ms", 1, _get(step, "p50_ms")
            ),
        ]
    for n in plan.stream_levels:
        step = f"stream:{n}"
        out += [
            Row(
                f"stream_c{n}_tps",
                f"streaming c={n}: tokens/s",
                "tok/s",
                0,
                _get(step, "tokens_per_s"),
            ),
            Row(
                f"stream_c{n}_itl50",
                f"streaming c={n}: inter-token p50",
                "ms",
                1,
                _get(step, "itl_p50_ms"),
            ),
            Row(
                f"stream_c{n}_server_cpu",
                f"streaming c={n}: non-model CPU",
                "% of a core",
                0,
                _get(step, "server_cpu_pct"),
            ),
            Row(
                f"stream_c{n}_model_cpu",
                f"streaming c={n}: model CPU (EngineCore + Worker)",
                "% of a core",
                0,
                _get(step, "model_cpu_pct"),
            ),
        ]
    load_steps = [f"{kind}:{level}" for kind, level in plan.load_steps()]
    out.append(
        Row(
            "load_others",
            "other processes' CPU (not these sides: the shared machine), load windows' mean",
            "% of a core",
            0,
            lambda results: statistics.fmean(
                [_get(step, "other_cpu_pct")(results) for step in load_steps] or [math.nan]
            ),
        )
    )
    out += [
        Row(
            "ttft_p50",
            f"TTFT p50, c=1 ({plan.ttft_tokens}-token streams)",
            "ms",
            2,
            _get("ttft", "p50_ms"),
        ),
        Row("ttft_p99", "TTFT p99, c=1", "ms", 2, _get("ttft", "p99_ms")),
        Row("ttft_mean", "TTFT mean, c=1", "ms", 2, _get("ttft", "mean_ms")),
        Row(
            "ttft_engine_mean",
            "vLLM's own TTFT (its histogram), mean",
            "ms",
            2,
            _get("ttft", "engine_mean_ms"),
        ),
        Row(
            "ttft_added_mean",
            "TTFT added over vLLM's own, mean",
            "ms",
            2,
            _get("ttft", "added_mean_ms"),
        ),
        Row(
            "abort_sse_p50",
            "abort, SSE: FIN to vLLM running 0, p50",
            "ms",
            1,
            _get("abort", "sse_p50_ms"),
        ),
        Row("abort_sse_max", "abort, SSE: max", "ms", 1, _get("abort", "sse_max_ms")),
        Row(
            "abort_json_p50",
            "abort, non-streaming: FIN to vLLM running 0, p50",
            "ms",
            1,
            _get("abort", "json_p50_ms"),
        ),
        Row("abort_json_max", "abort, non-streaming: max", "ms", 1, _get("abort", "json_max_ms")),
        Row(
            "abort_scrape",
            "abort: one scrape of vLLM's metrics (the resolution), p50",
            "ms",
            1,
            _get("abort", "scrape_p50_ms"),
        ),
    ]
    return out


def figures_of(plan: Plan, rounds: list[dict[str, dict[str, dict]]]) -> dict[str, dict]:
    out = {}
    for row in rows(plan):
        values = {label: [row.value(rnd.get(label, {})) for rnd in rounds] for label in (A, B)}
        ratios = [
            a / b if not (math.isnan(a) or math.isnan(b) or b == 0) else math.nan
            for a, b in zip(values[A], values[B], strict=True)
        ]
        out[row.key] = {
            "label": row.label,
            "unit": row.unit,
            "digits": row.digits,
            "values": values,
            "ratios": ratios,
        }
    return out


def goals_of(figures: dict[str, dict]) -> dict[str, dict]:
    out = {}
    for key, (target, at_most) in GOALS.items():
        good = [x for x in figures[key]["ratios"] if not math.isnan(x)]
        ratio = statistics.median(good) if good else math.nan
        met = (ratio <= target if at_most else ratio >= target) if good else False
        out[key] = {
            "label": figures[key]["label"],
            "target": f"{'≤' if at_most else '≥'} {target:g}",
            "ratio": ratio,
            "ratios": figures[key]["ratios"],
            "met": met,
        }
    return out


def report(plan: Plan, meta: dict, figures: dict[str, dict], goals: dict[str, dict]) -> str:
    m = meta["machine"]
    pids = meta["processes"]

    def procs(label: str, which: str) -> str:
        return ", ".join(f"{name} ({what})" for name, what in pids[label][which].items()) or "none"

    lines = [
        BEGIN,
        "## vLLM: trioserve against vLLM's own API server",
        "",
        f"Measured {meta['date']}, code {meta['commit']} (git HEAD + a hash of the package as "
        f"the processes loaded it) on {m['cpu']}, {m['cores']} cores, "
        f"{m['memory']}, Linux {m['kernel']}, Python {m['python']}, vLLM {meta['vllm']}, "
        f"with `{meta['command']}` ({meta['duration_s'] / 60:.1f} minutes). Load average "
        f"(shared machine) {meta['loadavg_start']} at the start, {meta['loadavg_end']} at the "
        "end.",
        "",
        f"- A, trioserve: `{meta['commands'][A][0]}` and `{meta['commands'][A][1]}`. B, vLLM: "
        f"`{meta['commands'][B][0]}`. Same model, same vLLM options, same environment "
        f"({meta['env']}).",
        f"- CPU counted (not the model): A: {procs(A, 'counted')}; B: {procs(B, 'counted')}. "
        f"Not counted (the model and its helpers; measured apart): A: {procs(A, 'excluded')}; "
        f"B: {procs(B, 'excluded')}. Tokens: vLLM's `{GENERATED}` over the same window.",
        f"- Pinning: {meta['pinning']}.",
        f"- {plan.rounds} round(s), A B then B A; each cell the median over rounds "
        f"(min{DASH}max), the last column A/B per round. Windows: {plan.json_duration:g} s "
        f"after {plan.json_warmup:g} s (non-streaming, {plan.json_tokens} tokens an answer), "
        f"{plan.stream_duration:g} s after {plan.stream_warmup:g} s (streaming, "
        f"{plan.stream_tokens} tokens an answer, the next on the same connection); every "
        "request greedy with `ignore_eos`. TTFT: one streaming request at a time, "
        f"{plan.ttft_count} a side and round, each side alone (not in turns: both sides' "
        "Workers share core 1, and one still spinning after its request delays the other's); "
        "vLLM's own TTFT is its "
        "`vllm:time_to_first_token_seconds` histogram (from AsyncLLM taking the request to its "
        "output processor holding the first token), mean only (the buckets are too coarse "
        f"for a p50). Abort: {plan.abort_count} SSE and {plan.abort_count} non-streaming "
        "requests a round, one at a time; the client closes while the request runs and "
        f"`{RUNNING}` is polled every {plan.abort_poll_ms:g} ms plus a scrape.",
        f"- Same greedy answer from both: {'yes' if meta['same_answer'] else '**no**'}.",
        "",
        f"| figure | {A} | {B} | {A} / {B} |",
        "|---|---|---|---|",
    ]
    for figure in figures.values():
        values = figure["values"]
        lines.append(
            f"| {figure['label']} ({figure['unit']}) | {bench.cell(values[A], figure['digits'])} "
            f"| {bench.cell(values[B], figure['digits'])} | "
            f"{bench.ratios(values[A], values[B])} |"
        )
    lines += ["", "Goals (trioserve / vLLM, median over rounds):", ""]
    for goal in goals.values():
        verdict = "met" if goal["met"] else "**not met**"
        lines.append(
            f"- {goal['label']}: {bench._fmt(goal['ratio'], 2)} (goal {goal['target']}): {verdict}"
        )
    if meta["failures"]:
        lines += ["", "Runs that failed:", ""] + [f"- {f}" for f in meta["failures"]]
    lines.append(END)
    return "\n".join(lines)


DASH = bench.DASH


# -- main -----------------------------------------------------------------------------------


def _gist(answer: dict) -> str:
    """What two servers answering the same greedy request must agree on."""
    choice = (answer.get("choices") or [{}])[0]
    usage = answer.get("usage") or {}
    return json.dumps(
        [
            (choice.get("message") or {}).get("content"),
            choice.get("finish_reason"),
            usage.get("prompt_tokens"),
            usage.get("completion_tokens"),
        ]
    )


def served_name(args: argparse.Namespace) -> str:
    argv = shlex.split(args.vllm_args)
    for i, arg in enumerate(argv):
        if arg == "--served-model-name" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--served-model-name="):
            return arg.split("=", 1)[1]
    return args.model


def _vllm_version(python: str) -> str:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        return (
            subprocess.run(
                [python, "-c", "from importlib.metadata import version as v; print(v('vllm-cpu'))"],
                capture_output=True,
                text=True,
                timeout=60,
            ).stdout.strip()
            or "?"
        )
    return "?"


def _loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def levels(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    class Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
        pass

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=Formatter)
    parser.add_argument("--quick", action="store_true", help="a short run (about 3 minutes)")
    parser.add_argument(
        "--vllm-python",
        default=os.environ.get("TRIOSERVE_VLLM_PYTHON", sys.executable),
        help="a python with vllm (vllm-cpu) and trioserve installed: runs both sides",
    )
    parser.add_argument(
        "--model", help="the model (a path); default: a tiny Llama built by tools/tiny_llama.py"
    )
    parser.add_argument("--vllm-args", default=VLLM_ARGS, help="vLLM options, both sides")
    parser.add_argument("--kv-cache-gib", type=float, default=1, help="VLLM_CPU_KVCACHE_SPACE")
    parser.add_argument("--start-timeout", type=float, default=300, help="seconds per start")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (A B, then B A)")
    parser.add_argument("--duration", type=float, default=8.0, help="seconds per load window")
    parser.add_argument("--json-levels", type=levels, default=[32, 256], help="concurrencies")
    parser.add_argument("--stream-levels", type=levels, default=[32, 256], help="streams")
    parser.add_argument("--json-tokens", type=int, default=16, help="tokens per JSON answer")
    parser.add_argument("--stream-tokens", type=int, default=64, help="tokens per stream")
    parser.add_argument("--ttft-count", type=int, default=100, help="TTFT requests per side")
    parser.add_argument("--abort-count", type=int, default=15, help="aborts per mode and side")
    parser.add_argument("--no-pin", action="store_true", help="do not pin processes to cores")
    parser.add_argument("--json", type=Path, help="write every figure here as JSON")
    parser.add_argument(
        "--write-docs",
        type=Path,
        metavar="MARKDOWN",
        help=f"replace the text between {BEGIN} and {END} in this file (appended if absent)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    plan = build_plan(args)
    command = (
        "python tools/bench_vllm.py"
        + (" " + shlex.join(sys.argv[1:] if argv is None else argv)).rstrip()
    )
    pin = not args.no_pin and (os.cpu_count() or 1) >= 2 and shutil.which("taskset") is not None
    if pin:
        os.sched_setaffinity(0, {LOAD_CORE})
        pinning = (
            f"every thread of the non-model processes on core {SERVER_CORE}; their "
            f"descendants (the model) on core {MODEL_CORE}, with vLLM's OpenMP threads "
            f"(VLLM_CPU_OMP_THREADS_BIND={MODEL_CORE}), alone there; the load generator and "
            f"the driver on core {LOAD_CORE} (on the model's core, vLLM's Worker starved them)"
        )
    else:
        pinning = "none"
    bench._raise_fd_limit()
    # SIGTERM ends the run as an error would: every process started here is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    estimate = 120 + plan.rounds * (
        2 * sum(d + w + 3 for d, w in [(plan.json_duration, plan.json_warmup)] * 2)
        + 2 * sum(d + w + 5 for d, w in [(plan.stream_duration, plan.stream_warmup)] * 2)
        + (plan.ttft_count + plan.ttft_warmup) * 0.2
        + plan.abort_count * 2
    )
    progress = bench.Progress(estimate)
    progress.note(f"{command}: pinning {pinning}")
    workdir = Path(tempfile.mkdtemp(prefix="trioserve-bench-vllm-"))
    t_start = time.monotonic()
    loadavg_start = _loadavg()
    model = args.model
    if model is None:
        model = str(workdir / "tiny")
        subprocess.run(
            [args.vllm_python, str(TOOLS / "tiny_llama.py"), model],
            check=True,
            capture_output=True,
            timeout=300,
        )
        args.model = model
    name = served_name(args)
    sides: list[Side] = []
    rounds: list[dict[str, dict[str, dict]]] = []
    failures: list[str] = []
    sources: list[str] = []
    # The processes start once and run the code they loaded then: that is the code under
    # test; the working tree per round only says whether someone edited it meanwhile.
    code = bench.source_state()
    try:
        progress.show("starting both sides (vLLM takes about a minute)")
        sides = start_sides(args, pin, workdir)
        progress.note(
            "up: "
            + "; ".join(
                f"{s.label}: counted {s.counted}, not counted "
                + ", ".join(f"{pid} {what}" for pid, what in s.model.items())
                for s in sides
            )
        )
        answers = [chat(side.url, name, {"max_tokens": 16}) for side in sides]
        same = (
            all(status == 200 for status, _ in answers) and len({_gist(b) for _, b in answers}) == 1
        )
        for r in range(plan.rounds):
            sources.append(bench.source_state())
            results, failed = measure_round(r, plan, sides, pin, progress, name)
            rounds.append(results)
            failures += failed
    finally:
        for side in sides:
            for proc in side.procs:
                stop_group(proc)
        if not sides:  # a start that failed: its processes are not in ``sides`` yet
            for proc_log in workdir.glob("*.log"):
                progress.note(f"log {proc_log}")
    for side in sides:
        for proc in side.procs:
            if not group_gone(proc.pid):
                failures.append(f"{side.label}: process group {proc.pid} outlived the run")
    if sys.stderr.isatty():
        print(file=sys.stderr)
    a, b = sides
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": code,
        "source_per_round": sources,
        "command": command,
        "machine": bench.machine(),
        "vllm": _vllm_version(args.vllm_python),
        "loadavg_start": loadavg_start,
        "loadavg_end": _loadavg(),
        "pinning": pinning,
        "env": f"VLLM_CPU_KVCACHE_SPACE={args.kv_cache_gib:g}"
        + (f", VLLM_CPU_OMP_THREADS_BIND={MODEL_CORE}" if pin else ""),
        "commands": {
            A: [
                shlex.join(["trioserve", *a.procs[0].popen.args[3:]]),
                shlex.join(["trioserve", *a.procs[1].popen.args[3:]]),
            ],
            B: [shlex.join(["python", *b.procs[0].popen.args[1:]])],
        },
        "processes": {
            s.label: {
                "counted": {f"{n} {pid}": s.names[pid] for n, pid in s.counted.items()},
                "excluded": {str(pid): what for pid, what in s.model.items()},
            }
            for s in sides
        },
        "same_answer": same,
        "answers": [body for _, body in answers],
        "duration_s": time.monotonic() - t_start,
        "logs": str(workdir),
        "failures": failures,
    }
    figures = figures_of(plan, rounds)
    goals = goals_of(figures)
    text = report(plan, meta, figures, goals)
    print(text)
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "meta": meta,
                    "plan": plan.__dict__,
                    "figures": figures,
                    "goals": goals,
                    "rounds": rounds,
                },
                indent=2,
                default=str,
            )
        )
    if args.write_docs:
        bench.write_docs(args.write_docs, text, BEGIN, END)
    return 1 if failures else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["_loadgen"]:
        print(json.dumps(loadgen_child(json.loads(sys.argv[2]))), flush=True)
    else:
        sys.exit(main())
