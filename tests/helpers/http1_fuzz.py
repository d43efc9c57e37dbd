"""Generated HTTP/1.1 traffic for the built-in server, and the properties it must hold
(the fuzz tests, tests/server/http1/test_fuzz.py, and ``tools/fuzz_http.py``, which runs
them unseeded for as long as asked).

Generated requests (heads, bodies, chunked framing, pipelining, WebSocket upgrades),
then mutated (bytes flipped, dropped, inserted) and cut into arbitrary reads:

- at the sans-io parser (``http1.RequestParser``): no exception but its ``HttpProtocolError``,
  and the events it gives are the ones it documents;
- at the running server (a real socket on 127.0.0.1): no fault of its own (the connection
  barrier's log line), no 5xx, and the next normal request on a new connection is served.
"""

from __future__ import annotations

import itertools
import logging
from typing import Any, TypeVar

import trio
from hypothesis import strategies as st

from tests.helpers.http import read_to_end
from tests.helpers.waiting import HANG_GUARD
from trioserve.http.channel import AsgiHandler, Receive, Send
from trioserve.server.http1 import Http1Config, serve_http1
from trioserve.server.http1 import protocol as http1
from trioserve.server.http1.protocol import HttpProtocolError

T = TypeVar("T")

# -- generated requests ------------------------------------------------------------------

_KEY = b"AQIDBAUGBwgJCgsMDQ4PEA=="
_HEADER_NAMES = [
    b"host",
    b"content-length",
    b"transfer-encoding",
    b"connection",
    b"upgrade",
    b"expect",
    b"sec-websocket-key",
    b"sec-websocket-version",
    b"content-type",
    b"x-request-id",
]
_HEADER_VALUES = [
    b"x",
    b"0",
    b"5",
    b"-1",
    b"99999999999999999999",
    b"chunked",
    b"gzip, chunked",
    b"close",
    b"keep-alive",
    b"Upgrade",
    b"websocket",
    b"h2c",
    b"100-continue",
    _KEY,
    b"13",
    b"8",
    b"application/json",
    b"multipart/form-data",
    b"",
    b" \t",
]


@st.composite
def often(draw: st.DrawFn, good: st.SearchStrategy[T], bad: st.SearchStrategy[T]) -> T:
    """``good`` nine times in ten: mostly well-formed, so that requests get past the
    parser into the server; sometimes not."""
    return draw(good if draw(st.integers(0, 9)) else bad)


_header = st.tuples(
    often(st.sampled_from(_HEADER_NAMES), st.binary(min_size=1, max_size=8)),
    often(st.sampled_from(_HEADER_VALUES), st.binary(max_size=16)),
)


@st.composite
def chunked_body(draw: st.DrawFn) -> bytes:
    """A chunked body whose sizes may lie, with or without its last chunk; sometimes in
    hundreds of 1- or 2-byte chunks (the shape that was an object per chunk)."""
    out = b""
    if draw(st.integers(0, 3)) == 0:
        out += b"".join(
            b"%x\r\n%s\r\n" % (len(piece), piece)
            for piece in draw(st.lists(st.binary(min_size=1, max_size=2), max_size=300))
        )
    for data in draw(st.lists(st.binary(max_size=12), max_size=4)):
        size = len(data) + draw(st.sampled_from([0, 0, 0, 1, -1]))
        out += b"%x\r\n%s\r\n" % (max(size, 0), data)
    if draw(st.booleans()):
        out += b"0\r\n\r\n"
    return out


_UPGRADES = [
    [],
    [(b"upgrade", b"websocket"), (b"connection", b"Upgrade")],
    [(b"upgrade", b"websocket"), (b"connection", b"Upgrade"), (b"sec-websocket-version", b"8")],
    [
        (b"upgrade", b"websocket"),
        (b"connection", b"Upgrade"),
        (b"sec-websocket-key", _KEY),
        (b"sec-websocket-version", b"13"),
    ],
]


