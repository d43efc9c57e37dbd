"""ZMTP 3 without I/O: the frontend's side of one connection to an engine's ROUTER.

Bytes in, events out, as h11 does for HTTP: :meth:`ZmtpConnection.receive_data` takes
what the socket read, :meth:`~ZmtpConnection.next_event` returns a :class:`Ready` (once,
when the handshake is over), then a :class:`Message` at a time, or None when it needs
more bytes; :meth:`~ZmtpConnection.data_to_send` returns what the protocol itself must
send (the greeting, the handshake's commands, answers to PINGs) and
:meth:`~ZmtpConnection.encode` frames (and under CURVE encrypts) a message of ours. The
dealer that does the I/O is ``zmtp.py``; this module never touches a socket, a clock or
an event loop, so every input can be tested, and fuzzed, as plain bytes.

Theory of operation. ZMTP 3.0 (https://rfc.zeromq.org/spec/23/) with the NULL mechanism,
or CURVE (https://rfc.zeromq.org/spec/26/, the client's half in ``curve.py``), as a
DEALER:

1. each side sends a 64-byte greeting (signature, version, mechanism, and an as-server
   flag that libzmq leaves 0 whatever the socket is, so it is not checked);
2. the mechanism's handshake, in commands (frames with the COMMAND flag): under NULL our
   READY and theirs, each carrying metadata (``Socket-Type``, ``Identity``); under CURVE
   HELLO, WELCOME, INITIATE (our metadata inside, encrypted) and READY (theirs), or an
   ERROR from the peer that refuses us;
3. then messages of one or more frames (MORE flag on all but the last), and commands
   (PING, answered with a PONG; anything else ignored, as the spec asks). Under CURVE
   every frame after the handshake is a MESSAGE box whose nonce must be the next one, and
   the MORE and COMMAND flags that count are the ones inside the box.

What it refuses: every malformed or hostile input raises :class:`ZmtpProtocolError` (the ERROR
command: :class:`ZmtpRefusedError`), which ends that connection only; after it the
connection is dead and every later call raises the same error. Nothing else is raised,
whatever the bytes (``tests/transport/test_zmtp_fuzz.py`` holds it to that). Memory is
bounded: a frame larger than what it may be (a message: ``max_message``, all its frames
together; a command: :data:`MAX_COMMAND`) is refused from its length field, before its
body is read, and a message has at most :data:`MAX_PARTS` frames; so a caller that
alternates reads of at most N bytes with :meth:`~ZmtpConnection.next_event` until it
returns None holds at most one frame plus N bytes.
"""

from __future__ import annotations

from typing import Protocol

from ..errors import ZmtpProtocolError, ZmtpRefusedError

#: The ZMTP frame flags.
MORE, LONG, COMMAND = 1, 2, 4
GREETING_SIZE = 64

#: The largest message accepted from an engine by default, all frames together (bytes;
#: ``--engine-max-frame-mb``). What the protocol needs: one engine step's outputs for one
#: frontend, where a step yields one delta per request. Text steps are kilobytes; the
#: largest item is a media payload, and engines send media larger than this in several
#: items (docs/protocol.md §2).
MAX_MESSAGE = 128 * 2**20
#: The most frames one message may have (the engine protocol uses one).
MAX_PARTS = 64
#: The largest metadata a peer's READY may carry (bytes). A ROUTER sends its
#: ``Socket-Type`` (about 20 bytes) and whatever ``ZMQ_METADATA`` properties its engine set.
MAX_METADATA = 16 * 1024
#: The largest command frame accepted (bytes): a READY with the most metadata, and the
#: CURVE box around it.
MAX_COMMAND = MAX_METADATA + 256
#: Frames from this size on are copied out of the receive buffer through a view (one copy,
#: not two).
LARGE = 64 * 1024

# Connection states.
GREETING, HANDSHAKE, WELCOME, READY = "greeting", "handshake", "welcome", "ready"


