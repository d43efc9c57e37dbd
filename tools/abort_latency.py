"""Abort latency: from a client's connection close to the engine receiving the abort.

Runs a mock engine in this process (so the abort's arrival is timed on the same clock as
the close), ``trioserve run`` as a real subprocess in front of it, and, one at a time,
opens a request, waits until it is generating, closes the connection and waits for the
engine to see the abort. Streaming (SSE, closed after the first event) and non-streaming
(JSON, closed while waiting) are measured separately. All traffic is on 127.0.0.1.

    python -m tools.abort_latency --count 300
    python -m tools.abort_latency --count 300 --write-docs docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import trio

from trioserve.engine_programs.mock import MockBackend
from trioserve.sdk import serve_engine

BEGIN, END = "<!-- abort-latency:begin -->", "<!-- abort-latency:end -->"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


async def measure(count: int, progress: bool) -> dict[str, dict[str, float]]:
    arrived: dict[str, float] = {}
    waiting: dict[str, trio.Event] = {}

    def on_end(key: tuple[bytes, str], how: str) -> None:
        if how == "aborted":
            arrived[key[1]] = time.monotonic()
            if key[1] in waiting:
                waiting[key[1]].set()

    results: dict[str, list[float]] = {"sse": [], "json": []}
    async with trio.open_nursery() as nursery:
        engine = await nursery.start(
            partial(serve_engine, MockBackend(tokens_per_second=50, ttft_ms=5), "tcp://127.0.0.1:*")
        )
        engine.core.on_end = on_end
        process = await trio.lowlevel.open_process(
            [sys.executable, "-m", "trioserve", "run", "--port", "0", "--engine", engine.address],
            stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        try:
            port = await _port_of(process)
            await _wait_ready(port)
            for mode in ("sse", "json"):
                for i in range(count):
                    request_id = f"{mode}-{i}"
                    waiting[request_id] = trio.Event()
                    latency = await _one(
                        port, engine, request_id, mode, waiting[request_id], arrived
                    )
                    results[mode].append(latency)
                    if progress and (i + 1) % 25 == 0:
                        print(f"\r{mode}: {i + 1}/{count}", end="", file=sys.stderr, flush=True)
                if progress:
                    print(file=sys.stderr)
        finally:
            process.terminate()
            with trio.move_on_after(10):
                await process.wait()
            nursery.cancel_scope.cancel()
    return {
        mode: {
            "count": len(values),
            "p50_ms": percentile(values, 50) * 1000,
            "p99_ms": percentile(values, 99) * 1000,
            "max_ms": max(values) * 1000,
            "mean_ms": statistics.fmean(values) * 1000,
        }
        for mode, values in results.items()
    }


async def _one(port, engine, request_id, mode, event, arrived) -> float:
    body = json.dumps(
        {
            "messages": [{"role": "user", "content": "abort me"}],
            "max_tokens": 100_000,
            "stream": mode == "sse",
        }
    ).encode()
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        + f"x-request-id: {request_id}\r\ncontent-length: {len(body)}\r\n\r\n".encode()
        + body
    )
    with trio.fail_after(30):
        if mode == "sse":
            data = b""
            while b"data: " not in data:
                data += await stream.receive_some(65536)
        else:
            while not any(key[1] == request_id for key in engine.core.running):
                await trio.sleep(0.001)
        closed = time.monotonic()
        await stream.aclose()
        await event.wait()
    return arrived[request_id] - closed


async def _port_of(process: trio.Process) -> int:
    output = b""
    with trio.fail_after(30):
        async for chunk in process.stderr:
            output += chunk
            if match := re.search(rb"Running on http://127\.0\.0\.1:(\d+)", output):
                return int(match.group(1))
    raise RuntimeError(f"trioserve run did not start: {output.decode()}")


async def _wait_ready(port: int) -> None:
    with trio.fail_after(30):
        while True:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.send_all(b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            reply = await stream.receive_some(1024)
            await stream.aclose()
            if reply.startswith(b"HTTP/1.1 200"):
                return
            await trio.sleep(0.05)


def table(figures: dict[str, dict[str, float]], command: str) -> str:
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    lines = [
        BEGIN,
        f"Measured {time.strftime('%Y-%m-%d')} on {machine}, with `{command}`.",
        "",
        "| response kind | disconnects | p50 | p99 | max |",
        "|---|---|---|---|---|",
    ]
    for mode, label in (("sse", "streaming (SSE)"), ("json", "non-streaming (JSON)")):
        f = figures[mode]
        lines.append(
            f"| {label} | {f['count']} | {f['p50_ms']:.2f} ms | {f['p99_ms']:.2f} ms "
            f"| {f['max_ms']:.2f} ms |"
        )
    lines.append(END)
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tools.abort_latency", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--count", type=int, default=300, help="disconnects per response kind")
    parser.add_argument("--json", type=Path, help="also write the figures here as JSON")
    parser.add_argument("--write-docs", type=Path, help="update this markdown file's table")
    parser.add_argument("--quiet", action="store_true", help="no progress display")
    args = parser.parse_args()
    figures = trio.run(measure, args.count, not args.quiet)
    command = "python -m tools.abort_latency --count " + str(args.count)
    text = table(figures, command)
    print(text)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    if args.write_docs:
        doc = args.write_docs.read_text()
        if BEGIN in doc and END in doc:
            doc = doc[: doc.index(BEGIN)] + text + doc[doc.index(END) + len(END) :]
        else:
            doc += "\n" + text + "\n"
        args.write_docs.write_text(doc)


if __name__ == "__main__":
    main()