@st.composite
def request(draw: st.DrawFn) -> bytes:
    method = draw(often(st.sampled_from([b"GET", b"GET", b"POST", b"HEAD"]), st.just(b"G T")))
    target = draw(st.sampled_from([b"/", b"/v1/ws", b"/a?b=c", b"*", b"http://x/", b"/%zz"]))
    version = draw(often(st.just(b"1.1"), st.sampled_from([b"1.0", b"2.0", b"0.9", b"1.2"])))
    headers = draw(st.lists(_header, max_size=3))
    if draw(often(st.just(True), st.just(False))):
        headers.insert(0, (b"host", b"x"))
    headers += draw(st.sampled_from(_UPGRADES))  # a WebSocket upgrade, more or less whole
    body = draw(often(st.just(b""), st.binary(max_size=24) | chunked_body()))
    head = b"%s %s HTTP/%s\r\n" % (method, target, version)
    head += b"".join(b"%s: %s\r\n" % pair for pair in headers)
    return head + b"\r\n" + body


@st.composite
def mutated(draw: st.DrawFn, inner: st.SearchStrategy[bytes]) -> bytes:
    data = bytearray(draw(inner))
    for _ in range(draw(st.sampled_from([0, 0, 1, 2, 3]))):
        if not data:
            break
        at = draw(st.integers(0, len(data) - 1))
        kind = draw(st.sampled_from(["flip", "drop", "insert"]))
        if kind == "flip":
            data[at] = draw(st.sampled_from([0, 10, 13, 32, 58, 127, 255, data[at] ^ 0x20]))
        elif kind == "drop":
            del data[at]
        else:
            data[at:at] = draw(st.sampled_from([b"\r\n", b"\n", b":", b" ", b"\x00", b"0\r\n"]))
    return bytes(data)


#: A connection's bytes: up to three requests pipelined, mutated.
traffic = mutated(st.lists(request(), min_size=1, max_size=3).map(b"".join))


@st.composite
def websocket_frame(draw: st.DrawFn) -> bytes:
    """A WebSocket frame from a client, its bits and lengths sometimes wrong (RFC 6455
    section 5.2): reserved bits, unknown opcodes, unmasked, a length that lies."""
    fin = draw(often(st.just(0x80), st.just(0)))
    rsv = draw(often(st.just(0), st.sampled_from([0x40, 0x20, 0x10])))
    opcode = draw(often(st.sampled_from([0, 1, 2, 8, 9, 10]), st.sampled_from([3, 7, 11, 15])))
    payload = draw(st.binary(max_size=40))
    if opcode == 1 and draw(st.booleans()):
        payload = draw(st.text(max_size=20)).encode()
    length = len(payload) + draw(often(st.just(0), st.sampled_from([-1, 1, 1 << 20, 1 << 40])))
    length = max(length, 0)
    if length < 126:
        header = bytes([fin | rsv | opcode, 0x80 | length])
    elif length < 1 << 16:
        header = bytes([fin | rsv | opcode, 0x80 | 126]) + length.to_bytes(2, "big")
    else:
        header = bytes([fin | rsv | opcode, 0x80 | 127]) + length.to_bytes(8, "big")
    if not draw(often(st.just(True), st.just(False))):  # unmasked: a client must mask
        return bytes([header[0], header[1] & 0x7F]) + header[2:] + payload
    key = draw(st.binary(min_size=4, max_size=4))
    return header + key + bytes(b ^ key[i % 4] for i, b in enumerate(payload))


def _masked(first: int, payload: bytes) -> bytes:
    return bytes([first, 0x80 | len(payload)]) + b"\0\0\0\0" + payload  # a zero mask


@st.composite
def fragmented_message(draw: st.DrawFn) -> bytes:
    """A text message in many fragments, empty ones among them, ended or not, with
    control frames between (RFC 6455 section 5.4)."""
    out = _masked(0x01, draw(st.binary(max_size=4)))
    for _ in range(draw(st.integers(0, 200))):
        kind = draw(st.sampled_from(["empty", "empty", "empty", "byte", "ping"]))
        if kind == "empty":
            out += _masked(0x00, b"")
        elif kind == "byte":
            out += _masked(0x00, draw(st.binary(min_size=1, max_size=2)))
        else:
            out += _masked(0x89, b"")
    if draw(st.booleans()):
        out += _masked(0x80, b"")
    return out


