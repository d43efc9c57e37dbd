"""The WebSocket protocol of ``GET /v1/ws``, from a client's side (trio-websocket)."""

from __future__ import annotations

import json
from typing import Any

import trio
from trio_websocket import WebSocketConnection

from tests.helpers.frontends import Frontend
from tests.helpers.waiting import HANG_GUARD


def ws_url(frontend: Frontend) -> str:
    return f"ws://{frontend.host}:{frontend.port}/v1/ws"


def request(client_id: str, prompt: str, max_tokens: int = 5, **body: object) -> str:
    return json.dumps(
        {
            "type": "request",
            "id": client_id,
            "endpoint": "completions",
            "body": {"prompt": prompt, "max_tokens": max_tokens, **body},
        }
    )


async def receive(ws: WebSocketConnection) -> dict[str, Any]:
    with trio.fail_after(HANG_GUARD):
        return json.loads(await ws.get_message())


async def collect(ws: WebSocketConnection, ids: set[str]) -> dict[str, list[dict[str, Any]]]:
    """Read until every id in ``ids`` has ended (done or error)."""
    seen: dict[str, list[dict[str, Any]]] = {i: [] for i in ids}
    open_ids = set(ids)
    while open_ids:
        message = await receive(ws)
        seen[message["id"]].append(message)
        if message["type"] in ("done", "error"):
            open_ids.discard(message["id"])
    return seen


# -- raw frames: shapes a WebSocket library would not send ------------------------------

MASK = b"\x11\x22\x33\x44"


def frame(opcode: int, payload: bytes = b"", *, fin: bool = True, rsv1: bool = False) -> bytes:
    """One client frame (masked, as a client's must be)."""
    first = (0x80 if fin else 0) | (0x40 if rsv1 else 0) | opcode
    length = len(payload)
    if length < 126:
        head = bytes([first, 0x80 | length])
    elif length < 65536:
        head = bytes([first, 0x80 | 126]) + length.to_bytes(2, "big")
    else:
        head = bytes([first, 0x80 | 127]) + length.to_bytes(8, "big")
    masked = bytes(b ^ MASK[i % 4] for i, b in enumerate(payload))
    return head + MASK + masked


TEXT, CONTINUATION, CLOSE = 1, 0, 8


async def open_raw(frontend: Frontend, *headers: bytes) -> tuple[trio.SocketStream, bytes]:
    """A WebSocket handshake on /v1/ws by hand: the stream and the server's answer head
    (a 101, or a refusal)."""
    stream = await trio.open_tcp_stream(frontend.host, frontend.port)
    lines = [
        b"GET /v1/ws HTTP/1.1",
        b"host: " + frontend.host.encode(),
        b"upgrade: websocket",
        b"connection: Upgrade",
        b"sec-websocket-version: 13",
        b"sec-websocket-key: AQIDBAUGBwgJCgsMDQ4PEA==",
        *headers,
    ]
    await stream.send_all(b"\r\n".join(lines) + b"\r\n\r\n")
    head = b""
    with trio.fail_after(HANG_GUARD):
        while b"\r\n\r\n" not in head:
            data = await stream.receive_some()
            if not data:
                break
            head += data
    head, _, rest = head.partition(b"\r\n\r\n")
    if rest:
        raise AssertionError(f"frames before any were asked for: {rest[:100]!r}")
    return stream, head


class FrameReader:
    """The server's frames (unmasked), read as they come."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buffer = b""

    async def _need(self, size: int) -> bool:
        while len(self.buffer) < size:
            try:
                data = await self.stream.receive_some()
            except trio.BrokenResourceError:
                data = b""
            if not data:
                return False
            self.buffer += data
        return True

    async def next(self) -> tuple[int, bytes] | None:
        """The next frame's opcode and payload; None once the server closed the stream."""
        with trio.fail_after(HANG_GUARD):
            if not await self._need(2):
                return None
            length, offset = self.buffer[1] & 0x7F, 2
            if length == 126:
                if not await self._need(4):
                    return None
                length, offset = int.from_bytes(self.buffer[2:4], "big"), 4
            elif length == 127:
                if not await self._need(10):
                    return None
                length, offset = int.from_bytes(self.buffer[2:10], "big"), 10
            if not await self._need(offset + length):
                return None
            opcode = self.buffer[0] & 0x0F
            payload = self.buffer[offset : offset + length]
            self.buffer = self.buffer[offset + length :]
            return opcode, payload

    async def text(self) -> dict:
        """The next text message, as JSON (pings and pongs skipped)."""
        while True:
            got = await self.next()
            if got is None:
                raise AssertionError("the server closed the socket")
            opcode, payload = got
            if opcode == CLOSE:
                raise AssertionError(f"closed with {int.from_bytes(payload[:2], 'big')}")
            if opcode == TEXT:
                return json.loads(payload)

    async def close_code(self) -> int | None:
        """Read until the server's close frame: its code (None: closed without one)."""
        while True:
            got = await self.next()
            if got is None:
                return None
            opcode, payload = got
            if opcode == CLOSE:
                return int.from_bytes(payload[:2], "big") if len(payload) >= 2 else 1005
