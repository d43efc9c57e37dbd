"""HTTP/1.1 on the wire without I/O: the request parser's events and the response framing.

End to end (the server on a real socket) in test_serve.py.
"""

import random

import pytest

from trioserve.server.http1 import protocol as http1
from trioserve.server.http1.protocol import (
    CLOSED,
    END,
    NEED_DATA,
    HttpProtocolError,
    Request,
    RequestParser,
)


def events(parser: http1.RequestParser) -> list[object]:
    out = []
    while (event := parser.next_event()) is not NEED_DATA:
        out.append(event)
        if event is CLOSED:
            break
    return out


def parse(data: bytes, max_head_bytes: int = 16384) -> list[object]:
    parser = http1.RequestParser(max_head_bytes)
    parser.receive_data(data)
    return events(parser)


def summary(evs: list[object]) -> list[object]:
    """Requests as (method, target), the rest as they are."""
    return [(e.method, e.target) if isinstance(e, Request) else e for e in evs]


def test_pipelined_requests_come_out_in_order_with_their_bodies():
    evs = parse(
        b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n"
        b"POST /b?q=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"
        b"POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"2\r\nab\r\n1\r\nc\r\n0\r\n\r\n"
    )
    assert summary(evs) == [
        (b"GET", b"/a"),
        END,
        (b"POST", b"/b?q=1"),
        b"hello",
        END,
        (b"POST", b"/c"),
        b"abc",  # the chunks received together, as one piece
        END,
    ]


