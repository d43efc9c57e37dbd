"""The ASGI application: CORS, API keys, admission, and dispatch to the routes.

What the routes need is in :class:`~trioserve.http.services.Services`; this module only
decides which route serves an exchange and under which checks.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import trio

from ..config import Settings
from ..engine import EngineClient
from ..errors import ClientGone, InputError
from .auth import ApiKeys, header_values
from .channel import AsgiChannel, Receive, RequestHead, ResponseChannel, Send, head_of
from .cors import CorsPolicy
from .errors import HTTPError, http_error
from .exchange import Exchange
from .memory import Holding
from .observe import Observer
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
from .websocket_handshake import WebSocketHandshakes

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
        #: WebSocket handshakes, checked before they are accepted.
        self.websockets = WebSocketHandshakes(services, self.api_keys, self.cors)

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
                Exchange(head_of(scope), AsgiChannel(receive, send, scope), self.services.state)
            )
        elif kind == "lifespan":
            await _lifespan(receive, send)
        elif kind == "websocket":
            await self.websockets.serve(scope, receive, send)

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
        except (HTTPError, InputError) as error:  # (the text layer's refusals: a 400)
            if not exchange.started:
                await exchange.respond_error(http_error(error))

    async def _preflight(self, exchange: Exchange, origin: bytes | None) -> None:
        if not self.cors.allows(origin):
            raise HTTPError(403, "this origin is not allowed (CORS)", "cors_origin_not_allowed")
        requested = exchange.header(b"access-control-request-headers")
        headers = self.cors.preflight_headers(origin, requested)
        exchange.extra_headers = []
        await exchange.respond(204, b"", headers)


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
        await trio.lowlevel.checkpoint()
