"""HTTP by hand on a socket (for disconnect and framing tests), the ``/health`` poll, and
reading an SSE answer."""

from __future__ import annotations

import httpx
import trio

from tests.helpers.frontends import Frontend
from tests.helpers.waiting import HANG_GUARD


async def raw_request(
    frontend: Frontend, method: str, path: str, body: bytes, **headers: str
) -> trio.SocketStream:
    """Open a TCP stream and send one request by hand (for disconnect tests)."""
    stream = await trio.open_tcp_stream(frontend.host, frontend.port)
    head = [f"{method} {path} HTTP/1.1", f"host: {frontend.host}", "content-type: application/json"]
    head += [f"{name.replace('_', '-')}: {value}" for name, value in headers.items()]
    head.append(f"content-length: {len(body)}")
    await stream.send_all(("\r\n".join(head) + "\r\n\r\n").encode() + body)
    return stream


async def read_until(stream: trio.SocketStream, marker: bytes) -> bytes:
    data = b""
    with trio.fail_after(HANG_GUARD):
        while marker not in data:
            chunk = await stream.receive_some(65536)
            if not chunk:
                break
            data += chunk
    return data


async def read_to_end(stream: trio.abc.ReceiveStream) -> bytes:
    """Everything the peer sends until it closes (or resets) the connection."""
    received = b""
    while True:
        try:
            chunk = await stream.receive_some(65536)
        except trio.BrokenResourceError:
            return received
        if not chunk:
            return received
        received += chunk


async def wait_health(client: httpx.AsyncClient | str, status: int = 200) -> None:
    """Until ``GET /health`` answers ``status``, on ``client`` or at the base URL
    ``client``. A server still starting (connection refused), a connection slot not yet
    free, an engine handshake under way (503): each is waited out under the hang guard."""
    if isinstance(client, str):
        async with httpx.AsyncClient(base_url=client, timeout=HANG_GUARD) as own:
            return await wait_health(own, status)
    last: object = None
    with trio.move_on_after(HANG_GUARD):
        while True:
            try:
                last = (await client.get("/health")).status_code
            except httpx.TransportError as exc:
                last = exc
            if last == status:
                return
            await trio.sleep(0.02)
    raise AssertionError(f"/health never answered {status} (last: {last!r})")


def sse_events(text: str) -> list[str]:
    """The data of each event of an SSE body, in order."""
    return [line.removeprefix("data: ") for line in text.split("\n\n") if line.startswith("data: ")]


async def get(frontend: Frontend, path: str) -> tuple[int, bytes]:
    """``GET path`` on a fresh connection: the status and the body."""
    stream = await trio.open_tcp_stream(frontend.host, frontend.port)
    head = f"GET {path} HTTP/1.1\r\nhost: {frontend.host}\r\nconnection: close\r\n\r\n"
    await stream.send_all(head.encode())
    with trio.fail_after(HANG_GUARD):
        data = await read_to_end(stream)
    await stream.aclose()
    status_line, _, rest = data.partition(b"\r\n")
    return int(status_line.split(b" ")[1]), rest.partition(b"\r\n\r\n")[2]
