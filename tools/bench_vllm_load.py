"""The load child of ``tools.bench_vllm``: one process per measurement, pinned with the load
generator, driving one side and reading its processes (/proc) and metrics.

Modes (``spec["mode"]``):

- ``json`` / ``stream``: ``tools.toolkit.load``'s runs with vLLM's request body, every answer
  greedy with ``ignore_eos``; the CPU of each of the side's processes and threads over the
  window (:class:`bench_vllm_procs.ThreadMeter`), and the tokens generated meanwhile as the
  client received them (the same count on every side: a non-streaming answer's
  ``max_tokens``, a streamed token event with non-empty text), beside the server's own
  count where it keeps one (vLLM's ``vllm:generation_tokens_total``; the direct path's
  ``trioserve_generation_tokens_total``, counted when a request ends);
- ``ttft``: one streaming request at a time, time to its first ``data:`` event;
- ``abort``: a request is generating, the client closes, time until the engine's running
  count (as the side's metrics say it) is 0;
- ``long_prompt``: ``level`` streams flowing; a window without, a window with long
  prompts arriving one after another, a window without again (each prompt refused for its
  length once tokenized: the frontend's work, not the engine's), the streams' inter-token
  gaps in each.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import re
import socket
import statistics
import time
import urllib.error
import urllib.request
from array import array
from collections.abc import Callable

from tools import bench_vllm_procs as procs
from tools.toolkit import http_client, load, procfs

METRIC_RE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{[^}]*\})? (\S+)$", re.M)
TTFT_SUM, TTFT_COUNT = (
    "vllm:time_to_first_token_seconds_sum",
    "vllm:time_to_first_token_seconds_count",
)
#: A streamed event that carries no text (the role's first event, a finish): not a token.
EMPTY_CONTENT = b'"content":""'


def scrape(url: str) -> dict[str, float]:
    """A Prometheus page's figures, each summed over its label sets (one retry)."""
    try:
        with urllib.request.urlopen(url, timeout=30) as reply:
            text = reply.read().decode()
    except OSError:
        with urllib.request.urlopen(url, timeout=30) as reply:
            text = reply.read().decode()
    out: dict[str, float] = {}
    for name, value in METRIC_RE.findall(text):
        with contextlib.suppress(ValueError):
            out[name] = out.get(name, 0.0) + float(value)
    return out


def _watched(spec: dict) -> list[procs.Watched]:
    return [procs.Watched(w["pid"], w["name"], w["role"], w["core"]) for w in spec["watched"]]


class TokenStream(load.Stream):
    """loadgen's stream, counting only events with text as tokens."""

    __slots__ = ()

    def on_chunk(self, chunk: bytes) -> None:
        if EMPTY_CONTENT in chunk:
            chunk = chunk.replace(EMPTY_CONTENT, b"")
        super().on_chunk(chunk)


def run(spec: dict) -> dict:
    mode = spec["mode"]
    if mode == "ttft":
        return run_ttft(spec)
    if mode == "abort":
        return run_abort(spec)
    if mode == "long_prompt":
        import uvloop

        return uvloop.run(run_long_prompt(spec))
    return run_load(spec)


