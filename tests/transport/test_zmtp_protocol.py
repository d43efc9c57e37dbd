"""ZmtpConnection: ZMTP 3 without I/O, driven with bytes (NULL and CURVE), no socket, no
event loop."""

from __future__ import annotations

import pytest

from tests.helpers.zmtp_peer import (
    IDENTITY,
    CurveServer,
    curve_handshake,
    greeting,
    keys,
    null_handshake,
    null_message,
    parse_frames,
    router_ready,
)
from trioserve.transport.curve import MESSAGE_OVERHEAD, CurveClient
from trioserve.transport.zmtp_protocol import (
    COMMAND,
    LONG,
    MAX_COMMAND,
    MAX_METADATA,
    MAX_PARTS,
    MORE,
    Message,
    Ready,
    ZmtpConnection,
    ZmtpProtocolError,
    ZmtpRefusedError,
    command,
    frame,
    parse_properties,
    properties,
)


def events(conn: ZmtpConnection) -> list:
    out = []
    while (event := conn.next_event()) is not None:
        out.append(event)
    return out


def ready_null(max_message: int = 1 << 20) -> ZmtpConnection:
    conn = ZmtpConnection(IDENTITY, max_message=max_message)
    conn.receive_data(null_handshake())
    (event,) = events(conn)
    assert isinstance(event, Ready)
    conn.data_to_send()
    return conn


def test_null_handshake_sends_greeting_then_ready_with_our_identity():
    conn = ZmtpConnection(IDENTITY)
    sent = conn.data_to_send()
    assert len(sent) == 64 and sent[0] == 0xFF and sent[9] == 0x7F
    assert sent[12:32].rstrip(b"\0") == b"NULL" and sent[32] == 0  # a client
    assert conn.next_event() is None
    assert conn.data_to_send() == b""  # READY only once the peer's greeting is read
    conn.receive_data(greeting())
    assert conn.next_event() is None
    ((flags, body),) = parse_frames(conn.data_to_send())
    assert flags == COMMAND and body[:6] == b"\x05READY"
    assert parse_properties(body[6:]) == {b"socket-type": b"DEALER", b"identity": IDENTITY}
    conn.receive_data(command(b"READY", router_ready()))
    event = conn.next_event()
    assert isinstance(event, Ready) and event.properties == {b"socket-type": b"ROUTER"}
    assert conn.ready


def test_messages_single_multipart_and_long_frames_in_any_cut():
    big = bytes(range(256)) * 10
    stream = null_handshake() + null_message([b"a"]) + null_message([b"x", b"", big])
    for cut in range(len(stream) + 1):
        conn = ZmtpConnection(IDENTITY)
        conn.receive_data(stream[:cut])
        got = events(conn)
        conn.receive_data(stream[cut:])
        got += events(conn)
        assert [type(e) for e in got] == [Ready, Message, Message]
        assert got[1].frames == [b"a"] and got[2].frames == [b"x", b"", big]
        assert conn.buffered == 0


def test_our_messages_are_framed_short_long_and_multipart():
    conn = ready_null()
    assert conn.encode([b"hi"]) == b"\x00\x02hi"
    assert conn.encode([b"a", b"b"]) == b"\x01\x01a\x00\x01b"
    assert conn.encode([b"z" * 300]) == bytes((LONG,)) + (300).to_bytes(8, "big") + b"z" * 300
    with pytest.raises(RuntimeError):
        ZmtpConnection(IDENTITY).encode([b"too early"])


def test_one_pong_answers_any_number_of_pings_with_their_context():
    conn = ready_null()
    for _ in range(1000):
        conn.receive_data(command(b"PING", b"\x00\x10ctx"))
    assert events(conn) == []
    assert parse_frames(conn.data_to_send()) == [(COMMAND, b"\x04PONGctx")]
    assert conn.data_to_send() == b""
    conn.receive_data(command(b"PONG") + command(b"UNKNOWN", b"data"))  # ignored
    assert events(conn) == []


def test_a_message_over_the_bound_is_refused_from_its_length_before_its_body():
    conn = ready_null(max_message=1000)
    conn.receive_data(bytes((LONG,)) + (1001).to_bytes(8, "big"))
    with pytest.raises(ZmtpProtocolError, match="larger than 1000 bytes"):
        conn.next_event()
    conn = ready_null(max_message=1000)
    conn.receive_data(null_message([b"a" * 600, b"b" * 400]))  # exactly at the bound
    assert [e.frames for e in events(conn)] == [[b"a" * 600, b"b" * 400]]
    conn.receive_data(frame(b"a" * 600, MORE) + bytes((LONG,)) + (401).to_bytes(8, "big"))
    with pytest.raises(ZmtpProtocolError, match="larger than 1000"):
        events(conn)
    assert conn.message_size == 600


