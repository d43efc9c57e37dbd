"""Generated and mutated engine traffic for the ZMTP framer, and the properties it must
hold (tests/transport/test_zmtp_fuzz.py runs them seeded and bounded;
tools/fuzz_zmtp.py for as long as asked).

The traffic is what an engine's ROUTER sends a frontend: greeting, handshake, then
messages of one or more frames (short and long), PINGs and commands nobody knows, under
NULL or CURVE (``zmtp_peer.CurveServer`` boxes it), then mutated (bytes flipped, dropped,
inserted; lengths that lie) and cut into arbitrary reads. The properties:

- nothing but ``ZmtpProtocolError`` is ever raised, and after one the connection stays dead;
- memory stays bounded: after each read's events, what is buffered is less than one
  frame at the bound, the message being gathered is within ``max_message``, and what the
  connection asks to send is bounded (one PONG answers any number of PINGs);
- a valid stream parses exactly into its messages, however it is cut; a valid stream
  followed by garbage gives all its messages first; garbage on one connection leaves a
  fresh one parsing a valid stream right;
- under CURVE, a message is delivered only as the engine sent it: whatever the
  mutation, what comes out is the sent messages' prefix, never an altered one.
"""

from __future__ import annotations

import itertools

from hypothesis import strategies as st

from tests.helpers.zmtp_peer import (
    IDENTITY,
    CurveServer,
    greeting,
    keys,
    null_handshake,
    null_message,
    parse_frames,
)
from trioserve.errors import ZmtpProtocolError
from trioserve.transport.curve import MESSAGE_OVERHEAD, CurveClient
from trioserve.transport.zmtp_protocol import (
    COMMAND,
    LONG,
    MAX_COMMAND,
    MORE,
    Message,
    Ready,
    ZmtpConnection,
    command,
)

#: Small, so that generated frames and lengths cross it.
MAX_MESSAGE = 4096
#: The most one data_to_send may return once the handshake is over: one PONG.
MAX_ANSWER = 64


def often(common: st.SearchStrategy, rare: st.SearchStrategy) -> st.SearchStrategy:
    return st.one_of(common, common, common, rare)


#: One frame's body: mostly short, sometimes long (a LONG frame), rarely over the bound.
body = often(
    st.binary(max_size=40),
    st.integers(200, MAX_MESSAGE + 100).map(lambda n: bytes(range(256)) * (n // 256) + b"x"),
)

#: Messages as the engine sends them: one to three frames each.
messages = st.lists(st.lists(body, min_size=1, max_size=3), max_size=5)

#: Commands between messages: PINGs (with a context), PONGs, unknown ones.
extra_command = st.sampled_from(
    [
        command(b"PING", b"\x00\x64ctx"),
        command(b"PING", b""),
        command(b"PONG", b"ctx"),
        command(b"X-NEWS", b"\x00" * 10),
    ]
)


@st.composite
def null_traffic(draw: st.DrawFn) -> tuple[bytes, list[list[bytes]]]:
    """A NULL engine's bytes, and the messages in them that are within the bound."""
    sent = draw(messages)
    stream = null_handshake()
    expected = []
    for frames in sent:
        if draw(st.booleans()):
            stream += draw(extra_command)
        stream += null_message(frames)
        if sum(map(len, frames)) > MAX_MESSAGE:
            break  # past this the connection is dead: nothing after it counts
        expected.append(frames)
    return stream, expected


_SPICE = [b"\xff", b"\x7f", b"\x00", bytes((LONG,)), bytes((COMMAND,)), b"\x05READY", b"\x03"]

#: A short frame with any flags (reserved ones too) around a body that is often a
#: command's start (empty, a name cut short, a known name with little or no data) or a
#: CURVE MESSAGE box too short to hold one, with a nonce a session may be at.
stray_frame = st.builds(
    lambda flags, body: bytes((flags, len(body))) + body,
    st.sampled_from([0, MORE, COMMAND, COMMAND | MORE, 8, 0x80]),
    st.one_of(
        st.sampled_from(
            [b"", b"\x05", b"\x09READ", b"\x04PING", b"\x04PING\x00", b"\x05ERROR", b"\x05READY"]
        ),
        st.binary(max_size=12),
        st.builds(
            lambda nonce, box: b"\x07MESSAGE" + nonce.to_bytes(8, "big") + box,
            st.integers(1, 8),
            st.binary(max_size=20),
        ),
    ),
)


@st.composite
def mutated(draw: st.DrawFn, data: bytes) -> bytes:
    """``data`` with a few bytes flipped, dropped, inserted, a length made to lie, or cut."""
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        if not out:
            break
        at = draw(st.integers(0, len(out) - 1))
        kind = draw(st.sampled_from(["flip", "drop", "insert", "frame", "length", "cut"]))
        if kind == "flip":
            out[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "drop":
            del out[at : at + draw(st.integers(1, 8))]
        elif kind == "insert":
            out[at:at] = draw(st.one_of(st.sampled_from(_SPICE), st.binary(max_size=8)))
        elif kind == "frame":  # at a frame's start or not: the parser cannot tell
            out[at:at] = draw(stray_frame)
        elif kind == "length":  # a long frame's header claiming any size
            size = draw(st.sampled_from([0, 255, 256, MAX_MESSAGE, MAX_MESSAGE + 1, 2**63]))
            out[at:at] = bytes((LONG,)) + size.to_bytes(8, "big")
        else:
            del out[at:]
    return bytes(out)


@st.composite
def reads(draw: st.DrawFn, data: bytes) -> list[bytes]:
    """``data`` cut into the reads a socket could return."""
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=6)))
    edges = [0, *cuts, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(edges) if b > a]


