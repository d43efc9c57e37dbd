"""ZmtpDealer: the frontend's own ZMTP DEALER, against real libzmq ROUTERs (pyzmq), on
real sockets."""

from __future__ import annotations

import logging
import socket

import pytest
import trio
import zmq

from tests.helpers.transport import SlowFlood, check_many_senders
from tests.helpers.waiting import HANG_GUARD, wait_until
from trioserve.transport import zmtp
from trioserve.transport.zmq_pump import ZmqPump
from trioserve.transport.zmtp import ZmtpDealer, parse_address

IDENTITY = b"frontend-test"


@pytest.fixture
def ctx():
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


def router(
    ctx: zmq.Context, address: str = "tcp://127.0.0.1", rcvhwm: int = 1000, **options: int
) -> tuple[zmq.Socket, str]:
    """A libzmq ROUTER bound to ``address`` (a free port for a bare host); ``options``
    by libzmq name, set before the bind."""
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    # A small receive high-water mark keeps libzmq's I/O thread from reading far ahead of
    # the test, so that what the test sends backs up in the dealer's outbox.
    sock.setsockopt(zmq.RCVHWM, rcvhwm)
    for name, value in options.items():
        sock.setsockopt(getattr(zmq, name), value)
    if address.startswith("tcp://") and address.count(":") == 1:
        port = sock.bind_to_random_port(address)
        return sock, f"{address}:{port}"
    sock.bind(address)
    return sock, address


async def recv(peer: zmq.Socket) -> list[bytes]:
    with trio.fail_after(HANG_GUARD):
        while True:
            try:
                return peer.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                await trio.sleep(0.005)


async def test_messages_both_ways_with_our_identity_multipart_and_long_frames(nursery, ctx):
    peer, address = router(ctx)
    heard: list[list[bytes]] = []
    dealer = ZmtpDealer(address, IDENTITY, heard.append)
    nursery.start_soon(dealer.run)
    big = bytes(range(256)) * 4096  # 1 MiB: a long frame, and more than one read
    assert dealer.send([b"hello"])
    assert await recv(peer) == [IDENTITY, b"hello"]  # the ROUTER routes by our identity
    assert dealer.send([b"a", b"", big])
    assert await recv(peer) == [IDENTITY, b"a", b"", big]
    peer.send_multipart([IDENTITY, b"x" * 300])
    peer.send_multipart([IDENTITY, b"one", b"two"])
    peer.send_multipart([IDENTITY, big])
    await wait_until(lambda: len(heard) == 3, "three replies")
    assert heard == [[b"x" * 300], [b"one", b"two"], [big]]
    assert dealer.connections == 1
    nursery.cancel_scope.cancel()


async def test_a_host_name_is_resolved_and_each_address_tried(nursery, ctx):
    # "localhost" may resolve to ::1 first, where nothing listens: the next address is
    # tried in the same attempt.
    peer, address = router(ctx)
    port = address.rsplit(":", 1)[1]
    dealer = ZmtpDealer(f"tcp://localhost:{port}", IDENTITY, lambda frames: None)
    nursery.start_soon(dealer.run)
    assert dealer.send([b"by name"])
    assert await recv(peer) == [IDENTITY, b"by name"]
    nursery.cancel_scope.cancel()


async def test_a_large_message_arrives_whole_while_other_tasks_keep_running(nursery, ctx):
    # 64 MiB from the engine (a generated video, say) takes hundreds of reads: the owner
    # lets other tasks run between them instead of copying it all in one go.
    peer, address = router(ctx)
    heard: list[list[bytes]] = []
    dealer = ZmtpDealer(address, IDENTITY, heard.append)
    nursery.start_soon(dealer.run)
    assert dealer.send([b"hello"])
    await recv(peer)
    big = bytes(range(256)) * (2**18)
    ticks = 0

    async def other() -> None:
        nonlocal ticks
        while not heard:
            ticks += 1
            await trio.lowlevel.checkpoint()

    nursery.start_soon(other)
    peer.send_multipart([IDENTITY, b"head", big])
    await wait_until(lambda: bool(heard), "the large message")
    assert heard == [[b"head", big]]
    assert ticks > 10
    nursery.cancel_scope.cancel()


