"""One HTTP exchange: read the body under a limit, send a response, watch for the client
going away, over whichever server's response channel."""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from time import perf_counter
from typing import Any

import attrs
import trio

from ..errors import ClientGone
from . import error_bodies
from .channel import Headers, RequestHead, ResponseChannel
from .errors import HTTPError
from .memory import Holding

_REQUEST_ID_RE = re.compile(rb"[A-Za-z0-9._:\-]{1,128}")

JSON_HEADERS = [(b"content-type", b"application/json")]


@attrs.define
class ServerState:
    """What the drain controller has decided so far (see ``server/drain.py``)."""

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


#: The holding of requests whose bodies count nowhere (it takes nothing, holds nothing).
UNCOUNTED = Holding(None)


def body_too_large(limit: int) -> HTTPError:
    """413: a body over ``limit`` bytes, said as the operator sets it (``--max-body-mb``)."""
    return HTTPError(
        413,
        f"the body exceeds the server's limit of {limit / 2**20:g} MiB ({limit} bytes; "
        "trioserve run --max-body-mb)",
        "body_too_large",
    )


class Exchange:
    """One HTTP request as the application sees it: its head, its body, and its answer
    through the server's :class:`~trioserve.http.channel.ResponseChannel`."""

    __slots__ = (
        "_prepared_start",
        "arrived",
        "body_ended",
        "channel",
        "error_shape",
        "extra_headers",
        "handle",
        "head",
        "headers",
        "key_index",
        "memory",
        "method",
        "path",
        "request_id",
        "sent",
        "started",
        "state",
        "status",
    )

    def __init__(self, head: RequestHead, channel: ResponseChannel, state: ServerState) -> None:
        #: When the request arrived (``time.perf_counter``).
        self.arrived = perf_counter()
        self.head = head
        self.channel = channel
        self.state = state
        self.method = head.method
        self.path = head.path
        self.headers: dict[bytes, bytes] = {}
        for name, value in head.headers:
            self.headers[name.lower()] = value
        self.started = False
        #: The body has been read to its end (see respond_error).
        self.body_ended = False
        #: (status, headers, closing then) of the start framed ahead (see prepare_start).
        self._prepared_start: tuple[int, Headers, bool, Headers] | None = None
        self.request_id = self._request_id()
        #: Added to every response (CORS).
        self.extra_headers: Headers = []
        #: The shape of its error bodies: OpenAI's (``openai``), the native routes'
        #: ``{"detail": ...}`` (``detail``) or Anthropic's (``anthropic``, which also
        #: answers 400 where the others say 422).
        self.error_shape = "openai"
        #: The index of the API key the request came with (``http/auth.py``; None: no
        #: keys configured, or a route open to all).
        self.key_index: int | None = None
        #: What this request holds of the body budget (``memory.py``; set by the app for
        #: routes that read bodies): its body's bytes, the fields of its form; given back
        #: when the request ends (:meth:`close`).
        self.memory = UNCOUNTED
        #: The response's status once started, and the body bytes sent (the access log).
        self.status: int | None = None
        self.sent = 0
        #: What the request runs on its engines (a ``lifecycle.RequestHandle``, or a
        #: fan-out group of them), for the access log; None for other routes.
        self.handle: object = None

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
        arriving must not hold the request (and its admission slot) forever. A body that
        came with its head is taken without setting up a timeout.
        """
        piece = self.channel.body_at_hand()
        if piece is not None:
            self.body_ended = not piece[1]
            return piece
        received = False
        with trio.move_on_after(timeout if timeout > 0 else math.inf):
            piece = await self.channel.receive_body()
            received = True
        if not received:
            raise HTTPError(
                408, f"the request body stopped arriving for {timeout:g} s", "body_timeout"
            )
        if piece is None:
            raise ClientGone
        self.body_ended = not piece[1]
        return piece

    async def read_body(self, limit: int, timeout: float = 0) -> bytes:
        """The whole request body, or 413 past ``limit`` bytes (declared or counted, so a
        chunked body is cut off too). Raises :class:`ClientGone`; 408 as
        :meth:`next_body_chunk`."""
        self.check_declared_length(limit)
        chunks: list[bytes] = []
        size = 0
        memory = self.memory
        while True:
            chunk, more = await self.next_body_chunk(timeout)
            size += len(chunk)
            if size > limit:
                raise body_too_large(limit)
            memory.take(len(chunk))
            chunks.append(chunk)
            if not more:
                return b"".join(chunks)

    def close(self) -> None:
        """The request has ended: what it held of the body budget is given back."""
        self.memory.release()

    def response_headers(self, headers: Headers) -> Headers:
        out = [*headers, *self.extra_headers, (b"x-request-id", self.request_id.encode())]
        if self.state.closing and self.head.http_version in ("1.0", "1.1"):
            out.append((b"connection", b"close"))
        return out

    @property
    def writes_now(self) -> bool:
        """Whether :meth:`try_start` and :meth:`try_send` can take data (the built-in
        server without TLS)."""
        return self.channel.writes_now

    async def start(self, status: int, headers: Headers) -> None:
        self.started = True
        self.status = status
        await self.channel.start(status, self.response_headers(headers))

    def prepare_start(self, status: int, headers: Headers) -> None:
        """Build the start that :meth:`try_start` may send later with the same
        ``status`` and ``headers`` (the same list): its headers, and the server's framing
        of them, while the engine works rather than on the way of the first byte."""
        if not self.channel.writes_now or self.started:
            return
        full = self.response_headers(headers)
        self._prepared_start = (status, headers, self.state.closing, full)
        self.channel.prepare_start(status, full)

    def try_start(self, status: int, headers: Headers, body: bytes) -> bool:
        """Start a chunked response with its first piece of body without awaiting, where
        the server can (trioserve's built-in server); False, with nothing sent, otherwise."""
        if self.started:
            return False
        prepared = self._prepared_start
        if (
            prepared is not None
            and prepared[0] == status
            and prepared[1] is headers
            and prepared[2] == self.state.closing  # a drain began: the head says close
        ):
            full = prepared[3]
        else:
            full = self.response_headers(headers)
        if not self.channel.try_start(status, full, body):
            return False
        self.started = True
        self.status = status
        self.sent += len(body)
        return True

    def try_send(self, body: bytes) -> bool:
        """One more piece of a started chunked response without awaiting, where the
        server can; False, with nothing sent, otherwise."""
        if self.channel.try_send(body):
            self.sent += len(body)
            return True
        return False

    async def body(self, data: bytes, more: bool = True) -> None:
        self.sent += len(data)
        await self.channel.send_body(data, more)

    async def respond(self, status: int, body: bytes, headers: Headers = JSON_HEADERS) -> None:
        """Send a whole response, head and body, with no cancellation point between."""
        headers = [*headers, (b"content-length", str(len(body)).encode())]
        if self.channel.cancel_safe:  # the server writes head and body at once, or closes
            await self.start(status, headers)
            await self.body(body, more=False)
            return
        with trio.CancelScope(shield=True):
            await self.start(status, headers)
            await self.body(body, more=False)

    async def respond_json(self, status: int, obj: Any) -> None:
        await self.respond(status, json.dumps(obj, separators=(",", ":")).encode())

    async def respond_error(self, error: HTTPError) -> None:
        shape = self.error_shape
        status = error.status
        if shape == "detail":
            body = error_bodies.detail_body(error)
        elif shape == "anthropic":
            body = error_bodies.anthropic_body(error, self.request_id)
            status = error_bodies.anthropic_status(error)
        else:
            body = error_bodies.body(error)
        headers = [*JSON_HEADERS, *error.headers]
        if not self.body_ended and self._declares_body():
            # Refused before its body was read (401, 404, 413, ...): the connection ends
            # with the answer, so no server reads (and parses) a body nobody wants.
            headers.append((b"connection", b"close"))
        await self.respond(status, body, headers)

    def _declares_body(self) -> bool:
        headers = self.headers
        return b"transfer-encoding" in headers or headers.get(b"content-length", b"0") != b"0"

    def watch_disconnect(self, on_gone: Callable[[], None]) -> AbstractAsyncContextManager[None]:
        """While the context is open, ``on_gone`` is called once if the client goes away.
        Only once the body has been read."""
        return self.channel.watch_disconnect(on_gone)
