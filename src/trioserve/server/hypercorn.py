"""The hypercorn adapter: trioserve's application under hypercorn's trio worker (HTTP/2
over TLS), through plain ASGI (``trioserve.http.channel.AsgiChannel``).

Two changes to hypercorn's WebSocket stream, for the bounds the built-in server holds
(docs/security.md): no permessage-deflate (hypercorn inflates a frame whole before its
size check: 64 KiB on the wire became 64 MiB held), and every fragment of a message
counted, an empty one too, with the frame loop letting other tasks run every
``EVENTS_PER_YIELD`` events (one read of empty frames held the loop for everyone).
And its HTTP/1.1 event loop yields every ``EVENTS_PER_YIELD`` events too, and stops
parsing a body once the answer is sent and the connection closing (a refused body in
2-byte chunks held the loop for everyone). And each connection's task group holds the
connection's place in its API key's share of connections (``--max-connections-per-key``),
given to every scope of the connection as the ``HOLD_FOR_KEY`` extension. All are set on
hypercorn's modules once, when this module is imported, and held to hypercorn's behaviour
by ``tests/http/test_websocket_framing.py``, ``tests/http/test_connection_shares.py`` and
``tests/process/test_hostile_clients.py``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from sys import getsizeof
from typing import Any

import h2.events
import h11
import hypercorn.protocol as hypercorn_protocol
import trio
from hypercorn.config import Config
from hypercorn.events import Closed, Updated
from hypercorn.protocol import h2 as hypercorn_h2
from hypercorn.protocol import h11 as hypercorn_h11
from hypercorn.protocol import ws_stream
from hypercorn.protocol.events import Body, Data, EndBody, StreamClosed
from hypercorn.trio import serve
from hypercorn.trio import task_group as hypercorn_task_group
from hypercorn.trio import tcp_server as hypercorn_tcp_server
from wsproto.connection import ConnectionState
from wsproto.events import CloseConnection, Message, Ping
from wsproto.frame_protocol import CloseReason

from ..config import Settings, connections_per_key
from ..http import App
from ..http.admission import ConnectionKeyHold, KeyShares, connection_shares
from ..http.channel import HOLD_FOR_KEY
from ..http.errors import HTTPError
from ..http.memory import Holding, MemoryBudget
from . import tls
from .http1.websocket import EVENTS_PER_YIELD, max_message_fragments


class _Handshake(ws_stream.Handshake):
    """hypercorn's handshake, offering no extension: permessage-deflate is declined."""

    def __init__(self, headers: list[tuple[bytes, bytes]], http_version: str) -> None:
        super().__init__(headers, http_version)
        self.extensions = None


class _Config(Config):
    """hypercorn's settings, and the application's body budget, which WebSocket messages
    in assembly draw on too (None: not counted)."""

    memory: MemoryBudget | None = None
    #: Each API key's share of the connections (None: not bounded).
    key_connections: KeyShares | None = None


class _ConnectionTaskGroup(hypercorn_task_group.TaskGroup):
    """hypercorn's task group of one TCP connection (its ``tcp_server`` opens one per
    connection, around everything the connection runs), holding the connection's place in
    its API key's share of connections from the first keyed request on it until the
    connection closes (:class:`_ProtocolWrapper`; at the latest when every task of the
    connection has ended, which hypercorn's keep-alive task delays by up to
    ``--keep-alive-timeout``). Each scope spawned on it (HTTP/1.1 requests, HTTP/2
    streams, WebSockets) gets the ``HOLD_FOR_KEY`` extension the application calls once
    it has authenticated a request."""

    def __init__(self) -> None:
        super().__init__()
        self.key_hold: ConnectionKeyHold | None = None

    async def spawn_app(self, app: Any, config: Config, scope: Any, send: Any) -> Any:
        shares = getattr(config, "key_connections", None)
        if shares is not None:
            if self.key_hold is None:
                self.key_hold = ConnectionKeyHold(shares)
            scope["extensions"][HOLD_FOR_KEY] = self.key_hold.hold_for_key
        return await super().spawn_app(app, config, scope, send)

    async def __aexit__(self, *exc_info: Any) -> None:
        try:
            await super().__aexit__(*exc_info)
        finally:
            if self.key_hold is not None:
                self.key_hold.release()


class _ProtocolWrapper(hypercorn_protocol.ProtocolWrapper):
    """hypercorn's connection protocol, giving its key's share back as the connection
    closes."""

    async def handle(self, event: Any) -> None:
        try:
            await super().handle(event)
        finally:
            if isinstance(event, Closed):
                key_hold = getattr(self.task_group, "key_hold", None)
                if key_hold is not None:
                    key_hold.release()


