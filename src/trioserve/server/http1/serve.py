"""trioserve's own lean HTTP/1.1 server on trio hosting the app (``--server builtin``).

Requests are parsed and responses framed by ``protocol.py`` (httptools, i.e. llhttp; the
server began on h11, whose name ``--server h11`` still accepts, and left it for a sixth of
the CPU per request: ``docs/architecture.md``); WebSocket is wsproto's.

Why not only hypercorn: its trio worker restarts a keep-alive timer task per request,
takes a lock and a shielded cancel scope around every socket write and makes three writes
per response; relaying tokens, that is most of the frontend's CPU. This server keeps one
task per connection and writes once per ASGI body message (a whole non-streaming
response, head and body, leaves in one write). Hypercorn stays available
(``--server hypercorn``) for what this server does not do: HTTP/2.

What it does, per connection:

- keep-alive and pipelining (the next request waits until the response ends),
  header size limit, header-read timeout, idle timeout between requests (one task of the
  server closes idle connections: no timer in each request's cycle);
- a request body that came with its head is handed over without waiting
  (``trioserve.receive_nowait``), so the app need not arm a read timeout for it;
- ``http.disconnect`` delivered from ``receive()``: once the body has been read, the app's
  ``receive()`` reads the socket itself and reports EOF as a disconnect; or, without a
  task of the app's (the ``trioserve.watch_disconnect`` extension, Linux), a callback
  from the server's one hang-up watcher (``hangups.py``);
- every socket write bounded by ``write_timeout``: a client that stops reading has its
  connection closed (and is then reported disconnected), so no cleanup waits on a client;
- ``Connection: close`` honoured, and after the drain signal every connection closes once
  its current response is done (idle ones at once);
- TLS (``ssl_context``): each connection wrapped in ``trio.SSLStream``, its reads and
  writes through it, and the synchronous fast paths off (not offered to the app, and
  False if called: the awaiting path writes); the handshake bounded by the header
  timeout, and one that fails (plain HTTP, a client certificate refused) closes that
  connection with one log line;
- WebSocket upgrade (ASGI websocket scope): the handshake checked before wsproto sees
  it (400, 426), message size limit (close 1009), pings every ``ws_ping_interval`` and a
  peer that answers nothing for two intervals is gone (1006);
- what one client can do to the others, bounded (docs/security.md): an exception barrier
  around every connection (a fault: one traceback, a 500 or a close, the server goes
  on); a total deadline for a request body, and small bodies read whole before the app
  is called (a slow body holds no admission slot); an early answer closes the
  connection; at most ``max_connections`` at once (503 past it), and a quiet accept
  loop when descriptors run out.
"""

from __future__ import annotations

import errno
import json
import logging
import math
import os
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any
from urllib.parse import unquote

import attrs
import trio
import wsproto
import wsproto.events as ws_events
from wsproto.utilities import LocalProtocolError as WSLocalProtocolError
from wsproto.utilities import RemoteProtocolError as WSRemoteProtocolError

from ...errors import ClientGone, HttpProtocolError
from ...http.channel import Headers, HttpHandler, RequestHead
from . import hangups
from . import protocol as http1
from .protocol import END, NEED_DATA, Request

log = logging.getLogger("trioserve.http1")


RECEIVE_SIZE = 65536
#: Bytes of a pipelined next request buffered while a response is in progress; past it the
#: server stops reading that connection until the response is done.
PIPELINE_BUFFER = 65536
#: Connections turned away at once (past ``max_connections``) that are given a moment to
#: read their 503 before the socket closes; past it, further ones are closed at once.
TURN_AWAY_LINGERING = 64
#: Seconds a turned-away connection is given to read its 503 and close.
TURN_AWAY_LINGER = 1.0
#: Seconds between two log lines about connections refused or accept(2) failing.
LOG_INTERVAL = 10.0
#: Seconds the accept loop waits after accept(2) ran out of descriptors or memory.
ACCEPT_BACKOFF = 0.1
#: After an early answer (a body not read), how long and how much of the body the server
#: still reads off before it closes (nginx's lingering close).
LINGER_SECONDS = 2.0
LINGER_BYTES = 1024 * 1024
#: Default of ``Http1Config.body_preread_bytes``: a generation request's JSON fits.
BODY_PREREAD_BYTES = 1024 * 1024