def run_load(spec: dict) -> dict:
    mode = spec["mode"]
    make_request = http_client.chat_request

    def chat_request(host: str, body: dict) -> bytes:
        # The mock's knobs out; every answer its full length, the same tokens on each side.
        body = {k: v for k, v in body.items() if not k.startswith("mock_")}
        body.update(model=spec["model"], ignore_eos=True, temperature=0)
        return make_request(host, body)

    counter_url, counter = spec["token_counter"]

    class SideMeter(procfs.CpuMeter):
        """CPU of the side's processes, each alone, per thread, and the tokens generated."""

        def __init__(self, _frontend: int | None, _engine: int | None) -> None:
            super().__init__(None, None)
            self.pids = {"loadgen": os.getpid()}
            watched = _watched(spec)
            self.threads = procs.ThreadMeter(watched, spec["tops"])
            self._server_before = 0.0

        def start(self) -> None:  # the scrape stays outside the CPU window
            self._server_before = scrape(counter_url).get(counter, math.nan)
            self.threads.start()
            super().start()

        def stop(self) -> float:
            wall = super().stop()
            threads = self.threads.stop(wall)
            server_tokens = scrape(counter_url).get(counter, math.nan) - self._server_before
            r = self.result
            counted = {
                name: p["cpu_s"] for name, p in threads["processes"].items() if p["role"] != "model"
            }
            model = sum(p["cpu_s"] for p in threads["processes"].values() if p["role"] == "model")
            server = sum(counted.values())
            # loadgen's own figures read these: the counted processes are "the frontend".
            r["frontend_cpu_s"] = server
            # Everything else that ran meanwhile: not this side, not the load generator.
            side_pct = sum(p["cpu_pct"] for p in threads["processes"].values())
            r["other_cpu_pct"] = max(0.0, r["other_cpu_pct"] - side_pct)
            r.update(
                threads=threads,
                server_counted_tokens=server_tokens,
                server_cpu_s=server,
                server_cpu_pct=100 * server / wall,
                model_cpu_pct=100 * model / wall,
                **{f"{name}_cpu_s": cpu for name, cpu in counted.items()},
            )
            return wall

    # In the runs' place (they look these up in tools.toolkit.load as they run).
    load.chat_request = chat_request
    load.CpuMeter = SideMeter  # type: ignore[misc]
    load.Stream = TokenStream  # type: ignore[misc]
    host, port = spec["url"].removeprefix("http://").rsplit(":", 1)
    ns = argparse.Namespace(
        host=host,
        port=int(port),
        duration=spec["duration"],
        warmup=spec["warmup"],
        frontend_pid=None,
        engine_pid=None,
        progress=False,
        concurrency=spec["level"],
        streams=spec["level"],
        max_tokens=spec["tokens"],
        stream_tokens=spec["tokens"],
        rate=0.0,
        # On a machine shared with other work, 256 streams' first tokens took over 90 s.
        ramp_timeout=spec["ramp_timeout"],
    )
    import uvloop

    runner = load.run_json if mode == "json" else load.run_stream
    result = uvloop.run(runner(ns))
    # A non-streaming answer is max_tokens long (ignore_eos): exact. A streamed event may
    # carry several tokens (a server behind merges them), so streamed tokens are the
    # engine's own count over the window (vLLM's vllm:generation_tokens_total; the direct
    # path's per-step counter), the client's events kept beside it.
    if mode == "json":
        tokens = result["requests"] * spec["tokens"]
    else:
        tokens = result["server_counted_tokens"]
        if math.isnan(tokens):
            raise RuntimeError(f"no token counter {counter!r} at {counter_url}")
        result["client_events"] = result["events"]
    wall = result["window_s"]
    result.update(
        generated_tokens=tokens,
        tokens_per_s=tokens / wall,
        server_cpu_us_per_token=1e6 * result["server_cpu_s"] / tokens if tokens else math.nan,
        **{
            f"{name}_cpu_us_per_token": 1e6 * result[f"{name}_cpu_s"] / tokens
            if tokens
            else math.nan
            for name in spec["counted"]
        },
    )
    return result


def stream_body(model: str, max_tokens: int) -> dict:
    return {
        "model": model,
        "messages": [{"role": "user", "content": load.PROMPT}],
        "stream": True,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0,
    }


def run_ttft(spec: dict) -> dict:
    """One request at a time on a keep-alive connection; vLLM's TTFT histogram (where the
    side has one) read before and after."""
    host, port = spec["url"].removeprefix("http://").rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=30)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    request = http_client.chat_request(f"{host}:{port}", stream_body(spec["model"], spec["tokens"]))
    histogram = spec.get("ttft_histogram_url")
    via: list[float] = []
    before: dict[str, float] = {}
    try:
        for i in range(spec["warmup"] + spec["count"]):
            if i == spec["warmup"] and histogram:
                before = scrape(histogram)
            first = load.first_token(sock, request)
            if i >= spec["warmup"]:
                via.append(first)
        after = scrape(histogram) if histogram else {}
    finally:
        sock.close()
    count = after.get(TTFT_COUNT, 0) - before.get(TTFT_COUNT, 0)
    engine_mean = (after.get(TTFT_SUM, 0) - before.get(TTFT_SUM, 0)) / count if count else math.nan
    mean = statistics.fmean(via)
    return {
        "count": len(via),
        "engine_count": count,
        "p50_ms": load.percentile(via, 50) * 1000,
        "p99_ms": load.percentile(via, 99) * 1000,
        "mean_ms": mean * 1000,
        "engine_mean_ms": engine_mean * 1000,
        "added_mean_ms": (mean - engine_mean) * 1000,
    }


def _running(url: str, metric: str) -> float:
    return scrape(url).get(metric, math.nan)


