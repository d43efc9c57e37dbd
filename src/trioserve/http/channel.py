"""The response channel: how the application reads one HTTP request's body and answers it,
whatever server carries it.

Two implementations: trioserve's built-in server implements :class:`ResponseChannel`
itself (``server/http1/serve.py``), with synchronous writes for the per-token path and a
disconnect watch without a task; :class:`AsgiChannel` implements it over plain ASGI
(hypercorn), where every write awaits and a disconnect is learnt by a task reading
``receive()``. The application (:class:`HttpHandler`) sees only this interface; the
other direction, a plain ASGI application on the built-in server, is
:class:`AsgiHandler`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, Protocol

import attrs
import trio

Headers = list[tuple[bytes, bytes]]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
ASGIApp = Callable[[dict[str, Any], Receive, Send], Awaitable[None]]

#: An ASGI scope's extension (http and websocket) where the server bounds connections per
#: API key: :meth:`ResponseChannel.hold_for_key` for the scope's connection (trioserve's
#: hypercorn glue sets it on every scope; the built-in server on WebSocket scopes).
HOLD_FOR_KEY = "trioserve.hold_for_key"


@attrs.frozen(slots=True)
class RequestHead:
    """What the application knows of a request before its body."""

    method: str
    #: Percent-decoded, without the query.
    path: str
    headers: Headers
    http_version: str = "1.1"
    query_string: bytes = b""
    scheme: str = "http"
    client: tuple[str, int] | None = None
    server: tuple[str, int] | None = None


class ResponseChannel(Protocol):
    """The server's side of one HTTP exchange."""

    #: A cancelled :meth:`start` or :meth:`send_body` closes the connection rather than
    #: leave it half-written: the application needs no shield around them.
    cancel_safe: bool
    #: :meth:`try_start` and :meth:`try_send` can take data (else they always say no).
    writes_now: bool

    def body_at_hand(self) -> tuple[bytes, bool] | None:
        """The body bytes already received and whether more follow, without waiting;
        None when none are at hand (then :meth:`receive_body`)."""

    async def receive_body(self) -> tuple[bytes, bool] | None:
        """The next piece of the body and whether more follows; None: the client left."""

    async def start(self, status: int, headers: Headers) -> None:
        """Send the response head."""

    async def send_body(self, data: bytes, more: bool) -> None:
        """Send body bytes; ``more`` False ends the response."""

    def prepare_start(self, status: int, headers: Headers) -> None:
        """Frame a head now for a later :meth:`try_start` with the same ``status`` and the
        same ``headers`` list (while the engine works, not on the first token's way)."""

    def try_start(self, status: int, headers: Headers, body: bytes) -> bool:
        """Start a chunked response with its first piece of body without awaiting; False,
        with nothing sent, where that cannot be done now."""

    def try_send(self, body: bytes) -> bool:
        """One more piece of a started chunked response without awaiting; False, with
        nothing sent, where that cannot be done now (the awaiting path then sends it)."""

    def watch_disconnect(self, on_gone: Callable[[], None]) -> AbstractAsyncContextManager[None]:
        """While the context is open, call ``on_gone`` once if the client goes away. Only
        once the body has been read."""

    def hold_for_key(self, key: int) -> None:
        """Count the connection against API key ``key`` until it closes, or raise the 429
        :class:`~trioserve.http.errors.HTTPError` (which closes it) if the key holds its share
        of connections. A no-op where the server bounds no connections."""


class HttpHandler(Protocol):
    """An application of the typed interface (trioserve's :class:`~trioserve.http.App`),
    which also serves ASGI (WebSocket on every server; HTTP under hypercorn)."""

    async def handle_http(self, head: RequestHead, channel: ResponseChannel) -> None: ...

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None: ...


def head_of(scope: dict[str, Any]) -> RequestHead:
    return RequestHead(
        method=scope["method"],
        path=scope["path"],
        headers=scope["headers"],
        http_version=scope.get("http_version", "1.1"),
        query_string=scope.get("query_string", b""),
        scheme=scope.get("scheme", "http"),
        client=scope.get("client"),
        server=scope.get("server"),
    )


