"""trioserve's own lean HTTP/1.1 server on trio hosting the app (``--server builtin``):
listening, accepting, and each connection's cycle of requests.

Requests are parsed and responses framed by ``protocol.py`` (httptools, i.e. llhttp; the
server began on h11, whose name ``--server h11`` still accepts, and left it for a sixth of
the CPU per request: ``docs/architecture.md``); WebSocket is wsproto's.

Why not only hypercorn: its trio worker restarts a keep-alive timer task per request,
takes a lock and a shielded cancel scope around every socket write and makes three writes
per response; relaying tokens, that is most of the frontend's CPU. This server keeps one
task per connection and writes once per body send (a whole non-streaming response, head
and body, leaves in one write), and speaks to the application through the typed response
channel (``trioserve.http.channel``), not ASGI. Hypercorn stays available (``--server
hypercorn``) for what this server does not do: HTTP/2.

What it does, per connection:

- keep-alive and pipelining (the next request waits until the response ends),
  header size limit, header-read timeout, idle timeout between requests (one task of the
  server closes idle connections: no timer in each request's cycle);
- a request body that came with its head is handed over without waiting
  (``body_at_hand``), so the app need not arm a read timeout for it;
- the client's hang-up, once the body has been read: without a task, a callback from the
  server's one hang-up watcher (``hangups.py``, Linux), else a task reading the socket;
- every socket write bounded by ``write_timeout``: a client that stops reading has its
  connection closed (and is then reported gone), so no cleanup waits on a client; a
  synchronous write the socket took only part of is finished by a flush task;
- ``Connection: close`` honoured, and after the drain signal every connection closes once
  its current response is done (idle ones at once);
- TLS (``ssl_context``): each connection wrapped in ``trio.SSLStream``, its reads and
  writes through it, and the synchronous fast paths off (``writes_now`` False); the
  handshake bounded by the header timeout, and one that fails (plain HTTP, a client
  certificate refused) closes that connection with one log line;
- WebSocket upgrade (ASGI websocket scope): the handshake checked before wsproto sees
  it (400, 426), message size limit (close 1009), pings every ``ws_ping_interval`` and a
  peer that answers nothing for two intervals is gone (1006);
- what one client can do to the others, bounded (docs/security.md): an exception barrier
  around every connection (a fault: one traceback, a 500 or a close, the server goes
  on); a total deadline for a request body, no body read before the app has checked
  the head (what came with it is one contiguous buffer of at most one read); an early
  answer closes the connection; at most ``max_connections`` at once (503 past it, but
  the probes of ``probe_paths`` still answered: ``serve_at_the_door``), and a quiet
  accept loop when descriptors run out.
"""

from __future__ import annotations

import errno
import logging
import math
import os
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from ...errors import ClientGone
from ...http.channel import HttpHandler
from ...http.memory import MemoryBudget
from .config import ACCEPT_BACKOFF, TURN_AWAY_LINGER, TURN_AWAY_LINGERING, Http1Config
from .connection import Connection, Shared, error_response
from .exchange import HttpExchange
from .protocol import END, HttpProtocolError, Request
from .websocket import WebSocketSession

log = logging.getLogger("trioserve.http1")


async def serve_connection(self: Connection) -> None:
    """Serve the connection's requests until it closes. The exception barrier: what
    goes wrong here ends this connection only (one traceback in the log; a 500 if no
    answer began, else the connection closes), never the server."""
    try:
        if self.at_the_door:
            await serve_at_the_door(self)
            return
        if self.tls is not None and not await self.handshake():
            return
        while not self.closed:
            self.answering = False
            request = await self._wait_for_request()
            if request is None:
                return
            if request.websocket:
                await WebSocketSession(self, request).run()
                return
            exchange = HttpExchange(self, request)
            await exchange.run()
            if not await _next_cycle(self, exchange):
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


async def _next_cycle(self: Connection, exchange: HttpExchange) -> bool:
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


TOO_MANY_CONNECTIONS = "too_many_connections"


def _turned_away(shared: Shared) -> tuple[int, str, str, tuple[tuple[bytes, bytes], ...]]:
    """The 503 of a connection past ``max_connections``: status, reason, code, headers."""
    reason = f"the server has its limit of {shared.max_connections} connections open; retry later"
    return 503, reason, TOO_MANY_CONNECTIONS, ((b"retry-after", b"1"),)


