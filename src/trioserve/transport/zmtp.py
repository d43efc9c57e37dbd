"""The frontend's link to one engine: a ZeroMQ DEALER that speaks ZMTP itself, on a socket
trio owns, with no ZeroMQ I/O thread.

Engines bind a libzmq ROUTER (the SDK uses pyzmq, as any engine may). libzmq on the
frontend's side would put its I/O thread between every request and the engine: a submit
waits for that thread to be scheduled before it leaves, and an output wakes that thread
first, then the event loop. Measured against that (docs/benchmarks.md): 0.29-0.45 ms
less added to every first token and 9-11% less CPU per request, with the event loop and
that thread sharing a core. Here a submit is one ``send(2)`` in the submitting task, and an
output is read by the event loop itself.

What is spoken: ZMTP 3.0 (https://rfc.zeromq.org/spec/23/) with the NULL mechanism, as a
DEALER: the 64-byte greeting, a READY command carrying ``Socket-Type`` and ``Identity``
(the engine's ROUTER routes by it, so a stable identity lets the engine know the frontend
again after a reconnect), then messages of one or more frames. PING commands (ZMTP 3.1
heartbeats, should an engine turn them on) are answered; an ERROR command, a peer that is
not a ROUTER or DEALER, a security mechanism other than NULL, or a malformed frame ends the
connection with a logged reason. Addresses are ``tcp://host:port`` (a name, an IPv4
address or ``[IPv6]``) and ``ipc://path`` (``ipc://@name``: Linux's abstract namespace).

Like libzmq it reconnects on its own (every :data:`RECONNECT_INTERVAL`) when the connection
drops or cannot be made, and like libzmq with ``ZMQ_IMMEDIATE`` what was queued for a
connection that dropped is dropped with it: frames meant for a dead engine must not reach
its successor. Frames queued while no connection is up leave once one is.

One task owns the socket (:meth:`ZmtpDealer.run`), in the loop it shares with
:class:`~trioserve.zmq_trio.ZmqPump` (:class:`~trioserve.owner.SocketOwner`): it reads,
hands each message to ``on_message``, calls ``after_receive`` and ``before_flush``, sends
what is queued and parks. Other tasks :meth:`~ZmtpDealer.send` without waiting: with
nothing queued before it a message leaves at once, in the caller's task; what the kernel
does not take is queued, in order, for the owner.

Bounds: one message (all its frames) is at most ``max_message`` bytes (default
:data:`MAX_MESSAGE`) and
:data:`MAX_PARTS` frames, so the receive buffer holds at most one message plus one read;
the outbox holds at most ``outbox_limit`` messages; connecting and the handshake take at
most :data:`HANDSHAKE_TIMEOUT`; a pass reads once and handles what it read within
:data:`~trioserve.owner.RECV_BUDGET` of CPU time before other tasks run.
"""

from __future__ import annotations

import errno
import logging
import math
import os
import socket
import time
from collections.abc import Callable
from typing import Any

import trio

from ..errors import ZmtpProtocolError
from .owner import OUTBOX_LIMIT, RECV_BUDGET, SocketOwner

log = logging.getLogger(__name__)

#: The greeting: signature, version 3.0, mechanism NULL, as-server 0, filler.
GREETING = b"\xff" + bytes(8) + b"\x7f" + bytes((3, 0)) + b"NULL".ljust(20, b"\0") + bytes(32)
MORE, LONG, COMMAND = 1, 2, 4

