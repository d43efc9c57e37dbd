"""``trioserve client``: send a prompt, print tokens as they arrive.

Over WebSocket by default (trio-websocket), over SSE on request (h11 on a trio stream).
Ctrl-C stops the request cleanly: over WebSocket a ``cancel`` message (the server answers
with a ``request_cancelled`` error and aborts the engine request), over SSE by closing the
connection (the server notices the disconnect and aborts).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any, TextIO
from urllib.parse import urlsplit

import h11
import trio
from trio_websocket import ConnectionClosed, ConnectionRejected, HandshakeError, open_websocket_url

#: Exit status after Ctrl-C, as shells report a SIGINT.
INTERRUPTED = 130
CANCEL_REPLY_TIMEOUT = 2.0


def _delta(chunk: dict[str, Any]) -> str:
    choices = chunk.get("choices") or []
    if not choices:
        return ""
    choice = choices[0]
    if "delta" in choice:
        return choice["delta"].get("content") or ""
    return choice.get("text") or ""


def _body(prompt: str, endpoint: str, max_tokens: int | None, model: str | None) -> dict[str, Any]:
    body: dict[str, Any] = (
        {"messages": [{"role": "user", "content": prompt}]}
        if endpoint == "chat"
        else {"prompt": prompt}
    )
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    if model is not None:
        body["model"] = model
    return body


async def run_client(
    url: str,
    prompt: str,
    *,
    sse: bool = False,
    endpoint: str = "chat",
    max_tokens: int | None = None,
    model: str | None = None,
    api_key: str | None = None,
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
) -> int:
    """Stream one completion to ``out``; returns a process exit status. ``url`` is
    ``http(s)://HOST:PORT`` (``--sse``: ``http://`` only); ``api_key`` goes in an
    ``Authorization: Bearer`` header. A server that cannot be reached or that refuses is
    one line on ``err`` and status 1."""
    if sse and not url.startswith("http://"):
        raise ValueError(f"SSE is spoken over http:// only, not {url}")
    body = _body(prompt, endpoint, max_tokens, model)
    auth = [(b"authorization", b"Bearer " + api_key.encode())] if api_key else []
    async with trio.open_nursery() as nursery:
        interrupted = trio.Event()

        async def watch_signals() -> None:
            with trio.open_signal_receiver(signal.SIGINT) as signals:
                async for _ in signals:
                    interrupted.set()
                    return

        nursery.start_soon(watch_signals)
        try:
            if sse:
                status = await _sse(url, body, endpoint, interrupted, out, err, auth)
            else:
                status = await _websocket(url, body, endpoint, interrupted, out, err, auth)
        except ConnectionRejected as exc:  # a 401 (API keys), say: no traceback
            status = _refused(exc, err)
        except (OSError, HandshakeError) as exc:  # nobody there: a sentence, not a traceback
            err.write(
                f"cannot reach {url}: {_reason(exc)}; is the server running there? Start it "
                "(trioserve run), or give its address with --url\n"
            )
            status = 1
        nursery.cancel_scope.cancel()
    return status


def _reason(exc: BaseException) -> str:
    """Why a connection failed, in the system's words ("Connection refused"): trio wraps
    the attempts' errors in a group, trio-websocket in a HandshakeError."""
    while not isinstance(exc, OSError) and exc.__cause__ is not None:
        exc = exc.__cause__
    if isinstance(exc, OSError) and exc.strerror is None and exc.__cause__ is not None:
        exc = exc.__cause__  # "all attempts to connect to ... failed"
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    if isinstance(exc, OSError) and exc.errno and exc.errno > 0:  # not a getaddrinfo error
        return os.strerror(exc.errno)
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc)


def _refused(exc: ConnectionRejected, err: TextIO) -> int:
    try:
        error = json.loads(exc.body or b"")["error"]
        reason = f": {error.get('message')} ({error.get('code')})"
    except (ValueError, KeyError, TypeError):
        reason = ""
    err.write(f"error {exc.status_code}: the server refused the WebSocket{reason}\n")
    return 1