async def serve_at_the_door(self: Connection) -> None:
    """A connection past ``max_connections``: given :data:`TURN_AWAY_LINGER` to send its
    request head (over TLS, to shake hands first). A probe (GET or HEAD of one of
    ``probe_paths``: liveness, readiness) is answered by the app as on any connection,
    then the connection closes: clients holding every slot must not make the pod's
    probes fail. Anything else, or nothing in time, gets the 503 and is closed."""
    request = None
    shaken = self.tls is None
    with trio.move_on_after(TURN_AWAY_LINGER):
        if not shaken:
            if not await self.handshake():
                return
            shaken = True
        request = await self._wait_for_request()
    if self.closed or not shaken:  # refused already (400, 408), or no TLS to answer in
        return
    if request is None or not _is_probe(request, self.config.probe_paths):
        await self.refuse(*_turned_away(self.shared), linger=True)
        return
    self.last_request = True
    await HttpExchange(self, request).run()


def _is_probe(request: Request, probe_paths: frozenset[str]) -> bool:
    path = request.target.partition(b"?")[0].decode("latin-1")
    return request.method in (b"GET", b"HEAD") and not request.websocket and path in probe_paths


def _turn_away_now(stream: trio.SocketStream, shared: Shared) -> None:
    """Past ``max_connections`` with the door full too: the 503 written if the socket
    takes it at once (a new socket's buffer has room for it), then closed. Over TLS,
    closed at once: a plain 503 would mean nothing to a TLS client."""
    sock = stream.socket
    if shared.ssl_context is None:
        try:
            os.write(sock.fileno(), error_response(*_turned_away(shared)))
        except OSError:
            pass
    sock.close()


#: accept(2) errors that mean "out of resources for now", not "the listener is broken".


_ACCEPT_CAPACITY_ERRNOS = {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS}


async def _accept(
    listener: trio.SocketListener,
    connections: trio.Nursery,
    handle: Callable[[trio.SocketStream], Awaitable[None]],
    shared: Shared,
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


async def _close_idle(shared: Shared) -> None:
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


def host_port(sockaddr: Any) -> str:
    """``host:port`` as in a URL (an IPv6 address in brackets)."""
    host, port = sockaddr[0], sockaddr[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def serve_http1(
    app: HttpHandler,
    host: str,
    port: int,
    *,
    config: Http1Config | None = None,
    ssl_context: ssl.SSLContext | None = None,
    stop_accepting: trio.Event,
    graceful_deadline: Callable[[], float] = lambda: math.inf,
    listeners: list[trio.SocketListener] | None = None,
    memory: MemoryBudget | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` on ``host:port`` until ``stop_accepting`` is set and every connection
    has finished (idle ones are closed at once). ``graceful_deadline()`` gives the time
    after which connections still open are cancelled. ``task_status`` gets the bound URLs.
    With ``ssl_context``, every connection speaks TLS (``tls.server_context``).
    ``listeners``: accept on these (listening sockets another process made, shared by
    ``--workers``) instead of binding ``host:port``; they are closed when accepting stops.
    ``memory``: the budget WebSocket messages in assembly are counted in (the app's body
    budget).
    """
    shared = Shared(config or Http1Config(), ssl_context, memory)
    bound_here = listeners is None
    if listeners is None:
        listeners = await trio.open_tcp_listeners(port, host=host)
    scheme = "http" if ssl_context is None else "https"
    urls = []
    for listener in listeners:
        name = listener.socket.getsockname()
        urls.append(f"{scheme}://{host_port(name)}")
        if bound_here:
            log.info("Running on %s://%s (CTRL + C to quit)", scheme, host_port(name))

    async def handle(stream: trio.SocketStream) -> None:
        at_the_door = shared.active >= shared.max_connections
        if at_the_door:
            shared.log_refused(shared.active)
            if shared.lingering >= TURN_AWAY_LINGERING:
                _turn_away_now(stream, shared)
                return
            shared.lingering += 1
        else:
            shared.active += 1
        try:
            try:
                connection = Connection(stream, app, shared)
            except OSError:
                # The client reset before we looked at it (getpeername: ENOTCONN). One
                # connection's trouble must never reach the nursery that serves them all.
                stream.socket.close()
                return
            connection.at_the_door = at_the_door
            await serve_connection(connection)
        except Exception:
            # run() is the barrier; this is the barrier's own guard.
            log.exception("unexpected error on a connection; closing it")
            stream.socket.close()
        finally:
            if at_the_door:
                shared.lingering -= 1
            else:
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
