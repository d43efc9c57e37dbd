"""One HTTP request and its response on a connection: the application's response channel
(``trioserve.http.channel.ResponseChannel``), with the synchronous writes of the
per-token path and a disconnect watch without a task."""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from urllib.parse import unquote

import trio

from ...errors import ClientGone
from ...http.channel import Headers, RequestHead, watch_with_task
from . import protocol as http1
from .config import PIPELINE_BUFFER
from .connection import Connection
from .protocol import END, NEED_DATA, HttpProtocolError, Request

log = logging.getLogger("trioserve.http1")


class HttpExchange:
    """One request/response on an HTTP connection: the application's
    :class:`~trioserve.http.channel.ResponseChannel`."""

    #: start() and send_body() either complete or close the connection: no shield needed.
    cancel_safe = True

    def __init__(self, connection: Connection, request: Request) -> None:
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

    def hold_for_key(self, key: int) -> None:
        self.connection.hold_for_key(key)

    def watch_disconnect(self, on_gone: Callable[[], None]) -> AbstractAsyncContextManager[None]:
        """While the context is open, call ``on_gone`` once if the client goes away:
        without a task, from the server's one hang-up watcher (Linux); elsewhere a task
        reads the socket. Only once the body has been read. A pipelined next request does
        not count; it stays in the socket until its turn."""
        if self.connection.shared.hangups is not None:
            return HangupWatch(self, on_gone)
        return watch_with_task(self._wait_disconnect, on_gone)

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
        # No body is read before the app is called: it answers what it refuses (no key,
        # no route, a declared length over its limit) first, from the head alone, and
        # reads the body (from what came with the head on) only for what it serves.
        connection = self.connection
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
            or connection.last_request
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


class HangupWatch:
    """:meth:`HttpExchange.watch_disconnect` on Linux: the server's hang-up watcher calls
    back; no task, one ``epoll_ctl`` to watch and one to stop."""

    __slots__ = ("exchange", "on_gone")

    def __init__(self, exchange: HttpExchange, on_gone: Callable[[], None]) -> None:
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