async def _websocket(
    url: str,
    body: dict[str, Any],
    endpoint: str,
    interrupted: trio.Event,
    out: TextIO,
    err: TextIO,
    auth: list[tuple[bytes, bytes]],
) -> int:
    parts = urlsplit(url)
    scheme = "wss" if parts.scheme == "https" else "ws"
    ws_url = f"{scheme}://{parts.netloc}/v1/ws"
    name = "chat.completions" if endpoint == "chat" else "completions"
    request = {"type": "request", "id": "1", "endpoint": name, "body": body}
    answer = _Answer(out, err)
    async with open_websocket_url(ws_url, extra_headers=auth) as ws:
        await ws.send_message(json.dumps(request))
        result: dict[str, int] = {}
        finished = trio.Event()

        def finish(status: int) -> None:
            result.setdefault("status", status)
            finished.set()

        async def read() -> None:
            try:
                while True:
                    message = json.loads(await ws.get_message())
                    if message["type"] == "chunk":
                        answer.write(_delta(message["data"]))
                    elif message["type"] == "done":
                        answer.end()
                        return finish(0)
                    elif message["type"] == "error":
                        error = message["error"]
                        if error.get("code") == "request_cancelled":
                            answer.end()
                            return finish(INTERRUPTED)
                        answer.error(f"error: {error.get('message')} ({error.get('code')})")
                        return finish(1)
            except ConnectionClosed as exc:
                answer.error(f"connection closed: {exc.reason}")
                finish(1)

        async def on_interrupt() -> None:
            await interrupted.wait()
            await ws.send_message(json.dumps({"type": "cancel", "id": "1"}))
            with trio.move_on_after(CANCEL_REPLY_TIMEOUT):
                await finished.wait()  # the server confirms the cancel
            finish(INTERRUPTED)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            nursery.start_soon(on_interrupt)
            await finished.wait()
            nursery.cancel_scope.cancel()
        return result["status"]


class _Answer:
    """The answer on ``out`` as it streams, and an error on ``err`` on a line of its own:
    after the answer's line if it had begun, else at once (no empty line before it)."""

    def __init__(self, out: TextIO, err: TextIO) -> None:
        self.out, self.err = out, err
        self.line_open = False

    def write(self, text: str) -> None:
        if text:
            self.out.write(text)
            self.out.flush()
            self.line_open = True

    def end(self) -> None:
        self.out.write("\n")
        self.out.flush()
        self.line_open = False

    def error(self, line: str) -> None:
        if self.line_open:
            self.end()
        self.err.write(line + "\n")
        self.err.flush()


async def _sse(
    url: str,
    body: dict[str, Any],
    endpoint: str,
    interrupted: trio.Event,
    out: TextIO,
    err: TextIO,
    auth: list[tuple[bytes, bytes]],
) -> int:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    path = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
    payload = json.dumps({**body, "stream": True}).encode()
    stream = await trio.open_tcp_stream(host, port)
    conn = h11.Connection(h11.CLIENT)
    headers = [
        (b"host", parts.netloc.encode()),
        (b"content-type", b"application/json"),
        (b"accept", b"text/event-stream"),
        (b"content-length", str(len(payload)).encode()),
        *auth,
    ]
    await stream.send_all(
        conn.send(h11.Request(method="POST", target=path, headers=headers))
        + conn.send(h11.Data(data=payload))
        + conn.send(h11.EndOfMessage())
    )
    status = 1
    failed = False  # an error event came: [DONE] after it is no success
    answer = _Answer(out, err)
    async with stream, trio.open_nursery() as nursery:

        async def on_interrupt() -> None:
            await interrupted.wait()
            nursery.cancel_scope.cancel()  # closing the connection is the cancel

        nursery.start_soon(on_interrupt)
        buffer = b""
        code = 0
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await stream.receive_some(65536))
                continue
            if isinstance(event, h11.Response):
                code = event.status_code
            elif isinstance(event, h11.Data):
                buffer += bytes(event.data)
                if code != 200:
                    continue
                *events, buffer = buffer.split(b"\n\n")
                for raw in events:
                    if not raw.startswith(b"data: "):
                        continue
                    data = raw[6:]
                    if data == b"[DONE]":
                        if not failed:
                            answer.end()
                            status = 0
                        continue
                    chunk = json.loads(data)
                    if "error" in chunk:
                        error = chunk["error"]
                        answer.error(f"error: {error.get('message')} ({error.get('code')})")
                        status, failed = 1, True
                    else:
                        answer.write(_delta(chunk))
            elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                if code != 200:
                    try:
                        error = json.loads(buffer)["error"]
                        err.write(f"error {code}: {error.get('message')} ({error.get('code')})\n")
                    except (ValueError, KeyError, TypeError):
                        err.write(f"error {code}: {buffer[:500]!r}\n")
                    status = 1
                nursery.cancel_scope.cancel()
                break
    if interrupted.is_set() and status != 0:
        out.write("\n")
        return INTERRUPTED
    return status