def _wait_running(url: str, metric: str, done: Callable[[float], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not done(_running(url, metric)):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the engine's running count stuck at {_running(url, metric)}")
        time.sleep(0.01)


def run_abort(spec: dict) -> dict:
    """One request at a time: make it generate, close the connection, time until the
    engine's running count is 0 again."""
    url, metric = spec["running"]
    host, port = spec["url"].removeprefix("http://").rsplit(":", 1)
    out: dict = {}
    scrapes: list[float] = []
    for stream in (True, False):
        latencies = []
        for _ in range(spec["count"]):
            _wait_running(url, metric, lambda n: n == 0, 30)
            body = stream_body(spec["model"], spec["tokens"])
            body["stream"] = stream
            sock = socket.create_connection((host, int(port)), timeout=30)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                sock.sendall(http_client.chat_request(f"{host}:{port}", body))
                data = b""
                if stream:  # generating: its first event is here
                    while b"data: " not in data:
                        chunk = sock.recv(65536)
                        if not chunk:
                            raise RuntimeError("closed before the first event")
                        data += chunk
                try:
                    _wait_running(url, metric, lambda n: n >= 1, 30)
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
                running = _running(url, metric)
                scrapes.append(time.perf_counter() - t)
                if running == 0:
                    latencies.append(time.perf_counter() - t0)
                    break
                if t > deadline:
                    raise RuntimeError("the engine still runs an aborted request after 30 s")
                time.sleep(spec["poll_s"])
        which = "sse" if stream else "json"
        out[f"{which}_p50_ms"] = load.percentile(latencies, 50) * 1000
        out[f"{which}_p99_ms"] = load.percentile(latencies, 99) * 1000
        out[f"{which}_max_ms"] = max(latencies) * 1000
        out[f"{which}_count"] = len(latencies)
    out["scrape_p50_ms"] = load.percentile(scrapes, 50) * 1000
    return out


async def _long_prompt_once(host: str, port: int, request: bytes) -> tuple[int, float, bytes]:
    conn = await http_client.connect(host, port)
    response = http_client.Response()
    done = asyncio.get_running_loop().create_future()
    body = bytearray()

    def on_data(data: bytes) -> None:
        response.feed(data, None)
        body.extend(data)
        if response.done and not done.done():
            done.set_result(None)

    conn.on_data = on_data
    t0 = time.perf_counter()
    try:
        assert conn.transport is not None
        conn.transport.write(request)
        await asyncio.wait_for(asyncio.shield(done), 120)
        return response.status, time.perf_counter() - t0, bytes(body[-400:])
    finally:
        conn.reset()


async def run_long_prompt(spec: dict) -> dict:
    """``level`` streams flowing; the inter-token gaps over a window without long prompts,
    one with them arriving back to back (each refused once tokenized), one without."""
    make_request = http_client.chat_request
    host, port = spec["url"].removeprefix("http://").rsplit(":", 1)
    stream_request = make_request(f"{host}:{port}", stream_body(spec["model"], spec["tokens"]))
    prompt = spec["unit"] * spec["copies"]
    long_request = make_request(
        f"{host}:{port}",
        {
            "model": spec["model"],
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 1,
            "temperature": 0,
        },
    )
    ctx = load.stream_context()
    streams: list[load.Stream] = []
    opening = asyncio.Semaphore(64)

    async def open_one() -> None:
        async with opening:
            conn = await http_client.connect(host, int(port))
            stream = TokenStream(ctx, conn, stream_request)
            streams.append(stream)
            stream.send()
            await stream.first

    windows: dict[str, dict] = {}
    long_prompts: list[tuple[int, float]] = []
    tail = b""
    try:
        streams_up = asyncio.gather(*(open_one() for _ in range(spec["level"])))
        await asyncio.wait_for(streams_up, spec["ramp_timeout"])
        await asyncio.sleep(spec["warmup"])
        for name in ("before", "with", "after"):
            ctx["gaps"], ctx["events"] = array("d"), 0
            ctx["measuring"] = True
            t0 = time.monotonic()
            if name == "with":
                while time.monotonic() - t0 < spec["duration"]:
                    status, took, tail = await _long_prompt_once(host, int(port), long_request)
                    long_prompts.append((status, took))
            else:
                await asyncio.sleep(spec["duration"])
            wall = time.monotonic() - t0
            ctx["measuring"] = False
            gaps = ctx["gaps"]
            windows[name] = {
                "window_s": wall,
                "tokens_per_s": ctx["events"] / wall,
                "itl_p50_ms": load.percentile(gaps, 50) * 1000,
                "itl_p99_ms": load.percentile(gaps, 99) * 1000,
                "itl_max_ms": max(gaps) * 1000 if gaps else math.nan,
            }
            if ctx["failed"]:
                raise RuntimeError(f"{ctx['failed']} streams failed: {ctx['why']}")
    finally:
        for stream in streams:
            stream.conn.reset()
    took = [t for _, t in long_prompts]
    return {
        "streams": spec["level"],
        "prompt_chars": len(prompt),
        "windows": windows,
        "long_prompts": len(long_prompts),
        "long_prompt_statuses": sorted({s for s, _ in long_prompts}),
        "long_prompt_answer": tail.decode(errors="replace"),
        "long_prompt_p50_ms": statistics.median(took) * 1000 if took else math.nan,
        "long_prompt_busy_share": sum(took) / windows["with"]["window_s"] if took else 0.0,
        # Against the worse of the windows either side of it: the machine's drift is not the
        # long prompt's.
        "itl_p99_ratio": _ratio(
            windows["with"]["itl_p99_ms"],
            max(windows["before"]["itl_p99_ms"], windows["after"]["itl_p99_ms"]),
        ),
    }


def _ratio(value: float, reference: float) -> float:
    """``value / reference``; NaN when the reference is 0 (no gap between events in the
    windows without long prompts: every stream's events came in bursts)."""
    return value / reference if reference else math.nan