class Ready:
    """The handshake is over: messages may flow. ``properties``: the peer's metadata,
    names lowercased (they are case-insensitive)."""

    __slots__ = ("properties",)

    def __init__(self, properties: dict[bytes, bytes]) -> None:
        self.properties = properties

    def __repr__(self) -> str:
        return f"Ready({self.properties!r})"


class Message:
    """One message from the peer: its frames, in order."""

    __slots__ = ("frames",)

    def __init__(self, frames: list[bytes]) -> None:
        self.frames = frames

    def __repr__(self) -> str:
        return f"Message({self.frames!r})"


class CurveMechanism(Protocol):
    """What the connection needs of the CURVE client (``curve.CurveClient``). Each method
    raises :class:`ZmtpProtocolError` for what it cannot accept."""

    #: Bytes a MESSAGE box adds to the frame it carries.
    overhead: int

    def hello(self) -> bytes:
        """Our HELLO command's body."""
        ...

    def initiate(self, welcome: bytes, metadata: bytes) -> bytes:
        """Our INITIATE command's body, from the peer's WELCOME command's body."""
        ...

    def ready(self, ready: bytes) -> bytes:
        """The metadata inside the peer's READY command's body."""
        ...

    def encode(self, frames: list[bytes], command: bool = False) -> bytes:
        """A message (or, with ``command``, one command body), boxed and framed."""
        ...

    def decode(self, body: bytes) -> tuple[int, bytes]:
        """The flags (MORE 1, COMMAND 2) and the frame inside a MESSAGE box's frame body."""
        ...


def frame(data: bytes, flags: int = 0) -> bytes:
    """One ZMTP frame: flags, size (one byte or eight), body."""
    size = len(data)
    if size < 256:
        return bytes((flags, size)) + data
    return bytes((flags | LONG,)) + size.to_bytes(8, "big") + data


def message(frames: list[bytes]) -> bytes:
    """A whole message, framed (NULL mechanism)."""
    if len(frames) == 1:
        return frame(frames[0])
    last = len(frames) - 1
    return b"".join(frame(part, MORE if i < last else 0) for i, part in enumerate(frames))


def command_body(name: bytes, data: bytes = b"") -> bytes:
    return bytes((len(name),)) + name + data


def command(name: bytes, data: bytes = b"") -> bytes:
    """A command frame (NULL mechanism, or a handshake command)."""
    return frame(command_body(name, data), COMMAND)


def properties(pairs: tuple[tuple[bytes, bytes], ...]) -> bytes:
    """Metadata as READY and INITIATE carry it: name length, name, value length, value."""
    return b"".join(
        bytes((len(name),)) + name + len(value).to_bytes(4, "big") + value for name, value in pairs
    )


def parse_properties(data: bytes) -> dict[bytes, bytes]:
    """A READY command's metadata; names lowercased (they are case-insensitive)."""
    if len(data) > MAX_METADATA:
        raise ZmtpProtocolError(f"READY metadata of {len(data)} bytes (at most {MAX_METADATA})")
    props = {}
    pos, end = 0, len(data)
    while pos < end:
        size = data[pos]
        if size == 0:
            raise ZmtpProtocolError("malformed READY metadata (an empty property name)")
        name = data[pos + 1 : pos + 1 + size]
        pos += 1 + size
        if len(name) != size or pos + 4 > end:
            raise ZmtpProtocolError("malformed READY metadata (a property cut short)")
        value_size = int.from_bytes(data[pos : pos + 4], "big")
        pos += 4
        if value_size > end - pos:
            raise ZmtpProtocolError("malformed READY metadata (a value longer than the command)")
        props[name.lower()] = data[pos : pos + value_size]
        pos += value_size
    return props


def check_identity(identity: bytes) -> None:
    """Raise ValueError unless ``identity`` can be a ZeroMQ routing id."""
    if not 0 < len(identity) < 256 or identity[0] == 0:
        raise ValueError("a ZMTP identity is 1-255 bytes, not starting with a zero byte")


