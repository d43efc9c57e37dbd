"""Routing policies compared on engines with a prefix cache: hit rate and time to first token.

Starts ``--engines`` mock engines, each simulating a prefix cache of ``--cache-blocks``
blocks of 16 prompt words (``trioserve engine mock --prefix-cache``: a prompt whose start
the engine saw before waits ``--ttft-ms`` scaled down by the share of it that was
cached), and one frontend (``trioserve run --routing POLICY``), for each policy in turn
(the order alternates from round to round; every run starts from cold caches).

The workload is a chat application's: ``--sessions`` conversations, each with a system
prompt of its own (``--prefix-blocks`` blocks long) followed by ``--turns`` questions,
the turns of all sessions interleaved (turn 1 of every session, then turn 2, ...) and sent
by ``--concurrency`` clients as streamed chat completions. Each request names its session
as the client says (``--key``: the body's ``user``, an ``X-Session-Id`` header, or
nothing, when only the prompt prefix can keep a session together).

The sizes are chosen so that the question is routing, not cache size: all sessions'
prefixes together need more blocks than one engine holds, while each engine's share of
them fits. Routed by load alone, every engine sees every session and its cache evicts
what the next turn needs; routed by affinity, each session stays on one engine.

Figures per policy (medians over ``--rounds``): the share of requests that found part of
their prompt cached (hit rate), the share of prompt tokens served from cache, the time
to first token (p50, p90, mean, client-side) and the time the whole workload took; then
affinity / least-load for each.

    python -m tools.bench_routing                    # 2 rounds, about a minute
    python -m tools.bench_routing --rounds 3 --json figures.json --write-docs docs/benchmarks.md

All traffic is on 127.0.0.1; every step is bounded in time.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import trio

from tools.toolkit.reports import write_docs

BEGIN, END = "<!-- bench-routing:begin -->", "<!-- bench-routing:end -->"
POLICIES = ("least-load", "affinity")
#: Words per prefix-cache block of the mock (trioserve.engine_programs.mock.PREFIX_BLOCK_WORDS).
BLOCK_WORDS = 16
#: Seconds a process may take to start, and one request to complete.
START_TIMEOUT = 30.0
REQUEST_TIMEOUT = 60.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def log(args: argparse.Namespace, message: str) -> None:
    if not args.quiet:
        print(message, file=sys.stderr, flush=True)


async def start(command: list[str], log_path: Path, ready: str) -> trio.Process:
    """A process whose stderr goes to ``log_path``; returns once it logged ``ready``."""
    log_file = log_path.open("wb")
    process = await trio.lowlevel.open_process(
        command, stdout=subprocess.DEVNULL, stderr=log_file, start_new_session=True
    )
    log_file.close()
    with trio.fail_after(START_TIMEOUT):
        while not re.search(ready, text := await trio.Path(log_path).read_text(errors="replace")):
            if process.returncode is not None:
                raise RuntimeError(f"{command[3:6]} exited: {text[-2000:]}")
            await trio.sleep(0.05)
    return process


async def stop(process: trio.Process) -> None:
    if process.returncode is None:
        process.terminate()
        with trio.move_on_after(10):
            await process.wait()
        if process.returncode is None:
            process.kill()
            await process.wait()


def workload(args: argparse.Namespace) -> list[tuple[int, int]]:
    """(session, turn) in the order sent: the turns of all sessions interleaved."""
    return [(session, turn) for turn in range(args.turns) for session in range(args.sessions)]


def request_body(args: argparse.Namespace, session: int, turn: int) -> dict[str, Any]:
    system = " ".join(f"s{session}w{i}" for i in range(args.prefix_blocks * BLOCK_WORDS))
    body: dict[str, Any] = {
        "model": "mock",
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": f"question {turn} of session {session}"},
        ],
        "max_tokens": 4,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if args.key == "user":
        body["user"] = f"session-{session}"
    return body


async def one_request(
    client: httpx.AsyncClient, args: argparse.Namespace, session: int, turn: int
) -> dict[str, Any]:
    headers = {"x-session-id": f"session-{session}"} if args.key == "header" else {}
    body = request_body(args, session, turn)
    began = time.perf_counter()
    ttft = None
    usage = None
    buffer = ""
    async with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
        if r.status_code != 200:
            raise RuntimeError(f"status {r.status_code}: {(await r.aread())[:300]!r}")
        async for chunk in r.aiter_text():
            buffer += chunk
            while "\n\n" in buffer:
                event, buffer = buffer.split("\n\n", 1)
                if not event.startswith("data: {"):
                    continue
                data = json.loads(event.removeprefix("data: "))
                if data.get("usage"):
                    usage = data["usage"]
                choices = data.get("choices") or []
                if ttft is None and choices and choices[0].get("delta", {}).get("content"):
                    ttft = time.perf_counter() - began
    if ttft is None or usage is None:
        raise RuntimeError("a stream without content or usage")
    return {
        "session": session,
        "ttft_ms": ttft * 1000,
        "prompt_tokens": usage["prompt_tokens"],
        "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0),
    }


async def run_policy(args: argparse.Namespace, policy: str, workdir: Path) -> dict[str, Any]:
    """One run: fresh engines and frontend, the whole workload, the figures."""
    python = [sys.executable, "-m", "trioserve"]
    engines: list[trio.Process] = []
    addresses = []
    frontend = None
    try:
        for index in range(args.engines):
            address = f"tcp://127.0.0.1:{free_port()}"
            addresses.append(address)
            engines.append(
                await start(
                    python
                    + ["engine", "mock", "--bind", address, "--ttft-ms", str(args.ttft_ms)]
                    + ["--tokens-per-second", "200", "--prefix-cache", str(args.cache_blocks)],
                    workdir / f"{policy}-engine{index}.log",
                    "mock engine serving",
                )
            )
        port = free_port()
        command = python + ["run", "--port", str(port), "--routing", policy]
        command += ["--max-concurrent-requests", str(max(256, 2 * args.concurrency))]
        for address in addresses:
            command += ["--engine", address]
        frontend = await start(command, workdir / f"{policy}-frontend.log", "Running on")
        url = f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient(base_url=url, timeout=REQUEST_TIMEOUT) as client:
            with trio.fail_after(START_TIMEOUT):
                while (await client.get("/health")).status_code != 200:
                    await trio.sleep(0.05)
            # Every engine welcomed (/health is green with one): /metrics says so.
            with trio.fail_after(START_TIMEOUT):
                while connected((await client.get("/metrics")).text) < args.engines:
                    await trio.sleep(0.05)
            pending = workload(args)
            pending.reverse()
            results: list[dict[str, Any]] = []

            async def worker() -> None:
                while pending:
                    session, turn = pending.pop()
                    results.append(await one_request(client, args, session, turn))

            began = time.perf_counter()
            async with trio.open_nursery() as nursery:
                for _ in range(args.concurrency):
                    nursery.start_soon(worker)
            elapsed = time.perf_counter() - began
    finally:
        if frontend is not None:
            await stop(frontend)
        for engine in engines:
            await stop(engine)
    return figures(results, elapsed)


def connected(metrics: str) -> int:
    """Engines /metrics shows connected."""
    return len(re.findall(r"^trioserve_engine_connected\{[^}]*\} 1\.0$", metrics, re.M))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


def figures(results: list[dict[str, Any]], elapsed: float) -> dict[str, Any]:
    ttfts = [r["ttft_ms"] for r in results]
    prompt = sum(r["prompt_tokens"] for r in results)
    cached = sum(r["cached_tokens"] for r in results)
    return {
        "requests": len(results),
        "hit_rate": sum(1 for r in results if r["cached_tokens"]) / len(results),
        "cached_share": cached / prompt if prompt else 0.0,
        "ttft_p50_ms": percentile(ttfts, 0.5),
        "ttft_p90_ms": percentile(ttfts, 0.9),
        "ttft_mean_ms": statistics.fmean(ttfts),
        "seconds": elapsed,
    }


def median(runs: list[dict[str, Any]], name: str) -> float:
    return statistics.median(run[name] for run in runs)


ROWS = (
    ("hit rate (requests that found part of their prompt cached)", "hit_rate", "{:.0%}"),
    ("prompt tokens served from cache", "cached_share", "{:.0%}"),
    ("time to first token, p50 (ms)", "ttft_p50_ms", "{:.0f}"),
    ("time to first token, p90 (ms)", "ttft_p90_ms", "{:.0f}"),
    ("time to first token, mean (ms)", "ttft_mean_ms", "{:.0f}"),
    ("seconds for the whole workload", "seconds", "{:.1f}"),
)


def report(args: argparse.Namespace, runs: dict[str, list[dict[str, Any]]]) -> str:
    lines = [
        "## Routing: least-load against affinity (prefix-cache hits)",
        "",
        f"`python -m tools.bench_routing {shown_args()}`".replace(" `", "`"),
        "",
        f"{args.engines} mock engines with a prefix cache of {args.cache_blocks} blocks "
        f"of 16 words each; {args.sessions} sessions with a system prompt of "
        f"{args.prefix_blocks} blocks each and {args.turns} turns, interleaved, sent by "
        f"{args.concurrency} clients; session key: {args.key}; a full miss waits "
        f"{args.ttft_ms:g} ms for its first token. Medians of {args.rounds} round(s), each "
        f"from cold caches; {platform.machine()}, {os.cpu_count()} CPUs.",
        "",
        "| figure | least-load | affinity | affinity / least-load |",
        "|---|---|---|---|",
    ]
    for label, name, fmt in ROWS:
        base, aff = median(runs["least-load"], name), median(runs["affinity"], name)
        ratio = f"{aff / base:.2f}" if base else "—"
        lines.append(f"| {label} | {fmt.format(base)} | {fmt.format(aff)} | {ratio} |")
    return "\n".join(lines) + "\n"


def shown_args() -> str:
    """The command line's options, less where the figures were written."""
    shown, skip = [], False
    for arg in sys.argv[1:]:
        if skip:
            skip = False
        elif arg in ("--json", "--write-docs"):
            skip = True
        elif arg != "--quiet" and not arg.startswith(("--json=", "--write-docs=")):
            shown.append(arg)
    return " ".join(shown)


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.bench_routing", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--engines", type=int, default=3)
    parser.add_argument("--sessions", type=int, default=24)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--prefix-blocks", type=int, default=8)
    parser.add_argument(
        "--cache-blocks",
        type=int,
        default=None,
        help="blocks each engine caches (default: half of what all sessions need, so "
        "one engine cannot hold every prefix, but its share of them fits)",
    )
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--ttft-ms", type=float, default=200.0)
    parser.add_argument("--key", choices=["user", "header", "none"], default="user")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--write-docs", type=Path, help="put the table in this Markdown file")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args()
    if args.cache_blocks is None:
        args.cache_blocks = max(1, args.sessions * args.prefix_blocks // 2)

    async def run_all() -> dict[str, list[dict[str, Any]]]:
        runs: dict[str, list[dict[str, Any]]] = {policy: [] for policy in POLICIES}
        with tempfile.TemporaryDirectory(prefix="bench-routing-") as tmp:
            for round_ in range(args.rounds):
                order = POLICIES if round_ % 2 == 0 else POLICIES[::-1]
                for policy in order:
                    log(args, f"round {round_ + 1}: {policy}")
                    result = await run_policy(args, policy, Path(tmp))
                    log(args, f"  {json.dumps(result)}")
                    runs[policy].append(result)
        return runs

    runs = trio.run(run_all)
    text = report(args, runs)
    print(text)
    if args.json:
        settings = {k: v for k, v in vars(args).items() if k not in ("json", "write_docs")}
        args.json.write_text(json.dumps({"args": settings, "runs": runs}, indent=2))
    if args.write_docs:
        write_docs(args.write_docs, f"{BEGIN}\n{text}{END}", BEGIN, END)
    return 0


if __name__ == "__main__":
    sys.exit(main())