class _BudgetSpent(Exception):
    """A message in assembly found the body budget spent."""


class _MessageBuffer(ws_stream.WebsocketBuffer):
    """hypercorn's message buffer, counting fragments as the built-in server does, and
    its bytes in the body budget until the message is handed over."""

    def __init__(self, max_length: int, memory: MemoryBudget | None) -> None:
        super().__init__(max_length)
        self.fragments = 0
        self.max_fragments = max_message_fragments(max_length)
        self.held = Holding(memory)

    def extend(self, event: Message[Any]) -> None:
        self.fragments += 1
        if self.fragments > self.max_fragments:
            raise ws_stream.FrameTooLargeError()
        super().extend(event)
        if event.data:
            try:
                self.held.take(getsizeof(event.data))
            except HTTPError:
                raise _BudgetSpent from None

    def to_message(self) -> dict[str, Any]:
        message = super().to_message()
        self.held.release()  # handed over: the app counts the joined message itself
        return message

    def clear(self) -> None:
        super().clear()
        self.fragments = 0
        self.held.release()


class _WSStream(ws_stream.WSStream):
    """hypercorn's WebSocket stream with the buffer above and a frame loop that yields."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        memory = getattr(self.config, "memory", None)
        self.buffer = _MessageBuffer(self.config.websocket_max_message_size, memory)

    async def handle(self, event: Any) -> None:
        try:
            await super().handle(event)
        finally:
            if isinstance(event, StreamClosed):
                self.buffer.clear()  # a message left half-assembled gives its bytes back

    async def _handle_events(self) -> None:
        # hypercorn's own loop (0.17), with the checkpoint, the buffer cleared on 1009
        # and a close frame for a frame that does not parse.
        for handled, event in enumerate(self.connection.events(), 1):
            if handled % EVENTS_PER_YIELD == 0:
                await trio.lowlevel.checkpoint()
            if isinstance(event, Message):
                try:
                    self.buffer.extend(event)
                except (ws_stream.FrameTooLargeError, _BudgetSpent) as refused:
                    self.buffer.clear()
                    code = (
                        CloseReason.TRY_AGAIN_LATER
                        if isinstance(refused, _BudgetSpent)
                        else CloseReason.MESSAGE_TOO_BIG
                    )
                    await self._send_wsproto_event(CloseConnection(code=code))
                    break
                if event.message_finished:
                    assert self.app_put is not None
                    await self.app_put(self.buffer.to_message())
                    self.buffer.clear()
            elif isinstance(event, Ping):
                await self._send_wsproto_event(event.response())
            elif isinstance(event, CloseConnection):
                if self.connection.state == ConnectionState.REMOTE_CLOSING:
                    await self._send_wsproto_event(event.response())
                else:
                    # A frame wsproto could not parse (1002, 1007): say why, as the
                    # built-in server does, rather than drop the connection unexplained.
                    await self._send_wsproto_event(CloseConnection(code=event.code))
                await self.send(StreamClosed(stream_id=self.stream_id))


class _H11Protocol(hypercorn_h11.H11Protocol):
    """hypercorn's HTTP/1.1 protocol, its event loop letting other tasks run every
    ``EVENTS_PER_YIELD`` events. One read of a body in 2-byte chunks is ten thousand h11
    events, all handled before anything else ran: a request refused from its head (no
    key) was answered only once its body's reads had all been parsed, and ten such
    clients held the loop long enough that another client's stream ended slow_client.
    With the checkpoint the refusal is answered, its connection closes and what is left
    of the body is never parsed."""

    async def _handle_events(self) -> None:
        # hypercorn's own loop (0.17), with the checkpoint.
        handled = 0
        while True:
            handled += 1
            if handled % EVENTS_PER_YIELD == 0:
                await trio.lowlevel.checkpoint()
                if self.stream is None or self.connection.our_state in _CLOSING:
                    break  # answered and closing (or closed): nothing more to parse
            if self.connection.they_are_waiting_for_100_continue:
                await self._send_h11_event(
                    h11.InformationalResponse(
                        status_code=100, headers=self.config.response_headers("h11")
                    )
                )
            try:
                event = self.connection.next_event()
            except h11.RemoteProtocolError as error:
                if self.connection.our_state in {h11.IDLE, h11.SEND_RESPONSE}:
                    await self._send_error_response(error.error_status_hint)
                await self.send(Closed())
                break
            if isinstance(event, h11.Request):
                await self.send(Updated(idle=False))
                await self._check_protocol(event)
                await self._create_stream(event)
            elif event is h11.PAUSED:
                await self.can_read.clear()
                await self.can_read.wait()
            elif (
                isinstance(event, h11.ConnectionClosed)
                or event is h11.NEED_DATA
                or self.stream is None
            ):
                break
            elif isinstance(event, h11.Data):
                await self.stream.handle(Body(stream_id=hypercorn_h11.STREAM_ID, data=event.data))
            elif isinstance(event, h11.EndOfMessage):
                await self.stream.handle(EndBody(stream_id=hypercorn_h11.STREAM_ID))
            elif isinstance(event, Data):
                await self.stream.handle(event)  # WebSocket pass through


_CLOSING = (h11.MUST_CLOSE, h11.CLOSED)


class _H2Protocol(hypercorn_h2.H2Protocol):
    """hypercorn's HTTP/2 protocol, dropping the body of a stream it has already
    answered and closed. A request refused from its head (no key, 413) is answered before
    its body is read, and hypercorn forgets the stream once the answer is sent: the body's
    next DATA frame was a ``KeyError`` that ended the connection and every other stream on
    it. Its data is now acknowledged (flow control) and dropped. The stream is not reset:
    RFC 9113 (section 8.1) allows a ``NO_ERROR`` reset after a complete answer, but
    httpx's client then fails the request whose answer it has not read yet."""

    async def _handle_events(self, events: list[Any]) -> None:
        for event in events:  # one at a time: a stream may close while one is handled
            if (
                isinstance(event, (h2.events.DataReceived, h2.events.StreamEnded))
                and event.stream_id not in self.streams
            ):
                if isinstance(event, h2.events.DataReceived):
                    self.connection.acknowledge_received_data(
                        event.flow_controlled_length, event.stream_id
                    )
                    await self._flush()
                continue
            await super()._handle_events([event])


