"""WebSocket handshakes, checked before they are accepted: the route (``/v1/ws``; another
path gets the 404 an HTTP request there gets), the page's origin (cross-site WebSocket
hijacking), the API key (a bearer token, or a subprotocol), and the key's share of
connections and sockets. A refused handshake is answered with a whole HTTP response where
the server can send one. An accepted socket is a
:class:`~trioserve.http.websocket.WebSocketConnection` (``websocket.py``).
"""

from __future__ import annotations

from time import perf_counter
from typing import Any

import trio

from . import error_bodies
from .auth import ApiKeys, header_values, select_subprotocol
from .channel import HOLD_FOR_KEY, Receive, Send
from .cors import CorsPolicy
from .errors import POLICY_VIOLATION, HTTPError
from .exchange import JSON_HEADERS
from .observe import WEBSOCKET_ROUTE
from .services import Services
from .websocket import WebSocketConnection


class WebSocketHandshakes:
    """The server's WebSocket handshakes (ASGI ``websocket`` scopes, on every server)."""

    def __init__(self, services: Services, api_keys: ApiKeys, cors: CorsPolicy) -> None:
        self.services = services
        self.settings = services.settings
        self.api_keys = api_keys
        self.cors = cors

    async def serve(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        """One handshake: accepted and served until the socket closes, or refused."""
        if scope["path"] == WEBSOCKET_ROUTE:
            await self._accept(scope, receive, send)
        else:
            await self._no_route(scope, receive, send)

    async def _accept(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        headers = scope["headers"]
        protocols = header_values(headers, b"sec-websocket-protocol")
        arrived = perf_counter()
        if not self.origin_allowed(headers):
            # A browser page of another site opening a socket with the user's network
            # position and cookies (cross-site WebSocket hijacking).
            error = HTTPError(
                403,
                "this origin may not open a WebSocket here (allow it with --cors-origin, or "
                "any origin with --ws-allow-any-origin)",
                "websocket_origin_not_allowed",
            )
            await self._refuse(scope, receive, send, error, arrived)
            return
        try:
            key_index = self.api_keys.authenticate_websocket(
                header_values(headers, b"authorization"), protocols
            )
            hold_for_key = (scope.get("extensions") or {}).get(HOLD_FOR_KEY)
            if key_index is not None and hold_for_key is not None:
                hold_for_key(key_index)  # the socket's connection, in its key's share
            share = self.services.websocket_shares.take(key_index)
        except HTTPError as error:
            await self._refuse(scope, receive, send, error, arrived)
            return
        with share:  # until the socket has closed
            connection = WebSocketConnection(
                self.services,
                receive,
                send,
                key_index=key_index,
                subprotocol=select_subprotocol(protocols),
                client=scope.get("client"),
                headers={name.lower(): value for name, value in headers},
            )
            await connection.serve()

    async def _refuse(
        self,
        scope: dict[str, Any],
        receive: Receive,
        send: Send,
        error: HTTPError,
        arrived: float,
    ) -> None:
        try:
            await refuse_handshake(scope, receive, send, error)
        finally:
            self.services.observer.ws_socket_done(
                client=scope.get("client"),
                socket=None,
                status=error.status,
                sent=0,
                arrived=arrived,
                end=error.code,
                requests=0,
                path=scope["path"],
            )

    async def _no_route(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        """A WebSocket handshake on another path: 404, as an HTTP request there gets, before
        any upgrade; with API keys, a 401 first without one (unknown paths are not probed)."""
        error = HTTPError(404, f"no WebSocket route at {scope['path']} (it is /v1/ws)", "not_found")
        headers = scope["headers"]
        try:
            self.api_keys.authenticate_websocket(
                header_values(headers, b"authorization"),
                header_values(headers, b"sec-websocket-protocol"),
            )
        except HTTPError as refused:
            error = refused
        await self._refuse(scope, receive, send, error, perf_counter())

    def origin_allowed(self, headers: list[tuple[bytes, bytes]]) -> bool:
        """Browsers say where a page came from (``Origin``); other clients send none. A
        browser may open a socket from an origin ``--cors-origin`` allows, from this
        server's own origin, or from any with ``--ws-allow-any-origin``."""
        origins = header_values(headers, b"origin")
        if not origins:
            return True
        if len(origins) > 1:
            return False
        origin = origins[0]
        if self.settings.ws_allow_any_origin or self.cors.allows(origin):
            return True
        hosts = header_values(headers, b"host")
        return len(hosts) == 1 and origin.partition(b"://")[2] == hosts[0].lower()


async def refuse_handshake(
    scope: dict[str, Any], receive: Receive, send: Send, error: HTTPError
) -> None:
    """Refuse a WebSocket handshake with ``error`` as a whole HTTP response, where the
    server can send one (ASGI's ``websocket.http.response`` extension: hypercorn); else
    by closing before accepting, which servers answer with a 403 and no body."""
    if (await receive())["type"] != "websocket.connect":
        return
    # Shielded, as Exchange._send: a cancelled send can leave hypercorn's state broken.
    with trio.CancelScope(shield=True):
        if "websocket.http.response" not in (scope.get("extensions") or {}):
            await send({"type": "websocket.close", "code": POLICY_VIOLATION})
            return
        body = error_bodies.body(error)
        headers = [*JSON_HEADERS, *error.headers, (b"content-length", b"%d" % len(body))]
        await send(
            {"type": "websocket.http.response.start", "status": error.status, "headers": headers}
        )
        await send({"type": "websocket.http.response.body", "body": body})
