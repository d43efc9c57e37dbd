"""The frontend's link to one engine: a ZeroMQ DEALER that speaks ZMTP itself, on a socket
trio owns, with no ZeroMQ I/O thread.

Engines bind a libzmq ROUTER (the SDK uses pyzmq, as any engine may). libzmq on the
frontend's side would put its I/O thread between every request and the engine: a submit
waits for that thread to be scheduled before it leaves, and an output wakes that thread
first, then the event loop (docs/benchmarks.md has the measurements). Here a submit is
one ``send(2)`` in the submitting task, and an output is read by the event loop itself.

What is spoken is in ``zmtp_protocol.py`` (ZMTP 3 without I/O: greeting, handshake,
frames; the NULL mechanism, or CURVE with ``curve.py``); this module does the I/O around
it. A frontend given CURVE keys (:class:`~trioserve.transport.curve.CurveClientKeys`)
speaks CURVE only: an engine that answers in NULL is refused, never spoken to in clear
text. Addresses are ``tcp://host:port`` (a name, an IPv4 address or ``[IPv6]``) and
``ipc://path`` (``ipc://@name``: Linux's abstract namespace).

Like libzmq it reconnects on its own (every :data:`RECONNECT_INTERVAL`) when the connection
drops or cannot be made, and like libzmq with ``ZMQ_IMMEDIATE`` what was queued for a
connection that dropped is dropped with it: frames meant for a dead engine must not reach
its successor. Messages sent while no connection is up wait (as frames, not yet encoded:
under CURVE each connection has its own keys and nonces) and leave once one is.

One task owns the socket (:meth:`ZmtpDealer.run`), in the loop it shares with
:class:`~trioserve.transport.zmq_pump.ZmqPump`
(:class:`~trioserve.transport.owner.SocketOwner`): it reads, hands each message to
``on_message``, calls ``after_receive`` and ``before_flush``, sends what is queued and
parks. Other tasks :meth:`~ZmtpDealer.send` without waiting: with nothing queued before it
a message leaves at once, in the caller's task; what the kernel does not take is queued,
in order, for the owner.

Bounds: one message (all its frames) is at most ``max_message`` bytes (default
:data:`~trioserve.transport.zmtp_protocol.MAX_MESSAGE`) and
:data:`~trioserve.transport.zmtp_protocol.MAX_PARTS` frames, so the receive buffer holds
at most one message plus one read; the outbox holds at most ``outbox_limit`` messages;
connecting and the handshake take at most :data:`HANDSHAKE_TIMEOUT`; a pass reads once and
handles what it read within :data:`~trioserve.transport.owner.RECV_BUDGET` of CPU time
before other tasks run.
"""

from __future__ import annotations

import collections
import errno
import logging
import math
import os
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from ..errors import ZmtpProtocolError
from .curve import CurveClient, CurveClientKeys
from .owner import OUTBOX_LIMIT, RECV_BUDGET, SocketOwner
from .zmtp_protocol import (
    MAX_MESSAGE,
    MAX_PARTS,
    Ready,
    ZmtpConnection,
    check_identity,
    command,
    message,
)

log = logging.getLogger(__name__)

#: Seconds between connection attempts (libzmq's default ``ZMQ_RECONNECT_IVL``).
#: Seconds an engine may stay unreachable before it is said at WARNING.
UNREACHABLE_GRACE = 5.0
RECONNECT_INTERVAL = 0.1
#: Seconds a connection may take from ``connect(2)`` to the peer's READY.
HANDSHAKE_TIMEOUT = 5.0
#: Bytes asked of the kernel per read (one read per pass: see ``_receive_available``).
RECV_SIZE = 256 * 1024

__all__ = [
    "HANDSHAKE_TIMEOUT",
    "MAX_MESSAGE",
    "MAX_PARTS",
    "RECONNECT_INTERVAL",
    "ZmtpDealer",
    "command",
    "message",
    "parse_address",
]


def parse_address(address: str) -> tuple[int, str, int | None]:
    """``(family, host or path, port)`` of a ``tcp://`` or ``ipc://`` address."""
    scheme, sep, rest = address.partition("://")
    if scheme == "ipc" and sep and rest:
        return socket.AF_UNIX, "\0" + rest[1:] if rest.startswith("@") else rest, None
    if scheme == "tcp" and sep:
        host, _, port = rest.rpartition(":")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        if host and port.isdigit() and 0 < int(port) < 65536 and host != "*":
            return socket.AF_INET, host, int(port)
    raise ValueError(
        f"engine address {address!r}: expected tcp://HOST:PORT or ipc://PATH "
        "(the frontend connects; engines bind)"
    )


