"""ZmqPump: one owner task per ZeroMQ socket, sends from any task, real sockets."""

from __future__ import annotations

import time

import pytest
import trio
import zmq

from tests.helpers.transport import SlowFlood, check_many_senders
from tests.helpers.waiting import HANG_GUARD, wait_until
from trioserve.transport.zmq_pump import ZmqPump


@pytest.fixture
def ctx():
    # Destroyed even when a test fails: a context left to the garbage collector waits
    # for its sockets for ever.
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


def dealer(ctx: zmq.Context, address: str) -> zmq.Socket:
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.IMMEDIATE, 1)
    sock.connect(address)
    return sock


def router(ctx: zmq.Context) -> tuple[zmq.Socket, str]:
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    return sock, f"tcp://127.0.0.1:{port}"


async def first_identity(peer: zmq.Socket, pump: ZmqPump) -> bytes:
    """The routing identity of the first message the ROUTER ``peer`` receives from
    ``pump``'s socket. The pump is woken meanwhile: a message queued before the
    connection was up is only retried when the owner runs (the engine connection's
    heartbeat does the same), since the descriptor need not fire on connecting."""
    with trio.fail_after(HANG_GUARD):
        while True:
            try:
                identity, _ = peer.recv_multipart(zmq.NOBLOCK)
                return identity
            except zmq.Again:
                pump.wake()
                await trio.sleep(0.01)


async def test_many_senders_in_order_and_every_reply_heard(nursery, ctx):
    # An echo peer answers every message; senders in many tasks send while the owner is
    # parked. A send that consumes the descriptor's edge must not leave a reply unheard.
    echo, address = router(ctx)
    echo_pump = ZmqPump(echo, lambda frames: echo_pump.send(frames))
    nursery.start_soon(echo_pump.run)
    heard: list[bytes] = []
    pump = ZmqPump(dealer(ctx, address), lambda frames: heard.append(frames[0]))
    nursery.start_soon(pump.run)
    assert pump.send([b"ready"])  # first, the connection (see first_identity)
    with trio.fail_after(HANG_GUARD):
        while not heard:
            pump.wake()
            await trio.sleep(0.01)
    heard.clear()
    await check_many_senders(lambda body: pump.send([body]), heard)
    nursery.cancel_scope.cancel()


async def test_without_a_peer_messages_queue_up_to_the_bound_and_leave_once_it_comes(
    nursery, ctx, tmp_path
):
    address = f"ipc://{tmp_path}/engine"  # nobody there yet
    pump = ZmqPump(dealer(ctx, address), lambda frames: None, outbox_limit=5)
    nursery.start_soon(pump.run)
    assert all(pump.send([b"m%d" % i]) for i in range(5))
    assert pump.pending == 5
    assert not pump.send([b"over"])  # full: refused, nothing queued
    assert pump.pending == 5
    peer = ctx.socket(zmq.ROUTER)
    peer.setsockopt(zmq.LINGER, 0)
    peer.bind(address)
    got: list[bytes] = []
    with trio.fail_after(HANG_GUARD):
        while len(got) < 5:
            pump.wake()  # as the engine connection's heartbeat does until connected
            try:
                got.append(peer.recv_multipart(zmq.NOBLOCK)[1])
            except zmq.Again:
                await trio.sleep(0.01)
    assert got == [b"m%d" % i for i in range(5)]
    assert pump.pending == 0
    nursery.cancel_scope.cancel()


async def test_a_send_that_consumes_the_descriptors_edge_wakes_the_owner(nursery, ctx):
    # The owner is parked on the descriptor; a message arrives and the descriptor fires;
    # before trio looks, another task sends, and zmq's send handles the pending
    # commands, which resets the descriptor. Unless that sender wakes the owner, the
    # message waits for ever.
    peer, address = router(ctx)
    heard: list[bytes] = []
    pump = ZmqPump(dealer(ctx, address), lambda frames: heard.append(frames[0]))
    nursery.start_soon(pump.run)
    assert pump.send([b"hello"])
    identity = await first_identity(peer, pump)
    for round_ in range(5):
        await trio.sleep(0.01)  # the owner parks
        peer.send_multipart([identity, b"reply %d" % round_])
        time.sleep(0.05)  # noqa: ASYNC251 - keep trio from polling while it arrives
        assert pump.send([b"more"])  # no checkpoint in between
        await wait_until(lambda n=round_ + 1: len(heard) == n, "the reply")
    nursery.cancel_scope.cancel()


async def test_a_flood_of_slow_messages_does_not_starve_other_tasks(nursery, ctx):
    peer, address = router(ctx)
    flood = SlowFlood()
    pump = ZmqPump(dealer(ctx, address), flood.handle)
    nursery.start_soon(pump.run)
    assert pump.send([b"hello"])
    identity = await first_identity(peer, pump)
    for body in flood.messages():
        peer.send_multipart([identity, body])
    await flood.check_others_ran(nursery)
    nursery.cancel_scope.cancel()