def greeting(mechanism: bytes) -> bytes:
    """Our greeting: signature, version 3.0, mechanism, as-server 0 (a client), filler."""
    return b"\xff" + bytes(8) + b"\x7f" + bytes((3, 0)) + mechanism.ljust(20, b"\0") + bytes(32)


def _printable(data: bytes, limit: int = 80) -> str:
    """Bytes from the peer, safe for a log line (no control characters, bounded)."""
    return repr(data[:limit].decode("utf-8", "replace"))


class ZmtpConnection:
    """The frontend's side of one ZMTP 3 connection, as a DEALER, without I/O.

    ``curve``: a ``curve.CurveClient`` for this connection (fresh for each: it holds the
    connection's short-term keys and nonces), or None for the NULL mechanism. A connection
    is used once; a reconnect makes a new one. Every method but the constructor may raise
    :class:`ZmtpProtocolError`; nothing else is raised for anything the peer sends.
    """

    def __init__(
        self,
        identity: bytes,
        *,
        curve: CurveMechanism | None = None,
        max_message: int = MAX_MESSAGE,
        socket_type: bytes = b"DEALER",
    ) -> None:
        check_identity(identity)
        self.max_message = max_message
        self._curve = curve
        self._mechanism = b"CURVE" if curve is not None else b"NULL"
        self._metadata = properties(((b"Socket-Type", socket_type), (b"Identity", identity)))
        self._state = GREETING
        self._buffer = bytearray()
        #: Where parsing stopped in the buffer (what is before it is consumed).
        self._pos = 0
        self._parts: list[bytes] = []
        self._parts_size = 0
        self._outgoing = bytearray(greeting(self._mechanism))
        #: The context of the PING to answer with the next :meth:`data_to_send` (one PONG
        #: answers any number of PINGs; None: none to answer).
        self._pong: bytes | None = None
        self._error: ZmtpProtocolError | None = None
        #: The peer's metadata, once the handshake is over.
        self.peer_properties: dict[bytes, bytes] | None = None

    # -- state -----------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        """True from the peer's READY on: messages may be sent and received."""
        return self._state == READY

    @property
    def buffered(self) -> int:
        """Bytes received and not yet consumed."""
        return len(self._buffer) - self._pos

    @property
    def message_size(self) -> int:
        """Bytes of the message being received (its frames so far)."""
        return self._parts_size

    def closed_reason(self) -> str:
        """What a peer that closes the connection now most likely means by it (for the
        log line of a handshake that ended that way)."""
        if self._state == GREETING:
            # What libzmq does when the mechanisms differ (it does not say which it wants).
            if self._curve is not None:
                return (
                    "the engine closed the connection during the greeting: it most likely "
                    "does not speak CURVE, which this frontend requires (--engine-curve-* "
                    "keys; it never falls back to clear text): start the engine with "
                    "--curve-secret-key and --curve-authorized-keys"
                )
            return (
                "the engine closed the connection during the greeting: it most likely "
                "requires a security mechanism (CURVE): give this frontend the engine's public "
                "key and a key of its own (--engine-curve-server-key, --engine-curve-secret-key)"
            )
        if self._state == WELCOME:
            return (
                "the engine closed the connection after our CURVE HELLO: it could not open it, "
                "so the engine public key this frontend was given (--engine-curve-server-key) "
                "is not the one the engine uses"
            )
        if self._curve is not None and self._state == HANDSHAKE:
            return (
                "the engine closed the connection after our CURVE INITIATE without an ERROR: "
                "its authenticator failed or is not running (ZAP), or it refuses our metadata"
            )
        return (
            "the engine closed the connection during the handshake: it refused a DEALER "
            "with this identity, or is not a ZeroMQ ROUTER"
        )

    # -- bytes in, events out --------------------------------------------------------------

    def receive_data(self, data: bytes) -> None:
        """Bytes read from the peer (parsed by :meth:`next_event`)."""
        self._buffer += data

    def data_to_send(self) -> bytes:
        """What the protocol must send now (greeting, handshake commands, PONGs), in
        order, before anything :meth:`encode` returns later; taken once."""
        if self._pong is not None:
            # Encoded now, not when the PING came: under CURVE the nonce is taken here, so
            # the PONG leaves in the order of nonces whatever was encoded meanwhile.
            pong = command_body(b"PONG", self._pong)
            self._pong = None
            curve = self._curve
            self._outgoing += (
                frame(pong, COMMAND) if curve is None else curve.encode([pong], command=True)
            )
        if not self._outgoing:
            return b""
        data = bytes(self._outgoing)
        self._outgoing.clear()
        return data

    def encode(self, frames: list[bytes]) -> bytes:
        """One message of ours, framed (and under CURVE, encrypted: what it returns must
        be sent in the order it was returned in). Only once :attr:`ready`."""
        if self._state != READY:
            raise RuntimeError("a ZMTP message before the handshake ended")
        if self._curve is None:
            if len(frames) == 1:
                return frame(frames[0])
            return message(frames)
        return self._curve.encode(frames)

    # -- parsing ---------------------------------------------------------------------------

    def next_event(self) -> Ready | Message | None:
        """The next event in what was received, or None until more bytes come."""
        if self._error is not None:
            raise self._error
        try:
            buf = self._buffer
            end = len(buf)
            pos = self._pos
            if self._state == GREETING:
                if end - pos < GREETING_SIZE:
                    if end > pos:  # a stranger is refused before its 64th byte
                        self._check_greeting(bytes(buf[pos:end]))
                    return None
                self._check_greeting(bytes(buf[pos : pos + GREETING_SIZE]))
                pos = self._pos = pos + GREETING_SIZE
                self._state = HANDSHAKE
                if self._curve is None:
                    self._outgoing += command(b"READY", self._metadata)
                else:
                    self._outgoing += frame(self._curve.hello(), COMMAND)
                    self._state = WELCOME
            ready = self._state == READY
            curve = self._curve
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
                if not ready:
                    if not flags & COMMAND:
                        raise ZmtpProtocolError("a message before the handshake ended")
                    limit = MAX_COMMAND
                elif curve is not None:  # every frame is a MESSAGE box; its flags are inside
                    limit = self.max_message - self._parts_size + curve.overhead
                elif flags & COMMAND:
                    limit = MAX_COMMAND
                else:
                    limit = self.max_message - self._parts_size
                if size > limit:
                    if ready and (curve is not None or not flags & COMMAND):
                        raise ZmtpProtocolError(f"a message larger than {self.max_message} bytes")
                    raise ZmtpProtocolError(f"a command of {size} bytes (at most {MAX_COMMAND})")
                if flags & COMMAND and flags & MORE and (curve is None or not ready):
                    raise ZmtpProtocolError("a command frame with the MORE flag")
                if end - start < size:
                    break
                if size < LARGE:
                    body = bytes(buf[start : start + size])
                else:  # one copy, not two (the view is released before the buffer changes)
                    with memoryview(buf) as view:
                        body = bytes(view[start : start + size])
                pos = self._pos = start + size
                if not ready:
                    event = self._handshake_command(body)
                    if event is not None:
                        return event
                    continue
                if curve is not None:
                    inner, body = curve.decode(body)
                    if inner & 2:  # a command inside the box
                        self._command(body)
                        continue
                    more = inner & MORE
                elif flags & COMMAND:
                    self._command(body)
                    continue
                else:
                    more = flags & MORE
                parts = self._parts
                parts.append(body)
                if more:
                    self._parts_size += len(body)
                    if len(parts) >= MAX_PARTS:
                        raise ZmtpProtocolError(f"a message of more than {MAX_PARTS} frames")
                    continue
                self._parts, self._parts_size = [], 0
                return Message(parts)
            del buf[:pos]
            self._pos = 0
            return None
        except ZmtpProtocolError as exc:
            self._error = exc  # dead: every later call says why
            raise

    def _check_greeting(self, data: bytes) -> None:
        if data[0] != 0xFF or (len(data) >= 10 and data[9] != 0x7F):
            raise ZmtpProtocolError(
                "the peer is not speaking ZMTP 3 (bad greeting signature): is this address "
                "an engine's ZeroMQ ROUTER?"
            )
        if len(data) < GREETING_SIZE:
            return
        major, minor = data[10], data[11]
        if major < 3:
            raise ZmtpProtocolError(f"the peer speaks ZMTP {major}.{minor}; 3.0 or later is needed")
        mechanism = data[12:32].rstrip(b"\0")
        if mechanism != self._mechanism:
            raise ZmtpProtocolError(_mechanism_mismatch(mechanism, self._mechanism))

    def _split(self, body: bytes) -> tuple[bytes, bytes]:
        """A command body's name and data."""
        if not body or len(body) < 1 + body[0]:
            raise ZmtpProtocolError("a malformed command (its name cut short)")
        size = body[0]
        return body[1 : 1 + size], body[1 + size :]

    def _handshake_command(self, body: bytes) -> Ready | None:
        name, data = self._split(body)
        if name == b"ERROR":
            raise _refused(data, self._curve is not None)
        curve = self._curve
        if curve is None:
            if name != b"READY":
                raise ZmtpProtocolError(f"{_printable(name)} before READY")
            return self._ready(data)
        if self._state == WELCOME:
            if name != b"WELCOME":
                raise ZmtpProtocolError(f"{_printable(name)} where CURVE's WELCOME belongs")
            self._outgoing += frame(curve.initiate(body, self._metadata), COMMAND)
            self._state = HANDSHAKE
            return None
        if name != b"READY":
            raise ZmtpProtocolError(f"{_printable(name)} where CURVE's READY belongs")
        return self._ready(curve.ready(body))

    def _ready(self, metadata: bytes) -> Ready:
        props = parse_properties(metadata)
        peer = props.get(b"socket-type", b"?")
        if peer not in (b"ROUTER", b"DEALER"):
            raise ZmtpProtocolError(f"the peer is a {_printable(peer)} socket, not a ROUTER")
        self._state = READY
        self.peer_properties = props
        return Ready(props)

    def _command(self, body: bytes) -> None:
        """A command once the handshake is over."""
        name, data = self._split(body)
        if name == b"PING":
            # Answered with the context it carries (after a 2-byte TTL), by the next
            # data_to_send; one PONG answers any number of PINGs, so a peer that pings
            # and does not read grows nothing here.
            self._pong = data[2:18]
        elif name == b"ERROR":
            raise _refused(data, self._curve is not None)
        elif name == b"READY":
            raise ZmtpProtocolError("a second READY")
        # PONG and anything unknown: ignored, as the spec asks.


