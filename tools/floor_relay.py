"""The floor under trioserve's time to first token: trio, trioserve's engine client and a
socket, and nothing else.

It reads a streaming chat request (head and body in one read, as a benchmark client sends
it), submits its messages and params to the engine as they are, and writes each batch of
outputs as SSE events, the first one with a fixed response head. No HTTP parser, no
validation, no request lifecycle, no deadline, no disconnect watch, no abort: not a server
to use. Measured beside trioserve request by request, it says how much of the time a
frontend adds is trioserve's own and how much is the floor of any trio frontend on the same
machine (two wake-ups from idle, the engine client, the loopback hops):

    python -m tools.floor_relay --engine tcp://127.0.0.1:5555 --port 8001 &
    python -m tools.loadgen ttft --engine tcp://127.0.0.1:5555 \\
        --url http://127.0.0.1:8001 --also-url http://127.0.0.1:8000

prints ``Running on http://127.0.0.1:PORT`` (stderr) once the engine has welcomed it.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import uuid

import trio

from trioserve.ends import EndReason
from trioserve.engine import EngineClient
from trioserve.links.protocol_client import open_protocol_client
from trioserve.protocol import Submit
from trioserve.server.http1.protocol import LAST_CHUNK, chunk

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
NOT_PARAMS = frozenset({"model", "messages", "stream", "stream_options"})


def event(obj: object) -> bytes:
    return chunk(b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n")


async def relay(stream: trio.SocketStream, engines: EngineClient, model: str) -> None:
    sock = stream.socket
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    fd = sock.fileno()
    while True:
        await trio.lowlevel.wait_readable(fd)
        data = os.read(fd, 1 << 16)
        if not data:
            return
        body = json.loads(data.partition(b"\r\n\r\n")[2])
        params = {k: v for k, v in body.items() if k not in NOT_PARAMS}
        submit = Submit(uuid.uuid4().hex, model, "chat", {"messages": body["messages"]}, params)
        head = HEAD
        sub = engines.submit(submit, "chat")
        try:
            while batch := await sub.receive_batch():
                out = [head]
                head = b""
                for item in batch:
                    if item.data:
                        out.append(event({"choices": [{"delta": {"content": item.data}}]}))
                    if item.finish_reason is not None or item.error is not None:
                        out.append(chunk(b"data: [DONE]\n\n") + LAST_CHUNK)
                os.write(fd, b"".join(out))
        finally:
            sub.abort(EndReason.DISCONNECT)  # a no-op once the engine finished it


async def serve(engine: str, host: str, port: int) -> None:
    async with open_protocol_client([engine]) as engines:
        await engines.wait_ready()
        model = engines.default_model() or "mock"
        listeners = await trio.open_tcp_listeners(port, host=host)
        bound = listeners[0].socket.getsockname()[1]
        print(f"Running on http://{host}:{bound}", file=sys.stderr, flush=True)

        async def handle(stream: trio.SocketStream) -> None:
            async with stream:
                await relay(stream, engines, model)

        await trio.serve_listeners(handle, listeners)


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.floor_relay", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--engine", default="tcp://127.0.0.1:5555")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    try:
        trio.run(serve, args.engine, args.host, args.port)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