def test_too_many_frames_a_large_command_and_large_metadata_are_refused():
    conn = ready_null()
    conn.receive_data(frame(b"", MORE) * MAX_PARTS)
    with pytest.raises(ZmtpProtocolError, match=f"more than {MAX_PARTS} frames"):
        events(conn)
    conn = ready_null()
    conn.receive_data(bytes((COMMAND | LONG,)) + (MAX_COMMAND + 1).to_bytes(8, "big"))
    with pytest.raises(ZmtpProtocolError, match="a command of"):
        conn.next_event()
    with pytest.raises(ZmtpProtocolError, match="READY metadata of"):
        parse_properties(properties(((b"X-Big", b"v" * MAX_METADATA),)))


@pytest.mark.parametrize(
    ("stream", "reason"),
    [
        (b"HTTP/1.1 400 Bad Request\r\n", "not speaking ZMTP 3"),
        (b"\xff" + bytes(8) + b"\x01", "not speaking ZMTP 3"),
        (greeting(version=(2, 0)), "ZMTP 2.0; 3.0 or later"),
        (greeting(b"PLAIN"), "requires the 'PLAIN' security mechanism"),
        (greeting(b"CURVE", as_server=1), "requires CURVE security and this frontend speaks NULL"),
        (greeting() + null_message([b"early"]), "a message before the handshake ended"),
        (greeting() + command(b"PING", b"\0\0"), "'PING' before READY"),
        (greeting() + command(b"ERROR", b"\x05Nope!"), "refused us: ERROR 'Nope!'"),
        (greeting() + command(b"READY", router_ready(b"PUB")), "a 'PUB' socket"),
        (greeting() + command(b"READY", b"\x05Socket"), "malformed READY metadata"),
        (greeting() + command(b"READY", b"\x00"), "an empty property name"),
        (
            greeting() + command(b"READY", b"\x01X" + (99).to_bytes(4, "big")),
            "a value longer than the command",
        ),
        (greeting() + frame(b"\x09REA", COMMAND), "a malformed command"),
        (greeting() + frame(b"", COMMAND), "a malformed command"),
        (null_handshake() + command(b"READY", router_ready()), "a second READY"),
        (null_handshake() + b"\x08\x00", "reserved frame flags"),
        (null_handshake() + frame(b"\x04PING", COMMAND | MORE), "a command frame with the MORE"),
    ],
)
def test_malformed_input_is_a_protocol_error_and_the_connection_stays_dead(stream, reason):
    conn = ZmtpConnection(IDENTITY)
    conn.receive_data(stream)
    with pytest.raises(ZmtpProtocolError, match=reason) as caught:
        events(conn)
    with pytest.raises(ZmtpProtocolError) as again:  # dead: the same error, whatever comes next
        conn.receive_data(null_message([b"more"]))
        conn.next_event()
    assert again.value is caught.value


def test_an_error_command_after_the_handshake_refuses_too():
    conn = ready_null()
    conn.receive_data(command(b"ERROR", b"\x03bye"))
    with pytest.raises(ZmtpRefusedError, match="'bye'"):
        conn.next_event()


def test_what_the_peer_sends_is_logged_safely():
    conn = ZmtpConnection(IDENTITY)
    conn.receive_data(greeting() + command(b"ERROR", b"\x0b\x1b[31mred\nx\x00"))
    with pytest.raises(ZmtpRefusedError) as caught:
        conn.next_event()
    assert "\n" not in str(caught.value) and "\x1b" not in str(caught.value)


def test_identities_are_checked():
    from trioserve.transport.zmtp import ZmtpDealer

    for bad in (b"", b"\0lead", b"x" * 256):
        with pytest.raises(ValueError):
            ZmtpConnection(bad)
        with pytest.raises(ValueError):
            ZmtpDealer("tcp://127.0.0.1:9", bad, lambda frames: None)


# -- CURVE ---------------------------------------------------------------------------------


def curve_pair() -> tuple[ZmtpConnection, CurveServer]:
    client_keys, server_public, server_secret = keys()
    conn = ZmtpConnection(IDENTITY, curve=CurveClient(client_keys), max_message=1 << 20)
    return conn, CurveServer(server_public, server_secret)


def test_curve_handshake_proves_both_keys_and_carries_our_metadata_encrypted():
    conn, server = curve_pair()
    sent = conn.data_to_send()
    assert sent[12:32].rstrip(b"\0") == b"CURVE" and sent[32] == 0
    curve_handshake(conn, server)
    event = conn.next_event()
    assert isinstance(event, Ready) and event.properties == {b"socket-type": b"ROUTER"}
    assert server.client_public == conn._curve._keys.public  # what ZAP is asked about


def test_curve_messages_both_ways_multipart_and_pings():
    conn, server = curve_pair()
    curve_handshake(conn, server)
    assert isinstance(conn.next_event(), Ready)
    big = b"q" * 70_000
    conn.receive_data(server.message([b"one"]) + server.message([b"a", big]))
    conn.receive_data(server.message([b"\x04PING\x00\x05ctx"], command=True))
    assert [e.frames for e in events(conn)] == [[b"one"], [b"a", big]]
    (pong,) = parse_frames(conn.data_to_send())
    assert pong[0] == 0  # boxed: a data frame, its flags inside
    assert server.open(pong[1]) == (2, b"\x04PONGctx")
    sent = parse_frames(conn.encode([b"x", b"y"]))
    assert [server.open(body) for _, body in sent] == [(1, b"x"), (0, b"y")]


