"""How a client of vLLM's EngineCore opens: its sockets (their options, binds and monitor
events), the handshake with an engine that connects (HELLO, the clients' addresses, READY)
and what the sockets' owners learn meanwhile (:class:`Opening`). The running client, and
:func:`~trioserve.enginecore.client.open_enginecore_client` that opens it, are
``client.py``'s."""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable, Sequence
from typing import cast

import trio
import zmq

from ..errors import PeerProtocolError
from ..transport.zmq_pump import ZmqPump
from . import codec

log = logging.getLogger(__name__)

#: Messages queued in libzmq for the engine before sends are held in our bounded outbox
#: (and past that, refused): an engine that stops reading does not grow memory unbounded.
SNDHWM = 10_000


def monitor_event(frames: list[bytes]) -> int:
    if len(frames) != 2 or len(frames[0]) < 6:
        return 0
    return cast(int, struct.unpack("=hi", frames[0][:6])[0])


def client_socket(ctx: zmq.Context[zmq.Socket[bytes]], kind: int) -> zmq.Socket[bytes]:
    """A socket of ``kind`` with the options every one of the client's has."""
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    if kind == zmq.ROUTER:
        sock.setsockopt(zmq.SNDHWM, SNDHWM)
        # A restarted engine (or one whose connection dropped) takes its identity back.
        sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
    else:
        sock.setsockopt(zmq.RCVHWM, 0)  # the engine's steps are bounded by its batch
    return sock


def bind(sock: zmq.Socket[bytes], address: str) -> str:
    """Bind ``sock`` to ``address`` (``tcp://HOST:*`` takes a free port): the address it is
    bound to. (Its monitor, if it has one, is made before: an engine already trying to
    connect may finish its handshake the moment the socket is bound.)"""
    if "[" in address:
        sock.setsockopt(zmq.IPV6, 1)
    try:
        sock.bind(address)
    except zmq.ZMQError as exc:
        raise OSError(f"cannot bind {address} for vLLM's EngineCore: {exc}") from None
    return cast(bytes, sock.getsockopt(zmq.LAST_ENDPOINT)).decode()


class Opening:
    """What the sockets' owners learn while a client opens, for the task that waits. An
    error in a message is kept here (the owners' barrier would only log it) and ends
    every wait."""

    def __init__(self) -> None:
        self.ready: codec.EngineCoreReadyResponse | None = None
        self.registered = trio.Event()
        self.connected = {"input": trio.Event(), "output": trio.Event()}
        self.handshake_done = trio.Event()
        self.problem: BaseException | None = None

    def fail(self, exc: BaseException) -> None:
        if self.problem is None:
            self.problem = exc
        for event in (self.registered, self.handshake_done, *self.connected.values()):
            event.set()

    async def until(self, event: trio.Event) -> None:
        await event.wait()
        if self.problem is not None:
            raise self.problem


async def handshake(
    ctx: zmq.Context[zmq.Socket[bytes]],
    address: str,
    inputs: Sequence[str],
    outputs: Sequence[str],
    opening: Opening,
    on_bound: Callable[[str], None] | None,
) -> None:
    """Bind the handshake ROUTER at ``address``, answer the engine's HELLO with every
    client's ``inputs`` and ``outputs`` and return at its READY (the ready response on the
    input socket may come before or after it)."""
    sock = client_socket(ctx, zmq.ROUTER)
    try:
        bound_at = bind(sock, address)
    except OSError:
        sock.close()
        raise
    if on_bound is not None:
        on_bound(bound_at)
    said_hello = False

    def on_message(frames: list[bytes]) -> None:
        nonlocal said_hello
        try:
            if len(frames) != 2:
                raise PeerProtocolError(f"a handshake message of {len(frames)} frames")
            identity, payload = frames
            hello = codec.decode_hello(payload)
            if hello.status == "HELLO" and not said_hello:
                said_hello = True
                log.info("vLLM's EngineCore said hello; it loads the model now")
                pump.send([identity, codec.encode_init(inputs, outputs)])
            elif hello.status == "READY" and said_hello:
                opening.handshake_done.set()
            else:
                raise PeerProtocolError(f"an unexpected {hello.status!r} in the handshake")
        except PeerProtocolError as exc:
            opening.fail(exc)

    pump = ZmqPump(sock, on_message)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pump.run)
            await opening.handshake_done.wait()  # set by a failure too
            nursery.cancel_scope.cancel()
    finally:
        sock.close()
    if opening.problem is not None:
        raise opening.problem  # out here, not in a group: the caller's except sees it
