"""The sides ``tools.bench_vllm`` measures: the direct path (``trioserve run --vllm``, vLLM's
EngineCore started by the frontend), the shared path (``trioserve engine vllm`` and a
frontend in front of it) and vLLM's own API server; each started from the vLLM venv,
waited for until it answers and pinned, its processes named (the counted ones and the
model's) for the per-thread CPU figures."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from tools import bench_vllm_procs as procs  # (spawning, pinning, per-thread CPU)
from tools.toolkit import load, processes

SERVER_CORE, MODEL_CORE = 0, 1
DIRECT, SHARED, VLLM = "direct", "shared", "vLLM API server"


@dataclass
class Side:
    label: str
    procs: list[processes.Proc]
    url: str = ""
    #: (metrics page, counter): the server's own count of generated tokens.
    token_counter: tuple[str, str] = ("", "")
    #: (metrics page, gauge): the engine's running requests, as the side reports them.
    running: tuple[str, str] = ("", "")
    ttft_histogram_url: str | None = None  # vLLM's TTFT histogram, where the side has one
    counted: dict[str, int] = field(default_factory=dict)  # the non-model processes
    names: dict[int, str] = field(default_factory=dict)  # their pid -> comm
    model: dict[int, str] = field(default_factory=dict)  # their descendants: pid -> comm

    def alive(self) -> bool:
        return all(proc.popen.poll() is None for proc in self.procs)

    def log_tails(self) -> str:
        return "\n".join(f"--- {p.name}:\n{p.log_tail(1500)}" for p in self.procs)

    def watched(self, pin: bool) -> list[dict]:
        out = [
            {"pid": pid, "name": name, "role": "counted", "core": SERVER_CORE if pin else None}
            for name, pid in self.counted.items()
        ]
        out += [
            {
                "pid": pid,
                "name": f"model:{what}:{pid}",
                "role": "model",
                "core": MODEL_CORE if pin else None,
            }
            for pid, what in self.model.items()
        ]
        return out

    def tops(self) -> list[int]:
        return list(self.counted.values())


def chat(url: str, model: str, extra: dict, timeout: float = 30) -> tuple[int, dict]:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": load.PROMPT}],
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


def served_name(args: argparse.Namespace) -> str:
    argv = shlex.split(args.vllm_args)
    for i, arg in enumerate(argv):
        if arg == "--served-model-name" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--served-model-name="):
            return arg.split("=", 1)[1]
    return args.model


def _null_engine(
    label: str, args: argparse.Namespace, workdir: Path, env: dict[str, str]
) -> tuple[str, processes.Proc]:
    """``--engine null``: a null EngineCore (``tools.null_enginecore``) for one side, told
    to find its client at a free port; returns the client's ``HOST:PORT`` and the engine."""
    handshake = f"127.0.0.1:{processes.free_port()}"
    engine = procs.spawn(
        f"{label}-null-engine",
        [*processes.tool_command("null_enginecore", args.vllm_python)]
        + ["--handshake", f"tcp://{handshake}", "--model", args.model]
        + ["--step-ms", str(args.null_step_ms)],
        workdir,
        env,
    )
    return handshake, engine