def test_a_body_in_tiny_chunks_is_held_as_one_contiguous_piece():
    """Issue 27: a body in 2-byte chunks was one Python object per chunk (25 times its
    size on the wire); it is one buffer, handed out as one piece."""
    parser = RequestParser(16384)
    parser.receive_data(b"POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
    assert type(parser.next_event()) is Request
    parser.receive_data(b"2\r\nab\r\n" * 10_000)
    assert len(parser._events) == 1 and parser.buffered_body == 20_000
    assert parser.next_event() == b"ab" * 10_000
    assert parser.buffered_body == 0


def test_header_names_are_lower_cased_and_values_kept():
    [request, _] = parse(
        b"GET / HTTP/1.1\r\nHost: x\r\nX-Thing:  a, B \r\nx-thing: c\r\nAccept: */*\r\n\r\n"
    )
    assert request.headers == [
        (b"host", b"x"),
        (b"x-thing", b"a, B"),  # optional whitespace around a value is not part of it
        (b"x-thing", b"c"),
        (b"accept", b"*/*"),
    ]
    assert request.http_version == "1.1" and request.keep_alive


def test_a_head_in_many_pieces_is_one_request():
    parser = http1.RequestParser(16384)
    raw = (
        b"POST /p HTTP/1.1\r\nHost: x\r\nX-Long: "
        + b"v" * 3000
        + b"\r\nContent-Length: 2\r\n\r\nok"
    )
    for i in range(0, len(raw), 7):
        parser.receive_data(raw[i : i + 7])
    evs = events(parser)
    assert isinstance(evs[0], Request)
    assert (b"x-long", b"v" * 3000) in evs[0].headers
    assert b"".join(e for e in evs if isinstance(e, bytes)) == b"ok" and evs[-1] is END


@pytest.mark.parametrize(
    "head",
    [
        # Request smuggling: two framings, or two lengths, for one body.
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
        # A header value folded onto the next line, a bare LF in a value, a NUL.
        b"GET / HTTP/1.1\r\nHost: x\r\nX-A: a\r\n b\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: x\r\nX-A: a\nX-B: b\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: x\r\nX-A: a\x01b\r\n\r\n",
        # Whitespace before the colon (a proxy may read another header name there).
        b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length : 3\r\n\r\nabc",
        # Not HTTP; a space in the target; a header without a name.
        b"NOT HTTP AT ALL\r\n\r\n",
        b"GET /a b HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET / HTTP/1.1\r\n: x\r\n\r\n",
    ],
)
def test_malformed_heads_are_400(head):
    with pytest.raises(HttpProtocolError) as caught:
        parse(head)
    assert caught.value.status == 400 and caught.value.reason


def test_a_fault_comes_after_the_requests_before_it():
    parser = http1.RequestParser(16384)
    parser.receive_data(b"GET /ok HTTP/1.1\r\nHost: x\r\n\r\nBROKEN\r\n\r\n")
    assert summary([parser.next_event(), parser.next_event()]) == [(b"GET", b"/ok"), END]
    with pytest.raises(HttpProtocolError):
        parser.next_event()


def test_a_head_over_the_limit_is_431_whole_or_still_arriving():
    big = b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 2000 + b"\r\n\r\n"
    with pytest.raises(HttpProtocolError) as caught:
        parse(big, max_head_bytes=1024)
    assert caught.value.status == 431
    # A head that never ends: refused once it holds more than the limit past its first
    # read, not buffered on.
    parser = http1.RequestParser(1024)
    parser.receive_data(b"GET / HTTP/1.1\r\nX-Big: ")
    received = 0
    while not parser.has_events:
        parser.receive_data(b"a" * 100)
        received += 100
        assert received <= 1024 + 100
    with pytest.raises(HttpProtocolError) as caught:
        parser.next_event()
    assert caught.value.status == 431
    parser.receive_data(b"a" * 100)  # ignored after the fault
    assert not parser.has_events


def test_the_end_of_the_client_stream_is_closed_idle_or_mid_body():
    parser = http1.RequestParser(16384)
    parser.receive_data(b"")
    assert events(parser) == [CLOSED]
    parser = http1.RequestParser(16384)
    parser.receive_data(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc")
    parser.receive_data(b"")
    assert summary(events(parser))[1:] == [b"abc", CLOSED]


def test_a_websocket_upgrade_leaves_what_follows_to_the_websocket():
    parser = http1.RequestParser(16384)
    parser.receive_data(
        b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        b"\x81\x85frame"
    )
    [request, end] = events(parser)
    assert request.websocket and end is END
    assert parser.trailing == b"\x81\x85frame"
    parser.receive_data(b"more")  # the WebSocket's, not the parser's
    assert not parser.has_events


def test_another_upgrade_is_ignored_and_the_connection_stays_http():
    h2c = b"GET /a HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
    evs = parse(h2c + b"HTTP2-Settings: AAMAAABkAAQAAP__\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\n")
    assert summary(evs) == [(b"GET", b"/a"), END, (b"GET", b"/b"), END]
    assert not evs[0].websocket
    # With a body, refused before the app sees it: the body would be taken for the new
    # protocol's bytes and lost.
    parser = http1.RequestParser(16384)
    parser.receive_data(
        b"POST /a HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n"
        b"Content-Length: 2\r\n\r\nhi"
    )
    with pytest.raises(HttpProtocolError) as caught:
        parser.next_event()
    assert caught.value.status == 400 and "Upgrade" in caught.value.reason


def test_expect_100_continue_is_owed_until_the_body_starts():
    parser = http1.RequestParser(16384)
    parser.receive_data(
        b"POST / HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n"
    )
    [request] = events(parser)  # the head only: the body waits for the 100
    assert isinstance(request, Request) and parser.awaiting_continue
    parser.receive_data(b"o")
    assert not parser.awaiting_continue


@pytest.mark.parametrize(
    ("head", "keep_alive"),
    [
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", True),
        (b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", False),
        (b"GET / HTTP/1.0\r\n\r\n", False),
        (b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", False),  # as h11: 1.0 closes
    ],
)
def test_keep_alive_only_for_http_1_1_without_connection_close(head, keep_alive):
    [request, _] = parse(head)
    assert request.keep_alive is keep_alive


# -- responses -------------------------------------------------------------------------


def request(head: bytes) -> Request:
    [req, *_] = parse(head)
    assert isinstance(req, Request)
    return req


GET = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"


def test_a_response_with_a_length_keeps_it_and_the_connection():
    head = http1.response_head(
        200, [(b"content-type", b"text/plain"), (b"content-length", b"5")], request(GET), False
    )
    assert head.data == b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 5\r\n\r\n"
    assert (head.framing, head.length, head.keep_alive) == (http1.LENGTH, 5, True)


def test_a_response_without_a_length_is_chunked_on_1_1_and_runs_to_close_on_1_0():
    head = http1.response_head(200, [], request(GET), False)
    assert head.data == b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
    assert head.framing == http1.CHUNKED and head.keep_alive
    old = http1.response_head(200, [], request(b"GET / HTTP/1.0\r\n\r\n"), False)
    assert old.data == b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n"
    assert old.framing == http1.UNTIL_CLOSE and not old.keep_alive


@pytest.mark.parametrize(("status", "method"), [(204, b"GET"), (304, b"GET"), (200, b"HEAD")])
def test_no_body_for_head_204_and_304(status, method):
    req = request(method + b" / HTTP/1.1\r\nHost: x\r\n\r\n")
    head = http1.response_head(status, [(b"content-length", b"12")], req, False)
    assert head.framing == http1.NO_BODY and head.keep_alive
    assert b"transfer-encoding" not in head.data


def test_connection_close_from_the_app_or_the_server_is_said_once():
    for headers, closing in [([(b"Connection", b"close")], False), ([], True)]:
        head = http1.response_head(
            200, headers + [(b"content-length", b"0")], request(GET), closing
        )
        assert not head.keep_alive
        assert head.data.lower().count(b"connection: close") == 1
    # The client's Connection: close, too.
    req = request(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert b"connection: close" in http1.response_head(200, [], req, False).data


def test_the_app_cannot_choose_the_framing():
    head = http1.response_head(
        200, [(b"transfer-encoding", b"gzip"), (b"content-length", b"3")], request(GET), False
    )
    assert b"gzip" not in head.data and head.framing == http1.LENGTH


@pytest.mark.parametrize(
    "headers",
    [
        [(b"x-a", b"v\r\nset-cookie: evil=1")],
        [(b"x-a\r\nx-b", b"v")],
        [(b"x-a", b"v\nx")],
        [(b"x-a", b"v\rx")],
        [(b"x-a", b"v\x00")],
        [(b"content-length", b"ten")],
        [(b"content-length", b"-3")],
        [(b"content-length", b"1_0")],
        [(b"content-length", b" 5")],
    ],
)
def test_a_header_that_would_split_or_misframe_the_response_is_refused(headers):
    with pytest.raises(ValueError):
        http1.response_head(200, headers, request(GET), False)


def test_status_lines():
    assert http1.response_head(404, [], request(GET), False).data.startswith(
        b"HTTP/1.1 404 Not Found\r\n"
    )
    assert http1.response_head(299, [], request(GET), False).data.startswith(b"HTTP/1.1 299 \r\n")
    for bad in (99, 101, 1000, "200"):
        with pytest.raises(ValueError):
            http1.response_head(bad, [], request(GET), False)  # type: ignore[arg-type]


def test_how_the_bytes_are_split_into_reads_changes_nothing():
    stream = (
        b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\nX-Pad: " + b"p" * 300 + b"\r\n\r\n"
        b"hello world"
        b"GET /b?x=1 HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n\r\n"
        b"POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nabcde\r\n10\r\n0123456789abcdef\r\n0\r\n\r\n"
        b"GET /d HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )

    def requests(parser_events: list[object]) -> list[tuple]:
        """Each request as (method, target, headers, keep_alive, body): the body pieces
        joined, since a body may come in more pieces when its bytes came in more reads."""
        out: list[tuple] = []
        for event in parser_events:
            if isinstance(event, Request):
                out.append([event.method, event.target, event.headers, event.keep_alive, b""])
            elif isinstance(event, bytes):
                out[-1][4] += event
            else:
                assert event is END
        return [tuple(r) for r in out]

    whole = requests(parse(stream))
    assert [r[1] for r in whole] == [b"/a", b"/b?x=1", b"/c", b"/d"]
    assert [r[4] for r in whole] == [b"hello world", b"", b"abcde0123456789abcdef", b""]
    rng = random.Random(6)
    for _ in range(200):
        parser = http1.RequestParser(16384)
        cuts = sorted(rng.sample(range(1, len(stream)), rng.randint(1, 40)))
        for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
            parser.receive_data(stream[start:end])
        assert requests(events(parser)) == whole, cuts


@pytest.mark.parametrize(
    ("head", "status"),
    [
        (b"GET / HTTP/1.1\r\n\r\n", 400),  # no Host on HTTP/1.1
        (b"GET / HTTP/1.1\r\nHost: a\r\nHost: a\r\n\r\n", 400),
        (b"GET / HTTP/1.0\r\nHost: a\r\nHost: b\r\n\r\n", 400),
        (b"GET / HTTP/2.0\r\nHost: a\r\n\r\n", 505),  # llhttp takes these lines
        (b"GET / HTTP/0.9\r\nHost: a\r\n\r\n", 505),
    ],
)
def test_host_rules_and_http_versions_are_h11s(head, status):
    parser = http1.RequestParser(16384)
    parser.receive_data(head)
    with pytest.raises(HttpProtocolError) as caught:
        parser.next_event()
    assert caught.value.status == status


def test_an_http_1_0_request_needs_no_host():
    [request, end] = parse(b"GET / HTTP/1.0\r\n\r\n")
    assert request.http_version == "1.0" and end is END


def test_body_complete_says_whether_the_request_body_was_parsed_to_its_end():
    parser = http1.RequestParser(16384)
    parser.receive_data(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nab")
    assert isinstance(parser.next_event(), Request)
    assert not parser.body_complete and parser.buffered_body == 2
    parser.receive_data(b"cd" + b"GET /next HTTP/1.1\r\nHost: x\r\n")
    assert parser.body_complete and parser.buffered_body == 4
    assert parser.next_event() == b"abcd"  # the two reads' pieces, joined
    assert parser.next_event() is END and parser.buffered_body == 0
    parser.receive_data(b"\r\n")
    assert isinstance(parser.next_event(), Request) and parser.body_complete  # no body


def websocket_request(*headers: tuple[bytes, bytes], version: str = "1.1") -> Request:
    base = [(b"host", b"x"), (b"upgrade", b"websocket"), (b"connection", b"keep-alive, Upgrade")]
    return Request(b"GET", b"/v1/ws", version, base + list(headers), True)


KEY = (b"sec-websocket-key", b"AQIDBAUGBwgJCgsMDQ4PEA==")
V13 = (b"sec-websocket-version", b"13")


@pytest.mark.parametrize(
    ("headers", "version", "expected"),
    [
        ((KEY, V13), "1.1", None),
        ((V13,), "1.1", 400),
        ((KEY,), "1.1", 400),
        ((KEY, (b"sec-websocket-version", b"8")), "1.1", 426),
        ((KEY, V13, V13), "1.1", 426),
        ((KEY, KEY, V13), "1.1", 400),
        (((b"sec-websocket-key", b"AQID"), V13), "1.1", 400),
        (((b"sec-websocket-key", b"\xff\xfe==="), V13), "1.1", 400),
        ((KEY, V13), "1.0", 400),
    ],
)
def test_the_websocket_handshake_is_checked_before_wsproto(headers, version, expected):
    refused = http1.websocket_handshake_error(websocket_request(*headers, version=version))
    assert (refused and refused[0]) == expected
