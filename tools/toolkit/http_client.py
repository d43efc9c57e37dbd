"""The load generator's HTTP/1.1 client: a plain ``asyncio.Protocol`` connection, a chat
request's bytes, and an incremental parser of the response (content-length or chunked).
All traffic goes to 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import ssl
import struct
from collections.abc import Callable

LINGER_RST = struct.pack("ii", 1, 0)


def chat_request(host: str, body: dict) -> bytes:
    payload = json.dumps(body, separators=(",", ":")).encode()
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: "
        + host.encode()
        + b"\r\ncontent-type: application/json\r\ncontent-length: "
        + str(len(payload)).encode()
        + b"\r\n\r\n"
        + payload
    )


class Response:
    """Incremental parser of one HTTP/1.1 response (content-length or chunked)."""

    __slots__ = ("_buf", "_chunked", "_need", "close", "done", "status")

    def __init__(self) -> None:
        self._buf = b""
        self.status = 0
        self.close = False  # the server said "connection: close"
        self._chunked: bool | None = None  # None while the head is incomplete
        self._need = -1  # content-length mode: bytes left; chunked: -1 = want a size line
        self.done = False

    def feed(self, data: bytes, on_chunk: Callable[[bytes], None] | None) -> bytes:
        """Consume ``data``; returns bytes past the end of this response (pipelining)."""
        buf = self._buf + data if self._buf else data
        if self._chunked is None:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                self._buf = buf
                return b""
            head = buf[:end].lower()
            self.status = int(head[9:12])
            self.close = b"connection: close" in head
            buf = buf[end + 4 :]
            if b"transfer-encoding: chunked" in head:
                self._chunked = True
                self._need = -1
            else:
                self._chunked = False
                at = head.find(b"content-length:")
                if at < 0:
                    self._need = 0
                else:
                    line_end = head.find(b"\r\n", at)
                    self._need = int(head[at + 15 : line_end if line_end >= 0 else len(head)])
        if not self._chunked:
            if len(buf) < self._need:
                self._buf = buf
                return b""
            if on_chunk is not None and self._need:
                on_chunk(buf[: self._need])
            self._buf = b""
            self.done = True
            return buf[self._need :]
        while True:
            if self._need < 0:
                line_end = buf.find(b"\r\n")
                if line_end < 0:
                    self._buf = buf
                    return b""
                size = int(buf[:line_end].split(b";", 1)[0], 16)
                buf = buf[line_end + 2 :]
                if size == 0:
                    if len(buf) < 2:  # the final CRLF (no trailers from these servers)
                        self._buf = buf
                        self._need = -2
                        return b""
                    self._buf = b""
                    self.done = True
                    return buf[2:]
                self._need = size
            elif self._need == -2:
                if len(buf) < 2:
                    self._buf = buf
                    return b""
                self._buf = b""
                self.done = True
                return buf[2:]
            if len(buf) < self._need + 2:
                self._buf = buf
                return b""
            if on_chunk is not None:
                on_chunk(buf[: self._need])
            buf = buf[self._need + 2 :]
            self._need = -1


class Connection(asyncio.Protocol):
    """One keep-alive client connection; ``on_data`` sees every read with its timestamp."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = asyncio.get_running_loop().create_future()
        self.on_data: Callable[[bytes], None] | None = None

    def connection_made(self, transport) -> None:  # type: ignore[no-untyped-def]
        self.transport = transport
        sock = transport.get_extra_info("socket")
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        if self.on_data is not None:
            self.on_data(data)

    def connection_lost(self, exc) -> None:  # type: ignore[no-untyped-def]
        if not self.closed.done():
            self.closed.set_result(None)

    def reset(self) -> None:
        """Close with an RST (no TIME_WAIT left behind): the client vanished."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        with contextlib.suppress(OSError):
            transport.get_extra_info("socket").setsockopt(
                socket.SOL_SOCKET, socket.SO_LINGER, LINGER_RST
            )
        transport.abort()


#: The client's TLS context for an https:// URL (tools.loadgen sets it); None: plain HTTP.
TLS: ssl.SSLContext | None = None


async def connect(host: str, port: int) -> Connection:
    loop = asyncio.get_running_loop()
    _, protocol = await loop.create_connection(Connection, host, port, ssl=TLS)
    return protocol
