"""HTTP/1.1 on the wire, without I/O: requests parsed into events, responses framed.

The server (``serve.py``, ``connection.py``) reads and writes; this module only turns bytes into
events and a response into bytes. Requests are parsed by httptools (llhttp, the parser
of Node.js, and uvicorn's): strict by default (conflicting Content-Length and
Transfer-Encoding, bad chunk sizes, bare CR or LF, NUL and control characters are
errors), and it costs about a fifteenth of h11's pure-Python state machine, which was
a third of the CPU of a whole non-streaming request (``docs/benchmarks.md``). Response
heads are written here: the framing rules are few (below), and h11 validated every head
twice on its way out.

Framing of a response (as h11 frames it):

- a HEAD request, or a 204 or 304: no body, whatever the app sends;
- the app gave a Content-Length: exactly that many bytes (an app that sends more or
  fewer breaks the framing: the connection closes after the response);
- otherwise, on HTTP/1.1, chunked; on HTTP/1.0, the body runs until the connection closes.

The connection is kept alive only for an HTTP/1.1 request without ``Connection: close``
and a response without it (the app may end a connection that way, as the drain does);
a response on a connection that will close says ``Connection: close``.
"""

from __future__ import annotations

import base64
import binascii
from collections import deque
from http import HTTPStatus
from typing import Final, cast

import httptools

from ...errors import TrioserveError


