"""Helpers shared by the HTTP tests: what the engine received, PNG and WAV checks."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

from trioserve.protocol import Submit, decode


def capture_submits(frontend) -> list[Submit]:
    """Every submit the engine receives from now on, in order (the engine's own view)."""
    seen: list[Submit] = []
    core = frontend.engine.core
    original = core.handle

    def spy(identity, frame, now):
        message = decode(frame)
        if isinstance(message, Submit):
            seen.append(message)
        return original(identity, frame, now)

    core.handle = spy
    return seen


def png_info(data: bytes) -> tuple[int, int, bytes]:
    """(width, height, raw scanlines) of a PNG, checking its signature and every CRC."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks = 8, {}
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        tag = data[pos + 4 : pos + 8]
        body = data[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])
        assert crc == zlib.crc32(tag + body) & 0xFFFFFFFF, tag
        chunks[tag] = chunks.get(tag, b"") + body
        pos += 12 + length
    assert list(chunks)[-1] == b"IEND"
    width, height, depth, colour = struct.unpack(">IIBB", chunks[b"IHDR"][:10])
    assert (depth, colour) == (8, 2)
    raw = zlib.decompress(chunks[b"IDAT"])
    assert len(raw) == height * (1 + 3 * width)
    return width, height, raw


def upload_entries(root: Path) -> list[Path]:
    """Everything under the upload root (directories of requests still running)."""
    return sorted(root.rglob("*")) if root.exists() else []


def multipart(fields: dict[str, str], files: list[tuple[str, str, bytes, str]], boundary: str):
    """A multipart/form-data body built by hand (hostile filenames, truncation)."""
    out = b""
    for name, value in fields.items():
        out += (
            f'--{boundary}\r\ncontent-disposition: form-data; name="{name}"\r\n\r\n'.encode()
            + value.encode()
            + b"\r\n"
        )
    for field, filename, data, content_type in files:
        out += (
            (
                f'--{boundary}\r\ncontent-disposition: form-data; name="{field}"; '
                f'filename="{filename}"\r\ncontent-type: {content_type}\r\n\r\n'
            ).encode()
            + data
            + b"\r\n"
        )
    return out + f"--{boundary}--\r\n".encode()