hypercorn_protocol.H11Protocol = _H11Protocol  # type: ignore[misc]
hypercorn_protocol.H2Protocol = _H2Protocol  # type: ignore[misc]
ws_stream.Handshake = _Handshake  # type: ignore[misc]
hypercorn_h11.WSStream = _WSStream  # type: ignore[misc]
hypercorn_h2.WSStream = _WSStream  # type: ignore[misc]
hypercorn_tcp_server.TaskGroup = _ConnectionTaskGroup  # type: ignore[misc]
hypercorn_tcp_server.ProtocolWrapper = _ProtocolWrapper  # type: ignore[misc]


def hypercorn_config(
    settings: Settings,
    hard_stop_after: float,
    listen_fds: Sequence[int] = (),
    memory: MemoryBudget | None = None,
) -> Config:
    config = _Config()
    config.memory = memory
    per_key = connections_per_key(settings)
    if per_key:
        config.key_connections = connection_shares(per_key)
    # Inherited listening sockets (a worker of --workers), else bound here.
    config.bind = [f"fd://{fd}" for fd in listen_fds] or [f"{settings.host}:{settings.port}"]
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")
    config.include_server_header = False
    config.keep_alive_timeout = settings.keep_alive_timeout
    config.websocket_max_message_size = settings.ws_max_message_bytes
    config.websocket_ping_interval = settings.ws_ping_interval or None
    config.graceful_timeout = hard_stop_after
    if tls.enabled(settings):
        # hypercorn builds its context from these (TLS 1.2+, ALPN h2 and http/1.1).
        config.certfile = settings.ssl_certfile
        config.keyfile = settings.ssl_keyfile
        if settings.ssl_ca_certs:
            config.ca_certs = settings.ssl_ca_certs
            config.verify_mode = tls.CLIENT_CERT_MODES[settings.ssl_client_cert]
    return config


async def serve_hypercorn(
    app: App,
    settings: Settings,
    *,
    stop_accepting: trio.Event,
    hard_stop_after: float,
    listen_fds: Sequence[int] = (),
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` until ``stop_accepting`` is set and its connections have ended (or
    ``hard_stop_after`` seconds later). ``listen_fds``: listening sockets to accept on
    (inherited) instead of binding ``settings.host:port``."""
    await serve(
        # App speaks ASGI in plain dicts; hypercorn types each message as a TypedDict,
        # which no callable taking dict[str, Any] matches.
        app,  # type: ignore[arg-type]
        hypercorn_config(settings, hard_stop_after, listen_fds, app.services.body_budget),
        shutdown_trigger=stop_accepting.wait,
        task_status=task_status,
    )