async def test_many_senders_in_order_and_every_reply_heard(nursery, ctx):
    # A libzmq echo answers every message; senders in many tasks send while the owner is
    # parked; each sender's messages come back in its order, none lost.
    echo, address = router(ctx)
    echo_pump = ZmqPump(echo, lambda frames: echo_pump.send(frames))
    nursery.start_soon(echo_pump.run)
    heard: list[bytes] = []
    dealer = ZmtpDealer(address, IDENTITY, lambda frames: heard.append(frames[0]))
    nursery.start_soon(dealer.run)
    await check_many_senders(lambda body: dealer.send([body]), heard)
    nursery.cancel_scope.cancel()


async def slow_reader(nursery, ctx) -> tuple[zmq.Socket, str, ZmtpDealer]:
    """A peer that reads ahead by one message only, and a dealer connected to it."""
    peer, address = router(ctx, rcvhwm=1)
    dealer = ZmtpDealer(address, IDENTITY, lambda frames: None)
    nursery.start_soon(dealer.run)
    assert dealer.send([b"first"])
    assert await recv(peer) == [IDENTITY, b"first"]
    return peer, address, dealer


async def backlog(dealer: ZmtpDealer, count: int = 200) -> bytes:
    """Queue more than loopback buffers hold (20 MB, to a peer that reads ahead by one
    message): the outbox's head is then a message the kernel took part of."""
    chunk = b"y" * 100_000
    for n in range(count):
        assert dealer.send([b"%d" % n, chunk])
    assert dealer.pending > 0
    return chunk


async def test_a_backlog_larger_than_the_kernel_buffer_leaves_whole_and_in_order(nursery, ctx):
    # Sends faster than the peer reads fill the kernel's buffers; the rest waits in the
    # outbox (a partly sent message at its head) and leaves as the peer reads.
    peer, _, dealer = await slow_reader(nursery, ctx)
    count = 200
    chunk = await backlog(dealer, count)
    got = []
    while len(got) < count:
        frames = await recv(peer)
        assert frames[2] == chunk
        got.append(int(frames[1]))
    assert got == list(range(count))
    await wait_until(lambda: dealer.pending == 0, "the outbox empty")
    nursery.cancel_scope.cancel()


async def test_dropping_the_outbox_keeps_the_stream_whole(nursery, ctx):
    # What the engine connection does when it declares an engine lost: the queued
    # messages go, but the one already partly sent is finished, or the peer would read
    # the next message's bytes as the rest of it.
    peer, _, dealer = await slow_reader(nursery, ctx)
    chunk = await backlog(dealer)
    dropped = dealer.drop_outbox()
    assert dropped > 0
    assert dealer.send([b"after"])
    received = []
    while (frames := await recv(peer))[1] != b"after":
        assert frames[2] == chunk
        received.append(int(frames[1]))
    assert received == list(range(200 - dropped))
    nursery.cancel_scope.cancel()


async def test_what_was_queued_for_a_lost_connection_is_not_sent_to_the_next(nursery, ctx):
    peer, address, dealer = await slow_reader(nursery, ctx)
    await backlog(dealer)
    peer.close(linger=0)  # the engine dies with our backlog unread
    await wait_until(lambda: not dealer.connected, "the loss noticed")
    assert dealer.pending == 0
    peer, _ = router(ctx, address)
    await wait_until(lambda: dealer.connected, "reconnected")
    assert dealer.send([b"fresh"])
    assert await recv(peer) == [IDENTITY, b"fresh"]  # nothing stale, nothing torn, before it
    nursery.cancel_scope.cancel()


