"""One ZeroMQ socket on Trio, owned by exactly one task.

pyzmq has no Trio integration; what it offers is ``zmq.FD``, a descriptor that becomes
readable when the socket's state *may* have changed. It is edge-triggered: after it fires,
it does not fire again until the socket has been drained, and sending on the socket can
consume the edge too. So the owner task (its loop is
:class:`~trioserve.transport.owner.SocketOwner`'s)

1. receives until ``EAGAIN``,
2. lets its user add coalesced messages (``before_flush``) and sends its outbox,
3. re-reads ``ZMQ_EVENTS`` and only parks on the descriptor when nothing is readable.

Skipping step 3 is the classic bug: a reader that sleeps forever with messages waiting.
Two tasks waiting on the same descriptor is another (trio raises ``BusyResourceError``),
which is why no other task ever waits on the socket. Other tasks may *send* on it
(:meth:`ZmqPump.send`), without waiting: when nothing is queued before it, a message
leaves at once, in the caller's task (tasks share one thread, and a non-blocking send
cannot park); if that send consumed the descriptor's edge with a message waiting, the
caller wakes the owner. Anything that cannot leave at once is queued, in order, for the
owner, which is woken to send it.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from typing import cast

import trio
import zmq

from .keys import CurveServerKeys, z85_encode
from .owner import OUTBOX_LIMIT, RECV_BUDGET, SocketOwner

log = logging.getLogger(__name__)

#: Messages received in one go before the owner yields to other tasks (or RECV_BUDGET).
RECV_BATCH = 512

# Plain ints: pyzmq's constants are enums, and arithmetic on them goes through the enum
# machinery (a few µs per call on the per-request path).
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)
_NOBLOCK = int(zmq.NOBLOCK)
_RCVMORE = int(zmq.RCVMORE)


class ZmqPump(SocketOwner[list[bytes]]):
    """The single owner of one ZeroMQ socket (``on_message`` and ``before_flush``: see
    :class:`~trioserve.transport.owner.SocketOwner`)."""

    def __init__(
        self,
        sock: zmq.Socket[bytes],
        on_message: Callable[[list[bytes]], None],
        before_flush: Callable[[], None] | None = None,
        outbox_limit: int = OUTBOX_LIMIT,
        after_receive: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(on_message, before_flush, outbox_limit, after_receive)
        self.sock = sock
        # pyzmq's stubs type every option as int | bytes; ZMQ_FD and ZMQ_EVENTS are ints.
        self._fd = cast(int, sock.getsockopt(zmq.FD))

    def send(self, frames: list[bytes]) -> bool:
        """Send a multipart message now, or queue it behind the ones already waiting (or
        when the socket cannot take it); False, with nothing sent or queued, when the
        outbox is full. Never waits."""
        outbox = self._outbox
        if not outbox:
            sock = self.sock
            try:
                _send(sock, frames)
            except zmq.Again:  # high-water mark, or no peer yet (ZMQ_IMMEDIATE): queue it
                pass
            else:
                # The send may have consumed the descriptor's edge with a message waiting:
                # then the owner, parked on the descriptor, would not hear of it.
                if cast(int, sock.getsockopt(_EVENTS)) & _POLLIN:
                    self.wake()
                return True
        elif len(outbox) >= self._outbox_limit:
            return False
        outbox.append(frames)
        self.wake()
        return True

    async def run(self) -> None:
        """Own the socket until cancelled. Never returns otherwise."""
        await self._own()

    def _more_waiting(self) -> bool:
        # The edge may have been consumed with a message waiting (step 3 above).
        return bool(cast(int, self.sock.getsockopt(_EVENTS)) & _POLLIN)

    async def _wait(self) -> None:
        await trio.lowlevel.wait_readable(self._fd)

    def _receive_available(self) -> bool:
        """Receive and handle what is waiting, within RECV_BATCH and RECV_BUDGET; True
        when a limit cut the pass short (more may be waiting)."""
        sock = self.sock
        budget_end = time.perf_counter() + RECV_BUDGET
        for _ in range(RECV_BATCH):
            # Asked first: a receive that finds nothing raises zmq.Again, and pyzmq makes
            # that exception slowly (py-spy: 3% of a streaming frontend's samples, one per
            # pass).
            if not cast(int, sock.getsockopt(_EVENTS)) & _POLLIN:
                return False
            try:
                frames = [sock.recv(_NOBLOCK)]
            except zmq.Again:
                return False
            while sock.getsockopt(_RCVMORE):
                frames.append(sock.recv(_NOBLOCK))
            self._handle(frames)
            if time.perf_counter() > budget_end:
                return True
        return True

    def _send_available(self) -> None:
        sock = self.sock
        outbox = self._outbox
        while outbox:
            try:
                _send(sock, outbox[0])
            except zmq.Again:
                # High-water mark reached, or (with ZMQ_IMMEDIATE) no peer connected. The
                # descriptor fires when that changes; until then the frames wait here.
                return
            outbox.popleft()

    def drop_outbox(self) -> int:
        """Forget everything queued (e.g. stale frames for a peer that went away)."""
        count = len(self._outbox)
        self._outbox.clear()
        return count


def _send(sock: zmq.Socket[bytes], frames: list[bytes]) -> None:
    """One non-blocking multipart send (a single part, the usual case, without pyzmq's
    per-part loop)."""
    if len(frames) == 1:
        sock.send(frames[0], _NOBLOCK, copy=False)
    else:
        sock.send_multipart(frames, _NOBLOCK, copy=False)


#: Frames queued per frontend connection before ROUTER drops (one frame = one step).
SNDHWM = 100_000


def bind_router(
    ctx: zmq.Context[zmq.Socket[bytes]], address: str, *, curve: CurveServerKeys | None = None
) -> zmq.Socket[bytes]:
    """An engine's ROUTER bound to ``address``. With ``curve``, a CURVE server with that
    secret key, which asks the ZAP handler of ``ctx`` about every frontend and refuses
    all of them while none runs (``ZMQ_ZAP_ENFORCE_DOMAIN``): use :func:`bound_router`,
    which runs one."""
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    # A frontend that reconnects keeps its identity (it sets ROUTING_ID): hand its
    # identity over to the new connection instead of refusing it.
    sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
    # Frames for a frontend that went away are dropped by ROUTER (no ROUTER_MANDATORY):
    # that frontend's requests are orphans and will be cancelled by the sweep. The bound
    # per frontend is generous because one frame carries a whole step of outputs.
    sock.setsockopt(zmq.SNDHWM, SNDHWM)
    if curve is not None:
        sock.setsockopt(zmq.CURVE_SERVER, 1)
        sock.setsockopt(zmq.CURVE_SECRETKEY, curve.secret)
        # A domain makes libzmq ask the ZAP handler; enforcing it makes "no handler" a
        # refusal (libzmq's default would let every key in: encryption without
        # authentication).
        sock.setsockopt_string(zmq.ZAP_DOMAIN, ZAP_DOMAIN)
        sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)
    if "[" in address:  # an IPv6 address, e.g. tcp://[::]:5555 (libzmq's default is IPv4)
        sock.setsockopt(zmq.IPV6, 1)
    sock.bind(address)
    return sock


#: The ZAP domain trioserve's engines check frontends' CURVE keys in.
ZAP_DOMAIN = "trioserve"
#: Seconds between two warnings about the same refused key (a frontend retries with a
#: backoff; a stranger may retry as fast as it likes).
REFUSAL_LOG_INTERVAL = 60.0
#: Refused keys remembered for that (past it, the memory starts afresh).
REFUSAL_LOG_KEYS = 1024


class _AuthorizedKeys:
    """pyzmq's ZAP credentials provider: the frontends' keys an engine accepts. Called in
    the authenticator's thread, with the client's key in Z85."""

    def __init__(self, authorized: frozenset[bytes]) -> None:
        self._z85 = frozenset(z85_encode(key).encode("ascii") for key in authorized)
        self._warned: dict[bytes, float] = {}

    def callback(self, domain: str, key: bytes) -> bool:
        if key in self._z85:
            return True
        now = time.monotonic()
        if now - self._warned.get(key, -REFUSAL_LOG_INTERVAL) >= REFUSAL_LOG_INTERVAL:
            if len(self._warned) >= REFUSAL_LOG_KEYS:
                self._warned.clear()
            self._warned[key] = now
            log.warning(
                "refused a frontend whose CURVE public key %s is not in --curve-authorized-"
                "keys (warned once a minute per key)",
                key.decode("ascii", "replace"),
            )
        return False


@contextlib.contextmanager
def bound_router(
    context: zmq.Context[zmq.Socket[bytes]] | None,
    address: str,
    *,
    curve: CurveServerKeys | None = None,
) -> Iterator[zmq.Socket[bytes]]:
    """An engine's ROUTER (:func:`bind_router`), closed on exit. With ``curve``, on a
    context of its own (unless one is given) with a ZAP handler that accepts the keys in
    ``curve.authorized`` only (pyzmq's ``ThreadAuthenticator``: a thread of its own, so
    either shell's loop will do), stopped after the socket closes."""
    if curve is None:
        # A context of its own unless one is given: destroying it is what makes libzmq
        # send what a socket closed with a linger still holds (a drained engine's last
        # frames, sdk/), before the process exits.
        ctx = context or zmq.Context()
        try:
            sock = bind_router(ctx, address)
            try:
                yield sock
            finally:
                sock.close()  # with its own ZMQ_LINGER: 0, unless its user raised it
        finally:
            if context is None:
                ctx.destroy()
        return
    from zmq.auth.thread import ThreadAuthenticator

    # One ZAP handler per context (its endpoint is fixed): a context of our own keeps two
    # CURVE engines in one process from sharing one.
    ctx = context or zmq.Context()
    authenticator = ThreadAuthenticator(ctx, log=logging.getLogger(f"{__name__}.zap"))
    authenticator.start()
    try:
        authenticator.configure_curve_callback(ZAP_DOMAIN, _AuthorizedKeys(curve.authorized))
        sock = bind_router(ctx, address, curve=curve)
        try:
            yield sock
        finally:
            sock.close()  # with its own ZMQ_LINGER (see above)
    finally:
        authenticator.stop()
        if context is None:
            # destroy, not term: a socket whose bind failed is still open, and term would
            # wait for it forever.
            ctx.destroy()