def null_connection() -> ZmtpConnection:
    return ZmtpConnection(IDENTITY, max_message=MAX_MESSAGE)


def run(
    conn: ZmtpConnection, pieces: list[bytes]
) -> tuple[list[list[bytes]], ZmtpProtocolError | None]:
    """Feed ``pieces`` to ``conn`` as reads, checking the bounds after each; returns the
    messages delivered and the protocol error that ended the connection, if one did."""
    delivered: list[list[bytes]] = []
    frame_bound = 9 + max(MAX_MESSAGE + MESSAGE_OVERHEAD, MAX_COMMAND)
    readies = 0
    for piece in pieces:
        was_ready = conn.ready
        conn.receive_data(piece)
        try:
            while (event := conn.next_event()) is not None:
                if isinstance(event, Ready):
                    readies += 1
                    assert readies == 1
                else:
                    assert isinstance(event, Message) and readies == 1
                    assert len(event.frames) >= 1 and sum(map(len, event.frames)) <= MAX_MESSAGE
                    delivered.append(event.frames)
        except ZmtpProtocolError as exc:
            try:
                conn.next_event()
            except ZmtpProtocolError as again:
                assert again is exc  # dead, and says why
            else:
                raise AssertionError("the connection lived on after a protocol error") from None
            return delivered, exc
        assert conn.buffered < frame_bound
        assert conn.message_size <= MAX_MESSAGE
        answer = conn.data_to_send()
        if was_ready:  # (the handshake's own commands are a few hundred bytes, once)
            assert len(answer) <= MAX_ANSWER + MESSAGE_OVERHEAD
    return delivered, None


def check_null_valid(traffic: tuple[bytes, list[list[bytes]]], pieces: list[bytes]) -> None:
    """A valid NULL stream, however cut, gives exactly its messages."""
    _, expected = traffic
    delivered, error = run(null_connection(), pieces)
    assert delivered == expected
    if error is not None:  # only a message over the bound may end it
        assert "larger than" in str(error)


def check_null_mutated(pieces: list[bytes]) -> None:
    """Mutated or arbitrary bytes: only the protocol error, and the bounds."""
    run(null_connection(), pieces)


def check_valid_then_garbage(
    traffic: tuple[bytes, list[list[bytes]]], garbage: bytes, cut: list[bytes]
) -> None:
    """A valid stream's messages all come out before whatever garbage follows it does
    anything; and a fresh connection after garbage parses a valid stream right."""
    stream, expected = traffic
    delivered, _ = run(null_connection(), [*cut, garbage])
    assert delivered[: len(expected)] == expected
    run(null_connection(), [garbage])
    assert run(null_connection(), [stream])[0] == expected


class CurveSession:
    """A CURVE engine's whole stream to one frontend connection, and twins of that
    connection to replay it to (same short-term keys, so the stream opens for them)."""

    def __init__(self, sent: list[list[bytes]], pings: list[bool]) -> None:
        client_keys, server_public, server_secret = keys()
        self.client_keys = client_keys
        first = CurveClient(client_keys)
        self.short = (first._short_public, first._short_secret)
        conn = ZmtpConnection(IDENTITY, curve=first, max_message=MAX_MESSAGE)
        server = CurveServer(server_public, server_secret)
        stream = greeting(b"CURVE")
        conn.receive_data(stream)
        assert conn.next_event() is None
        (hello,) = parse_frames(conn.data_to_send()[64:])
        welcome = server.welcome(hello[1])
        conn.receive_data(welcome)
        assert conn.next_event() is None
        (initiate,) = parse_frames(conn.data_to_send())
        stream += welcome + server.ready(initiate[1])
        self.expected = []
        for frames, ping in zip(sent, pings, strict=False):
            if ping:
                stream += server.message([b"\x04PING\x00\x05ctx"], command=True)
            stream += server.message(frames)
            if sum(map(len, frames)) > MAX_MESSAGE:
                break
            self.expected.append(frames)
        self.stream = stream

    def connection(self) -> ZmtpConnection:
        twin = CurveClient(self.client_keys)
        twin._short_public, twin._short_secret = self.short
        conn = ZmtpConnection(IDENTITY, curve=twin, max_message=MAX_MESSAGE)
        conn.data_to_send()  # the greeting
        return conn


def check_curve(session: CurveSession, pieces: list[bytes], mutated: bool) -> None:
    """Under CURVE, what is delivered is what the engine sent, in order, or less."""
    delivered, error = run(session.connection(), pieces)
    if mutated:
        assert delivered == session.expected[: len(delivered)]
    else:
        assert delivered == session.expected
        if error is not None:
            assert "larger than" in str(error)


@st.composite
def curve_session(draw: st.DrawFn) -> CurveSession:
    sent = draw(messages)
    return CurveSession(sent, draw(st.lists(st.booleans(), min_size=len(sent), max_size=len(sent))))
