"""CPU instructions per request, trioserve against the reference frontend, under callgrind.

Wall-clock CPU figures on a shared machine move by 10-20% from one run to the next, more
than the differences worth measuring on the per-request path. ``valgrind --tool=callgrind``
counts the user-space instructions a process executes instead: for the same code and the
same requests the count repeats to a few per cent whatever else the machine is doing. What
it does not count: the kernel's work on the process's behalf (system calls, the network
stack) and how long each instruction took (cache misses, branch mispredictions), so it is a
companion to ``tools/bench.py``'s timings, not a replacement.

Starts the mock engine (not under valgrind), then each frontend in turn under callgrind
with instrumentation off; warms it up with each kind, switches instrumentation on, and for
each kind zeroes the counters, sends ``--requests`` requests from ``--concurrency``
keep-alive connections (opened before the zeroing, closed after the dump: the count is
of requests, not connections) and dumps the counters (``callgrind_control``). Every thread of
the frontend counts (the ZeroMQ I/O thread too). Kinds: a non-streaming chat completion
of 16 tokens, and the same streamed (SSE; the engine produces the 16 tokens at once, so
they leave in one or two writes). All traffic is on 127.0.0.1.

    python -m tools.instructions                      # 400 requests of each kind
    python -m tools.instructions --requests 40        # a smoke run
    python -m tools.instructions --write-docs docs/benchmarks.md

``--direct-vllm``: trioserve's direct vLLM path instead (``trioserve run --vllm MODEL
--vllm-attach``), on ``tools.null_enginecore`` (not under valgrind) with the tiny Llama's
text assets, one token a step every ``--step-ms``: slow enough that the frontend, slowed
down some fifty times by callgrind, keeps up, so that every token is a step of its own and
every streamed token an event, as on an engine with real decode steps. No reference
frontend: vLLM's API server under callgrind takes minutes to import torch. Its own table
in docs/benchmarks.md; a change's figure is compared with the one before it.

    python -m tools.instructions --direct-vllm --requests 192 --concurrency 32
"""

from __future__ import annotations

import argparse
import platform
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from tools.toolkit import http_client, processes, reports

BEGIN, END = "<!-- instructions:begin -->", "<!-- instructions:end -->"
DIRECT_BEGIN = "<!-- instructions-direct:begin -->"
DIRECT_END = "<!-- instructions-direct:end -->"
PROMPT = "Count the instructions of one request."
KINDS = {
    "non-streaming (JSON)": {"max_tokens": 16},
    "streaming (SSE)": {"max_tokens": 16, "stream": True},
}
ENGINE_KNOBS = {"mock_ttft_ms": 0, "mock_tokens_per_second": 0}


