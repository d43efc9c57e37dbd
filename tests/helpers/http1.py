"""The built-in HTTP/1.1 server alone (no frontend), with a small ASGI app, and what a raw
stream reads of its answers."""

from __future__ import annotations

import json
import ssl
from functools import partial
from typing import Any, cast

import trio

from tests.helpers.waiting import HANG_GUARD
from trioserve.http.channel import ASGIApp, AsgiHandler, HttpHandler, Receive, Send
from trioserve.server.http1 import Http1Config, serve_http1


class EchoApp:
    """Echoes the method, path and body; ``/stream`` streams until the client is gone,
    counted in ``disconnects``."""

    def __init__(self) -> None:
        self.disconnects = 0

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        body = b""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if scope["path"] == "/stream":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            async with trio.open_nursery() as nursery:

                async def watch() -> None:
                    while (await receive())["type"] != "http.disconnect":
                        pass
                    self.disconnects += 1
                    nursery.cancel_scope.cancel()

                nursery.start_soon(watch)
                while True:
                    await send(
                        {"type": "http.response.body", "body": b"x" * 65536, "more_body": True}
                    )
        reply = json.dumps(
            {"method": scope["method"], "path": scope["path"], "body": body.decode()}
        ).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(reply)).encode()),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": reply})


def _handler(app: HttpHandler | ASGIApp) -> HttpHandler:
    """The server's typed interface as it is (an ``HttpHandler``), or around a plain ASGI
    application."""
    if hasattr(app, "handle_http"):
        return cast(HttpHandler, app)
    return AsgiHandler(cast(ASGIApp, app))


async def serve(
    nursery: trio.Nursery,
    app: HttpHandler | ASGIApp | None = None,
    *,
    ssl_context: ssl.SSLContext | None = None,
    **config: object,
) -> tuple[int, trio.Event]:
    """The built-in server on 127.0.0.1 with ``app`` (an ``EchoApp`` if none) and
    ``Http1Config(**config)``: its port, and the event that stops it accepting."""
    stop = trio.Event()
    [url] = await nursery.start(
        partial(
            serve_http1,
            _handler(app if app is not None else EchoApp()),
            "127.0.0.1",
            0,
            config=Http1Config(**config),  # type: ignore[arg-type]
            ssl_context=ssl_context,
            stop_accepting=stop,
        )
    )
    assert url.startswith("https://" if ssl_context else "http://")
    return int(url.rsplit(":", 1)[1]), stop


def get(path: str, extra: str = "") -> bytes:
    """A GET request for ``path``, with ``extra`` header lines."""
    return f"GET {path} HTTP/1.1\r\nhost: x\r\n{extra}\r\n".encode()


async def read_responses(stream: trio.SocketStream, count: int) -> bytes:
    """What ``stream`` receives until ``count`` responses with JSON bodies have arrived, or
    the server closes."""
    data = b""
    with trio.fail_after(HANG_GUARD):
        while data.count(b"HTTP/1.1 ") < count or not data.endswith(b"}"):
            chunk = await stream.receive_some(65536)
            if not chunk:
                break
            data += chunk
    return data


def refusal(data: bytes) -> tuple[bytes, dict]:
    """The head and the JSON error of a response the server gave of its own."""
    head, _, body = data.partition(b"\r\n\r\n")
    return head, json.loads(body)["error"]