async def test_without_a_peer_messages_queue_up_to_the_bound_and_leave_once_it_comes(
    nursery, ctx, tmp_path
):
    address = f"ipc://{tmp_path}/engine"  # nobody there yet
    dealer = ZmtpDealer(address, IDENTITY, lambda frames: None, outbox_limit=5)
    nursery.start_soon(dealer.run)
    await trio.sleep(3 * zmtp.RECONNECT_INTERVAL)  # a few failed attempts
    assert all(dealer.send([b"m%d" % i]) for i in range(5))
    assert not dealer.send([b"over"])  # full: refused, nothing queued
    assert dealer.pending == 5
    peer, _ = router(ctx, address)
    got = [(await recv(peer))[1] for _ in range(5)]
    assert got == [b"m%d" % i for i in range(5)]
    assert dealer.pending == 0
    nursery.cancel_scope.cancel()


async def test_reconnects_to_a_restarted_peer_on_the_same_address(nursery, ctx):
    peer, address = router(ctx)
    heard: list[bytes] = []
    dealer = ZmtpDealer(address, IDENTITY, lambda frames: heard.append(frames[0]))
    nursery.start_soon(dealer.run)
    assert dealer.send([b"one"])
    assert await recv(peer) == [IDENTITY, b"one"]
    peer.close(linger=0)  # the engine dies
    await wait_until(lambda: not dealer.connected, "the loss noticed")
    peer, _ = router(ctx, address)  # its successor binds the same address
    await wait_until(lambda: dealer.connected, "reconnected")
    assert dealer.connections == 2
    assert dealer.send([b"two"])
    assert await recv(peer) == [IDENTITY, b"two"]
    peer.send_multipart([IDENTITY, b"back"])
    await wait_until(lambda: heard == [b"back"], "the successor's reply")
    nursery.cancel_scope.cancel()


async def test_libzmq_heartbeats_are_answered_so_the_connection_stays(nursery, ctx):
    # The ROUTER pings every 20 ms and drops a connection silent for 100 ms after a ping:
    # only PONGs keep an otherwise idle connection up.
    peer, address = router(ctx, HEARTBEAT_IVL=20, HEARTBEAT_TIMEOUT=100)
    dealer = ZmtpDealer(address, IDENTITY, lambda frames: None)
    nursery.start_soon(dealer.run)
    assert dealer.send([b"hello"])
    assert await recv(peer) == [IDENTITY, b"hello"]
    await trio.sleep(0.6)
    assert dealer.connections == 1
    nursery.cancel_scope.cancel()


async def test_a_message_over_the_bound_drops_the_connection_not_the_frontend(
    nursery, ctx, monkeypatch, caplog
):
    monkeypatch.setattr(zmtp, "MAX_MESSAGE", 1000)
    peer, address = router(ctx)
    heard: list[bytes] = []
    dealer = ZmtpDealer(address, IDENTITY, lambda frames: heard.append(frames[0]))
    nursery.start_soon(dealer.run)
    assert dealer.send([b"hello"])
    await recv(peer)
    peer.send_multipart([IDENTITY, b"z" * 1001])
    # The peer services its socket meanwhile, as an engine does (libzmq's ROUTER refuses a
    # reconnecting identity until it has processed the old connection's end).
    await wait_until(
        lambda: peer.getsockopt(zmq.EVENTS) is not None and dealer.connections == 2,
        "a new connection",
    )
    assert "larger than 1000 bytes" in caplog.text
    assert heard == []
    assert dealer.send([b"again"])
    assert await recv(peer) == [IDENTITY, b"again"]
    peer.send_multipart([IDENTITY, b"z" * 1000])  # at the bound: fine
    await wait_until(lambda: heard == [b"z" * 1000], "the message at the bound")
    nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("configure", "expected"),
    [
        (
            lambda s: s.setsockopt(zmq.CURVE_SERVER, 1),
            "it most likely requires a security mechanism (CURVE)",
        ),
        (None, "the peer is a 'PUB' socket"),
    ],
    ids=["curve", "pub"],
)
async def test_a_peer_we_cannot_talk_to_is_named_in_the_log(
    nursery, ctx, caplog, configure, expected
):
    if configure is not None:
        peer = ctx.socket(zmq.ROUTER)
        peer.setsockopt(zmq.CURVE_SECRETKEY, zmq.curve_keypair()[1])
        configure(peer)
    else:
        peer = ctx.socket(zmq.PUB)
    peer.setsockopt(zmq.LINGER, 0)
    port = peer.bind_to_random_port("tcp://127.0.0.1")
    dealer = ZmtpDealer(f"tcp://127.0.0.1:{port}", IDENTITY, lambda frames: None)
    nursery.start_soon(dealer.run)
    with caplog.at_level(logging.WARNING, logger="trioserve.transport.zmtp"):
        await wait_until(lambda: expected in caplog.text, expected)
        await trio.sleep(5 * zmtp.RECONNECT_INTERVAL)  # more attempts, no more warnings
    assert caplog.text.count(expected) == 1
    assert dealer.connections == 0
    nursery.cancel_scope.cancel()


