"""One HTTP exchange over ASGI: read the body under a limit, send a response, watch for the
client going away."""

from __future__ import annotations

import json
import math
import os
import re
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
#: ASGI scope extension of a server whose send() may be cancelled without corrupting the
#: connection (it either completes or closes it).
CANCEL_SAFE_SEND = "trioserve.cancel_safe_send"


@attrs.define
class ServerState:
    """What the drain controller has decided so far (see ``drain.py``)."""

    #: Readiness answers 503 (set at the first signal).
    draining: bool = False
    #: The listener is closed: every response says ``Connection: close``.
    closing: bool = False
    #: The grace period is over: new generation requests are refused.
    finished: bool = False


def new_request_id() -> str:
    """A fresh request id: a random (version 4) UUID as 32 hex digits, what
    ``uuid.uuid4().hex`` gives, without building a UUID object on every request."""
    raw = bytearray(os.urandom(16))
    raw[6] = (raw[6] & 0x0F) | 0x40  # version 4
    raw[8] = (raw[8] & 0x3F) | 0x80  # RFC 4122 variant
    return raw.hex()


def body_too_large(limit: int) -> HTTPError:
    return HTTPError(413, f"the body exceeds {limit} bytes", "body_too_large")


class ClientGone(Exception):
    """The client disconnected before its request was read."""