#: Seconds between connection attempts (libzmq's default ``ZMQ_RECONNECT_IVL``).
RECONNECT_INTERVAL = 0.1
#: Seconds a connection may take from ``connect(2)`` to the peer's READY.
HANDSHAKE_TIMEOUT = 5.0
#: The largest message accepted from an engine by default, all frames together (bytes;
#: ``--engine-max-frame-mb``). What the protocol needs: one engine step's outputs for one
#: frontend, where a step yields one delta per request. Text steps are kilobytes; the
#: largest item is a media payload, and engines send media larger than this in several
#: items (docs/protocol.md §2). A larger message is a protocol error: it ends the
#: connection before its body is read, so the buffer never holds more than this plus one
#: read.
MAX_MESSAGE = 128 * 2**20
#: The most frames one message may have (the engine protocol uses one).
MAX_PARTS = 64
#: Bytes asked of the kernel per read (one read per pass: see ``_receive_available``).
RECV_SIZE = 256 * 1024
#: Frames from this size on are copied out of the receive buffer through a view.
LARGE = 64 * 1024


def frame(data: bytes, flags: int = 0) -> bytes:
    """One ZMTP frame: flags, size (one byte or eight), body."""
    size = len(data)
    if size < 256:
        return bytes((flags, size)) + data
    return bytes((flags | LONG,)) + size.to_bytes(8, "big") + data


def message(frames: list[bytes]) -> bytes:
    """A whole message, framed."""
    if len(frames) == 1:
        return frame(frames[0])
    last = len(frames) - 1
    return b"".join(frame(part, MORE if i < last else 0) for i, part in enumerate(frames))


def command(name: bytes, data: bytes = b"") -> bytes:
    return frame(bytes((len(name),)) + name + data, COMMAND)


def ready_command(socket_type: bytes, identity: bytes) -> bytes:
    props = b"".join(
        bytes((len(name),)) + name + len(value).to_bytes(4, "big") + value
        for name, value in ((b"Socket-Type", socket_type), (b"Identity", identity))
    )
    return command(b"READY", props)


def parse_properties(data: bytes) -> dict[bytes, bytes]:
    """A READY command's metadata; names lowercased (they are case-insensitive)."""
    props = {}
    pos = 0
    while pos < len(data):
        size = data[pos]
        name = data[pos + 1 : pos + 1 + size]
        pos += 1 + size
        if len(name) != size or pos + 4 > len(data):
            raise ZmtpProtocolError("malformed READY metadata")
        value_size = int.from_bytes(data[pos : pos + 4], "big")
        value = data[pos + 4 : pos + 4 + value_size]
        if len(value) != value_size:
            raise ZmtpProtocolError("malformed READY metadata")
        pos += 4 + value_size
        props[name.lower()] = value
    return props


def check_greeting(greeting: bytes | bytearray) -> None:
    if greeting[0] != 0xFF or greeting[9] != 0x7F:
        raise ZmtpProtocolError("the peer is not speaking ZMTP 3 (bad greeting signature)")
    major, minor = greeting[10], greeting[11]
    if major < 3:
        raise ZmtpProtocolError(f"the peer speaks ZMTP {major}.{minor}; 3.0 or later is needed")
    mechanism = bytes(greeting[12:32]).rstrip(b"\0")
    if mechanism != b"NULL":
        raise ZmtpProtocolError(
            f"the peer requires the {mechanism.decode('ascii', 'replace')} security "
            "mechanism; this frontend speaks NULL only"
        )


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


