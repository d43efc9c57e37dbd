"""The ASGI application: CORS, API keys, admission, and dispatch to the routes.

What the routes need is in :class:`~trioserve.http.services.Services`; this module only
decides which route serves an exchange and under which checks.
"""

from __future__ import annotations

import json
import logging
from time import perf_counter
from typing import Any

import trio

from ..config import Settings
from ..engine import EngineClient
from ..errors import HTTPError
from . import error_bodies
from .auth import ApiKeys, header_values, select_subprotocol
from .channel import HOLD_FOR_KEY, AsgiChannel, Receive, RequestHead, ResponseChannel, Send, head_of
from .cors import CorsPolicy
from .exchange import JSON_HEADERS, ClientGone, Exchange
from .memory import Holding
from .observe import WEBSOCKET_ROUTE, Observer
from .openapi.spec import build_spec
from .routes.table import (
    ANTHROPIC_PATHS,
    DEBUG_ROUTES,
    PATHS,
    ROUTES,
    TEMPLATED,
    fallback,
    templates,
)
from .services import Services
from .websocket import POLICY_VIOLATION, WebSocketConnection

log = logging.getLogger("trioserve.http")


def key_labels(settings: Settings) -> list[str]:
    """What each configured key is called in logs (``key-N`` for one without a label)."""
    labels = settings.api_key_labels
    return [
        labels[index] if index < len(labels) else f"key-{index + 1}"
        for index in range(len(settings.api_keys))
    ]