class AsgiChannel:
    """:class:`ResponseChannel` over plain ASGI.

    Every send is shielded: hypercorn updates its h11 and stream state before it writes,
    so a cancellation inside its ``send()`` leaves the two disagreeing and every later
    send fails (hypercorn shields its socket writes too, so this costs no
    responsiveness).
    """

    cancel_safe = False
    writes_now = False

    def __init__(self, receive: Receive, send: Send, scope: dict[str, Any] | None = None) -> None:
        self._receive = receive
        self._send = send
        scope = scope or {}
        self._hold_for_key: Callable[[int], None] | None = (scope.get("extensions") or {}).get(
            HOLD_FOR_KEY
        )
        #: HTTP/2 and 3 forbid connection-specific headers (h2 refuses to send a head
        #: with one): a ``Connection: close`` is dropped there.
        self._multiplexed = scope.get("http_version") in ("2", "3")

    def body_at_hand(self) -> tuple[bytes, bool] | None:
        return None

    async def receive_body(self) -> tuple[bytes, bool] | None:
        message = await self._receive()
        if message["type"] == "http.disconnect":
            return None
        return message.get("body", b""), message.get("more_body", False)

    async def start(self, status: int, headers: Headers) -> None:
        if self._multiplexed:
            headers = [(name, value) for name, value in headers if name != b"connection"]
        with trio.CancelScope(shield=True):
            await self._send({"type": "http.response.start", "status": status, "headers": headers})

    async def send_body(self, data: bytes, more: bool) -> None:
        with trio.CancelScope(shield=True):
            await self._send({"type": "http.response.body", "body": data, "more_body": more})

    def prepare_start(self, status: int, headers: Headers) -> None:
        pass

    def try_start(self, status: int, headers: Headers, body: bytes) -> bool:
        return False

    def try_send(self, body: bytes) -> bool:
        return False

    def hold_for_key(self, key: int) -> None:
        if self._hold_for_key is not None:  # else a server that bounds no connections
            self._hold_for_key(key)

    def watch_disconnect(self, on_gone: Callable[[], None]) -> AbstractAsyncContextManager[None]:
        # hypercorn's trio worker never raises from send() after a disconnect: reading
        # receive() is the only way to learn of it, and that takes a task.
        return watch_with_task(self._wait_disconnect, on_gone)

    async def _wait_disconnect(self) -> None:
        while (await self._receive())["type"] != "http.disconnect":
            pass


@asynccontextmanager
async def watch_with_task(
    wait_gone: Callable[[], Awaitable[None]], on_gone: Callable[[], None]
) -> AsyncIterator[None]:
    """A disconnect watch by a task: ``on_gone()`` once ``wait_gone()`` returns, while the
    context is open (where no server calls back, as the built-in server's hang-up watcher
    does)."""

    async def watch() -> None:
        await wait_gone()
        on_gone()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch)
        try:
            yield
        finally:
            nursery.cancel_scope.cancel()


class AsgiHandler:
    """A plain ASGI application as an :class:`HttpHandler`, for the built-in server."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)

    async def handle_http(self, head: RequestHead, channel: ResponseChannel) -> None:
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": head.http_version,
            "method": head.method,
            "scheme": head.scheme,
            "path": head.path,
            "raw_path": head.path.encode("latin-1", "replace"),
            "query_string": head.query_string,
            "root_path": "",
            "headers": head.headers,
            "client": head.client,
            "server": head.server,
            "state": {},
        }
        body_done = False
        gone = trio.Event()

        async def receive() -> dict[str, Any]:
            nonlocal body_done
            if not body_done:
                piece = channel.body_at_hand() or await channel.receive_body()
                if piece is not None:
                    body_done = not piece[1]
                    return {"type": "http.request", "body": piece[0], "more_body": piece[1]}
            else:
                async with channel.watch_disconnect(gone.set):
                    await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                await channel.start(message["status"], list(message.get("headers", ())))
            elif message["type"] == "http.response.body":
                await channel.send_body(message.get("body", b""), message.get("more_body", False))

        await self.app(scope, receive, send)
