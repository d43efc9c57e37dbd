"""An engine driven by hand (a raw ZeroMQ ROUTER), for engines that misbehave."""

from __future__ import annotations

from typing import Any

import trio
import zmq

from tests.helpers.waiting import HANG_GUARD
from trioserve.protocol import PROTOCOL_VERSION, ModelCard, Welcome, decode, encode


class FakeEngine:
    """A raw ROUTER socket driven by hand, for misbehaving engines."""

    def __init__(self) -> None:
        self.sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind("tcp://127.0.0.1:*")
        self.address: str = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)

    async def receive(self) -> tuple[bytes, object]:
        while True:
            try:
                ident, frame = self.sock.recv_multipart(zmq.NOBLOCK)
                return ident, decode(frame)
            except zmq.Again:
                await trio.sleep(0.005)

    def send(self, ident: bytes, frame: bytes) -> None:
        self.sock.send_multipart([ident, frame])

    def close(self) -> None:
        self.sock.close(linger=0)


def welcome(version: int = PROTOCOL_VERSION, session: str = "s1", model: str = "mock") -> bytes:
    return encode(Welcome(version, "fake", session, [ModelCard(model)], ["completion"]))


async def receive_a(fake: FakeEngine, kind: type) -> tuple[bytes, Any]:
    """The next message of type ``kind`` the fake receives (hellos repeat until answered)."""
    with trio.fail_after(HANG_GUARD):
        while True:
            ident, message = await fake.receive()
            if isinstance(message, kind):
                return ident, message
