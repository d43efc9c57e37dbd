#!/usr/bin/env python3
"""What CURVE costs on the engine link: the handshake, and CPU per request and per relayed
token, NULL beside CURVE, measured the same way in alternation.

- **handshake**: this process connects a ZmtpDealer to a ``trioserve engine mock``
  process ``--handshakes`` times in a row (connect, handshake, first message answered,
  close), NULL and CURVE in turn: wall time per connection, this thread's CPU (the
  frontend's side) and the engine process's CPU (libzmq's CURVE server and its ZAP
  handler) per connection;
- **per request**: ``trioserve engine mock`` and ``trioserve run --engine`` as processes
  (the frontend alone on core 0 with ``taskset``; engine and load generator on core 1),
  driven by ``tools/loadgen.py``: non-streaming chat completions at ``--concurrency``
  (requests/s, frontend and engine CPU per request) and ``--streams`` SSE streams
  (frontend CPU per relayed token event), for ``--rounds`` rounds, NULL then CURVE in
  one round and CURVE then NULL in the next.

    python -m tools.bench_curve [--rounds 3] [--duration 5]

Prints the figures and writes them as JSON with ``--json``. All traffic is on 127.0.0.1;
every step is bounded in time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import trio

from tools.toolkit.processes import ROOT, tool_command
from tools.toolkit.procfs import cpu_seconds
from trioserve.protocol import Ping, encode
from trioserve.transport.keys import client_keys, write_keypair
from trioserve.transport.zmtp import ZmtpDealer

#: Seconds a process has to come up.
START_TIMEOUT = 20.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Keys:
    def __init__(self, directory: Path) -> None:
        _, self.engine_secret = write_keypair(directory / "engine")
        self.engine_public = str(directory / "engine.key")
        _, self.frontend_secret = write_keypair(directory / "frontend")
        self.frontend_public = str(directory / "frontend.key")

    def engine_args(self, curve: bool) -> list[str]:
        if not curve:
            return []
        return [
            "--curve-secret-key",
            self.engine_secret,
            "--curve-authorized-keys",
            self.frontend_public,
        ]

    def frontend_args(self, curve: bool) -> list[str]:
        if not curve:
            return []
        return [
            "--engine-curve-server-key",
            self.engine_public,
            "--engine-curve-secret-key",
            self.frontend_secret,
        ]


def pin(core: int, enabled: bool) -> list[str]:
    return ["taskset", "-c", str(core)] if enabled else []


def start(command: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        command,
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
        start_new_session=True,
    )


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def wait_for_log(log: Path, text: str, process: subprocess.Popen) -> None:
    end = time.monotonic() + START_TIMEOUT
    while text not in log.read_text(errors="replace"):
        if process.poll() is not None or time.monotonic() > end:
            raise RuntimeError(f"{log.name}: {log.read_text(errors='replace')[-2000:]}")
        time.sleep(0.05)


def wait_ready(url: str) -> None:
    end = time.monotonic() + START_TIMEOUT
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as reply:
                if reply.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{url} never became ready")


def engine_command(port: int, keys: Keys, curve: bool, pinned: bool) -> list[str]:
    return [
        *pin(1, pinned),
        sys.executable,
        "-m",
        "trioserve",
        "engine",
        "mock",
        "--bind",
        f"tcp://127.0.0.1:{port}",
        "--tokens-per-second",
        "1000",
        "--ttft-ms",
        "0",
        "--allow-fault-injection",  # loadgen sets the stream's token rate per request
        *keys.engine_args(curve),
    ]


# -- handshakes ------------------------------------------------------------------------------


def _setter(event: trio.Event):
    return lambda frames: event.set()


async def handshakes(address: str, curve_keys, count: int, engine_pid: int) -> dict:
    walls, cpus = [], []
    engine_cpu = cpu_seconds(engine_pid)
    for index in range(count):
        heard = trio.Event()
        dealer = ZmtpDealer(address, b"bench-%d" % index, _setter(heard), curve=curve_keys)
        start_wall, start_cpu = time.perf_counter(), time.thread_time()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(dealer.run)
            # A protocol ping: answered with a pong once the link is up.
            dealer.send([encode(Ping(1))])
            with trio.fail_after(START_TIMEOUT):
                await heard.wait()
            walls.append(time.perf_counter() - start_wall)
            cpus.append(time.thread_time() - start_cpu)
            nursery.cancel_scope.cancel()
        dealer.close()
    engine_cpu = cpu_seconds(engine_pid) - engine_cpu
    return {
        "wall_ms_median": 1000 * statistics.median(walls),
        "frontend_cpu_us_median": 1e6 * statistics.median(cpus),
        "engine_cpu_us_per_handshake": 1e6 * engine_cpu / count,
    }


def measure_handshakes(keys: Keys, count: int, logs: Path, rounds: int) -> dict:
    out = {}
    for curve in (False, True) * min(rounds, 2):
        name = "curve" if curve else "null"
        port = free_port()
        log = logs / f"handshake-engine-{name}.log"
        engine = start(engine_command(port, keys, curve, pinned=False), log)
        try:
            wait_for_log(log, "mock engine serving", engine)
            ck = client_keys(keys.frontend_secret, keys.engine_public) if curve else None
            figures = trio.run(handshakes, f"tcp://127.0.0.1:{port}", ck, count, engine.pid)
        finally:
            stop(engine)
        out.setdefault(name, []).append(figures)
    return out


# -- requests --------------------------------------------------------------------------------


def loadgen(mode: str, url: str, frontend: int, engine: int, args) -> dict:
    command = [
        *pin(1, args.pinned),
        *tool_command("loadgen"),
        mode,
        "--url",
        url,
        "--frontend-pid",
        str(frontend),
        "--engine-pid",
        str(engine),
        "--duration",
        str(args.duration),
        "--warmup",
        str(args.warmup),
    ]
    if mode == "json":
        command += ["--concurrency", str(args.concurrency), "--max-tokens", "16"]
    else:
        command += ["--streams", str(args.streams), "--rate", str(args.rate)]
    done = subprocess.run(
        command,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=args.duration * 10 + 60,
        check=True,
    )
    return json.loads(done.stdout)


def measure_requests(keys: Keys, curve: bool, args, logs: Path, round_: int) -> dict:
    name = "curve" if curve else "null"
    port, http = free_port(), free_port()
    engine_log = logs / f"engine-{name}-{round_}.log"
    frontend_log = logs / f"frontend-{name}-{round_}.log"
    engine = start(engine_command(port, keys, curve, args.pinned), engine_log)
    frontend = None
    try:
        wait_for_log(engine_log, "mock engine serving", engine)
        frontend = start(
            [
                *pin(0, args.pinned),
                sys.executable,
                "-m",
                "trioserve",
                "run",
                "--port",
                str(http),
                "--engine",
                f"tcp://127.0.0.1:{port}",
                "--max-concurrent-requests",
                "4096",
                *keys.frontend_args(curve),
            ],
            frontend_log,
        )
        url = f"http://127.0.0.1:{http}"
        wait_ready(url)
        plain = loadgen("json", url, frontend.pid, engine.pid, args)
        stream = loadgen("stream", url, frontend.pid, engine.pid, args)
    finally:
        if frontend is not None:
            stop(frontend)
        stop(engine)
    requests = plain["requests"] or 1
    return {
        "rps": plain["rps"],
        "p50_ms": plain["p50_ms"],
        "frontend_cpu_us_per_request": 1e6 * plain["frontend_cpu_s"] / requests,
        "engine_cpu_us_per_request": 1e6 * plain["engine_cpu_s"] / requests,
        "errors": plain["errors"],
        "events_per_s": stream["events_per_s"],
        "frontend_cpu_us_per_event": stream["frontend_cpu_us_per_event"],
        "streams_failed": stream["streams_failed"],
    }


def summary(runs: list[dict], key: str) -> str:
    values = [run[key] for run in runs]
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.bench_curve", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per load run")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--streams", type=int, default=256)
    parser.add_argument("--rate", type=float, default=10.0, help="tokens/s per stream")
    parser.add_argument("--handshakes", type=int, default=200)
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds before measuring")
    parser.add_argument("--no-pin", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    args.pinned = not args.no_pin and (os.cpu_count() or 1) >= 2 and bool(shutil.which("taskset"))
    with tempfile.TemporaryDirectory(prefix="bench-curve-") as tmp:
        directory = Path(tmp)
        keys = Keys(directory)
        result: dict = {
            "handshakes": measure_handshakes(keys, args.handshakes, directory, args.rounds)
        }
        runs: dict[str, list[dict]] = {"null": [], "curve": []}
        for round_ in range(args.rounds):
            order = (False, True) if round_ % 2 == 0 else (True, False)
            for curve in order:
                figures = measure_requests(keys, curve, args, directory, round_)
                runs["curve" if curve else "null"].append(figures)
                print(f"round {round_ + 1} {'curve' if curve else 'null'}: {figures}", flush=True)
        result["requests"] = runs
    print()
    print("handshake (median of medians):")
    for name, figures in result["handshakes"].items():
        walls = [f["wall_ms_median"] for f in figures]
        cpus = [f["frontend_cpu_us_median"] for f in figures]
        engine = [f["engine_cpu_us_per_handshake"] for f in figures]
        print(
            f"  {name}: {statistics.median(walls):.2f} ms wall, frontend "
            f"{statistics.median(cpus):.0f} us CPU, engine {statistics.median(engine):.0f} us CPU"
        )
    print(f"requests (median, range over {args.rounds} rounds):")
    for name, figures in runs.items():
        print(
            f"  {name}: {summary(figures, 'rps')} req/s at c={args.concurrency}, frontend "
            f"{summary(figures, 'frontend_cpu_us_per_request')} us CPU/request, engine "
            f"{summary(figures, 'engine_cpu_us_per_request')} us CPU/request; "
            f"{summary(figures, 'events_per_s')} events/s on {args.streams} streams, frontend "
            f"{summary(figures, 'frontend_cpu_us_per_event')} us CPU/event"
        )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