#: A whole WebSocket handshake, then frames (some of them messages in many fragments),
#: mutated.
websocket_traffic = mutated(
    st.lists(websocket_frame() | fragmented_message(), max_size=5).map(
        lambda frames: (
            (
                b"GET /v1/ws HTTP/1.1\r\nhost: x\r\nupgrade: websocket\r\nconnection: Upgrade\r\n"
                b"sec-websocket-key: %s\r\nsec-websocket-version: 13\r\n\r\n" % _KEY
            )
            + b"".join(frames)
        )
    )
)


@st.composite
def reads(draw: st.DrawFn, data: bytes) -> list[bytes]:
    """``data`` cut into the reads a server could see."""
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=4)))
    edges = [0, *cuts, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(edges) if b > a]


# -- the properties ----------------------------------------------------------------------


def check_parser(pieces: list[bytes]) -> None:
    """The parser raises nothing but HttpProtocolError, gives only documented events, and
    stops at a fault or at the end of the stream."""
    parser = http1.RequestParser(1024)
    done = False
    for piece in [*pieces, b""]:
        parser.receive_data(piece)
        while not done:
            try:
                event = parser.next_event()
            except HttpProtocolError as exc:
                assert 400 <= exc.status < 600 and exc.reason
                done = True
                break
            if event is http1.NEED_DATA:
                break
            assert (
                event is http1.END
                or event is http1.CLOSED
                or type(event)
                in (
                    bytes,
                    http1.Request,
                )
            ), event
            if isinstance(event, http1.Request) and event.websocket:
                done = True  # the rest is the WebSocket's
            if event is http1.CLOSED:
                done = True
    assert parser.buffered_body >= 0


async def fuzz_app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
    """Reads the body and answers 200; a WebSocket is accepted and read until it ends."""
    if scope["type"] == "websocket":
        await receive()
        await send({"type": "websocket.accept"})
        while (await receive())["type"] != "websocket.disconnect":
            pass
        return
    while True:
        message = await receive()
        if message["type"] == "http.disconnect" or not message.get("more_body"):
            break
    headers = [(b"content-length", b"2")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b"ok"})


class _Faults(logging.Handler):
    """Records the server's own faults: the connection barrier's and the app's."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


async def check_server(port: int, pieces: list[bytes], faults: _Faults) -> None:
    """Send ``pieces`` on one connection and end our side; then a normal request on a new
    connection is answered 200. No 5xx on the first, no fault logged."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    with trio.fail_after(HANG_GUARD):
        try:
            for piece in pieces:
                await stream.send_all(piece)
                await trio.lowlevel.checkpoint()
            await stream.send_eof()
        except trio.BrokenResourceError:
            pass  # the server answered and closed first
        received = await read_to_end(stream)
    await stream.aclose()
    head = received.partition(b"\r\n\r\n")[0]  # the first answer (a WebSocket: frames follow)
    for line in (
        head.split(b"\r\n") if received.startswith(b"HTTP/1.1 101") else received.split(b"\r\n")
    ):
        if line.startswith(b"HTTP/1.1 5"):
            assert line[9:12] in (b"505",), received
    assert not faults.records, faults.records[0].getMessage()
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(b"GET /next HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
    answer = b""
    with trio.fail_after(HANG_GUARD):
        while chunk := await stream.receive_some(65536):
            answer += chunk
    await stream.aclose()
    assert answer.startswith(b"HTTP/1.1 200"), answer


def run_server_check(pieces: list[bytes]) -> None:
    """One example against a server of its own (trio.run per example: hypothesis drives
    synchronous tests)."""
    faults = _Faults()
    logger = logging.getLogger("trioserve.http1")
    logger.addHandler(faults)

    async def main() -> None:
        stop = trio.Event()
        config = Http1Config(header_timeout=5, body_deadline=5, ws_ping_interval=0)
        async with trio.open_nursery() as nursery:
            [url] = await nursery.start(
                lambda task_status: serve_http1(
                    AsgiHandler(fuzz_app),
                    "127.0.0.1",
                    0,
                    config=config,
                    stop_accepting=stop,
                    graceful_deadline=lambda: trio.current_time(),
                    task_status=task_status,
                )
            )
            await check_server(int(url.rsplit(":", 1)[1]), pieces, faults)
            stop.set()

    try:
        trio.run(main)
    finally:
        logger.removeHandler(faults)
