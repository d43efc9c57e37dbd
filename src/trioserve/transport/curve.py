"""CurveZMQ's client side (https://rfc.zeromq.org/spec/26/), without I/O: the handshake's
commands and the MESSAGE boxes, as libzmq's ``curve_client`` builds them, so that a
frontend can talk to an engine's libzmq ROUTER with ``ZMQ_CURVE_SERVER``.

No cryptography is written here: every box is libsodium's ``crypto_box`` (PyNaCl's
bindings: Curve25519, XSalsa20, Poly1305); what is here is the layout of the commands
and the nonces, byte for byte as libzmq's ``curve_client_tools.hpp`` and
``curve_mechanism_base.cpp`` have them.

Keys: C/c the frontend's long-term pair, S the engine's long-term public key (both from
files: ``keys.py``); C'/c' and S'/s' the short-term pairs of one connection (ours made
here, fresh for each connection, and forgotten with it).

- HELLO: C', and Box[64 zeros](C'->S): only the holder of s can answer.
- WELCOME: Box[S' + cookie](S->C'): the engine's short-term key, proving it holds s.
- INITIATE: the cookie back, and Box[C + vouch + metadata](C'->S'), where the vouch is
  Box[C' + S](C->S'): proves we hold c; the engine checks C with its ZAP handler.
- READY: Box[metadata](S'->C').
- then MESSAGE: Box[flags + frame](C'->S' or S'->C'), one per frame, with an 8-byte
  nonce that grows by one with every command or message a side sends.

A box that does not open, a nonce that is not the next one (a message replayed,
reordered or dropped on the way: stricter than libzmq, which only asks for a greater
one, while its sender counts one by one) or a command of the wrong size raises
:class:`~trioserve.errors.ZmtpProtocolError`.
"""

from __future__ import annotations

import attrs
from nacl import bindings as sodium
from nacl.exceptions import CryptoError
from nacl.utils import random

from ..errors import ZmtpProtocolError
from .zmtp_protocol import frame

KEY_SIZE = 32
_MESSAGE = b"\x07MESSAGE"
#: What a MESSAGE box adds to the frame it carries: command name, nonce, MAC, flags.
MESSAGE_OVERHEAD = len(_MESSAGE) + 8 + 16 + 1
#: A WELCOME command's size (name, 16-byte nonce, Box[S' + cookie]).
WELCOME_SIZE = 168


@attrs.frozen(repr=False)
class CurveClientKeys:
    """A frontend's CURVE keys: its own pair, and the engine's public key (32 bytes each,
    raw; the secret key never in a repr)."""

    public: bytes
    secret: bytes
    server: bytes

    def __repr__(self) -> str:
        return "CurveClientKeys(<keys>)"


class CurveClient:
    """The CURVE client of one connection (see the module docstring). Made fresh for
    each connection: it holds that connection's short-term keys and nonces."""

    overhead = MESSAGE_OVERHEAD

    def __init__(self, keys: CurveClientKeys) -> None:
        self._keys = keys
        self._short_public, self._short_secret = sodium.crypto_box_keypair()
        #: Our next nonce (HELLO's is 1; libzmq's client counts the same way).
        self._nonce = 1
        #: The peer's last nonce: each of its messages must have the next one.
        self._peer_nonce = 0
        #: crypto_box_beforenm(S', c'), once WELCOME has brought S'.
        self._shared = b""

    def _next_nonce(self) -> bytes:
        nonce = self._nonce
        self._nonce = nonce + 1
        return nonce.to_bytes(8, "big")

    def hello(self) -> bytes:
        nonce = self._next_nonce()
        signature = sodium.crypto_box(
            bytes(64), b"CurveZMQHELLO---" + nonce, self._keys.server, self._short_secret
        )
        # Name, version 1.0, 72 bytes of anti-amplification padding, C', nonce, box.
        return b"\x05HELLO\x01\x00" + bytes(72) + self._short_public + nonce + signature

    def initiate(self, welcome: bytes, metadata: bytes) -> bytes:
        if len(welcome) != WELCOME_SIZE:
            raise ZmtpProtocolError(
                f"a CURVE WELCOME of {len(welcome)} bytes ({WELCOME_SIZE} expected)"
            )
        try:
            opened = sodium.crypto_box_open(
                welcome[24:], b"WELCOME-" + welcome[8:24], self._keys.server, self._short_secret
            )
        except CryptoError:
            raise ZmtpProtocolError(
                "the engine's CURVE WELCOME does not open with the engine public key this "
                "frontend was given (--engine-curve-server-key): another engine, or a relay"
            ) from None
        server_short, cookie = opened[:32], opened[32:128]
        self._shared = sodium.crypto_box_beforenm(server_short, self._short_secret)
        vouch_nonce = random(16)
        vouch = sodium.crypto_box(
            self._short_public + self._keys.server,
            b"VOUCH---" + vouch_nonce,
            server_short,
            self._keys.secret,
        )
        nonce = self._next_nonce()
        box = sodium.crypto_box_easy_afternm(
            self._keys.public + vouch_nonce + vouch + metadata,
            b"CurveZMQINITIATE" + nonce,
            self._shared,
        )
        return b"\x08INITIATE" + cookie + nonce + box

    def ready(self, ready: bytes) -> bytes:
        if len(ready) < 6 + 8 + 16:
            raise ZmtpProtocolError(f"a CURVE READY of {len(ready)} bytes (30 at least)")
        nonce = ready[6:14]
        try:
            metadata = sodium.crypto_box_open_easy_afternm(
                ready[14:], b"CurveZMQREADY---" + nonce, self._shared
            )
        except CryptoError:
            raise ZmtpProtocolError("the engine's CURVE READY does not authenticate") from None
        self._peer_nonce = int.from_bytes(nonce, "big")
        return metadata

    def encode(self, frames: list[bytes], command: bool = False) -> bytes:
        """A message, each frame in a MESSAGE box of its own (the MORE flag inside), as
        ZMTP data frames; with ``command``, the one frame is a command body."""
        shared = self._shared
        last = len(frames) - 1
        out = []
        for index, data in enumerate(frames):
            flags = 2 if command else 1 if index < last else 0
            nonce = self._next_nonce()
            box = sodium.crypto_box_easy_afternm(
                bytes((flags,)) + data, b"CurveZMQMESSAGEC" + nonce, shared
            )
            out.append(frame(_MESSAGE + nonce + box))
        return out[0] if len(out) == 1 else b"".join(out)

    def decode(self, body: bytes) -> tuple[int, bytes]:
        if len(body) < MESSAGE_OVERHEAD or body[:8] != _MESSAGE:
            raise ZmtpProtocolError("a frame that is not a CURVE MESSAGE after the handshake")
        nonce = body[8:16]
        number = int.from_bytes(nonce, "big")
        if number != self._peer_nonce + 1:
            # libzmq only asks for a greater nonce; its sender counts one by one (READY,
            # then every message and heartbeat), so a gap here is a message lost on the
            # way: a relay that drops one output frame must not go unnoticed.
            raise ZmtpProtocolError(
                f"a CURVE MESSAGE out of sequence (nonce {number} after {self._peer_nonce}): "
                "a message replayed, reordered or dropped on the way"
            )
        try:
            opened = sodium.crypto_box_open_easy_afternm(
                body[16:], b"CurveZMQMESSAGES" + nonce, self._shared
            )
        except CryptoError:
            raise ZmtpProtocolError(
                "a CURVE MESSAGE that does not authenticate: altered on the way, or not "
                "from this engine"
            ) from None
        self._peer_nonce = number
        return opened[0], opened[1:]