class HttpProtocolError(TrioserveError):
    """The client broke HTTP/1.1: answer ``status`` (4xx) and close the connection."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class Request:
    """A request head. Header names are lower-cased; values are as sent."""

    __slots__ = ("headers", "http_version", "keep_alive", "method", "target", "websocket")

    def __init__(
        self,
        method: bytes,
        target: bytes,
        http_version: str,
        headers: list[tuple[bytes, bytes]],
        keep_alive: bool,
    ) -> None:
        self.method = method
        self.target = target
        self.http_version = http_version
        self.headers = headers
        self.keep_alive = keep_alive
        #: A WebSocket upgrade: what follows its head is the WebSocket's (``trailing``).
        self.websocket = False


class _Marker:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


#: Events besides a :class:`Request` and body bytes.
END: Final = _Marker("END")  # the request's body is complete
CLOSED: Final = _Marker("CLOSED")  # the client closed its side
NEED_DATA: Final = _Marker("NEED_DATA")  # nothing until more bytes are received


def _is_websocket_upgrade(request: Request) -> bool:
    if request.method != b"GET":
        return False
    upgrade = connection = b""
    for name, value in request.headers:
        if name == b"upgrade":
            upgrade = value.lower()
        elif name == b"connection":
            connection = value.lower()
    return upgrade == b"websocket" and b"upgrade" in connection


#: The only WebSocket protocol version there is (RFC 6455).
WEBSOCKET_VERSION: Final = b"13"


def websocket_handshake_error(request: Request) -> tuple[int, str, str] | None:
    """Why a WebSocket upgrade request cannot be accepted: ``(status, code, message)``, or
    None if it can. Checked before wsproto sees the request (wsproto raises on what it
    cannot accept): RFC 6455 section 4.2.1, whose 426 (a version other than 13) is
    answered with ``Sec-WebSocket-Version: 13``.
    """
    keys: list[bytes] = []
    versions: list[bytes] = []
    connection = b""
    for name, value in request.headers:
        if name == b"sec-websocket-key":
            keys.append(value)
        elif name == b"sec-websocket-version":
            versions.append(value)
        elif name == b"connection":
            connection += b"," + value
    if request.http_version != "1.1":
        return 400, "invalid_websocket_handshake", "a WebSocket handshake needs HTTP/1.1"
    if not any(token.strip().lower() == b"upgrade" for token in connection.split(b",")):
        return 400, "invalid_websocket_handshake", "a WebSocket handshake needs Connection: Upgrade"
    if not versions:
        return 400, "invalid_websocket_handshake", "Sec-WebSocket-Version is missing"
    if versions != [WEBSOCKET_VERSION]:
        return 426, "unsupported_websocket_version", "only Sec-WebSocket-Version 13 is supported"
    if len(keys) != 1:
        return 400, "invalid_websocket_handshake", "exactly one Sec-WebSocket-Key is required"
    try:
        nonce = base64.b64decode(keys[0], validate=True)
    except (binascii.Error, ValueError):
        nonce = b""
    if len(nonce) != 16:
        return 400, "invalid_websocket_handshake", "Sec-WebSocket-Key is not 16 bytes in base64"
    return None


def _declares_body(headers: list[tuple[bytes, bytes]]) -> bool:
    for name, value in headers:
        if name == b"transfer-encoding" or (name == b"content-length" and value.strip() != b"0"):
            return True
    return False


class RequestParser:
    """Bytes in (:meth:`receive_data`), events out (:meth:`next_event`): a
    :class:`Request`, then its body as ``bytes`` pieces, then :data:`END`; per request,
    in order, pipelined ones included. :data:`CLOSED` once the client closed its side;
    a :class:`HttpProtocolError` is raised where the client broke the protocol (after the
    events before the fault).

    Buffers: the events of what was received (the server bounds what it reads ahead),
    each run of body bytes as one piece however it was chunked; a head that has not
    arrived whole yet, up to ``max_head_bytes`` plus one read.
    """

    def __init__(self, max_head_bytes: int) -> None:
        self.max_head_bytes = max_head_bytes
        self._parser = httptools.HttpRequestParser(self)
        self._events: deque[object] = deque()
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._head_size = 0
        #: A head has begun and is not complete yet.
        self.head_open = False
        self._began = False
        self._open_head_bytes = 0
        #: A 100 Continue is owed: the client waits for it before it sends its body.
        self.awaiting_continue = False
        #: Bytes after a WebSocket upgrade request: the WebSocket's, not HTTP.
        self.trailing = b""
        #: The last head asked for an upgrade to WebSocket: parsing stops after it.
        self._to_websocket = False
        self._stopped = False
        #: Requests whose body has been parsed to its end, and requests handed out by
        #: next_event (see body_complete).
        self._completed = 0
        self._handed_out = 0
        #: Body bytes parsed and not handed out yet.
        self.buffered_body = 0

    # -- httptools callbacks -------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.head_open = self._began = True
        self._url = b""
        self._headers = []
        self._head_size = 0

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if value[-1:] in (b" ", b"\t"):
            value = value.rstrip(b" \t")  # whitespace around a value is not part of it
        self._headers.append((name.lower(), value))
        self._head_size += len(name) + len(value) + 4

    def on_headers_complete(self) -> None:
        self.head_open = False
        self._open_head_bytes = 0
        parser = self._parser
        if len(self._url) + self._head_size > self.max_head_bytes:
            raise self._head_too_large()
        headers = self._headers
        version = parser.get_http_version()
        if version not in ("1.1", "1.0"):
            # llhttp takes HTTP/0.9 and 2.0 request lines; neither is served on this port.
            reason = f"HTTP/{version} is not supported; this port speaks HTTP/1.1"
            raise HttpProtocolError(505, reason)
        expect = False
        hosts = 0
        for name, value in headers:
            if name == b"expect" and value.lower() == b"100-continue":
                expect = version == "1.1"
            elif name == b"host":
                hosts += 1
        # As h11 (RFC 9112 section 3.2): exactly one Host on HTTP/1.1, at most one before.
        if hosts > 1:
            raise HttpProtocolError(400, "more than one Host header")
        if hosts == 0 and version == "1.1":
            raise HttpProtocolError(400, "an HTTP/1.1 request needs a Host header")
        request = Request(
            parser.get_method(),
            self._url,
            version,
            headers,
            version == "1.1" and parser.should_keep_alive(),
        )
        if parser.should_upgrade():
            request.websocket = self._to_websocket = _is_websocket_upgrade(request)
            if not request.websocket and _declares_body(headers):
                # llhttp hands a body after an Upgrade head over as the new protocol's
                # bytes; served as plain HTTP (we upgrade only to WebSocket), it would be
                # lost.
                raise HttpProtocolError(400, "an Upgrade request with a body is not supported")
        self.awaiting_continue = expect
        self._events.append(request)

    def on_body(self, body: bytes) -> None:
        self.awaiting_continue = False
        self.buffered_body += len(body)
        events = self._events
        # One contiguous piece per run of body bytes, not an object per chunk: a body
        # in 2-byte chunks held 25 times its size on the wire as Python objects.
        if events:
            last = events[-1]
            kind = type(last)
            if kind is bytearray:
                cast(bytearray, last).extend(body)
                return
            if kind is bytes:
                piece = bytearray(cast(bytes, last))
                piece += body
                events[-1] = piece
                return
        events.append(body)

    def on_message_complete(self) -> None:
        self.awaiting_continue = False
        self._completed += 1
        self._events.append(END)

    # -- events ------------------------------------------------------------------------

    def close(self) -> None:
        """Nothing more will be received (the connection closed). httptools' parser holds
        this object's callbacks and this object holds it: a reference cycle that kept
        every closed connection's parser, and the body bytes it had buffered, until the
        garbage collector ran. Dropping the parser breaks it."""
        if not self._stopped:
            self._stop(CLOSED)
        if hasattr(self, "_parser"):
            del self._parser

    def receive_data(self, data: bytes) -> None:
        """Parse ``data``; ``b""`` means the client closed its side."""
        if self._stopped:
            return
        if not data:
            self._stop(CLOSED)
            return
        self._began = False
        while True:
            try:
                self._parser.feed_data(data)
            except httptools.HttpParserUpgrade as exc:
                offset = exc.args[0]
                if self._to_websocket:
                    self.trailing = data[offset:]
                    self._stopped = True
                    return
                # Another protocol (h2c, say): ignored, as HTTP allows; what follows the
                # head is the next request (httptools resumed the parser).
                data = data[offset:]
                if data:
                    continue
            except httptools.HttpParserCallbackError as exc:
                cause = exc.__context__
                if isinstance(cause, HttpProtocolError):
                    self._stop(cause)
                    return
                raise
            except httptools.HttpParserError as exc:
                self._stop(HttpProtocolError(400, str(exc) or type(exc).__name__))
                return
            break
        if self.head_open and not self._began:
            # Count what an unfinished head holds, except the read it began in (what of
            # that read was the head is not known; it is at most one read).
            self._open_head_bytes += len(data)
            if self._open_head_bytes > self.max_head_bytes:
                self._stop(self._head_too_large())

    def _head_too_large(self) -> HttpProtocolError:
        return HttpProtocolError(431, f"the request head exceeds {self.max_head_bytes} bytes")

    def _stop(self, last: object) -> None:
        self._stopped = True
        self.head_open = False
        self._events.append(last)

    def next_event(self) -> object:
        """The next event, or :data:`NEED_DATA`."""
        if not self._events:
            return NEED_DATA
        event = self._events.popleft()
        kind = type(event)
        if kind is bytes:
            self.buffered_body -= len(event)  # type: ignore[arg-type]  # kind is bytes
        elif kind is bytearray:
            event = bytes(cast(bytearray, event))
            self.buffered_body -= len(event)
        elif kind is Request:
            self._handed_out += 1
        elif kind is HttpProtocolError:
            raise event  # type: ignore[misc]  # kind is HttpProtocolError
        return event

    @property
    def has_events(self) -> bool:
        return bool(self._events)

    @property
    def body_complete(self) -> bool:
        """The body of the last request handed out has been parsed to its end (its
        pieces may still wait in the events): nothing more of it needs to be read."""
        return self._completed >= self._handed_out

    @property
    def stopped(self) -> bool:
        """Nothing more will be parsed: the client closed its side, broke the protocol,
        or upgraded to WebSocket."""
        return self._stopped


# -- responses -------------------------------------------------------------------------

#: How a response's body is framed.
NO_BODY: Final = 0
LENGTH: Final = 1
CHUNKED: Final = 2
UNTIL_CLOSE: Final = 3

#: Final responses only: an ASGI app cannot send a 1xx.
_STATUS_LINES = {
    status.value: b"HTTP/1.1 %d %s\r\n" % (status.value, status.phrase.encode())
    for status in HTTPStatus
    if status.value >= 200
}


class ResponseHead:
    """A response head as bytes, with how its body is framed."""

    __slots__ = ("data", "framing", "keep_alive", "length")

    def __init__(self, data: bytes, framing: int, length: int, keep_alive: bool) -> None:
        self.data = data
        self.framing = framing
        #: The Content-Length (LENGTH framing).
        self.length = length
        self.keep_alive = keep_alive


def response_head(
    status: int, headers: list[tuple[bytes, bytes]], request: Request, closing: bool
) -> ResponseHead:
    """Frame a response to ``request``: the head's bytes and the body's framing.

    ``closing``: the connection closes after this response whatever the request says.
    Raises ``ValueError`` for a status or a header that cannot go on the wire (a CR, LF
    or NUL in a header would split the response).
    """
    status_line = _STATUS_LINES.get(status)
    if status_line is None:
        if type(status) is not int or not 200 <= status <= 999:
            raise ValueError(f"invalid response status {status!r}")
        status_line = b"HTTP/1.1 %d \r\n" % status
    keep_alive = request.keep_alive and not closing
    length = -1
    lines = []
    for name, value in headers:
        lower = name.lower()
        if lower == b"content-length":
            if not value.isdigit():  # int() would also take " 5", "+5", "1_0"
                raise ValueError(f"invalid content-length {value!r}")
            length = int(value)
        elif lower == b"transfer-encoding":
            continue  # framing is decided here
        elif lower == b"connection" and b"close" in value.lower():
            keep_alive = False
            continue  # said once, below
        lines.append(b"%s: %s\r\n" % (name, value))
    if request.method == b"HEAD" or status in (204, 304):
        framing = NO_BODY
    elif length >= 0:
        framing = LENGTH
    elif request.http_version == "1.1":
        framing = CHUNKED
        lines.append(b"transfer-encoding: chunked\r\n")
    else:
        framing = UNTIL_CLOSE
        keep_alive = False
    if not keep_alive:
        lines.append(b"connection: close\r\n")
    block = b"".join(lines)
    if block.count(b"\n") != len(lines) or block.count(b"\r") != len(lines) or b"\0" in block:
        raise ValueError("a response header contains CR, LF or NUL")
    return ResponseHead(status_line + block + b"\r\n", framing, length, keep_alive)


def chunk(data: bytes) -> bytes:
    """``data`` as one chunk of a chunked body (not empty: an empty chunk ends the body)."""
    return b"%x\r\n%b\r\n" % (len(data), data)


#: The end of a chunked body.
LAST_CHUNK: Final = b"0\r\n\r\n"


def simple_response(
    status: int, body: bytes, content_type: bytes, headers: tuple[tuple[bytes, bytes], ...] = ()
) -> bytes:
    """A whole response that closes the connection (refusals and errors)."""
    extra = b"".join(b"%s: %s\r\n" % (name, value) for name, value in headers)
    return b"%sconnection: close\r\ncontent-type: %s\r\ncontent-length: %d\r\n%s\r\n%s" % (
        _STATUS_LINES.get(status, b"HTTP/1.1 %d \r\n" % status),
        content_type,
        len(body),
        extra,
        body,
    )


CONTINUE: Final = b"HTTP/1.1 100 Continue\r\n\r\n"
