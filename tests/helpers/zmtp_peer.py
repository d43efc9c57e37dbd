"""The engine's side of ZMTP, by hand, for the sans-io tests and the fuzzer: the bytes a
libzmq ROUTER would send (NULL), and a CurveZMQ server (libsodium boxes, as libzmq's
``curve_server`` lays them out), so that a frontend's connection can be driven to READY
and fed messages without a socket. Interoperability with libzmq itself is tested over
real sockets (tests/transport/test_curve.py)."""

from __future__ import annotations

from nacl import bindings as sodium

from trioserve.transport.curve import CurveClientKeys
from trioserve.transport.zmtp_protocol import (
    COMMAND,
    MORE,
    ZmtpConnection,
    command,
    frame,
    properties,
)

IDENTITY = b"frontend-test"


def greeting(mechanism: bytes = b"NULL", as_server: int = 0, version: tuple = (3, 1)) -> bytes:
    return (
        b"\xff"
        + bytes(8)
        + b"\x7f"
        + bytes(version)
        + mechanism.ljust(20, b"\0")
        + bytes((as_server,))
        + bytes(31)
    )


def router_ready(socket_type: bytes = b"ROUTER") -> bytes:
    return properties(((b"Socket-Type", socket_type),))


def null_handshake() -> bytes:
    """What a NULL ROUTER sends before its messages."""
    return greeting() + command(b"READY", router_ready())


def null_message(frames: list[bytes]) -> bytes:
    last = len(frames) - 1
    return b"".join(frame(part, MORE if i < last else 0) for i, part in enumerate(frames))


def parse_frames(data: bytes) -> list[tuple[int, bytes]]:
    """``(flags, body)`` of each whole frame in ``data``."""
    out, pos = [], 0
    while pos < len(data):
        flags = data[pos]
        if flags & 2:
            size = int.from_bytes(data[pos + 1 : pos + 9], "big")
            pos += 9
        else:
            size = data[pos + 1]
            pos += 2
        out.append((flags, data[pos : pos + size]))
        pos += size
    return out


def keys() -> tuple[CurveClientKeys, bytes, bytes]:
    """A frontend's keys, and the engine's pair (public, secret)."""
    public, secret = sodium.crypto_box_keypair()
    server_public, server_secret = sodium.crypto_box_keypair()
    client = CurveClientKeys(public=public, secret=secret, server=server_public)
    return client, server_public, server_secret


class CurveServer:
    """A CurveZMQ server for one connection (the engine's side), answering a client's
    HELLO and INITIATE and boxing messages to it. Keeps what a real one checks: the HELLO
    box, the vouch, the client's long-term key (``client_public``)."""

    def __init__(self, public: bytes, secret: bytes) -> None:
        self.public, self.secret = public, secret
        self.short_public, self.short_secret = sodium.crypto_box_keypair()
        self.nonce = 1
        self.client_public = b""
        self.shared = b""
        self.client_short = b""

    def _next(self) -> bytes:
        nonce = self.nonce
        self.nonce += 1
        return nonce.to_bytes(8, "big")

    def welcome(self, hello: bytes) -> bytes:
        """The WELCOME command frame answering a HELLO command body."""
        assert len(hello) == 200 and hello[:6] == b"\x05HELLO"
        self.client_short = hello[80:112]
        opened = sodium.crypto_box_open(
            hello[120:200], b"CurveZMQHELLO---" + hello[112:120], self.client_short, self.secret
        )
        assert opened == bytes(64)
        long_nonce = bytes(range(16))
        cookie = bytes(96)  # opaque to the client; a real server boxes its state here
        box = sodium.crypto_box(
            self.short_public + cookie, b"WELCOME-" + long_nonce, self.client_short, self.secret
        )
        return frame(b"\x07WELCOME" + long_nonce + box, COMMAND)

    def ready(self, initiate: bytes, metadata: bytes | None = None) -> bytes:
        """The READY command frame answering an INITIATE command body."""
        assert initiate[:9] == b"\x08INITIATE"
        self.shared = sodium.crypto_box_beforenm(self.client_short, self.short_secret)
        opened = sodium.crypto_box_open_easy_afternm(
            initiate[113:], b"CurveZMQINITIATE" + initiate[105:113], self.shared
        )
        self.client_public = opened[:32]
        vouch = sodium.crypto_box_open(
            opened[48:128], b"VOUCH---" + opened[32:48], self.client_public, self.short_secret
        )
        assert vouch == self.client_short + self.public
        nonce = self._next()
        box = sodium.crypto_box_easy_afternm(
            router_ready() if metadata is None else metadata,
            b"CurveZMQREADY---" + nonce,
            self.shared,
        )
        return frame(b"\x05READY" + nonce + box, COMMAND)

    def message(self, frames: list[bytes], command: bool = False) -> bytes:
        last = len(frames) - 1
        out = b""
        for index, data in enumerate(frames):
            flags = 2 if command else 1 if index < last else 0
            nonce = self._next()
            box = sodium.crypto_box_easy_afternm(
                bytes((flags,)) + data, b"CurveZMQMESSAGES" + nonce, self.shared
            )
            out += frame(b"\x07MESSAGE" + nonce + box)
        return out

    def open(self, body: bytes) -> tuple[int, bytes]:
        """A MESSAGE frame body from the client: (flags, data)."""
        opened = sodium.crypto_box_open_easy_afternm(
            body[16:], b"CurveZMQMESSAGEC" + body[8:16], self.shared
        )
        return opened[0], opened[1:]


def curve_handshake(conn: ZmtpConnection, server: CurveServer) -> bytes:
    """Drive ``conn`` (a ZmtpConnection with CURVE) to READY; returns the server's bytes
    (greeting, WELCOME, READY) as one stream, for replays."""
    stream = greeting(b"CURVE", as_server=1)
    conn.receive_data(stream)
    assert conn.next_event() is None
    out = conn.data_to_send()
    sent = parse_frames(out[64:] if out[:1] == b"\xff" else out)  # our greeting, if there
    assert [flags for flags, _ in sent] == [COMMAND]
    welcome = server.welcome(sent[0][1])
    conn.receive_data(welcome)
    assert conn.next_event() is None
    (initiate,) = parse_frames(conn.data_to_send())
    ready = server.ready(initiate[1])
    conn.receive_data(ready)
    return stream + welcome + ready
