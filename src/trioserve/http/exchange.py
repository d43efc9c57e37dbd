"""One HTTP exchange over ASGI: read the body under a limit, send a response, watch for the
client going away."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import trio

from .errors import HTTPError

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

REQUEST_ID_MAX = 128
_REQUEST_ID_RE = re.compile(rb"[A-Za-z0-9._:\-]{1,128}")

JSON_HEADERS = [(b"content-type", b"application/json")]


@attrs.define
class ServerState:
    """What the drain controller has decided so far (see ``drain.py``)."""

    #: Readiness answers 503 (set at the first signal).
    draining: bool = False
    #: The listener is closed: every response says ``Connection: close``.
    closing: bool = False
    #: The grace period is over: new generation requests are refused.
    finished: bool = False


class ClientGone(Exception):
    """The client disconnected before its request was read."""


class Exchange:
    """Request side and response side of one ASGI HTTP scope."""

    __slots__ = (
        "headers",
        "method",
        "path",
        "receive",
        "request_id",
        "scope",
        "send",
        "started",
        "state",
    )

    def __init__(
        self, scope: dict[str, Any], receive: Receive, send: Send, state: ServerState
    ) -> None:
        self.scope = scope
        self.state = state
        self.receive = receive
        self.send = send
        self.method: str = scope["method"]
        self.path: str = scope["path"]
        self.headers: dict[bytes, bytes] = {}
        for name, value in scope["headers"]:
            self.headers[name.lower()] = value
        self.started = False
        self.request_id = self._request_id()

    def _request_id(self) -> str:
        supplied = self.headers.get(b"x-request-id")
        if supplied is not None and _REQUEST_ID_RE.fullmatch(supplied):
            return supplied.decode()
        # Missing or unusable (too long, odd characters): make one; the response says which.
        return uuid.uuid4().hex

    def header(self, name: bytes) -> bytes | None:
        return self.headers.get(name)

    async def read_body(self, limit: int) -> bytes:
        """The whole request body, or 413 past ``limit`` bytes. Raises :class:`ClientGone`."""
        declared = self.headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise HTTPError(413, f"the body exceeds {limit} bytes", "body_too_large")
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                raise ClientGone
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise HTTPError(413, f"the body exceeds {limit} bytes", "body_too_large")
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    def response_headers(self, headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
        out = [*headers, (b"x-request-id", self.request_id.encode())]
        if self.state.closing and self.scope.get("http_version", "1.1") in ("1.0", "1.1"):
            out.append((b"connection", b"close"))
        return out

    async def _send(self, message: dict[str, Any]) -> None:
        # Shielded: hypercorn updates its h11 and stream state before it writes, so a
        # cancellation inside send() leaves the two disagreeing and every later send fails.
        # (hypercorn shields its socket writes too, so this costs no responsiveness.)
        with trio.CancelScope(shield=True):
            await self.send(message)

    async def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.started = True
        await self._send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": self.response_headers(headers),
            }
        )

    async def body(self, data: bytes, more: bool = True) -> None:
        await self._send({"type": "http.response.body", "body": data, "more_body": more})

    async def respond(
        self, status: int, body: bytes, headers: list[tuple[bytes, bytes]] = JSON_HEADERS
    ) -> None:
        """Send a whole response, head and body, with no cancellation point between."""
        with trio.CancelScope(shield=True):
            await self.start(status, [*headers, (b"content-length", str(len(body)).encode())])
            await self.body(body, more=False)

    async def respond_json(self, status: int, obj: Any) -> None:
        await self.respond(status, json.dumps(obj, separators=(",", ":")).encode())

    async def respond_error(self, error: HTTPError) -> None:
        await self.respond(error.status, error.body(), [*JSON_HEADERS, *error.headers])

    async def wait_disconnect(self) -> None:
        """Return when the client has gone. Only call once the body has been read.

        hypercorn's trio worker never raises from ``send()`` after a disconnect; reading
        ``receive()`` is the only way to learn of it.
        """
        while True:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                return