async def test_a_peer_that_never_greets_is_given_up_on_and_retried(nursery, monkeypatch):
    monkeypatch.setattr(zmtp, "HANDSHAKE_TIMEOUT", 0.2)
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    address = f"tcp://127.0.0.1:{listener.getsockname()[1]}"
    dealer = ZmtpDealer(address, IDENTITY, lambda frames: None)
    nursery.start_soon(dealer.run)
    accepted = []
    with trio.fail_after(HANG_GUARD):
        while len(accepted) < 2:  # a second attempt after the first timed out
            await trio.lowlevel.wait_readable(listener)
            conn, _ = listener.accept()
            accepted.append(conn)
    assert dealer.connections == 0
    for conn in accepted:
        conn.close()
    listener.close()
    nursery.cancel_scope.cancel()


async def test_a_flood_of_slow_messages_does_not_starve_other_tasks(nursery, ctx):
    peer, address = router(ctx)
    flood = SlowFlood()
    dealer = ZmtpDealer(address, IDENTITY, flood.handle)
    nursery.start_soon(dealer.run)
    assert dealer.send([b"hello"])
    await recv(peer)
    for body in flood.messages():
        peer.send_multipart([IDENTITY, body])
    await flood.check_others_ran(nursery)
    nursery.cancel_scope.cancel()


async def test_close_sends_what_is_queued_then_closes(nursery, ctx):
    peer, address = router(ctx)
    dealer = ZmtpDealer(address, IDENTITY, lambda frames: None)
    async with trio.open_nursery() as inner:
        inner.start_soon(dealer.run)
        await wait_until(lambda: dealer.connected, "connected")
        dealer.send_raw(zmtp.message([b"last words"]))  # queued, owner not yet run
        inner.cancel_scope.cancel()
    dealer.close()
    assert await recv(peer) == [IDENTITY, b"last words"]
    assert not dealer.connected


@pytest.mark.parametrize(
    ("address", "parsed"),
    [
        ("tcp://127.0.0.1:5555", (socket.AF_INET, "127.0.0.1", 5555)),
        ("tcp://engine-0.svc:80", (socket.AF_INET, "engine-0.svc", 80)),
        ("tcp://[::1]:5555", (socket.AF_INET, "::1", 5555)),
        ("ipc:///tmp/e.sock", (socket.AF_UNIX, "/tmp/e.sock", None)),
        ("ipc://@engine", (socket.AF_UNIX, "\0engine", None)),
    ],
)
def test_addresses(address, parsed):
    assert parse_address(address) == parsed


@pytest.mark.parametrize(
    "address",
    ["inproc://e", "tcp://127.0.0.1", "tcp://*:5555", "tcp://h:0", "tcp://h:x", "ipc://", "e"],
)
def test_bad_addresses_are_refused_with_the_expected_forms(address):
    with pytest.raises(ValueError, match="expected tcp://HOST:PORT or ipc://PATH"):
        parse_address(address)