def _refused(data: bytes, curve: bool) -> ZmtpRefusedError:
    reason = data[1 : 1 + data[0]] if data else b""
    text = _printable(reason)
    if curve and reason[:1] == b"4":
        return ZmtpRefusedError(
            f"the engine refused this frontend's CURVE key (ERROR {text}): add this frontend's "
            "public key to the engine's --curve-authorized-keys"
        )
    if curve and reason[:1] == b"5":
        return ZmtpRefusedError(
            f"the engine could not check this frontend's CURVE key (ERROR {text}: its "
            "authenticator failed)"
        )
    return ZmtpRefusedError(f"the engine refused us: ERROR {text}")


def _mechanism_mismatch(theirs: bytes, ours: bytes) -> str:
    name = _printable(theirs)
    if ours == b"NULL" and theirs == b"CURVE":
        return (
            "the engine requires CURVE security and this frontend speaks NULL: give it the "
            "engine's public key and a key of its own (--engine-curve-server-key, "
            "--engine-curve-secret-key)"
        )
    if ours == b"CURVE" and theirs == b"NULL":
        return (
            "the engine speaks no security mechanism (NULL) and this frontend requires CURVE "
            "(--engine-curve-* keys): start the engine with --curve-secret-key and "
            "--curve-authorized-keys; this frontend never falls back to clear text"
        )
    return (
        f"the engine requires the {name} security mechanism; this frontend speaks "
        f"{ours.decode()} (trioserve speaks NULL and CURVE)"
    )
