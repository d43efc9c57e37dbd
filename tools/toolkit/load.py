"""The load generator's runs (``tools.loadgen`` is their command line): json, stream, ttft
and idle, over the client of ``http_client``, with the CPU and memory figures of ``procfs``.

The bench tools drive it in their own processes (``tools.bench_vllm_load``,
``tools.instructions``) or run ``tools.loadgen`` as a child (``tools.bench``,
``tools.bench_curve``). See ``tools.loadgen`` for what each mode measures. All traffic goes
to 127.0.0.1. The runs look ``chat_request``, ``CpuMeter`` and ``Stream`` up in this module
when they run, so a caller may put its own in their place (``tools.bench_vllm_load`` does).
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
import time
import uuid
from array import array

import zmq

from trioserve.errors import PeerProtocolError
from trioserve.protocol import (
    PROTOCOL_VERSION,
    Hello,
    Outputs,
    Ping,
    Pong,
    Submit,
    Welcome,
    decode,
    encode,
)

from .http_client import Connection, Response, chat_request, connect
from .procfs import CpuMeter, rss_bytes

PROMPT = "Tell me about the quiet northern sky"
TOKEN = b'"content":'


def log(message: str) -> None:
    print(f"[loadgen] {message}", file=sys.stderr, flush=True)


def percentile(values, q: float) -> float:  # type: ignore[no-untyped-def]
    if not len(values):
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


# -- json -----------------------------------------------------------------------------------


async def run_json(args: argparse.Namespace) -> dict:
    host, port = args.host, args.port
    request = chat_request(
        f"{host}:{port}",
        {
            "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": args.max_tokens,
            "mock_ttft_ms": 0,
            "mock_tokens_per_second": 0,
        },
    )
    latencies = array("d")
    state = {"measuring": False, "count": 0, "errors": 0, "reconnects": 0, "running": True}
    meter = CpuMeter(args.frontend_pid, args.engine_pid)
    loop = asyncio.get_running_loop()

    async def worker() -> None:
        conn = await connect(host, port)
        try:
            while state["running"]:
                if conn.closed.done():
                    # The server ends keep-alive connections when it likes (hypercorn:
                    # after 1000 requests): open another, as any client would.
                    conn = await connect(host, port)
                    state["reconnects"] += 1
                done = loop.create_future()
                response = Response()

                def on_data(data: bytes, response: Response = response, done=done) -> None:  # type: ignore[no-untyped-def]
                    response.feed(data, None)
                    if response.done and not done.done():
                        done.set_result(None)

                conn.on_data = on_data
                t0 = time.perf_counter()
                assert conn.transport is not None
                conn.transport.write(request)
                await asyncio.wait(
                    (done, conn.closed), timeout=30, return_when=asyncio.FIRST_COMPLETED
                )
                elapsed = time.perf_counter() - t0
                if not done.done():
                    if conn.closed.done():
                        continue  # closed before answering: ask again on a new connection
                    raise TimeoutError("no response in 30 s")
                if state["measuring"]:
                    if response.status == 200:
                        state["count"] += 1
                        latencies.append(elapsed)
                    else:
                        state["errors"] += 1
                if response.close:
                    assert conn.transport is not None
                    conn.transport.close()
                    await conn.closed
        finally:
            conn.reset()

    tasks = [loop.create_task(worker()) for _ in range(args.concurrency)]
    try:
        await asyncio.sleep(args.warmup)
        meter.start()
        state["measuring"] = True
        await _sleep_checking(args.duration, tasks)
        state["measuring"] = False
        wall = meter.stop()
    finally:
        state["running"] = False
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return {
        "mode": "json",
        "concurrency": args.concurrency,
        "requests": state["count"],
        "errors": state["errors"],
        "reconnects": state["reconnects"],
        "rps": state["count"] / wall,
        "p50_ms": percentile(latencies, 50) * 1000,
        "p99_ms": percentile(latencies, 99) * 1000,
        "max_ms": max(latencies) * 1000 if latencies else float("nan"),
        "mean_ms": sum(latencies) / len(latencies) * 1000 if latencies else float("nan"),
        **meter.result,
        "frontend_cpu_us_per_request": (
            1e6 * meter.result["frontend_cpu_s"] / max(state["count"], 1)
        ),
    }


async def _sleep_checking(seconds: float, tasks: list[asyncio.Task]) -> None:
    """Sleep, but raise at once if a worker failed."""
    done, _ = await asyncio.wait(tasks, timeout=seconds, return_when=asyncio.FIRST_EXCEPTION)
    for task in done:
        if task.exception() is not None:
            raise task.exception()  # type: ignore[misc]


# -- stream ---------------------------------------------------------------------------------


class Stream:
    """One client streaming answer after answer on one keep-alive connection.

    Counts token events and records the gaps between consecutive tokens of one answer
    while measuring; the next request leaves as soon as an answer is complete.
    """

    __slots__ = ("_ctx", "conn", "failed", "first", "last", "now", "request", "response")

    def __init__(self, ctx: dict, conn: Connection, request: bytes) -> None:
        self._ctx = ctx
        self.conn = conn
        self.request = request
        self.first: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.last = 0.0
        self.now = 0.0
        self.failed = False
        self.response = Response()
        conn.on_data = self.on_data

    def send(self) -> None:
        self.response = Response()
        self.last = 0.0
        assert self.conn.transport is not None
        self.conn.transport.write(self.request)

    def on_data(self, data: bytes) -> None:
        self.now = time.perf_counter()
        response = self.response
        rest = response.feed(data, self.on_chunk)
        if response.done:
            if response.status != 200:
                self.fail(f"HTTP {response.status}")
                return
            if rest:
                self.fail("unexpected bytes after a response")
                return
            self._ctx["answers"] += 1
            self.send()

    def on_chunk(self, chunk: bytes) -> None:
        # A chunk is one server write: whole events, so a marker is never split.
        tokens = chunk.count(TOKEN)
        if not tokens:
            if b'"error"' in chunk and self.response.status == 200:
                self.fail(chunk[:300].decode(errors="replace"))
            return
        now = self.now
        ctx = self._ctx
        if ctx["measuring"]:
            ctx["events"] += tokens
            gaps = ctx["gaps"]
            if self.last:
                gaps.append(now - self.last)
                tokens -= 1
            if tokens:
                gaps.extend(ctx["zeros"][:tokens] if tokens <= 64 else [0.0] * tokens)
        self.last = now
        if not self.first.done():
            self.first.set_result(None)

    def fail(self, why: str) -> None:
        if not self.failed:
            self.failed = True
            self._ctx["failed"] += 1
            self._ctx["why"] = why
        if not self.first.done():
            self.first.set_exception(RuntimeError(why))


def stream_context() -> dict:
    """What the streams of one run share (:class:`Stream` counts into it): whether the
    window is open, the events and answers counted, the gaps between events, failures."""
    return {
        "measuring": False,
        "events": 0,
        "answers": 0,
        "gaps": array("d"),
        "zeros": array("d", [0.0] * 64),
        "failed": 0,
        "why": "",
    }


async def run_stream(args: argparse.Namespace) -> dict:
    host, port = args.host, args.port
    request = chat_request(
        f"{host}:{port}",
        {
            "messages": [{"role": "user", "content": PROMPT}],
            "stream": True,
            "max_tokens": args.stream_tokens,
            "mock_ttft_ms": 0,
            "mock_tokens_per_second": args.rate,
        },
    )
    ctx = stream_context()
    meter = CpuMeter(args.frontend_pid, args.engine_pid)
    streams: list[Stream] = []
    # Streams still waiting for their first token, at most: a burst of connections larger
    # than a listen backlog would measure SYN retries instead of the frontend.
    opening = asyncio.Semaphore(64)

    async def open_one() -> None:
        async with opening:
            conn = await connect(host, port)
            stream = Stream(ctx, conn, request)
            streams.append(stream)
            stream.send()
            await stream.first

    t_open = time.monotonic()
    try:
        # Every stream's first token within the ramp's bound (90 s unless the caller says).
        ramp_timeout = getattr(args, "ramp_timeout", 90)
        await asyncio.wait_for(
            asyncio.gather(*(open_one() for _ in range(args.streams))), ramp_timeout
        )
        ramp = time.monotonic() - t_open
        if args.progress:
            log(f"{args.streams} streams flowing after {ramp:.1f} s")
        await asyncio.sleep(args.warmup)
        ctx["failed"] = ctx["answers"] = 0
        meter.start()
        ctx["measuring"] = True
        await asyncio.sleep(args.duration)
        ctx["measuring"] = False
        wall = meter.stop()
    finally:
        for stream in streams:
            stream.conn.reset()
    gaps = ctx["gaps"]
    events = ctx["events"]
    return {
        "mode": "stream",
        "streams": args.streams,
        "rate_per_stream": args.rate,
        "tokens_per_answer": args.stream_tokens,
        "events": events,
        "events_per_s": events / wall,
        "expected_per_s": args.streams * args.rate,
        "answers_completed": ctx["answers"],
        "itl_p50_ms": percentile(gaps, 50) * 1000,
        "itl_p99_ms": percentile(gaps, 99) * 1000,
        "itl_max_ms": max(gaps) * 1000 if gaps else float("nan"),
        "streams_failed": ctx["failed"],
        "failure": ctx["why"],
        "ramp_s": ramp,
        "frontend_cpu_us_per_event": 1e6 * meter.result["frontend_cpu_s"] / events
        if events
        else float("nan"),
        **meter.result,
    }


# -- engine probe (ZeroMQ, blocking) ---------------------------------------------------------


class EngineProbe:
    """A DEALER of its own to the engine: direct submits, and pings for ``running``."""

    def __init__(self, address: str) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.id = f"loadgen-{uuid.uuid4().hex[:12]}"
        self.sock.setsockopt(zmq.ROUTING_ID, self.id.encode())
        self.sock.connect(address)
        self.seq = 0
        deadline = time.monotonic() + 10
        self.sock.send(encode(Hello(PROTOCOL_VERSION, self.id)))
        while True:
            message = self._recv(deadline)
            if isinstance(message, Welcome):
                break

    def _recv(self, deadline: float):  # type: ignore[no-untyped-def]
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not self.sock.poll(remaining * 1000):
            raise TimeoutError("the engine did not answer")
        try:
            return decode(self.sock.recv())
        except PeerProtocolError:
            return None

    def running(self) -> int:
        self.seq += 1
        self.sock.send(encode(Ping(self.seq)))
        deadline = time.monotonic() + 5
        while True:
            message = self._recv(deadline)
            if isinstance(message, Pong) and message.seq == self.seq:
                return message.running

    def ttft(self, params: dict) -> float:
        request_id = uuid.uuid4().hex
        submit = Submit(
            request_id, "mock", "chat", {"messages": [{"role": "user", "content": PROMPT}]}, params
        )
        frame = encode(submit)
        deadline = time.monotonic() + 10
        t0 = time.perf_counter()
        self.sock.send(frame)
        first = 0.0
        while True:  # the first output timed; then the rest, so that the engine is idle
            message = self._recv(deadline)
            if not isinstance(message, Outputs):
                continue
            mine = [item for item in message.items if item.request_id == request_id]
            if mine and not first:
                first = time.perf_counter() - t0
            if any(item.final for item in mine):
                return first

    def close(self) -> None:
        self.sock.close(linger=0)
        self.ctx.term()


# -- ttft -----------------------------------------------------------------------------------


def first_token(sock: socket.socket, request: bytes) -> float:
    """Send one streaming request on ``sock``; seconds until its first ``data:`` event
    (after which the rest of the response is read, up to its last chunk)."""
    t0 = time.perf_counter()
    sock.sendall(request)
    data = b""
    first = 0.0
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            raise RuntimeError("the frontend closed the connection")
        if not first and b"data: " in data + chunk:
            first = time.perf_counter() - t0
        data += chunk
        if data.endswith(b"0\r\n\r\n") and b"[DONE]" in data:
            return first


def _ttft_figures(direct: list[float], via: list[float], ttft_ms: float) -> dict:
    return {
        "mode": "ttft",
        "count": len(via),
        "engine_ttft_ms": ttft_ms,
        "direct_p50_ms": percentile(direct, 50) * 1000,
        "direct_p99_ms": percentile(direct, 99) * 1000,
        "frontend_p50_ms": percentile(via, 50) * 1000,
        "frontend_p99_ms": percentile(via, 99) * 1000,
        "added_p50_ms": (percentile(via, 50) - percentile(direct, 50)) * 1000,
        "added_p99_ms": (percentile(via, 99) - percentile(direct, 99)) * 1000,
    }


def run_ttft(args: argparse.Namespace) -> dict:
    """The frontends (``--url``, then each ``--also-url``) take turns request by request,
    each request right after one straight to the engine: whatever the machine does
    meanwhile falls on every frontend alike. The figures of ``--url`` come at the top
    level, those of the others under ``others`` by URL."""
    params = {"max_tokens": args.ttft_tokens, "mock_ttft_ms": args.ttft_ms}
    if args.ttft_tokens > 1:  # the first token alone in its step, the rest 1 ms apart
        params["mock_tokens_per_second"] = 1000
    body = {"messages": [{"role": "user", "content": PROMPT}], "stream": True, **params}
    targets = [(args.host, args.port), *args.also]
    probe = EngineProbe(args.engine)
    direct: list[list[float]] = [[] for _ in targets]
    via: list[list[float]] = [[] for _ in targets]
    socks: list[socket.socket] = []
    try:
        requests = []
        for host, port in targets:
            sock = socket.create_connection((host, port), timeout=10)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            socks.append(sock)
            requests.append(chat_request(f"{host}:{port}", body))
        for i in range(args.warmup_count + args.count):
            for k, sock in enumerate(socks):
                d = probe.ttft(params)
                first = first_token(sock, requests[k])
                if i >= args.warmup_count:
                    direct[k].append(d)
                    via[k].append(first)
    finally:
        for sock in socks:
            sock.close()
        probe.close()
    result = _ttft_figures(direct[0], via[0], args.ttft_ms)
    if args.also:
        result["others"] = {
            url: _ttft_figures(direct[k], via[k], args.ttft_ms)
            for k, url in enumerate(args.also_url, start=1)
        }
    return result


# -- idle -----------------------------------------------------------------------------------


async def run_idle(args: argparse.Namespace) -> dict:
    host, port = args.host, args.port
    request = chat_request(
        f"{host}:{port}",
        {
            "messages": [{"role": "user", "content": "stay silent"}],
            "stream": True,
            "max_tokens": 1,
            "mock_ttft_ms": 1e9,
        },
    )
    probe = EngineProbe(args.engine)
    pid = args.frontend_pid
    conns: list[Connection] = []
    # A silent stream may still get its response head and SSE comments (keep-alives);
    # anything but a 200 is a refusal, reported at once.
    refused: list[bytes] = []

    def on_data(data: bytes) -> None:
        refusal = data.startswith(b"HTTP/") and not data.startswith(b"HTTP/1.1 200")
        if refusal or b'"content":' in data or b'"error"' in data:
            refused.append(data[:400])

    async def wait_running(target: int, timeout: float, what: str) -> float:
        t0 = time.monotonic()
        while (running := probe.running()) != target:
            if refused:
                raise RuntimeError(
                    f"{what}: {len(refused)} stream(s) answered: "
                    + refused[0].decode(errors="replace")
                )
            if time.monotonic() - t0 > timeout:
                raise RuntimeError(f"{what}: the engine holds {running}, expected {target}")
            await asyncio.sleep(0.02)
        return time.monotonic() - t0

    async def open_one() -> None:
        conn = await connect(host, port)
        conn.on_data = on_data
        conns.append(conn)
        assert conn.transport is not None
        conn.transport.write(request)

    result: dict = {"mode": "idle", "levels": {}}
    try:
        # Requests of an earlier scenario may still be ending at the engine (a frontend
        # stopped with streams open leaves them to the engine's orphan sweep): counting
        # from a baseline that is still falling would miscount what this run opens.
        await wait_running(0, 60, "waiting for the engine to end earlier requests")
        baseline_running = probe.running()
        result["rss_baseline_bytes"] = rss_bytes(pid)
        for level in args.levels:
            t0 = time.monotonic()
            while len(conns) < level:
                batch = min(args.batch, level - len(conns))
                await asyncio.wait_for(asyncio.gather(*(open_one() for _ in range(batch))), 60)
                await wait_running(baseline_running + len(conns), 60, f"opening {level}")
                if args.progress:
                    print(f"\r[loadgen] {len(conns)}/{level} open", end="", file=sys.stderr)
            if args.progress:
                print(file=sys.stderr)
            opened_in = time.monotonic() - t0
            await asyncio.sleep(args.settle)
            if refused:
                raise RuntimeError(f"idle streams answered: {refused[0].decode(errors='replace')}")
            rss = rss_bytes(pid)
            result["levels"][str(level)] = {
                "rss_bytes": rss,
                "per_stream_bytes": (rss - result["rss_baseline_bytes"]) / level,
                "opened_in_s": opened_in,
            }
        t0 = time.monotonic()
        for conn in conns:
            conn.reset()
        result["aborted_in_s"] = await wait_running(baseline_running, 120, "closing")
        await asyncio.sleep(args.settle)
        result["rss_after_close_bytes"] = rss_bytes(pid)
    finally:
        for conn in conns:
            conn.reset()
        probe.close()
    return result