class ZmtpDealer(SocketOwner["bytes | memoryview"]):
    """A DEALER connected to one engine's ROUTER; the frontend's half of the link.

    ``on_message``, ``before_flush`` and ``after_receive``: see
    :class:`~trioserve.owner.SocketOwner`; ``on_error``: see its attribute.
    :meth:`run` owns the socket until cancelled; :meth:`close` then sends what it can and
    closes it.
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
    ) -> None:
        super().__init__(on_message, before_flush, outbox_limit, after_receive)
        self.address = address
        #: The largest message accepted from the peer (bytes, all frames together).
        self.max_message = MAX_MESSAGE if max_message is None else max_message
        #: Told why the peer broke the protocol (a :class:`ZmtpProtocolError`); returns the seconds
        #: to wait before connecting again, and logs (without it: a warning per new reason,
        #: and the next attempt after :data:`RECONNECT_INTERVAL`).
        self._on_error = on_error
        self._family, self._host, self._port = parse_address(address)
        self._ready_command = ready_command(b"DEALER", identity)
        # The outbox holds framed messages; a ``memoryview`` at its head is the unsent
        # rest of a message the kernel took part of.
        self._sock: socket.socket | None = None
        #: True from the peer's READY until the connection drops: messages may flow.
        self._ready = False
        self._buffer = bytearray()
        self._parts: list[bytes] = []
        self._parts_size = 0
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
        if len(outbox) >= self._outbox_limit:
            return False
        data: bytes | memoryview = message(frames)
        if not outbox and self._ready:
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

    def drop_outbox(self) -> int:
        """Forget everything queued (e.g. stale frames for a peer that went away), except
        the rest of a message already partly sent, which the stream needs."""
        outbox = self._outbox
        keep = outbox[0] if outbox and isinstance(outbox[0], memoryview) else None
        count = len(outbox) - (keep is not None)
        outbox.clear()
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
        self._ready = False
        sock.close()

    # -- the owner -------------------------------------------------------------------------

    async def run(self) -> None:
        """Own the socket until cancelled: connect, serve, reconnect. Never returns."""
        refused = None  # the last refusal logged as a warning: each is logged once
        while True:
            delay = RECONNECT_INTERVAL
            try:
                with trio.fail_after(HANDSHAKE_TIMEOUT):
                    await self._connect()
                self.connections += 1
                refused = None
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
                else:
                    log.debug("engine %s: cannot connect: %r", self.address, exc)
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
            try:
                await self._handshake(sock)
            except OSError as exc:
                raise ZmtpProtocolError(
                    f"the peer closed the connection during the handshake ({exc}): trioserve "
                    "speaks to ZeroMQ ROUTER sockets with no security mechanism (NULL)"
                ) from None
            return
        raise error

    async def _handshake(self, sock: socket.socket) -> None:
        # The greeting first, READY only once the peer's greeting is read, as libzmq
        # does: a peer that will refuse our READY (a PUB, say) has then sent its own
        # READY first, which names what it is; one that refuses our mechanism closes.
        sock.send(GREETING)  # a fresh socket's buffer takes 64 bytes whole
        buffer = self._buffer
        while len(buffer) < len(GREETING):
            await self._read(sock)
        check_greeting(buffer)
        del buffer[: len(GREETING)]
        sock.send(self._ready_command)
        self._budget_end = math.inf
        # Then the peer's READY (commands only: a message before it is an error).
        while not self._parse():
            await self._read(sock)

    async def _read(self, sock: socket.socket) -> None:
        while True:
            try:
                data = sock.recv(RECV_SIZE)
            except BlockingIOError:
                await trio.lowlevel.wait_readable(sock)
                continue
            if not data:
                raise ConnectionResetError("the peer closed the connection")
            self._buffer += data
            return

    async def _wait(self) -> None:
        sock = self._sock
        assert sock is not None
        if self._outbox:  # the kernel's send buffer is full
            await _readable_or_writable(sock)
        else:
            await trio.lowlevel.wait_readable(sock)

    def _receive_available(self) -> bool:
        """Read once, and handle the whole messages the buffer then holds, within
        :data:`~trioserve.owner.RECV_BUDGET`; True when more may be waiting (the budget
        cut the pass short, or the read filled :data:`RECV_SIZE`).

        One read per pass: what piled up in the kernel since the last pass, and no more.
        A frontend that keeps up handles each engine step as it comes; one that fell
        behind gets several steps in one pass, and the outputs of one request among them
        leave in one write (the engine connection holds them until the pass ends).
        """
        sock = self._sock
        assert sock is not None
        self._start_budget()
        if self._parse():  # what the budget left of the last read
            return True
        try:
            data = sock.recv(RECV_SIZE)
        except BlockingIOError:
            return False
        if not data:
            raise ConnectionResetError("the engine closed the connection")
        self._buffer += data
        return self._parse() or len(data) == RECV_SIZE

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

    def _parse(self) -> bool:
        """Handle the whole messages and commands in the buffer. True when it stopped
        early: the pass's budget ran out, or (during the handshake) the peer's READY
        arrived."""
        buf = self._buffer
        end = len(buf)
        pos = 0
        try:
            while end - pos >= 2:
                flags = buf[pos]
                if flags & LONG:
                    if end - pos < 9:
                        break
                    size = int.from_bytes(buf[pos + 1 : pos + 9], "big")
                    start = pos + 9
                else:
                    size = buf[pos + 1]
                    start = pos + 2
                if flags & ~(MORE | LONG | COMMAND):
                    raise ZmtpProtocolError(f"reserved frame flags set ({flags:#x})")
                if size > self.max_message - self._parts_size:
                    raise ZmtpProtocolError(f"a message larger than {self.max_message} bytes")
                if end - start < size:
                    break
                if size < LARGE:
                    body = bytes(buf[start : start + size])
                else:  # one copy, not two (the view is released before the buffer shrinks)
                    with memoryview(buf) as view:
                        body = bytes(view[start : start + size])
                pos = start + size
                if flags & COMMAND:
                    if self._command(body):
                        return True
                    continue
                if not self._ready:
                    raise ZmtpProtocolError("a message before the handshake ended")
                parts = self._parts
                parts.append(body)
                if flags & MORE:
                    self._parts_size += size
                    if len(parts) >= MAX_PARTS:
                        raise ZmtpProtocolError(f"a message of more than {MAX_PARTS} frames")
                    continue
                self._parts, self._parts_size = [], 0
                self._handle(parts)
                if self._budget_spent():
                    return True
            return False
        finally:
            del buf[:pos]

    def _command(self, body: bytes) -> bool:
        """Handle one command; True for the READY that ends the handshake."""
        size = body[0] if body else 0
        name, data = body[1 : 1 + size], body[1 + size :]
        if name == b"READY":
            if self._ready:
                raise ZmtpProtocolError("a second READY")
            peer = parse_properties(data).get(b"socket-type", b"?")
            if peer not in (b"ROUTER", b"DEALER"):
                raise ZmtpProtocolError(f"the peer is a {peer.decode('ascii', 'replace')} socket")
            self._ready = True
            return True
        if name == b"ERROR":
            reason = data[1 : 1 + data[0]] if data else b""
            raise ZmtpProtocolError(f"the peer refused us: {reason.decode('utf-8', 'replace')}")
        if name == b"PING":
            if self._ready:  # answer with the context it carries (after a 2-byte TTL)
                self.send_raw(command(b"PONG", data[2:18]))
        elif not self._ready:
            raise ZmtpProtocolError(f"{name!r} before READY")
        # PONG and anything unknown: ignored, as the spec asks.
        return False

    def send_raw(self, data: bytes) -> bool:
        """Queue bytes already framed (a command) for the owner's next send pass; False,
        with nothing queued, when the outbox is full (a peer that pings while it does not
        read gets no more answers than the outbox holds)."""
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
        was_ready, self._ready = self._ready, False
        self._buffer.clear()
        self._parts, self._parts_size = [], 0
        if was_ready:
            # What was queued for that connection goes with it (see the module docstring).
            self._outbox.clear()


async def _readable_or_writable(sock: socket.socket) -> None:
    """Return when ``sock`` is readable or writable (trio waits on one direction per task)."""
    async with trio.open_nursery() as nursery:

        async def wait(until: Callable) -> None:
            await until(sock)
            nursery.cancel_scope.cancel()

        nursery.start_soon(wait, trio.lowlevel.wait_readable)
        nursery.start_soon(wait, trio.lowlevel.wait_writable)
