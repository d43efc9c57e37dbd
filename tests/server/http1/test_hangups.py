"""The server's one hang-up watcher, with real TCP sockets on 127.0.0.1."""

from __future__ import annotations

import socket
import struct

import pytest
import trio

from tests.helpers.waiting import HANG_GUARD, wait_until
from trioserve.server.http1 import hangups
from trioserve.server.http1.hangups import HangupWatcher

pytestmark = pytest.mark.skipif(not hangups.available(), reason="epoll is Linux-only")


async def pair(listener: trio.socket.SocketType) -> tuple[trio.socket.SocketType, ...]:
    client = trio.socket.socket()
    await client.connect(listener.getsockname())
    server, _ = await listener.accept()
    return client, server


async def hang_up_another(
    watcher: HangupWatcher, listener: trio.socket.SocketType, heard: list[str], name: str
) -> None:
    """Watch a new connection, hang it up and wait for its callback: proof that the
    watcher had its turn after whatever the test did before."""
    client, server = await pair(listener)
    watcher.watch(server.fileno(), lambda: heard.append(name))
    client.close()
    await wait_until(lambda: name in heard, f"the {name} socket's hang-up")
    server.close()


@pytest.fixture
async def setup(nursery):
    watcher = HangupWatcher()
    nursery.start_soon(watcher.run)
    listener = trio.socket.socket()
    await listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    yield watcher, listener
    listener.close()


async def test_a_close_and_a_reset_are_hang_ups_each_reported_once(setup):
    watcher, listener = setup
    heard: list[str] = []
    closing, server_a = await pair(listener)
    resetting, server_b = await pair(listener)
    watcher.watch(server_a.fileno(), lambda: heard.append("a"))
    watcher.watch(server_b.fileno(), lambda: heard.append("b"))
    closing.close()  # FIN
    resetting.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    resetting.close()  # RST
    await wait_until(lambda: len(heard) == 2, "both hang-ups")
    assert sorted(heard) == ["a", "b"]
    assert len(watcher) == 0  # each descriptor is forgotten once reported
    server_a.close()
    server_b.close()


async def test_data_from_the_client_is_not_a_hang_up(setup):
    watcher, listener = setup
    heard: list[str] = []
    client, server = await pair(listener)
    watcher.watch(server.fileno(), lambda: heard.append("x"))
    await client.send(b"GET /next HTTP/1.1\r\nhost: x\r\n\r\n")  # a pipelined request
    await hang_up_another(watcher, listener, heard, "other")
    assert heard == ["other"]
    assert len(watcher) == 1
    with trio.fail_after(HANG_GUARD):  # the data is still there for the connection
        assert (await server.recv(1024)).startswith(b"GET /next")
    watcher.unwatch(server.fileno())
    client.close()
    server.close()


async def test_an_unwatched_socket_is_not_reported(setup):
    watcher, listener = setup
    heard: list[str] = []
    client, server = await pair(listener)
    watcher.watch(server.fileno(), lambda: heard.append("unwatched"))
    watcher.unwatch(server.fileno())
    watcher.unwatch(server.fileno())  # twice is harmless
    client.close()
    await hang_up_another(watcher, listener, heard, "other")
    assert heard == ["other"]
    server.close()


async def test_a_failing_callback_does_not_stop_the_watcher(setup):
    watcher, listener = setup
    heard: list[str] = []

    def fail() -> None:
        raise RuntimeError("boom")

    first, first_server = await pair(listener)
    watcher.watch(first_server.fileno(), fail)
    first.close()
    await wait_until(lambda: len(watcher) == 0, "the failing callback to run")
    await hang_up_another(watcher, listener, heard, "second")
    first_server.close()


async def test_a_descriptor_is_watched_once(setup):
    watcher, listener = setup
    client, server = await pair(listener)
    watcher.watch(server.fileno(), lambda: None)
    with pytest.raises(RuntimeError):
        watcher.watch(server.fileno(), lambda: None)
    watcher.unwatch(server.fileno())
    client.close()
    server.close()