def test_curve_refuses_what_does_not_authenticate_or_replays():
    conn, server = curve_pair()
    curve_handshake(conn, server)
    conn.next_event()
    first = server.message([b"first"])
    conn.receive_data(first)
    assert events(conn)[0].frames == [b"first"]
    conn.receive_data(first)  # replayed
    with pytest.raises(ZmtpProtocolError, match="out of sequence"):
        conn.next_event()

    conn, server = curve_pair()
    curve_handshake(conn, server)
    conn.next_event()
    server.message([b"dropped on the way"])
    conn.receive_data(server.message([b"after it"]))
    with pytest.raises(ZmtpProtocolError, match="nonce 3 after 1"):
        conn.next_event()

    conn, server = curve_pair()
    curve_handshake(conn, server)
    conn.next_event()
    tampered = bytearray(server.message([b"pay 10"]))
    tampered[-1] ^= 1
    conn.receive_data(bytes(tampered))
    with pytest.raises(ZmtpProtocolError, match="does not authenticate"):
        conn.next_event()

    conn, server = curve_pair()
    curve_handshake(conn, server)
    conn.next_event()
    conn.receive_data(null_message([b"clear text"]))
    with pytest.raises(ZmtpProtocolError, match="not a CURVE MESSAGE"):
        conn.next_event()


def test_curve_bound_counts_the_frame_inside_the_box():
    client_keys, server_public, server_secret = keys()
    conn = ZmtpConnection(IDENTITY, curve=CurveClient(client_keys), max_message=100)
    server = CurveServer(server_public, server_secret)
    curve_handshake(conn, server)
    conn.next_event()
    conn.receive_data(server.message([b"m" * 100]))
    assert events(conn)[0].frames == [b"m" * 100]
    big = server.message([b"m" * 101])
    assert len(big) == 2 + 101 + MESSAGE_OVERHEAD
    conn.receive_data(big)
    with pytest.raises(ZmtpProtocolError, match="larger than 100 bytes"):
        conn.next_event()


def test_curve_a_welcome_from_another_server_key_is_refused():
    client_keys, _, _ = keys()
    _, other_public, other_secret = keys()
    conn = ZmtpConnection(IDENTITY, curve=CurveClient(client_keys))
    conn.receive_data(greeting(b"CURVE", as_server=1))
    conn.next_event()
    (hello,) = parse_frames(conn.data_to_send()[64:])
    impostor = CurveServer(other_public, other_secret)
    impostor.client_short = hello[1][80:112]  # it cannot open the HELLO; it answers anyway
    conn.receive_data(_welcome_without_checking(impostor))
    with pytest.raises(ZmtpProtocolError, match="does not open with the engine public key"):
        conn.next_event()


def _welcome_without_checking(server: CurveServer) -> bytes:
    from nacl import bindings as sodium

    nonce = bytes(16)
    box = sodium.crypto_box(
        server.short_public + bytes(96), b"WELCOME-" + nonce, server.client_short, server.secret
    )
    return frame(b"\x07WELCOME" + nonce + box, COMMAND)


@pytest.mark.parametrize(
    ("stream", "reason"),
    [
        (greeting(b"NULL"), "speaks no security mechanism \\(NULL\\)"),
        (greeting(b"CURVE", as_server=1) + command(b"READY"), "where CURVE's WELCOME belongs"),
        (greeting(b"CURVE", as_server=1) + command(b"WELCOME", b"short"), "WELCOME of 13 bytes"),
        (greeting(b"CURVE", as_server=1) + command(b"ERROR", b"\x03400"), "refused this front"),
        (greeting(b"CURVE", as_server=1) + command(b"ERROR", b"\x03500"), "could not check"),
    ],
)
def test_curve_handshake_refusals(stream, reason):
    client_keys, _, _ = keys()
    conn = ZmtpConnection(IDENTITY, curve=CurveClient(client_keys))
    conn.receive_data(stream)
    with pytest.raises(ZmtpProtocolError, match=reason):
        events(conn)


def test_closed_reason_names_the_handshake_step():
    client_keys, server_public, server_secret = keys()
    conn = ZmtpConnection(IDENTITY, curve=CurveClient(client_keys))
    assert "does not speak CURVE" in conn.closed_reason()
    conn.receive_data(greeting(b"CURVE", as_server=1))
    conn.next_event()
    assert "--engine-curve-server-key" in conn.closed_reason()
    (hello,) = parse_frames(conn.data_to_send()[64:])
    conn.receive_data(CurveServer(server_public, server_secret).welcome(hello[1]))
    conn.next_event()
    assert "after our CURVE INITIATE" in conn.closed_reason()