def start_sides(args: argparse.Namespace, pin: bool, workdir: Path) -> list[Side]:
    """Every side asked for, started at once (the models load side by side), up and
    answering, and pinned. With ``--engine null`` each side's engine is a null EngineCore
    (``tools.null_enginecore``), measured apart as the model is: the direct path attaches to
    it (``--vllm-attach``), vLLM's API server runs with no engine of its own
    (``--data-parallel-size-local 0``) and takes it as its remote engine."""
    null = args.engine == "null"
    env = {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": str(args.kv_cache_gib),
        "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1",
    }
    if pin:
        env["VLLM_CPU_OMP_THREADS_BIND"] = str(MODEL_CORE)
    py, vllm_args = args.vllm_python, shlex.split(args.vllm_args)
    # No line per request on either side: vLLM's API server runs without uvicorn's access
    # log and logs no requests by default; trioserve's access log (on by default) is off too.
    frontend_options = ["--max-concurrent-requests", str(args.most_requests), "--no-access-log"]
    local = ["--host", "127.0.0.1", "--port", "0"]
    sides: list[Side] = []
    adapter_ready = None
    if DIRECT in args.sides:
        if null:
            handshake, engine = _null_engine("direct", args, workdir, env)
            engine_options = ["--vllm-attach", handshake]
        else:
            engine_options = ["--vllm-cpus", str(MODEL_CORE) if pin else "all"]
        frontend = procs.spawn(
            "direct",
            [py, "-m", "trioserve", "run", "--vllm", args.model, "--vllm-args", args.vllm_args]
            + [*engine_options, *local, *frontend_options]
            + ["--vllm-load-timeout", str(int(args.start_timeout))],
            workdir,
            env,
        )
        direct = Side(DIRECT, [frontend], counted={"frontend": frontend.pid})
        if null:
            direct.procs.append(engine)
            direct.model[engine.pid] = "null EngineCore"
        sides.append(direct)
    if SHARED in args.sides:
        address = f"tcp://127.0.0.1:{processes.free_port()}"
        metrics = f"http://127.0.0.1:{processes.free_port()}"
        adapter = procs.spawn(
            "shared-adapter",
            [py, "-m", "trioserve", "engine", "vllm", args.model, "--bind", address]
            + ["--metrics-port", metrics.rsplit(":", 1)[1], *vllm_args],
            workdir,
            env,
        )
        shared = Side(SHARED, [adapter], counted={"adapter": adapter.pid})
        shared.token_counter = (metrics + "/metrics", "vllm:generation_tokens_total")
        shared.running = (metrics + "/metrics", "vllm:num_requests_running")
        shared.ttft_histogram_url = metrics + "/metrics"
        adapter_ready = (shared, address)
        sides.append(shared)
    if VLLM in args.sides:
        port = processes.free_port()
        remote: list[str] = []
        if null:
            handshake, engine = _null_engine("vllm", args, workdir, env)
            host, rpc_port = handshake.rsplit(":", 1)
            remote = ["--data-parallel-size-local", "0", "--data-parallel-address", host]
            remote += ["--data-parallel-rpc-port", rpc_port]
        api = procs.spawn(
            "vllm-api-server",
            [py, "-m", "vllm.entrypoints.openai.api_server", "--model", args.model, *vllm_args]
            + [*remote, "--host", "127.0.0.1", "--port", str(port), "--disable-uvicorn-access-log"],
            workdir,
            env,
        )
        b = Side(VLLM, [api], url=f"http://127.0.0.1:{port}", counted={"frontend": api.pid})
        if null:
            b.procs.append(engine)
            b.model[engine.pid] = "null EngineCore"
        b.token_counter = (b.url + "/metrics", "vllm:generation_tokens_total")
        b.running = (b.url + "/metrics", "vllm:num_requests_running")
        b.ttft_histogram_url = b.url + "/metrics"
        sides.append(b)
    if adapter_ready is not None:
        shared, address = adapter_ready
        adapter = shared.procs[0]
        procs_ready = re.compile("vLLM engine serving")
        processes.wait_for_log(adapter, procs_ready, args.start_timeout)
        frontend = procs.spawn(
            "shared-frontend",
            # The heartbeat timeout of the direct path's EngineCore client (30 s): this
            # machine's load starved the adapter past the default 3 s.
            [py, "-m", "trioserve", "run", "--engine", address, *local, *frontend_options]
            + ["--heartbeat-timeout", "30"],
            workdir,
            env,
        )
        shared.procs.insert(0, frontend)
        shared.counted = {"frontend": frontend.pid, "adapter": adapter.pid}
        shared.url = processes.wait_for_log(frontend, processes.URL_RE, 60).group(1)
    for side in sides:
        if side.label == DIRECT:
            side.url = processes.wait_for_log(
                side.procs[0], processes.URL_RE, args.start_timeout
            ).group(1)
            # Counted step by step as EngineCore's outputs arrive, as vLLM counts its own.
            side.token_counter = (
                side.url + "/metrics",
                "trioserve_engine_generation_tokens_total",
            )
            side.running = (side.url + "/metrics", "trioserve_engine_requests_running")
    for side in sides:
        wait_ready(side, served_name(args), args.start_timeout)
        for pid in side.counted.values():
            side.names[pid] = procs.comm(pid)
            side.model.update({child: procs.comm(child) for child in procs.descendants(pid)})
        # The adapter is the shared frontend's engine, not its child: never its model.
        for pid in side.counted.values():
            side.model.pop(pid, None)
        if pin:
            for pid in side.counted.values():
                procs.pin_threads(pid, SERVER_CORE)
            for child in side.model:
                procs.pin_threads(child, MODEL_CORE)
    return sides
