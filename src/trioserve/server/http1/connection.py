"""One client connection of the built-in server: its socket's reads and bounded writes, its
parser, hang-up watching, and the server's own answers (refusals).

What the server shares between connections is :class:`Shared`."""

from __future__ import annotations

import json
import logging
import math
import os
import ssl
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

import trio

from ...errors import ClientGone
from ...http.admission import ConnectionKeyHold, connection_shares
from ...http.channel import HttpHandler
from ...http.memory import MemoryBudget
from . import hangups
from . import protocol as http1
from .config import (
    LINGER_BYTES,
    LINGER_SECONDS,
    LOG_INTERVAL,
    RECEIVE_SIZE,
    Http1Config,
    default_max_connections,
)
from .protocol import NEED_DATA, HttpProtocolError, Request

log = logging.getLogger("trioserve.http1")


class Throttled:
    """A log line at most once per :data:`LOG_INTERVAL`, saying how often it happened."""

    def __init__(self, message: str) -> None:
        self.message = message
        self._next = -math.inf
        self._count = 0

    def __call__(self, *args: object) -> None:
        self._count += 1
        now = trio.current_time()
        if now >= self._next:
            log.warning(self.message + " (%d in the last %g s)", *args, self._count, LOG_INTERVAL)
            self._next = now + LOG_INTERVAL
            self._count = 0


class Shared:
    """State shared by all connections of one server."""

    def __init__(
        self,
        config: Http1Config,
        ssl_context: ssl.SSLContext | None = None,
        memory: MemoryBudget | None = None,
    ) -> None:
        self.config = config
        self.ssl_context = ssl_context
        #: The application's body budget, which WebSocket messages in assembly draw on
        #: too (None: not counted).
        self.memory = memory
        self.terminating = False
        #: Connections waiting for their next request, with the time they are closed at
        #: (the keep-alive timeout; enforced by :func:`_close_idle`, not a timer each).
        self.idle: dict[Connection, float] = {}
        #: Hang-ups of clients with a request in flight (Linux; None elsewhere).
        self.hangups = hangups.HangupWatcher() if hangups.available() else None
        self.max_connections = config.max_connections or default_max_connections()
        #: Connections being served, and past the limit at the door (see serve_at_the_door).
        self.active = 0
        self.lingering = 0
        self.log_refused = Throttled("refusing connections: %d open (max_connections)")
        #: Each API key's share of the connections (``hold_for_key``).
        self.key_connections = connection_shares(config.max_connections_per_key)
        #: Where connections run; also the flushes of partial synchronous writes.
        self.connections: trio.Nursery | None = None
        self.log_accept = Throttled("accept: %s; trying again shortly")