@attrs.define
class Http1Config:
    #: Largest request head (request line + headers), bytes.
    max_header_bytes: int = 16 * 1024
    #: Seconds to receive a whole request head once its first byte arrived.
    header_timeout: float = 10.0
    #: Seconds an idle keep-alive connection stays open.
    keep_alive_timeout: float = 5.0
    #: Seconds one socket write may take before the connection is dropped.
    write_timeout: float = 30.0
    ws_max_message_bytes: int = 1024 * 1024
    #: Seconds between WebSocket pings (0: none).
    ws_ping_interval: float = 20.0
    #: Seconds from a request head to the end of its body (408 past it; 0: no limit).
    body_deadline: float = 120.0
    #: Seconds a body read before the app is called may stall between two pieces (408
    #: past it; 0: no limit). Later pieces are the app's to time (``body_timeout``).
    body_timeout: float = 30.0
    #: A request body up to this size is read whole before the app is called, so a
    #: client that sends it slowly holds a connection but no admission slot (0: never;
    #: multipart bodies never: the app streams uploads to disk).
    body_preread_bytes: int = BODY_PREREAD_BYTES
    #: Connections open at once; past it, a new one is answered 503 and closed (0: three
    #: quarters of the process's descriptor limit, see :func:`default_max_connections`).
    max_connections: int = 0