def unreachable_reason(exc: BaseException) -> str:
    """Why a connection attempt failed, in words that stay the same from one attempt to
    the next while the cause does (what the unreachable warning is said again on)."""
    if isinstance(exc, trio.TooSlowError):
        return f"no ZeroMQ handshake within {HANDSHAKE_TIMEOUT:g} s (is it a ZeroMQ ROUTER?)"
    if isinstance(exc, OSError) and exc.errno is not None:
        return os.strerror(exc.errno).lower()
    return str(exc) or type(exc).__name__


class ZmtpDealer(SocketOwner["bytes | memoryview"]):
    """A DEALER connected to one engine's ROUTER; the frontend's half of the link.

    ``on_message``, ``before_flush`` and ``after_receive``: see
    :class:`~trioserve.transport.owner.SocketOwner`; ``on_error``: see its attribute;
    ``curve``: the keys to speak CURVE with (None: the NULL mechanism). :meth:`run` owns
    the socket until cancelled; :meth:`close` then sends what it can and closes it.
    """

    def __init__(
        self,
        address: str,
        identity: bytes,
        on_message: Callable[[list[bytes]], None],
        before_flush: Callable[[], None] | None = None,
        outbox_limit: int = OUTBOX_LIMIT,
        *,
        after_receive: Callable[[], None] | None = None,
        max_message: int | None = None,
        on_error: Callable[[str], float] | None = None,
        curve: CurveClientKeys | None = None,
    ) -> None:
        super().__init__(on_message, before_flush, outbox_limit, after_receive)
        self.address = address
        check_identity(identity)  # here, not in the owner task at each connect
        self.identity = identity
        #: The largest message accepted from the peer (bytes, all frames together).
        self.max_message = MAX_MESSAGE if max_message is None else max_message
        self.curve = curve
        #: Told why the peer broke the protocol or refused us (a :class:`ZmtpProtocolError`);
        #: returns the seconds to wait before connecting again, and logs (without it: a
        #: warning per new reason, and the next attempt after :data:`RECONNECT_INTERVAL`).
        self._on_error = on_error
        self._family, self._host, self._port = parse_address(address)
        # The outbox holds encoded messages for the connection that is up; a
        # ``memoryview`` at its head is the unsent rest of a message the kernel took part
        # of. Messages sent while no connection is up wait here, as frames.
        self._waiting: collections.deque[list[bytes]] = collections.deque()
        self._sock: socket.socket | None = None
        #: The connection's protocol state (None between connections).
        self._conn: ZmtpConnection | None = None
        #: True from the peer's READY until the connection drops: messages may flow.
        self._ready = False
        #: The current pass's budget (see :meth:`_budget_spent`).
        self._cpu_start = 0.0
        self._budget_end = math.inf
        #: Connections made so far (for tests and logs).
        self.connections = 0

    # -- any task ------------------------------------------------------------------------

    def send(self, frames: list[bytes]) -> bool:
        """Send a message now, or queue it behind the ones already waiting (or while no
        connection is up, or for what the kernel did not take); False, with nothing sent
        or queued, when the outbox is full. Never waits."""
        outbox = self._outbox
        if len(outbox) + len(self._waiting) >= self._outbox_limit:
            return False
        if not self._ready:
            self._waiting.append(frames)
            return True
        data: bytes | memoryview = self._conn.encode(frames)  # type: ignore[union-attr]  # _ready
        if not outbox:
            try:
                sent = self._sock.send(data)  # type: ignore[union-attr]  # _ready: connected
            except BlockingIOError:
                sent = 0
            except OSError:
                # The connection broke; the owner finds out on its next read, and this
                # message goes with the connection, as everything queued for it does.
                self.wake()
                return True
            if sent == len(data):
                return True
            data = memoryview(data)[sent:]
        outbox.append(data)
        self.wake()
        return True

    @property
    def connected(self) -> bool:
        return self._ready

    @property
    def pending(self) -> int:
        """Messages queued for the owner to send (for the connection up, or the next)."""
        return len(self._outbox) + len(self._waiting)

    def drop_outbox(self) -> int:
        """Forget everything queued (e.g. stale frames for a peer that went away), except
        the rest of a message already partly sent, which the stream needs."""
        outbox = self._outbox
        keep = outbox[0] if outbox and isinstance(outbox[0], memoryview) else None
        count = len(outbox) - (keep is not None) + len(self._waiting)
        outbox.clear()
        self._waiting.clear()
        if keep is not None:
            outbox.append(keep)
        return count

    def close(self) -> None:
        """After :meth:`run` has ended: send what the kernel takes at once, then close."""
        sock = self._sock
        if sock is None:
            return
        try:
            self._send_available()
        except OSError:
            pass
        self._sock = None
        self._conn = None
        self._ready = False
        sock.close()

    # -- the owner -------------------------------------------------------------------------

    async def run(self) -> None:
        """Own the socket until cancelled: connect, serve, reconnect. Never returns.

        An engine that cannot be reached for :data:`UNREACHABLE_GRACE` seconds is said
        once at WARNING, with why and what to check; again only when the reason changes
        (every attempt is at DEBUG), and once more when it connects. (The grace: a child
        engine binds a moment after the frontend first tries it, at every ``trioserve
        run``; that is no news.)"""
        refused = None  # the last refusal logged as a warning: each is logged once
        unreachable = None  # why the last attempts failed, as warned
        failing_since: float | None = None  # the first failed attempt since a connection
        while True:
            delay = RECONNECT_INTERVAL
            try:
                with trio.fail_after(HANDSHAKE_TIMEOUT):
                    await self._connect()
                self.connections += 1
                refused = None
                failing_since = None
                if unreachable is not None:
                    log.warning("engine %s: connected (it was unreachable)", self.address)
                    unreachable = None
                self._send_available()
                await self._own()
            except ZmtpProtocolError as exc:
                if self._on_error is not None:
                    delay = self._on_error(str(exc))
                elif str(exc) != refused:
                    refused = str(exc)
                    log.warning("engine %s: dropping the connection: %s", self.address, exc)
            except (OSError, trio.TooSlowError) as exc:
                if self._ready:
                    log.info("engine %s: connection lost (%r); reconnecting", self.address, exc)
                why = unreachable_reason(exc)
                log.debug("engine %s: cannot connect: %r", self.address, exc)
                now = trio.current_time()
                if failing_since is None:
                    failing_since = now
                if why != unreachable and now - failing_since >= UNREACHABLE_GRACE:
                    unreachable = why
                    log.warning(
                        "engine %s is unreachable: %s; check that an engine runs and listens "
                        "there (trioserve engine ... --bind, or vLLM's) and that --engine names "
                        "its host and port; retrying every %g s, said again only if this "
                        "changes",
                        self.address,
                        why,
                        RECONNECT_INTERVAL,
                    )
            self._disconnect()
            await trio.sleep(delay)

    async def _connect(self) -> None:
        # (family, address): a path for AF_UNIX, a sockaddr tuple for the others.
        targets: list[tuple[int, str | tuple[Any, ...]]]
        if self._family == socket.AF_UNIX:
            targets = [(socket.AF_UNIX, self._host)]
        else:
            infos = await trio.socket.getaddrinfo(self._host, self._port, type=socket.SOCK_STREAM)
            targets = [(family, sockaddr) for family, _, _, _, sockaddr in infos]
        error: OSError = OSError(errno.EADDRNOTAVAIL, f"{self._host} has no address")
        for family, target in targets:
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setblocking(False)
            try:
                if family != socket.AF_UNIX:
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                code = sock.connect_ex(target)
                # (A Unix socket's EAGAIN is a full backlog, not a connection under way:
                # a failed attempt, like any other.)
                if code == errno.EINPROGRESS:
                    await trio.lowlevel.wait_writable(sock)
                    code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if code:
                    raise OSError(code, os.strerror(code))
            except OSError as exc:
                sock.close()
                error = exc
                continue
            except BaseException:
                sock.close()
                raise
            self._sock = sock
            conn = self._conn = ZmtpConnection(
                self.identity,
                curve=CurveClient(self.curve) if self.curve is not None else None,
                max_message=self.max_message,
            )
            try:
                await self._handshake(sock, conn)
            except OSError as exc:
                raise ZmtpProtocolError(f"{conn.closed_reason()} ({exc})") from None
            return
        raise error

    async def _handshake(self, sock: socket.socket, conn: ZmtpConnection) -> None:
        # Each side's greeting first, then the mechanism's commands, each sent once
        # what it answers is read (as libzmq does: a peer that will refuse our READY, a
        # PUB say, has then sent its own READY first, which names what it is).
        while True:
            event = conn.next_event()
            await _send_all(sock, conn.data_to_send())
            if isinstance(event, Ready):
                break
            assert event is None  # messages come after the handshake (or raise)
            data = await _recv(sock)
            if not data:
                raise ConnectionResetError("the peer closed the connection")
            conn.receive_data(data)
        self._ready = True
        self._budget_end = math.inf
        # What waited for a connection leaves first, in order.
        waiting, encode = self._waiting, conn.encode
        while waiting:
            self._outbox.append(encode(waiting.popleft()))

    async def _wait(self) -> None:
        sock = self._sock
        assert sock is not None
        if self._outbox:  # the kernel's send buffer is full
            await _readable_or_writable(sock)
        else:
            await trio.lowlevel.wait_readable(sock)

    def _receive_available(self) -> bool:
        """Read once, and handle the whole messages the buffer then holds, within
        :data:`~trioserve.transport.owner.RECV_BUDGET`; True when more may be waiting
        (the budget cut the pass short, or the read filled :data:`RECV_SIZE`).

        One read per pass: what piled up in the kernel since the last pass, and no more.
        A frontend that keeps up handles each engine step as it comes; one that fell
        behind gets several steps in one pass, and the outputs of one request among them
        leave in one write (the engine connection holds them until the pass ends).
        """
        sock, conn = self._sock, self._conn
        assert sock is not None and conn is not None
        self._start_budget()
        if self._parse(conn):  # what the budget left of the last read
            return True
        try:
            data = sock.recv(RECV_SIZE)
        except BlockingIOError:
            return False
        if not data:
            raise ConnectionResetError("the engine closed the connection")
        conn.receive_data(data)
        return self._parse(conn) or len(data) == RECV_SIZE

    def _start_budget(self) -> None:
        self._cpu_start = time.thread_time()
        self._budget_end = time.perf_counter() + RECV_BUDGET

    def _budget_spent(self) -> bool:
        """Whether this pass has used its budget of CPU time. The wall clock is read after
        each message (cheap), the thread's CPU clock only once the wall clock says the
        budget is gone: a thread that was preempted, or throttled by a CPU quota, has not
        spent that time, and cutting its pass short there would only make it read less
        per pass, which is what a frontend that fell behind must not do."""
        if time.perf_counter() <= self._budget_end:
            return False
        used = time.thread_time() - self._cpu_start
        if used >= RECV_BUDGET:
            return True
        self._budget_end = time.perf_counter() + RECV_BUDGET - used
        return False

    def _parse(self, conn: ZmtpConnection) -> bool:
        """Handle the whole messages the connection has. True when the pass's budget ran
        out first."""
        next_event = conn.next_event
        try:
            while (event := next_event()) is not None:
                self._handle(event.frames)  # type: ignore[union-attr]  # Ready comes once
                if self._budget_spent():
                    return True
            return False
        finally:
            answer = conn.data_to_send()  # PONGs
            if answer:
                self.send_raw(answer)

    def send_raw(self, data: bytes) -> bool:
        """Queue bytes already encoded for this connection (a command) for the owner's
        next send pass; False, with nothing queued, when the outbox is full (a peer that
        pings while it does not read gets no more answers than the outbox holds)."""
        if len(self._outbox) >= self._outbox_limit:
            return False
        self._outbox.append(data)
        self._flush_wanted = True
        return True

    def _send_available(self) -> None:
        if not self._ready:
            return
        sock = self._sock
        assert sock is not None
        outbox = self._outbox
        while outbox:
            data = outbox[0]
            try:
                sent = sock.send(data)
            except BlockingIOError:
                return
            if sent < len(data):
                outbox[0] = memoryview(data)[sent:]
                return
            outbox.popleft()

    def _disconnect(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()
        self._conn = None
        was_ready, self._ready = self._ready, False
        if was_ready:
            # What was queued for that connection goes with it (see the module docstring).
            self._outbox.clear()


async def _recv(sock: socket.socket) -> bytes:
    while True:
        try:
            return sock.recv(RECV_SIZE)
        except BlockingIOError:
            await trio.lowlevel.wait_readable(sock)


async def _send_all(sock: socket.socket, data: bytes) -> None:
    """Handshake commands: a few hundred bytes, which a fresh socket takes at once."""
    view = memoryview(data)
    while view:
        try:
            sent = sock.send(view)
        except BlockingIOError:
            await trio.lowlevel.wait_writable(sock)
            continue
        view = view[sent:]


async def _readable_or_writable(sock: socket.socket) -> None:
    """Return when ``sock`` is readable or writable (trio waits on one direction per task)."""
    async with trio.open_nursery() as nursery:

        async def wait(until: Callable[[socket.socket], Awaitable[None]]) -> None:
            await until(sock)
            nursery.cancel_scope.cancel()

        nursery.start_soon(wait, trio.lowlevel.wait_readable)
        nursery.start_soon(wait, trio.lowlevel.wait_writable)