class Connection:
    def __init__(self, stream: trio.SocketStream, app: HttpHandler, shared: Shared) -> None:
        self.stream = stream
        #: TLS: every read and write goes through it (``stream`` still owns the socket).
        self.tls = (
            None
            if shared.ssl_context is None
            else trio.SSLStream(stream, shared.ssl_context, server_side=True, https_compatible=True)
        )
        self.app = app
        self.shared = shared
        self.config = shared.config
        self.parser = http1.RequestParser(self.config.max_header_bytes)
        self.closed = False
        #: The connection closes after the current response (its head says so).
        self.last_request = False
        #: Past ``max_connections``: only probes are answered (``serve_at_the_door``).
        self.at_the_door = False
        #: The API key this connection counts against (``hold_for_key``).
        self.key_hold = ConnectionKeyHold(shared.key_connections)
        #: Bytes of an answer to the current request have been written (a failure then
        #: closes the connection instead of answering 500).
        self.answering = False
        #: Called if the client hangs up or the connection closes (see watch_hangup).
        self._on_hangup: Callable[[], None] | None = None
        sock = stream.socket
        self.fd = sock.fileno()
        self.client = address_of(sock.getpeername())
        self.server = address_of(sock.getsockname())

    # -- socket --------------------------------------------------------------------------

    async def write(self, data: bytes) -> None:
        """Write all of ``data`` or drop the connection (raising :class:`ClientGone`).

        The common case, a socket with room in its buffer, is one ``send(2)`` and no
        scheduling: the per-event cost that matters when relaying tokens. Only a full
        buffer parks the task, under the write timeout. A write interrupted half-way
        (cancelled, timed out) closes the connection: its framing is broken. TLS: all
        of it through the ``SSLStream``, under the write timeout.
        """
        if self.closed:
            raise ClientGone
        self.answering = True
        view = memoryview(data)
        if self.tls is None:
            try:
                sent = os.write(self.fd, view)
                if sent == len(view):
                    return
                view = view[sent:]
            except BlockingIOError:
                pass
            except OSError:
                self.close()
                raise ClientGone from None
        completed = False
        try:
            with trio.move_on_after(self.config.write_timeout) as scope:
                if self.tls is not None:
                    await self.tls.send_all(data)
                else:
                    while view:
                        await trio.lowlevel.wait_writable(self.fd)
                        try:
                            view = view[os.write(self.fd, view) :]
                        except BlockingIOError:
                            pass
                completed = True
            if scope.cancelled_caught:
                log.info(
                    "dropping %s: a write took longer than %g s",
                    self.client,
                    self.config.write_timeout,
                )
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the peer reset, or another task closed the connection under us
        finally:
            if not completed:
                self.close()
        if not completed:
            raise ClientGone

    async def read(self) -> bytes:
        """The next bytes from the client; b"" at EOF, on an error, or once closed.

        ``recv(2)`` first, and only if nothing is there, park until readable: one task
        switch per wait, where trio's ``receive_some`` makes two (it also yields after a
        successful read). A read that finds data at once yields anyway, so that a client
        sending faster than it is answered cannot starve the other connections.
        """
        if self.tls is not None:
            return await self._read_tls()
        fd = self.fd
        parked = False
        while not self.closed:
            try:
                data = os.read(fd, RECEIVE_SIZE)
            except BlockingIOError:
                try:
                    await trio.lowlevel.wait_readable(fd)
                except trio.ClosedResourceError:  # closed by another task (drain, idle)
                    return b""
                parked = True
                continue
            except OSError:
                return b""
            if not parked:
                await trio.lowlevel.checkpoint()
            return data
        return b""

    async def _read_tls(self) -> bytes:
        if self.closed:
            return b""
        try:
            assert self.tls is not None
            return bytes(await self.tls.receive_some(RECEIVE_SIZE))  # it is bytes: no copy
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            # The peer reset, sent something that is not TLS, or another task closed
            # the connection (drain, idle).
            return b""

    async def handshake(self) -> bool:
        """TLS: the handshake, within the header timeout; False (with one log line, no
        traceback) if it failed: plain HTTP, a client certificate refused, too slow."""
        assert self.tls is not None
        with trio.move_on_after(self.config.header_timeout):
            try:
                await self.tls.do_handshake()
                return True
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                reason = exc.__cause__ or "the connection closed"
                log.info("TLS handshake with %s failed: %s", self.client, reason)
                return False
        log.info("TLS handshake with %s not done within the header timeout", self.client)
        return False

    def hold_for_key(self, key: int) -> None:
        """Count this connection against API key ``key`` from now until it closes (the
        application calls it once it has authenticated a request of ``key`` here); the
        429 :class:`~trioserve.http.errors.HTTPError` (closing the connection) if ``key`` has
        its share. A connection that has carried no keyed request counts against no key
        (only ``max_connections``); a request of another key moves it to that key."""
        self.key_hold.hold_for_key(key)

    def close(self) -> None:
        """Close the socket now (synchronously: nothing to flush, nothing to cancel).

        trio's socket close wakes any task parked on it with ClosedResourceError, which
        read() and write() turn into EOF / a lost peer.
        """
        self.key_hold.release()
        if not self.closed:
            on_hangup = self._on_hangup
            self.unwatch_hangup()  # first: a closed descriptor's number is reused
            self.closed = True
            self.stream.socket.close()
            self.parser.close()
            if on_hangup is not None:
                on_hangup()  # whoever watched learns the client is gone

    def watch_hangup(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once if the client hangs up (from the server's watcher task)
        or the connection is closed (a write found the peer gone, or timed out)."""
        watcher = self.shared.hangups
        assert watcher is not None and not self.closed and self._on_hangup is None

        def hung_up() -> None:
            # Only the watcher calls this, and only while watched (unwatch_hangup and
            # close take the descriptor out first); it has forgotten the descriptor.
            self._on_hangup = None
            callback()

        watcher.watch(self.fd, hung_up)
        self._on_hangup = callback

    def unwatch_hangup(self) -> None:
        if self._on_hangup is not None:
            self._on_hangup = None
            assert self.shared.hangups is not None
            self.shared.hangups.unwatch(self.fd)

    async def fill(self) -> None:
        """Read more of the client's bytes into the parser (at EOF, it reports CLOSED
        next), answering ``Expect: 100-continue`` first."""
        parser = self.parser
        if parser.awaiting_continue:
            parser.awaiting_continue = False
            await self.write(http1.CONTINUE)
        parser.receive_data(await self.read())

    async def next_event(self) -> object:
        """The next request event (see ``http1.RequestParser``), reading as needed."""
        while True:
            event = self.parser.next_event()
            if event is not NEED_DATA:
                return event
            await self.fill()

    # -- the connection's life -----------------------------------------------------------

    async def _wait_for_request(self) -> Request | None:
        """Wait for a request head: idle timeout first, then the header timeout."""
        config = self.config
        shared = self.shared
        parser = self.parser
        if parser.has_events or parser.head_open:
            await trio.lowlevel.checkpoint()  # a pipelined request: others go first
        else:
            # Idle: nothing of the next request has arrived yet. The keep-alive timeout
            # closes the socket (see _close_idle), which ends the read.
            if shared.terminating:
                return None
            shared.idle[self] = trio.current_time() + config.keep_alive_timeout
            try:
                data = await self.read()
            finally:
                shared.idle.pop(self, None)
            if not data:
                return None
            parser.receive_data(data)
        try:
            event = parser.next_event()
            if event is NEED_DATA:
                # The head came in part: the rest must follow within the header timeout.
                with trio.move_on_after(config.header_timeout) as heads:
                    event = await self.next_event()
                if heads.cancelled_caught:
                    await self.refuse(408, "request head not received in time")
                    return None
        except HttpProtocolError as exc:
            await self.refuse(exc.status, exc.reason)
            return None
        if type(event) is Request:
            return event
        return None  # CLOSED

    async def _linger(self) -> None:
        """Close our side, then read off (a bounded amount, for a bounded time) what the
        client is still sending, so that it reads our answer: a socket closed with
        unread bytes in it sends a reset, and the client may lose the answer."""
        try:
            self.stream.socket.shutdown(trio.socket.SHUT_WR)
        except OSError:
            return
        discarded = 0
        with trio.move_on_after(LINGER_SECONDS):
            while discarded <= LINGER_BYTES:
                data = await self.read()
                if not data:
                    return
                discarded += len(data)

    async def refuse(
        self,
        status: int,
        reason: str,
        code: str = "bad_request",
        headers: tuple[tuple[bytes, bytes], ...] = (),
        *,
        linger: bool = False,
    ) -> None:
        """Answer with an error of the server's own (no response may have begun) and
        close: the error body of every route, ``code`` its machine-readable reason.
        ``linger``: the client may still be sending (see :meth:`_linger`)."""
        try:
            await self.write(error_response(status, reason, code, headers))
            if linger:
                await self._linger()
        except ClientGone:
            pass
        self.close()


def error_response(
    status: int, reason: str, code: str, headers: tuple[tuple[bytes, bytes], ...] = ()
) -> bytes:
    """A whole error response of the server's own, in the error shape of every route."""
    # The types of docs/api.md's table (the application's, which this layer cannot import).
    kind = {408: "timeout_error", 503: "overloaded_error"}
    error = {
        "message": reason,
        "type": kind.get(status, "server_error" if status >= 500 else "invalid_request_error"),
        "code": code,
        "param": None,
    }
    body = json.dumps({"error": error}).encode()
    return http1.simple_response(status, body, b"application/json", headers)


def asgi_scope(kind: str, request: Request, connection: Connection) -> dict[str, Any]:
    """The ASGI scope keys an http and a websocket scope share."""
    path, _, query = request.target.partition(b"?")
    return {
        "type": kind,
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": request.http_version,
        "scheme": ("http" if kind == "http" else "ws") + ("s" if connection.tls else ""),
        "path": unquote(path.decode("latin-1")) if b"%" in path else path.decode("latin-1"),
        "raw_path": path,
        "query_string": query,
        "root_path": "",
        "headers": list(request.headers),
        "client": connection.client,
        "server": connection.server,
        "state": {},
        "extensions": {},
    }


def address_of(sockaddr: Any) -> tuple[str, int] | None:
    if isinstance(sockaddr, tuple) and len(sockaddr) >= 2:
        return sockaddr[0], sockaddr[1]
    return None


def no_op() -> None:
    pass


def only_gone(exc: BaseException) -> bool:
    """``exc`` is :class:`ClientGone`, or a group of nothing else."""
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(ClientGone)[1] is None
    return isinstance(exc, ClientGone)
