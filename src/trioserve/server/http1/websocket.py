"""A WebSocket upgraded from a connection, as an ASGI websocket scope (wsproto)."""

from __future__ import annotations

import logging
from sys import getsizeof
from typing import Any

import trio
import wsproto
import wsproto.events as ws_events
from wsproto.utilities import LocalProtocolError as WSLocalProtocolError
from wsproto.utilities import RemoteProtocolError as WSRemoteProtocolError

from ...errors import ClientGone
from ...http.channel import HOLD_FOR_KEY
from ...http.errors import HTTPError
from ...http.memory import Holding
from . import protocol as http1
from .connection import Connection, asgi_scope, only_gone
from .protocol import Request

log = logging.getLogger("trioserve.http1")

#: Fragments of one message (each piece wsproto hands over: a frame, or the part of one
#: a read brought) are bounded by the message limit too, one per this many bytes of it, so
#: that empty continuation frames cannot go on for ever (close 1009 past it).
FRAGMENT_COST = 64
#: Events handled from one read before the other tasks get to run.
EVENTS_PER_YIELD = 16
#: The close code of a message refused because the server's body budget is spent
#: (RFC 6455's registry: "Try Again Later").
TRY_AGAIN_LATER = 1013


def max_message_fragments(limit: int) -> int:
    """Fragments one message may come in (the limit's share, and at least 64)."""
    return max(limit // FRAGMENT_COST, 64)


class WebSocketSession:
    """A WebSocket upgraded from an HTTP connection, as an ASGI websocket scope."""

    def __init__(self, connection: Connection, request: Request) -> None:
        self.connection = connection
        self.request = request
        self.ws = wsproto.WSConnection(wsproto.ConnectionType.SERVER)
        self.connected = False
        self.closed = False
        self.accepted = False
        self.close_code: int | None = None
        self._write_lock = trio.Lock()
        self._message: list[str | bytes] = []
        self._message_size = 0
        #: What the message in assembly holds of the server's body budget (its parts).
        self._assembly = Holding(connection.shared.memory)
        self._fragments = 0
        self._heard = True
        #: An HTTP answer to the handshake the app is sending (websocket.http.response).
        self._response: tuple[int, list[tuple[bytes, bytes]]] | None = None
        self._response_body: list[bytes] = []

    def scope(self) -> dict[str, Any]:
        offered = b",".join(v for k, v in self.request.headers if k == b"sec-websocket-protocol")
        subprotocols = [p.strip().decode("latin-1") for p in offered.split(b",") if p.strip()]
        return {
            **asgi_scope("websocket", self.request, self.connection),
            "subprotocols": subprotocols,
            # The app may answer the handshake with an HTTP response of its own (a 401).
            "extensions": {
                "websocket.http.response": {},
                # The socket counts against its key's connections (App._websocket).
                HOLD_FOR_KEY: self.connection.hold_for_key,
            },
        }

    async def run(self) -> None:
        request = self.request
        connection = self.connection
        # Checked here first: wsproto raises on a handshake it cannot accept.
        refused = http1.websocket_handshake_error(request)
        if refused is not None:
            status, code, reason = refused
            version = ((b"sec-websocket-version", http1.WEBSOCKET_VERSION),)
            await connection.refuse(status, reason, code, version if status == 426 else ())
            return
        head = b"%s %s HTTP/1.1\r\n" % (request.method, request.target)
        head += b"".join(b"%s: %s\r\n" % (k, v) for k, v in request.headers) + b"\r\n"
        try:
            self.ws.receive_data(head)
            trailing = connection.parser.trailing
            if trailing:
                self.ws.receive_data(trailing)
        except (WSRemoteProtocolError, UnicodeError) as exc:
            # What wsproto's own parse (h11) refuses and the check above let through.
            reason = f"invalid WebSocket handshake: {exc}"
            await connection.refuse(400, reason, "invalid_websocket_handshake")
            return
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                try:
                    await self.connection.app(self.scope(), self.receive, self.send)
                finally:
                    nursery.cancel_scope.cancel()
        except Exception as exc:
            # The peer gone (a write timed out, say) is expected, also when the nursery
            # wraps it in a group (the ping task's write).
            if not only_gone(exc):
                log.exception("error in ASGI websocket application")
        finally:
            self._assembly.release()  # a message left half-assembled, however it ended
        if not self.closed:
            await self._close(1011 if self.accepted else None)

    async def _end(self, code: int) -> dict[str, Any]:
        """Close with ``code`` for a message the server will not hold; the app learns
        the socket is gone."""
        self.close_code = code
        await self._close(code)
        return {"type": "websocket.disconnect", "code": code}

    async def _write(self, event: Any) -> None:
        data = self.ws.send(event)
        async with self._write_lock:
            await self.connection.write(data)

    async def _close(self, code: int | None) -> None:
        self.closed = True
        try:
            if code is not None and self.ws.state is wsproto.connection.ConnectionState.OPEN:
                await self._write(ws_events.CloseConnection(code=code))
        except (ClientGone, WSLocalProtocolError):
            pass
        self.connection.close()

    async def _pings(self) -> None:
        interval = self.connection.config.ws_ping_interval
        while True:
            await trio.sleep(interval)
            if not self._heard:
                log.info("websocket peer %s stopped answering pings", self.connection.client)
                self.close_code = 1006
                self.connection.close()
                return
            self._heard = False
            try:
                await self._write(ws_events.Ping())
            except (ClientGone, WSLocalProtocolError):
                return  # the peer is gone, or the socket closing: receive() reports it

    async def receive(self) -> dict[str, Any]:
        if not self.connected:
            self.connected = True
            return {"type": "websocket.connect"}
        limit = self.connection.config.ws_max_message_bytes
        max_fragments = max_message_fragments(limit)
        while True:
            if self.closed or self.connection.closed:
                return {"type": "websocket.disconnect", "code": self.close_code or 1006}
            for handled, event in enumerate(self.ws.events(), 1):
                self._heard = True
                if handled % EVENTS_PER_YIELD == 0:
                    # One read can hold ten thousand empty frames: others run between.
                    await trio.lowlevel.checkpoint()
                if isinstance(event, ws_events.Message):
                    if event.data:
                        self._message.append(event.data)
                    self._message_size += len(event.data)
                    # Every fragment counts, an empty one too: handling it costs what a
                    # piece of payload does (a Python object each, once).
                    self._fragments += 1
                    if self._message_size > limit or self._fragments > max_fragments:
                        return await self._end(1009)
                    if event.data:
                        try:
                            self._assembly.take(getsizeof(event.data))
                        except HTTPError:  # the server's body budget is spent: later
                            return await self._end(TRY_AGAIN_LATER)
                    if event.message_finished:
                        parts, self._message, self._message_size = self._message, [], 0
                        self._fragments = 0
                        # The app counts the joined message itself.
                        self._assembly.release()
                        # (A message's parts are all str, or all bytes, as wsproto gives.)
                        if isinstance(event, ws_events.TextMessage):
                            return {"type": "websocket.receive", "text": "".join(parts)}  # type: ignore[arg-type]
                        return {"type": "websocket.receive", "bytes": b"".join(parts)}  # type: ignore[arg-type]
                elif isinstance(event, ws_events.Ping):
                    await self._write(event.response())
                elif isinstance(event, ws_events.CloseConnection):
                    self.close_code = event.code
                    try:
                        await self._write(event.response())
                    except (ClientGone, WSLocalProtocolError):
                        pass
                    self.closed = True
                    self.connection.close()
                    return {"type": "websocket.disconnect", "code": event.code}
            data = await self.connection.read()
            if not data:
                self.closed = True
                return {"type": "websocket.disconnect", "code": self.close_code or 1006}
            try:
                self.ws.receive_data(data)
            except WSRemoteProtocolError:
                self.close_code = 1002
                await self._close(1002)

    async def send(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        if self.closed:
            return
        try:
            if kind == "websocket.accept":
                if self.accepted:
                    return
                self.accepted = True
                await self._write(
                    ws_events.AcceptConnection(
                        subprotocol=message.get("subprotocol"),
                        extra_headers=list(message.get("headers") or ()),
                    )
                )
                if self.connection.config.ws_ping_interval > 0:
                    self._nursery.start_soon(self._pings)
            elif kind == "websocket.send":
                if message.get("text") is not None:
                    await self._write(ws_events.TextMessage(data=message["text"]))
                else:
                    await self._write(ws_events.BytesMessage(data=message.get("bytes") or b""))
            elif kind == "websocket.close":
                if not self.accepted:
                    await self._reject()
                else:
                    await self._close(message.get("code", 1000))
            elif kind == "websocket.http.response.start" and not self.accepted:
                self._response = (message["status"], list(message.get("headers") or ()))
                self._response_body = []
            elif kind == "websocket.http.response.body" and self._response is not None:
                self._response_body.append(message.get("body", b""))
                if not message.get("more_body", False):
                    await self._reject(*self._response, b"".join(self._response_body))
        except (WSLocalProtocolError, ClientGone):
            self.closed = True

    async def _reject(
        self, status: int = 403, headers: list[tuple[bytes, bytes]] | None = None, body: bytes = b""
    ) -> None:
        """Refuse the handshake with an HTTP response (the app's own, or a bare 403)."""
        self.closed = True
        headers = [(k, v) for k, v in headers or () if k.lower() != b"content-length"]
        headers.append((b"content-length", b"%d" % len(body)))
        try:
            data = self.ws.send(
                ws_events.RejectConnection(status_code=status, headers=headers, has_body=bool(body))
            )
            if body:
                data += self.ws.send(ws_events.RejectData(data=body))
            await self.connection.write(data)
        except (ClientGone, WSLocalProtocolError):
            pass
        self.connection.close()