def drive(
    port: int,
    body: dict,
    count: int,
    concurrency: int,
    before: Callable[[], None] = lambda: None,
    after: Callable[[], None] = lambda: None,
) -> int:
    """``count`` requests over ``concurrency`` keep-alive connections; returns how many
    were answered 200. ``before`` runs once every connection is open and ``after`` once
    every answer is in, so that what they count is the requests, not the connections."""
    request = http_client.chat_request(f"127.0.0.1:{port}", body)
    share = [count // concurrency + (i < count % concurrency) for i in range(concurrency)]
    share = [n for n in share if n]
    sockets = [socket.create_connection(("127.0.0.1", port), timeout=120) for _ in share]
    ok = [0]
    lock = threading.Lock()
    errors: list[str] = []

    def worker(sock: socket.socket, n: int) -> None:
        try:
            for _ in range(n):
                sock.sendall(request)
                response = http_client.Response()
                while not response.done:
                    data = sock.recv(65536)
                    if not data:
                        raise ConnectionError("the frontend closed the connection")
                    response.feed(data, None)
                if response.status == 200:
                    with lock:
                        ok[0] += 1
        except OSError as exc:
            errors.append(str(exc))

    try:
        before()
        threads = [
            threading.Thread(target=worker, args=(sock, n))
            for sock, n in zip(sockets, share, strict=True)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        after()
    finally:
        for sock in sockets:
            sock.close()
    if errors:
        raise RuntimeError(f"requests failed: {errors[0]}")
    return ok[0]


def control(*args: str) -> None:
    subprocess.run(["callgrind_control", *args], check=True, capture_output=True, timeout=120)


def dumped_instructions(directory: Path, pid: int, timeout: float = 60) -> int:
    """The instruction count of the one dump ``callgrind_control -d`` asked for."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for path in directory.glob(f"callgrind.{pid}.out*"):
            text = path.read_text(errors="replace")
            if re.search(r"^desc: Trigger: dump\s*$", text, re.M):
                events = re.search(r"^events: (.*)$", text, re.M)
                totals = re.search(r"^(?:summary|totals): (.*)$", text, re.M)
                if events and totals:
                    return int(totals.group(1).split()[events.group(1).split().index("Ir")])
        time.sleep(0.2)
    raise RuntimeError("callgrind wrote no dump")


def measure_frontend(
    name: str,
    command: list[str],
    port: int,
    args: argparse.Namespace,
    workdir: Path,
    knobs: dict[str, object] = ENGINE_KNOBS,
    start: Callable[[], None] = lambda: None,
) -> dict[str, float]:
    out = workdir / name
    out.mkdir()
    valgrind = [
        "valgrind",
        "--tool=callgrind",
        "--instr-atstart=no",
        "--dump-instr=no",
        f"--callgrind-out-file={out}/callgrind.%p.out",
        "-q",
    ]
    proc = processes.spawn(name, [*valgrind, *command], workdir)
    proc.url = f"http://127.0.0.1:{port}"
    figures: dict[str, float] = {}
    try:
        start()
        processes.wait_healthy(proc, timeout=300)
        bodies = {
            kind: {"messages": [{"role": "user", "content": PROMPT}], **extra, **knobs}
            for kind, extra in KINDS.items()
        }
        for body in bodies.values():  # uninstrumented (faster): first-request work, caches
            drive(port, body, args.warmup, args.concurrency)
        pid = str(proc.pid)
        control("-i", "on", pid)
        for kind, body in bodies.items():
            for path in out.glob("callgrind.*"):
                path.unlink()
            answered = drive(
                port,
                body,
                args.requests,
                args.concurrency,
                before=partial(control, "-z", pid),  # counters from here...
                after=partial(control, "-d", pid),  # ...to here
            )
            if answered != args.requests:
                raise RuntimeError(f"{name}: {args.requests - answered} requests failed")
            figures[kind] = dumped_instructions(out, proc.pid) / answered
            if not args.quiet:
                print(f"{name:<10} {kind}: {figures[kind] / 1000:,.0f}k", file=sys.stderr)
    finally:
        proc.stop()  # the counts are dumped already: no need to wait for a drain
    return figures


def measure(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    engine_address = f"tcp://127.0.0.1:{processes.free_port()}"
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="trioserve-instructions-") as tmp:
        workdir = Path(tmp)
        engine = processes.spawn(
            "engine",
            [
                sys.executable,
                "-m",
                "trioserve",
                "engine",
                "mock",
                "--bind",
                engine_address,
                "--allow-fault-injection",  # for ENGINE_KNOBS
            ],
            workdir,
        )
        try:
            for name in ("trioserve", "reference"):
                port = processes.free_port()
                common = ["--engine", engine_address, "--host", "127.0.0.1", "--port", str(port)]
                if name == "trioserve":
                    command = [sys.executable, "-m", "trioserve", "--log-level", "warning", "run"]
                else:
                    command = processes.tool_command("reference_server")
                results[name] = measure_frontend(name, command + common, port, args, workdir)
        finally:
            engine.stop()
    return results


def measure_direct(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """The direct vLLM path on the null EngineCore (see the module docstring)."""
    from tools.tiny_llama import build_text_only

    with tempfile.TemporaryDirectory(prefix="trioserve-instructions-") as tmp:
        workdir = Path(tmp)
        model = build_text_only(workdir / "model")
        handshake, port = processes.free_port(), processes.free_port()
        command = [sys.executable, "-m", "trioserve", "--log-level", "warning", "run"]
        command += ["--vllm", str(model), "--vllm-attach", f"127.0.0.1:{handshake}"]
        command += ["--host", "127.0.0.1", "--port", str(port), "--no-access-log"]
        command += ["--max-concurrent-requests", str(max(256, 2 * args.concurrency))]
        engine: list[processes.Proc] = []

        def start_engine() -> None:  # once the frontend has bound its handshake socket
            engine.append(
                processes.spawn(
                    "null-engine",
                    [*processes.tool_command("null_enginecore"), "--model", str(model)]
                    + ["--handshake", f"tcp://127.0.0.1:{handshake}"]
                    + ["--step-ms", str(args.step_ms)],
                    workdir,
                )
            )

        try:
            knobs = {"ignore_eos": True}
            figures = measure_frontend(
                "trioserve", command, port, args, workdir, knobs, start_engine
            )
        finally:
            for proc in engine:
                proc.stop()
    return {"trioserve direct": figures}


def _measured(command: str) -> str:
    """The line above a table: when, where, with what."""
    valgrind = subprocess.run(["valgrind", "--version"], capture_output=True, text=True).stdout
    return (
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on "
        f"{platform.machine()}, Python {platform.python_version()}, {valgrind.strip()}, "
        f"with `{command}`."
    )


def direct_table(results: dict[str, dict[str, float]], command: str) -> str:
    lines = [
        _measured(command),
        "",
        "| user-space instructions per request, direct vLLM path, null EngineCore | trioserve |",
        "|---|---|",
    ]
    for kind in KINDS:
        lines.append(f"| {kind}, 16 tokens | {results['trioserve direct'][kind] / 1000:,.0f}k |")
    return "\n".join(lines)


def table(results: dict[str, dict[str, float]], command: str) -> str:
    lines = [
        _measured(command),
        "",
        "| user-space instructions per request | trioserve | reference | trioserve / reference |",
        "|---|---|---|---|",
    ]
    for kind in KINDS:
        ours, theirs = results["trioserve"][kind], results["reference"][kind]
        lines.append(
            f"| {kind}, 16 tokens | {ours / 1000:,.0f}k | {theirs / 1000:,.0f}k "
            f"| {ours / theirs:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tools.instructions", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--requests", type=int, default=400, help="counted, per kind")
    parser.add_argument("--warmup", type=int, default=64, help="uncounted, per kind, first")
    parser.add_argument("--concurrency", type=int, default=8, help="keep-alive connections")
    parser.add_argument(
        "--direct-vllm",
        action="store_true",
        help="trioserve's direct vLLM path on the null EngineCore (module docstring)",
    )
    parser.add_argument(
        "--step-ms", type=float, default=100.0, help="--direct-vllm: the null engine's step"
    )
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--write-docs", help="replace the table between the markers here")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args()
    for tool in ("valgrind", "callgrind_control"):
        if shutil.which(tool) is None:
            parser.error(f"{tool} is not installed (Debian: apt-get install valgrind)")
    shown = f"--requests {args.requests} --warmup {args.warmup} --concurrency {args.concurrency}"
    if args.direct_vllm:
        shown = f"--direct-vllm --step-ms {args.step_ms:g} {shown}"
    command = f"python -m tools.instructions {shown}"
    if args.direct_vllm:
        results = measure_direct(args)
        text = direct_table(results, command)
        begin, end = DIRECT_BEGIN, DIRECT_END
    else:
        results = measure(args)
        text = table(results, command)
        begin, end = BEGIN, END
    reports.publish(text, command, results, args.json, args.write_docs, begin, end)


if __name__ == "__main__":
    main()