class App:
    """trioserve's ASGI application over :class:`Services` (the drain controller flips
    ``services.state``)."""

    def __init__(self, engines: EngineClient, settings: Settings | None = None) -> None:
        settings = settings or Settings()
        tracing = None
        if settings.otlp_traces_endpoint:
            from .tracing import Tracing  # OpenTelemetry: imported only when tracing

            tracing = Tracing(settings.otlp_traces_endpoint)
        observer = Observer(
            access_log=settings.access_log, tracing=tracing, key_labels=key_labels(settings)
        )
        self.services = services = Services(engines, settings, observer=observer)
        self.settings = settings
        self.routes = ROUTES | DEBUG_ROUTES if settings.debug_endpoints else ROUTES
        self.cors = CorsPolicy(settings.cors_origins, settings.cors_allow_credentials)
        self.api_keys = ApiKeys(settings.api_keys)
        #: What a request without a key may reach when there are keys: every other path
        #: (unknown ones too, so they cannot be probed) answers 401 first.
        #: The pages (and the API's description, which the docs page reads) are open too:
        #: a browser cannot send a key when it opens a page.
        self.open_paths = {"/health", "/live", "/", "/docs", "/openapi.json", "/favicon.ico"}
        if not settings.metrics_require_key:
            self.open_paths.add("/metrics")
        self._openapi_json: bytes | None = None
        services.openapi = self._openapi

    def _openapi(self) -> bytes:
        """The description of this server's API (``/openapi.json``), built once."""
        if self._openapi_json is None:
            spec = self.openapi_spec()
            self._openapi_json = json.dumps(spec, separators=(",", ":")).encode()
        return self._openapi_json

    def openapi_spec(self) -> dict[str, Any]:
        routes = [
            (method, path, route.doc, route.error_shape)
            for table in (ROUTES, TEMPLATED)
            for (method, path), route in table.items()
            if path != "/" or self.settings.playground
        ]
        return build_spec(
            sorted(routes, key=lambda r: (r[1], r[0])),
            api_keys=self.api_keys.enabled,
            open_paths=self.open_paths,
        )

    async def aclose(self) -> None:
        """Send what is left of the traces (bounded: see ``Tracing.shutdown``)."""
        tracing = self.services.observer.tracing
        if tracing is not None:
            await trio.to_thread.run_sync(tracing.shutdown, abandon_on_cancel=True)

    async def handle_http(self, head: RequestHead, channel: ResponseChannel) -> None:
        """One HTTP request, from the built-in server (or from :meth:`__call__`)."""
        await self._http(Exchange(head, channel, self.services.state))

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        """ASGI: HTTP under hypercorn; WebSocket on every server."""
        kind = scope["type"]
        if kind == "http":
            await self._http(
                Exchange(head_of(scope), AsgiChannel(receive, send), self.services.state)
            )
        elif kind == "lifespan":
            await _lifespan(receive, send)
        elif kind == "websocket":
            if scope["path"] == WEBSOCKET_ROUTE:
                await self._websocket(scope, receive, send)
            else:
                await self._no_websocket_route(scope, receive, send)

    async def _websocket(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        headers = scope["headers"]
        protocols = header_values(headers, b"sec-websocket-protocol")
        arrived = perf_counter()
        if not self._websocket_origin_allowed(headers):
            # A browser page of another site opening a socket with the user's network
            # position and cookies (cross-site WebSocket hijacking).
            error = HTTPError(
                403,
                "this origin may not open a WebSocket here (allow it with --cors-origin, or "
                "any origin with --ws-allow-any-origin)",
                "websocket_origin_not_allowed",
            )
            await self._refuse_websocket(scope, receive, send, error, arrived)
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
            await self._refuse_websocket(scope, receive, send, error, arrived)
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

    async def _refuse_websocket(
        self,
        scope: dict[str, Any],
        receive: Receive,
        send: Send,
        error: HTTPError,
        arrived: float,
    ) -> None:
        try:
            await _refuse_websocket(scope, receive, send, error)
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

    async def _no_websocket_route(
        self, scope: dict[str, Any], receive: Receive, send: Send
    ) -> None:
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
        await self._refuse_websocket(scope, receive, send, error, perf_counter())

    def _websocket_origin_allowed(self, headers: list[tuple[bytes, bytes]]) -> bool:
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

    async def _http(self, exchange: Exchange) -> None:
        gone = False
        try:
            await self._dispatch(exchange)
        except ClientGone:
            gone = True
        finally:
            exchange.close()
            self.services.observer.http_done(exchange, self._route_label(exchange), gone)

    def _route_label(self, exchange: Exchange) -> str:
        """The route's path for the metrics (a templated one's template); a made-up path
        is ``unmatched``."""
        path = exchange.path
        if path in PATHS or (exchange.method, path) in self.routes:
            return path
        serving, matching = templates(exchange.method, path)
        if serving is not None or matching:
            return (serving or matching[0]).path
        return "unmatched"

    async def _dispatch(self, exchange: Exchange) -> None:
        services = self.services
        try:
            if self.cors.enabled:
                origin = exchange.header(b"origin")
                exchange.extra_headers = self.cors.response_headers(origin)
                if exchange.method == "OPTIONS" and exchange.header(
                    b"access-control-request-method"
                ):
                    await self._preflight(exchange, origin)
                    return
            if exchange.path in ANTHROPIC_PATHS:
                exchange.error_shape = "anthropic"  # before the key's check: its 401 too
            if self.api_keys.enabled and exchange.path not in self.open_paths:
                headers = exchange.head.headers
                exchange.key_index = self.api_keys.authenticate(
                    header_values(headers, b"authorization"), header_values(headers, b"x-api-key")
                )
                if exchange.key_index is not None:
                    # The connection now counts against this key's share (the 429 past it).
                    exchange.channel.hold_for_key(exchange.key_index)
            route = self.routes.get((exchange.method, exchange.path)) or fallback(exchange)
            if route.capability is not None:
                exchange.error_shape = route.error_shape
                services.require_capability(route.capability, exchange)
                # Refused from its head alone (as the key and the route above): no byte of
                # a body declared too large is read.
                exchange.check_declared_length(services.settings.max_body_bytes)
                # (Its admission slot is taken once its body is complete: services.run.)
                exchange.memory = Holding(services.body_budget)
            await route.handler(services, exchange)
        except HTTPError as error:
            if not exchange.started:
                await exchange.respond_error(error)

    async def _preflight(self, exchange: Exchange, origin: bytes | None) -> None:
        if not self.cors.allows(origin):
            raise HTTPError(403, "this origin is not allowed (CORS)", "cors_origin_not_allowed")
        requested = exchange.header(b"access-control-request-headers")
        headers = self.cors.preflight_headers(origin, requested)
        exchange.extra_headers = []
        await exchange.respond(204, b"", headers)


async def _refuse_websocket(
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


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
        await trio.lowlevel.checkpoint()