class Exchange:
    """Request side and response side of one ASGI HTTP scope."""

    __slots__ = (
        "_cancel_safe",
        "_prepare_start_body",
        "_prepared_start",
        "detail_errors",
        "extra_headers",
        "headers",
        "key_index",
        "method",
        "path",
        "receive",
        "receive_nowait",
        "request_id",
        "scope",
        "send",
        "started",
        "state",
        "try_send_body",
        "try_start_body",
        "watch_disconnect",
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
        extensions = scope.get("extensions") or {}
        self._cancel_safe = CANCEL_SAFE_SEND in extensions
        #: The server's synchronous body send, if it has one (trioserve's built-in server).
        self.try_send_body = extensions.get("trioserve.try_send_body", {}).get("call")
        #: ... and its synchronous start with a first chunk (see :meth:`try_start`), with
        #: the call that frames that start ahead (see :meth:`prepare_start`).
        start_body = extensions.get("trioserve.try_start_body")
        self.try_start_body = start_body["call"] if start_body else None
        self._prepare_start_body = start_body.get("prepare") if start_body else None
        self._prepared_start: tuple[int, list, bool, dict[str, Any]] | None = None
        #: The server's body receive that never waits (None: nothing at hand), if it has
        #: one: a body that came with its head is read without setting up a timeout.
        self.receive_nowait: Callable[[], dict[str, Any] | None] | None = extensions.get(
            "trioserve.receive_nowait", {}
        ).get("call")
        #: The server's own disconnect watch, if it has one (trioserve's built-in server on
        #: Linux): ``watch_disconnect(callback)`` returns the call that stops watching.
        #: Without it, :meth:`wait_disconnect` needs a task of its own.
        self.watch_disconnect: Callable[[Callable[[], None]], Callable[[], None]] | None = (
            extensions.get("trioserve.watch_disconnect", {}).get("call")
        )
        self.request_id = self._request_id()
        #: Added to every response (CORS).
        self.extra_headers: list[tuple[bytes, bytes]] = []
        #: Errors in the native ``{"detail": ...}`` shape instead of OpenAI's.
        self.detail_errors = False
        #: The index of the API key the request came with (``http/auth.py``; None: no
        #: keys configured, or a route open to all).
        self.key_index: int | None = None

    def _request_id(self) -> str:
        supplied = self.headers.get(b"x-request-id")
        if supplied is not None and _REQUEST_ID_RE.fullmatch(supplied):
            return supplied.decode()
        # Missing or unusable (too long, odd characters): make one; the response says which.
        return new_request_id()

    def header(self, name: bytes) -> bytes | None:
        return self.headers.get(name)

    def check_declared_length(self, limit: int) -> None:
        """413 at once when the declared ``Content-Length`` is over ``limit``."""
        declared = self.headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise body_too_large(limit)

    async def next_body_chunk(self, timeout: float = 0) -> tuple[bytes, bool]:
        """The next piece of the request body and whether more follows.

        Raises :class:`ClientGone` if the client disconnects, and 408 ``body_timeout`` if
        nothing arrives for ``timeout`` seconds (0: wait forever): a body that stops
        arriving must not hold the request (and its admission slot) forever.
        """
        message = self.receive_nowait() if self.receive_nowait is not None else None
        if message is None:
            with trio.move_on_after(timeout if timeout > 0 else math.inf):
                message = await self.receive()
            if message is None:  # the deadline cancelled the receive
                raise HTTPError(
                    408, f"the request body stopped arriving for {timeout:g} s", "body_timeout"
                )
        if message["type"] == "http.disconnect":
            raise ClientGone
        return message.get("body", b""), message.get("more_body", False)

    async def read_body(self, limit: int, timeout: float = 0) -> bytes:
        """The whole request body, or 413 past ``limit`` bytes (declared or counted, so a
        chunked body is cut off too). Raises :class:`ClientGone`; 408 as
        :meth:`next_body_chunk`."""
        self.check_declared_length(limit)
        chunks: list[bytes] = []
        size = 0
        while True:
            chunk, more = await self.next_body_chunk(timeout)
            size += len(chunk)
            if size > limit:
                raise body_too_large(limit)
            chunks.append(chunk)
            if not more:
                return b"".join(chunks)

    def response_headers(self, headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
        out = [*headers, *self.extra_headers, (b"x-request-id", self.request_id.encode())]
        if self.state.closing and self.scope.get("http_version", "1.1") in ("1.0", "1.1"):
            out.append((b"connection", b"close"))
        return out

    async def _send(self, message: dict[str, Any]) -> None:
        # Shielded, unless the server says its send() is cancel-safe (trioserve's h11
        # server: a cancelled write closes the connection). hypercorn updates its h11 and
        # stream state before it writes, so a cancellation inside its send() leaves the two
        # disagreeing and every later send fails. (hypercorn shields its socket writes too,
        # so the shield costs no responsiveness there.)
        if self._cancel_safe:
            await self.send(message)
        else:
            with trio.CancelScope(shield=True):
                await self.send(message)

    async def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.started = True
        await self._send(self._start_message(status, headers))

    def _start_message(self, status: int, headers: list[tuple[bytes, bytes]]) -> dict[str, Any]:
        return {
            "type": "http.response.start",
            "status": status,
            "headers": self.response_headers(headers),
        }

    def prepare_start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        """Build the start that :meth:`try_start` may send later with the same
        ``status`` and ``headers`` (the same list): its headers, and the server's framing
        of them, while the engine works rather than on the way of the first byte."""
        if self.try_start_body is None or self.started:
            return
        message = self._start_message(status, headers)
        self._prepared_start = (status, headers, self.state.closing, message)
        if self._prepare_start_body is not None:
            self._prepare_start_body(message)

    def try_start(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> bool:
        """Start a chunked response with its first piece of body without awaiting, where
        the server can (trioserve's built-in server); False, with nothing sent, otherwise."""
        start = self.try_start_body
        if start is None or self.started:
            return False
        prepared = self._prepared_start
        if (
            prepared is not None
            and prepared[0] == status
            and prepared[1] is headers
            and prepared[2] == self.state.closing  # a drain began: the head says close
        ):
            message = prepared[3]
        else:
            message = self._start_message(status, headers)
        if not start(message, body):
            return False
        self.started = True
        return True

    async def body(self, data: bytes, more: bool = True) -> None:
        await self._send({"type": "http.response.body", "body": data, "more_body": more})

    async def respond(
        self, status: int, body: bytes, headers: list[tuple[bytes, bytes]] = JSON_HEADERS
    ) -> None:
        """Send a whole response, head and body, with no cancellation point between."""
        headers = [*headers, (b"content-length", str(len(body)).encode())]
        if self._cancel_safe:  # the server writes head and body at once, or closes
            await self.start(status, headers)
            await self.body(body, more=False)
            return
        with trio.CancelScope(shield=True):
            await self.start(status, headers)
            await self.body(body, more=False)

    async def respond_json(self, status: int, obj: Any) -> None:
        await self.respond(status, json.dumps(obj, separators=(",", ":")).encode())

    async def respond_error(self, error: HTTPError) -> None:
        body = error.detail_body() if self.detail_errors else error.body()
        await self.respond(error.status, body, [*JSON_HEADERS, *error.headers])

    async def wait_disconnect(self) -> None:
        """Return when the client has gone. Only call once the body has been read.

        hypercorn's trio worker never raises from ``send()`` after a disconnect; reading
        ``receive()`` is the only way to learn of it.
        """
        while True:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                return