def default_max_connections() -> int:
    """Three quarters of ``RLIMIT_NOFILE``: the rest is for engine sockets, uploads,
    logs and the connections being turned away, so accept(2) never meets EMFILE."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return 1024
    if soft == resource.RLIM_INFINITY or soft <= 0:
        return 65536
    return max(soft * 3 // 4, 16)


class _Throttled:
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


class _Shared:
    """State shared by all connections of one server."""

    def __init__(self, config: Http1Config, ssl_context: ssl.SSLContext | None = None) -> None:
        self.config = config
        self.ssl_context = ssl_context
        self.terminating = False
        #: Connections waiting for their next request, with the time they are closed at
        #: (the keep-alive timeout; enforced by :func:`_close_idle`, not a timer each).
        self.idle: dict[_HTTPConnection, float] = {}
        #: Hang-ups of clients with a request in flight (Linux; None elsewhere).
        self.hangups = hangups.HangupWatcher() if hangups.available() else None
        self.max_connections = config.max_connections or default_max_connections()
        #: Connections being served, and being turned away (see _turn_away).
        self.active = 0
        self.lingering = 0
        self.log_refused = _Throttled("refusing connections: %d open (max_connections)")
        #: Where connections run; also the flushes of partial synchronous writes.
        self.connections: trio.Nursery | None = None
        self.log_accept = _Throttled("accept: %s; trying again shortly")


class _HTTPConnection:
    def __init__(self, stream: trio.SocketStream, app: HttpHandler, shared: _Shared) -> None:
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
        #: Bytes of an answer to the current request have been written (a failure then
        #: closes the connection instead of answering 500).
        self.answering = False
        #: Called if the client hangs up or the connection closes (see watch_hangup).
        self._on_hangup: Callable[[], None] | None = None
        sock = stream.socket
        self.fd = sock.fileno()
        self.client = _addr(sock.getpeername())
        self.server = _addr(sock.getsockname())

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

    def close(self) -> None:
        """Close the socket now (synchronously: nothing to flush, nothing to cancel).

        trio's socket close wakes any task parked on it with ClosedResourceError, which
        read() and write() turn into EOF / a lost peer.
        """
        if not self.closed:
            on_hangup = self._on_hangup
            self.unwatch_hangup()  # first: a closed descriptor's number is reused
            self.closed = True
            self.stream.socket.close()
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

    async def run(self) -> None:
        """Serve the connection's requests until it closes. The exception barrier: what
        goes wrong here ends this connection only (one traceback in the log; a 500 if no
        answer began, else the connection closes), never the server."""
        try:
            if self.tls is not None and not await self.handshake():
                return
            while not self.closed:
                self.answering = False
                request = await self._wait_for_request()
                if request is None:
                    return
                if request.websocket:
                    await _WebSocketConnection(self, request).run()
                    return
                exchange = _HTTPExchange(self, request)
                await exchange.run()
                if not await self._next_cycle(exchange):
                    return
        except ClientGone:
            pass
        except Exception:
            log.exception("unexpected error on the connection from %s; closing it", self.client)
            if not self.answering:
                await self.refuse(500, "internal server error", "internal_error")
        finally:
            self.shared.idle.pop(self, None)
            self.close()

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
            await self.write(_error_response(status, reason, code, headers))
            if linger:
                await self._linger()
        except ClientGone:
            pass
        self.close()

    async def _next_cycle(self, exchange: _HTTPExchange) -> bool:
        """After a response: whether the connection serves another request."""
        parser = self.parser
        if not (exchange.body_done or parser.body_complete or self.closed):
            # The app answered without reading a body that is still to come (a 404, a
            # 413): the connection closes (its response said so) rather than wait for
            # bytes nobody wants.
            await self._linger()
            return False
        if not (exchange.response_done and exchange.keep_alive) or self.shared.terminating:
            return False
        if not exchange.body_done:
            # The rest of the body has arrived: dropped.
            try:
                while parser.next_event() is not END:
                    pass
            except HttpProtocolError:
                return False
        return not self.closed


class _HTTPExchange:
    """One request/response on an HTTP connection: the application's
    :class:`~trioserve.http.channel.ResponseChannel`."""

    #: start() and send_body() either complete or close the connection: no shield needed.
    cancel_safe = True

    def __init__(self, connection: _HTTPConnection, request: Request) -> None:
        self.connection = connection
        self.request = request
        #: Synchronous sends for the per-token path (see try_send and try_start). Not
        #: over TLS, where they could only say no: the app would frame each event for them
        #: and then again for the awaiting path.
        self.writes_now = connection.tls is None
        self.body_done = False
        self.disconnected = False
        self.response_started = False
        self.response_done = False
        #: Whether the connection may serve another request after this response (set
        #: with the response head; False if the body broke its framing).
        self.keep_alive = False
        self._framing = http1.NO_BODY
        #: Body bytes still owed (LENGTH framing).
        self._remaining = 0
        #: A fault in the body found by receive_nowait, for receive() to report.
        self._fault: HttpProtocolError | None = None
        self._head: bytes = b""
        #: Bytes try_send accepted but the socket did not take yet: a flush task (see
        #: _flush) writes them, and every later send waits for it.
        self._pending = b""
        self._flushed: trio.Event | None = None
        #: (status, headers, their head, shared.terminating then): see prepare_start.
        self._prepared: tuple[int, Headers, http1.ResponseHead, bool] | None = None
        deadline = connection.config.body_deadline
        #: When the body must have arrived whole (trio time).
        self.body_deadline_at = trio.current_time() + deadline if deadline > 0 else math.inf

    def head(self) -> RequestHead:
        request = self.request
        path, _, query = request.target.partition(b"?")
        return RequestHead(
            method=request.method.decode("ascii"),
            path=unquote(path.decode("latin-1")) if b"%" in path else path.decode("latin-1"),
            headers=list(request.headers),
            http_version=request.http_version,
            query_string=query,
            scheme="https" if self.connection.tls else "http",
            client=self.connection.client,
            server=self.connection.server,
        )

    def watch_disconnect(self, on_gone: Callable[[], None]) -> AbstractAsyncContextManager[None]:
        """While the context is open, call ``on_gone`` once if the client goes away:
        without a task, from the server's one hang-up watcher (Linux); elsewhere a task
        reads the socket. Only once the body has been read. A pipelined next request does
        not count; it stays in the socket until its turn."""
        if self.connection.shared.hangups is not None:
            return _HangupWatch(self, on_gone)
        return self._watch_with_task(on_gone)

    @asynccontextmanager
    async def _watch_with_task(self, on_gone: Callable[[], None]) -> AsyncIterator[None]:
        async def watch() -> None:
            await self._wait_disconnect()
            on_gone()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch)
            try:
                yield
            finally:
                nursery.cancel_scope.cancel()

    async def _preread(self) -> bool:
        """Read a small body whole before the app sees the request (see
        ``Http1Config.body_preread_bytes``): the app, which takes its admission slot when
        it is called, then finds the body at hand. False if the request was answered
        here (408: the body took too long) and the app is not to be called.
        """
        connection = self.connection
        parser = connection.parser
        config = connection.config
        limit = config.body_preread_bytes
        if parser.body_complete or limit <= 0:
            return True
        for name, value in self.request.headers:
            if name == b"content-length" and (not value.isdigit() or int(value) > limit):
                return True  # the app's to refuse (413) or to stream
            if name == b"content-type" and value[:10].lower() == b"multipart/":
                return True  # uploads: the app streams them to disk as they come
        gap = config.body_timeout if config.body_timeout > 0 else math.inf
        with trio.move_on_at(self.body_deadline_at) as total:
            while not (parser.body_complete or parser.stopped) and parser.buffered_body <= limit:
                with trio.move_on_after(gap) as stalled:
                    await connection.fill()
                if stalled.cancelled_caught:
                    await self._body_too_slow(f"the request body stopped arriving for {gap:g} s")
                    return False
        if total.cancelled_caught:
            await self._body_too_slow(self._deadline_reason())
            return False
        return True

    def _deadline_reason(self) -> str:
        deadline = self.connection.config.body_deadline
        return f"the request body did not arrive whole within {deadline:g} s"

    async def _body_too_slow(self, reason: str) -> None:
        self.disconnected = True
        if self.response_started:
            self.connection.close()
        else:
            await self.connection.refuse(408, reason, "body_timeout", linger=True)

    async def run(self) -> None:
        connection = self.connection
        if not await self._preread():
            return
        try:
            await self.connection.app.handle_http(self.head(), self)
        except ClientGone:
            return
        except Exception:
            log.exception("error in the application")
            if not self.response_started:
                await self._simple(500)
            else:
                connection.close()
            return
        if not self.response_done:
            if self.disconnected or self.response_started or connection.closed:
                # The client is gone (nothing to tell it), or a response broke off.
                connection.close()
            else:
                await self._simple(500)  # the app returned without answering

    async def _simple(self, status: int) -> None:
        await self.start(status, [(b"content-length", b"0")])
        await self.send_body(b"", False)

    def try_send(self, body: bytes) -> bool:
        """Send one more chunk of a started chunked response without awaiting anything.

        True when the chunk is taken (written, or its unwritten tail kept to go first on
        the next send); False, with nothing written, when it cannot be: the response is
        not a started chunked one, or the socket is full (the caller then takes the
        ordinary, awaiting path, which waits under the write timeout).
        """
        if (
            self._pending
            or self._flushed is not None
            or self._head
            or self._framing is not http1.CHUNKED
            or self.response_done
            or self.connection.closed
        ):
            return False
        return self._write_now(http1.chunk(body))

    def try_start(self, status: int, headers: Headers, body: bytes) -> bool:
        """The response head and the first chunk of its body, written without awaiting
        anything: a stream's first event, sent by the engine's socket owner as it sends
        the later ones (no task switch on the way to the first token).

        Only for a chunked response (no Content-Length) not yet started; True and False
        as :meth:`try_send`, and with False nothing has changed: the caller takes the
        ordinary path, which starts the response itself.
        """
        if self.response_started or self._pending or self.connection.closed:
            return False
        prepared = self._prepared
        if (
            prepared is not None
            and prepared[0] == status
            and prepared[1] is headers
            and prepared[3] == self.connection.shared.terminating
        ):
            head = prepared[2]
        else:
            try:
                head = self._response_head(status, headers)
            except Exception:  # a header it refuses: the ordinary path answers 500
                return False
        if head.framing is not http1.CHUNKED:
            return False
        if not self._write_now(head.data + http1.chunk(body)):
            return False
        self._started(head)
        return True

    def prepare_start(self, status: int, headers: Headers) -> None:
        """Frame a head now, for a later :meth:`try_start` with the same status and
        headers list: built while the engine works, not on the first token's way. (Built
        again if the server began to terminate meanwhile: the head then says close.)"""
        try:
            head = self._response_head(status, headers)
        except Exception:  # try_start builds it again, and refuses
            self._prepared = None
            return
        self._prepared = (status, headers, head, self.connection.shared.terminating)

    def _write_now(self, data: bytes) -> bool:
        """Write without waiting: False if the socket takes nothing now; True if it took
        all or part (the rest goes first on the next send) or the peer is gone. Always
        False with TLS (never plaintext on a TLS socket): the awaiting path writes."""
        connection = self.connection
        if connection.tls is not None:
            return False
        try:
            sent = os.write(connection.fd, data)
        except BlockingIOError:
            return False
        except OSError:
            # The peer is gone: drop the chunk; receive() reports the disconnect.
            self.disconnected = True
            connection.close()
            return True
        connection.answering = True
        if sent < len(data):
            # The rest must leave without waiting for the next token (there may be none
            # for a while): a task of its own writes it once the socket has room.
            self._pending = data[sent:]
            if self._flushed is None and connection.shared.connections is not None:
                self._flushed = trio.Event()
                connection.shared.connections.start_soon(self._flush)
        return True

    async def _flush(self) -> None:
        """Write what a synchronous send left (under the write timeout, as every write)."""
        assert self._flushed is not None
        try:
            while self._pending and not self.connection.closed:
                data, self._pending = self._pending, b""
                await self.connection.write(data)
        except ClientGone:
            self.disconnected = True
        finally:
            self._pending = b""
            self._flushed.set()
            self._flushed = None

    def _response_head(self, status: int, headers: Headers) -> http1.ResponseHead:
        connection = self.connection
        return http1.response_head(
            status,
            headers,
            self.request,
            # A body not read to its end (an early answer: 404, 413, 408) ends the
            # connection after this response: see _next_cycle.
            closing=connection.shared.terminating
            or not (self.body_done or connection.parser.body_complete),
        )

    def _started(self, head: http1.ResponseHead) -> None:
        self.response_started = True
        self.connection.parser.awaiting_continue = False  # answered: no 100 Continue now
        self.keep_alive = head.keep_alive
        self._framing = head.framing
        self._remaining = head.length

    def _body_received(self) -> tuple[bytes, bool] | None:
        """All of the body the parser has at hand, as one piece, and whether more follows
        (the whole of a body that came in one read); None when it has nothing. Bounded by
        what one read buffered. Raises :class:`ClientGone` if the client left mid-body."""
        parser = self.connection.parser
        chunks: list[bytes] = []
        while True:
            event = parser.next_event()
            if type(event) is bytes:
                chunks.append(event)
            elif event is END:
                self.body_done = True
                return b"".join(chunks), False
            elif event is NEED_DATA:
                if not chunks:
                    return None
                return b"".join(chunks), True
            else:  # CLOSED mid-body
                self.disconnected = True
                raise ClientGone

    def body_at_hand(self) -> tuple[bytes, bool] | None:
        """The body bytes already received, without waiting (None: nothing at hand): the
        usual request body came with its head, and the app need not set up a timeout."""
        if self.body_done or self.disconnected or self.connection.closed:
            return None
        try:
            return self._body_received()
        except HttpProtocolError as exc:
            self._fault = exc  # receive_body() reports it
            return None
        except ClientGone:
            return None  # receive_body() reports it

    async def receive_body(self) -> tuple[bytes, bool] | None:
        """The next piece of the body; None: the client left (or sent a body that cannot
        be parsed, which is answered here, or took longer than the body deadline)."""
        connection = self.connection
        if self.disconnected or connection.closed or self.body_done:
            self.disconnected = True
            return None
        try:
            if self._fault is not None:
                raise self._fault
            piece = None
            with trio.move_on_at(self.body_deadline_at):
                while (piece := self._body_received()) is None:
                    await connection.fill()
            if piece is None:  # the body deadline passed
                await self._body_too_slow(self._deadline_reason())
            return piece
        except ClientGone:
            return None
        except HttpProtocolError as exc:
            # A body that cannot be parsed (chunk framing, a size that is not hex, ...):
            # the client gets a 400 of its own unless a response has started, the
            # connection closes (nothing after the fault can be framed), and the app
            # hears that the client left.
            self.disconnected = True
            reason = f"malformed request body: {exc.reason}"
            if self.response_started:
                connection.close()
            else:
                await connection.refuse(exc.status, reason)
            return None

    async def _wait_disconnect(self) -> None:
        """Return when the client has gone (the body read; without the hang-up watcher)."""
        connection = self.connection
        buffered = 0
        while not (self.disconnected or connection.closed):
            data = await connection.read()
            if not data:
                break
            # A pipelined next request: keep it for later (bounded), keep watching.
            connection.parser.receive_data(data)
            buffered += len(data)
            if buffered > PIPELINE_BUFFER:
                await trio.sleep_forever()  # ended by the response finishing (cancel)
        self.disconnected = True

    async def start(self, status: int, headers: Headers) -> None:
        if self.connection.closed:
            self.disconnected = True
            return
        if self.response_started:
            raise RuntimeError("the response was started twice")
        head = self._response_head(status, headers)
        self._started(head)
        self._head = head.data

    async def send_body(self, data: bytes, more: bool) -> None:
        connection = self.connection
        if connection.closed:
            # As hypercorn does: a send to a client that is gone (or was refused) is
            # dropped; the app learns of the disconnect from its watch. (A checkpoint, so
            # that an app which keeps sending cannot starve the task that would tell it.)
            self.disconnected = True
            await trio.lowlevel.checkpoint()
            return
        if not self.response_started or self.response_done:
            raise RuntimeError("a response body outside a response")
        if self._flushed is not None:  # the tail of a synchronous send goes first
            await self._flushed.wait()
        out = self._head + self._pending
        self._head = self._pending = b""
        framing = self._framing
        if data:
            if framing is http1.CHUNKED:
                out += http1.chunk(data)
            elif framing is http1.LENGTH:
                self._remaining -= len(data)
                if self._remaining < 0:
                    raise RuntimeError("response body longer than its Content-Length")
                out += data
            elif framing is http1.UNTIL_CLOSE:
                out += data
        if not more:
            self.response_done = True
            if framing is http1.CHUNKED:
                out += http1.LAST_CHUNK
            elif framing is http1.LENGTH and self._remaining:
                log.error("response body shorter than its Content-Length: closing")
                self.keep_alive = False
        if out:
            try:
                await connection.write(out)
            except ClientGone:
                self.disconnected = True


class _HangupWatch:
    """:meth:`_HTTPExchange.watch_disconnect` on Linux: the server's hang-up watcher calls
    back; no task, one ``epoll_ctl`` to watch and one to stop."""

    __slots__ = ("exchange", "on_gone")

    def __init__(self, exchange: _HTTPExchange, on_gone: Callable[[], None]) -> None:
        self.exchange = exchange
        self.on_gone = on_gone

    async def __aenter__(self) -> None:
        exchange = self.exchange
        connection = exchange.connection
        if exchange.disconnected or connection.closed:
            exchange.disconnected = True
            self.on_gone()
            return
        connection.watch_hangup(self._gone)

    def _gone(self) -> None:
        self.exchange.disconnected = True
        self.on_gone()

    async def __aexit__(self, *exc_info: object) -> None:
        self.exchange.connection.unwatch_hangup()


class _WebSocketConnection:
    """A WebSocket upgraded from an HTTP connection, as an ASGI websocket scope."""

    def __init__(self, connection: _HTTPConnection, request: Request) -> None:
        self.connection = connection
        self.request = request
        self.ws = wsproto.WSConnection(wsproto.ConnectionType.SERVER)
        self.connected = False
        self.closed = False
        self.accepted = False
        self.close_code: int | None = None
        self._write_lock = trio.Lock()
        self._message: list[str | bytes] = []
        self._message_size = 0
        self._heard = True
        #: An HTTP answer to the handshake the app is sending (websocket.http.response).
        self._response: tuple[int, list[tuple[bytes, bytes]]] | None = None
        self._response_body: list[bytes] = []

    def scope(self) -> dict[str, Any]:
        offered = b",".join(v for k, v in self.request.headers if k == b"sec-websocket-protocol")
        subprotocols = [p.strip().decode("latin-1") for p in offered.split(b",") if p.strip()]
        return {
            **_scope("websocket", self.request, self.connection),
            "subprotocols": subprotocols,
            # The app may answer the handshake with an HTTP response of its own (a 401).
            "extensions": {"websocket.http.response": {}},
        }

    async def run(self) -> None:
        request = self.request
        connection = self.connection
        # Checked here first: wsproto raises on a handshake it cannot accept.
        refused = http1.websocket_handshake_error(request)
        if refused is not None:
            status, code, reason = refused
            version = ((b"sec-websocket-version", http1.WEBSOCKET_VERSION),)
            await connection.refuse(status, reason, code, version if status == 426 else ())
            return
        head = b"%s %s HTTP/1.1\r\n" % (request.method, request.target)
        head += b"".join(b"%s: %s\r\n" % (k, v) for k, v in request.headers) + b"\r\n"
        try:
            self.ws.receive_data(head)
            trailing = connection.parser.trailing
            if trailing:
                self.ws.receive_data(trailing)
        except (WSRemoteProtocolError, UnicodeError) as exc:
            # What wsproto's own parse (h11) refuses and the check above let through.
            reason = f"invalid WebSocket handshake: {exc}"
            await connection.refuse(400, reason, "invalid_websocket_handshake")
            return
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                try:
                    await self.connection.app(self.scope(), self.receive, self.send)
                finally:
                    nursery.cancel_scope.cancel()
        except Exception as exc:
            # The peer gone (a write timed out, say) is expected, also when the nursery
            # wraps it in a group (the ping task's write).
            if not _only_gone(exc):
                log.exception("error in ASGI websocket application")
        if not self.closed:
            await self._close(1011 if self.accepted else None)

    async def _write(self, event: Any) -> None:
        data = self.ws.send(event)
        async with self._write_lock:
            await self.connection.write(data)

    async def _close(self, code: int | None) -> None:
        self.closed = True
        try:
            if code is not None and self.ws.state is wsproto.connection.ConnectionState.OPEN:
                await self._write(ws_events.CloseConnection(code=code))
        except (ClientGone, WSLocalProtocolError):
            pass
        self.connection.close()

    async def _pings(self) -> None:
        interval = self.connection.config.ws_ping_interval
        while True:
            await trio.sleep(interval)
            if not self._heard:
                log.info("websocket peer %s stopped answering pings", self.connection.client)
                self.close_code = 1006
                self.connection.close()
                return
            self._heard = False
            try:
                await self._write(ws_events.Ping())
            except (ClientGone, WSLocalProtocolError):
                return  # the peer is gone, or the socket closing: receive() reports it

    async def receive(self) -> dict[str, Any]:
        if not self.connected:
            self.connected = True
            return {"type": "websocket.connect"}
        limit = self.connection.config.ws_max_message_bytes
        while True:
            if self.closed or self.connection.closed:
                return {"type": "websocket.disconnect", "code": self.close_code or 1006}
            for event in self.ws.events():
                self._heard = True
                if isinstance(event, ws_events.Message):
                    self._message.append(event.data)
                    self._message_size += len(event.data)
                    if self._message_size > limit:
                        self.close_code = 1009
                        await self._close(1009)
                        return {"type": "websocket.disconnect", "code": 1009}
                    if event.message_finished:
                        parts, self._message, self._message_size = self._message, [], 0
                        # (A message's parts are all str, or all bytes, as wsproto gives.)
                        if isinstance(event, ws_events.TextMessage):
                            return {"type": "websocket.receive", "text": "".join(parts)}  # type: ignore[arg-type]
                        return {"type": "websocket.receive", "bytes": b"".join(parts)}  # type: ignore[arg-type]
                elif isinstance(event, ws_events.Ping):
                    await self._write(event.response())
                elif isinstance(event, ws_events.CloseConnection):
                    self.close_code = event.code
                    try:
                        await self._write(event.response())
                    except (ClientGone, WSLocalProtocolError):
                        pass
                    self.closed = True
                    self.connection.close()
                    return {"type": "websocket.disconnect", "code": event.code}
            data = await self.connection.read()
            if not data:
                self.closed = True
                return {"type": "websocket.disconnect", "code": self.close_code or 1006}
            try:
                self.ws.receive_data(data)
            except WSRemoteProtocolError:
                self.close_code = 1002
                await self._close(1002)

    async def send(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        if self.closed:
            return
        try:
            if kind == "websocket.accept":
                if self.accepted:
                    return
                self.accepted = True
                await self._write(
                    ws_events.AcceptConnection(
                        subprotocol=message.get("subprotocol"),
                        extra_headers=list(message.get("headers") or ()),
                    )
                )
                if self.connection.config.ws_ping_interval > 0:
                    self._nursery.start_soon(self._pings)
            elif kind == "websocket.send":
                if message.get("text") is not None:
                    await self._write(ws_events.TextMessage(data=message["text"]))
                else:
                    await self._write(ws_events.BytesMessage(data=message.get("bytes") or b""))
            elif kind == "websocket.close":
                if not self.accepted:
                    await self._reject()
                else:
                    await self._close(message.get("code", 1000))
            elif kind == "websocket.http.response.start" and not self.accepted:
                self._response = (message["status"], list(message.get("headers") or ()))
                self._response_body = []
            elif kind == "websocket.http.response.body" and self._response is not None:
                self._response_body.append(message.get("body", b""))
                if not message.get("more_body", False):
                    await self._reject(*self._response, b"".join(self._response_body))
        except (WSLocalProtocolError, ClientGone):
            self.closed = True

    async def _reject(
        self, status: int = 403, headers: list[tuple[bytes, bytes]] | None = None, body: bytes = b""
    ) -> None:
        """Refuse the handshake with an HTTP response (the app's own, or a bare 403)."""
        self.closed = True
        headers = [(k, v) for k, v in headers or () if k.lower() != b"content-length"]
        headers.append((b"content-length", b"%d" % len(body)))
        try:
            data = self.ws.send(
                ws_events.RejectConnection(status_code=status, headers=headers, has_body=bool(body))
            )
            if body:
                data += self.ws.send(ws_events.RejectData(data=body))
            await self.connection.write(data)
        except (ClientGone, WSLocalProtocolError):
            pass
        self.connection.close()


def _scope(kind: str, request: Request, connection: _HTTPConnection) -> dict[str, Any]:
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


def _error_response(
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


async def _turn_away(stream: trio.SocketStream, shared: _Shared) -> None:
    """Refuse a connection past ``max_connections``: a 503 written if the socket takes it
    at once, then close. Up to :data:`TURN_AWAY_LINGERING` of them wait (a bounded
    moment) for the client to read it and close first, so it gets the 503 rather than a
    reset; past that they are closed at once."""
    sock = stream.socket
    shared.log_refused(shared.active)
    if shared.ssl_context is not None:
        sock.close()  # a plain 503 would mean nothing to a TLS client; no handshake to spend
        return
    response = _error_response(
        503,
        f"the server has its limit of {shared.max_connections} connections open; retry later",
        "too_many_connections",
        ((b"retry-after", b"1"),),
    )
    try:
        os.write(sock.fileno(), response)  # a new socket's buffer has room for it
    except OSError:
        sock.close()
        return
    if shared.lingering >= TURN_AWAY_LINGERING:
        sock.close()
        return
    shared.lingering += 1
    try:
        sock.shutdown(trio.socket.SHUT_WR)
        with trio.move_on_after(TURN_AWAY_LINGER):
            while await sock.recv(RECEIVE_SIZE):
                pass
    except OSError:
        pass
    finally:
        shared.lingering -= 1
        sock.close()


#: accept(2) errors that mean "out of resources for now", not "the listener is broken".
_ACCEPT_CAPACITY_ERRNOS = {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS}


async def _accept(
    listener: trio.SocketListener,
    connections: trio.Nursery,
    handle: Callable[[trio.SocketStream], Awaitable[None]],
    shared: _Shared,
) -> None:
    """Accept connections until cancelled, then close the listener.

    trio's ``serve_listeners`` does the same, and also closes each stream after its
    handler with ``aclose_forcefully`` (a cancelled scope per connection): here the
    connection closes its own socket, and that cancel machinery was a tenth of the work
    when thousands of clients hung up at once.
    """
    async with listener:
        while True:
            try:
                stream = await listener.accept()
            except OSError as exc:
                if exc.errno not in _ACCEPT_CAPACITY_ERRNOS:
                    raise
                # Out of descriptors (or memory): one log line per interval, not per try.
                shared.log_accept(exc)
                await trio.sleep(ACCEPT_BACKOFF)
                continue
            connections.start_soon(handle, stream)


async def _close_idle(shared: _Shared) -> None:
    """Close keep-alive connections idle past their time, checking a few times a timeout
    (so a connection lives up to a quarter longer than the timeout). One task for the
    server instead of a timer scope in every request's cycle."""
    period = max(shared.config.keep_alive_timeout / 4, 0.01)
    while True:
        await trio.sleep(period)
        now = trio.current_time()
        for connection, deadline in list(shared.idle.items()):
            if deadline <= now:
                connection.close()


def _only_gone(exc: BaseException) -> bool:
    """``exc`` is :class:`ClientGone`, or a group of nothing else."""
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(ClientGone)[1] is None
    return isinstance(exc, ClientGone)


def _no_op() -> None:
    pass


def _addr(sockaddr: Any) -> tuple[str, int] | None:
    if isinstance(sockaddr, tuple) and len(sockaddr) >= 2:
        return sockaddr[0], sockaddr[1]
    return None


async def serve_http1(
    app: HttpHandler,
    host: str,
    port: int,
    *,
    config: Http1Config | None = None,
    ssl_context: ssl.SSLContext | None = None,
    stop_accepting: trio.Event,
    graceful_deadline: Callable[[], float] = lambda: math.inf,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` on ``host:port`` until ``stop_accepting`` is set and every connection
    has finished (idle ones are closed at once). ``graceful_deadline()`` gives the time
    after which connections still open are cancelled. ``task_status`` gets the bound URLs.
    With ``ssl_context``, every connection speaks TLS (``tls.server_context``).
    """
    shared = _Shared(config or Http1Config(), ssl_context)
    listeners = await trio.open_tcp_listeners(port, host=host)
    scheme = "http" if ssl_context is None else "https"
    urls = []
    for listener in listeners:
        name = listener.socket.getsockname()
        urls.append(f"{scheme}://{name[0]}:{name[1]}")
        log.info("Running on %s://%s:%d (CTRL + C to quit)", scheme, name[0], name[1])

    async def handle(stream: trio.SocketStream) -> None:
        if shared.active >= shared.max_connections:
            await _turn_away(stream, shared)
            return
        shared.active += 1
        try:
            try:
                connection = _HTTPConnection(stream, app, shared)
            except OSError:
                # The client reset before we looked at it (getpeername: ENOTCONN). One
                # connection's trouble must never reach the nursery that serves them all.
                stream.socket.close()
                return
            await connection.run()
        except Exception:
            # run() is the barrier; this is the barrier's own guard.
            log.exception("unexpected error on a connection; closing it")
            stream.socket.close()
        finally:
            shared.active -= 1

    async with trio.open_nursery() as service:
        if shared.hangups is not None:
            service.start_soon(shared.hangups.run)
        service.start_soon(_close_idle, shared)
        async with trio.open_nursery() as connections:
            shared.connections = connections
            async with trio.open_nursery() as accepting:
                for listener in listeners:
                    accepting.start_soon(_accept, listener, connections, handle, shared)
                task_status.started(urls)
                await stop_accepting.wait()
                accepting.cancel_scope.cancel()
            # The accept loops closed their listeners when they were cancelled: new
            # connections are refused from here on.
            shared.terminating = True
            for idle in list(shared.idle):
                idle.close()
            connections.cancel_scope.deadline = graceful_deadline()
        service.cancel_scope.cancel()
