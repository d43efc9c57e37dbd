"""Clients written by hand on raw sockets, so that a test or a tool can send what no client
library would: a connection and what the server answers within a timeout, and WebSocket by
hand (every frame shape, masked as a client must; the handshake, with or without
permessage-deflate; the server's frames read back, and its close code). All to 127.0.0.1."""

from __future__ import annotations

import base64
import os
import socket
import struct


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def answer_of(sock: socket.socket, timeout: float) -> bytes:
    """What the server sent within ``timeout`` (b"" if nothing)."""
    sock.settimeout(timeout)
    try:
        return sock.recv(4096)
    except (TimeoutError, OSError):
        return b""


def ws_frame(opcode: int, payload: bytes, fin: bool = True, rsv1: bool = False) -> bytes:
    first = (0x80 if fin else 0) | (0x40 if rsv1 else 0) | opcode
    mask = b"\x01\x02\x03\x04"
    length = len(payload)
    if length < 126:
        head = struct.pack("!BB", first, 0x80 | length)
    elif length < 65536:
        head = struct.pack("!BBH", first, 0x80 | 126, length)
    else:
        head = struct.pack("!BBQ", first, 0x80 | 127, length)
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload)) if payload else b""
    return head + mask + masked


def ws_open(port: int, *, deflate: bool = False, key: str | None = None) -> socket.socket:
    return ws_open_negotiated(port, deflate=deflate, key=key)[0]


def ws_open_negotiated(
    port: int, *, deflate: bool = False, key: str | None = None
) -> tuple[socket.socket, bool]:
    """A WebSocket, and whether the server agreed to permessage-deflate."""
    sock = connect(port)
    nonce = base64.b64encode(os.urandom(16))
    lines = [
        b"GET /v1/ws HTTP/1.1",
        b"host: 127.0.0.1",
        b"upgrade: websocket",
        b"connection: Upgrade",
        b"sec-websocket-version: 13",
        b"sec-websocket-key: " + nonce,
    ]
    if deflate:
        lines.append(b"sec-websocket-extensions: permessage-deflate")
    if key:
        lines.append(b"authorization: Bearer " + key.encode())
    sock.sendall(b"\r\n".join(lines) + b"\r\n\r\n")
    head = b""
    while b"\r\n\r\n" not in head:
        data = sock.recv(4096)
        if not data:
            raise OSError("closed during the handshake")
        head += data
    if not head.startswith(b"HTTP/1.1 101"):
        raise OSError(f"handshake refused: {head[:200]!r}")
    return sock, b"permessage-deflate" in head.lower()


def ws_read_frames(sock: socket.socket, timeout: float) -> list[tuple[int, bytes]]:
    """The server's frames until it closes or ``timeout`` of silence (unmasked)."""
    sock.settimeout(timeout)
    data = b""
    try:
        while True:
            piece = sock.recv(65536)
            if not piece:
                break
            data += piece
    except (TimeoutError, OSError):
        pass
    frames = []
    while len(data) >= 2:
        opcode, length = data[0] & 0x0F, data[1] & 0x7F
        offset = 2
        if length == 126:
            (length,) = struct.unpack("!H", data[2:4])
            offset = 4
        elif length == 127:
            (length,) = struct.unpack("!Q", data[2:10])
            offset = 10
        frames.append((opcode, data[offset : offset + length]))
        data = data[offset + length :]
    return frames


def close_code(frames: list[tuple[int, bytes]]) -> int | None:
    for opcode, payload in frames:
        if opcode == 8:
            return struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else 1005
    return None
