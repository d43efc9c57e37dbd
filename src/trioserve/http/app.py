"""The ASGI application: routes, and the glue between an exchange and its lifecycle."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import trio

from .. import metrics
from ..config import Settings
from ..engine import EngineClient
from ..protocol import Submit
from .admission import Admission
from .auth import ApiKeys, header_values, select_subprotocol
from .bodies.forms import JSON, MULTIPART, URLENCODED, Body, read_body
from .bodies.media import MediaFetcher
from .bodies.multimodal import resolve_chat_media
from .bodies.openai import parse_generation
from .bodies.uploads import Uploads
from .bodies.validation import invalid, parse_json
from .cors import CorsPolicy
from .errors import HTTPError
from .exchange import JSON_HEADERS, ClientGone, Exchange, Receive, Send, ServerState
from .fanout import StreamingGroup, run_group
from .lifecycle import Registry, RequestHandle, run_generation
from .routes import generate, images, speech, videos
from .websocket import GOING_AWAY, POLICY_VIOLATION, WebSocketConnection
from .writers.stream import Collected, JSONWriter, SSEWriter, Writer

log = logging.getLogger("trioserve.http")

Handler = Callable[[Exchange], Awaitable[None]]

#: What each capability an engine may declare is called in a 404 for a missing one.
CAPABILITY_NAMES = {
    "chat": "chat completions",
    "completion": "text completions",
    "generate": "native generation",
    "speech": "speech synthesis",
    "image_generation": "image generation",
    "image_edit": "image editing",
    "video_generation": "video generation",
}


@attrs.frozen
class Route:
    handler: Handler
    #: The engine capability the route needs; generation routes take an admission slot.
    capability: str | None = None
    #: Errors in the native ``{"detail": ...}`` shape.
    detail_errors: bool = False


class App:
    """trioserve's ASGI application. ``draining`` is flipped by the drain controller."""

    def __init__(self, engines: EngineClient, settings: Settings | None = None) -> None:
        self.engines = engines
        self.settings = settings or Settings()
        self.registry = Registry()
        self.state = ServerState()
        self.websockets: set[WebSocketConnection] = set()
        self.admission = Admission(self.settings.max_concurrent_requests)
        self.cors = CorsPolicy(self.settings.cors_origins, self.settings.cors_allow_credentials)
        self.api_keys = ApiKeys(self.settings.api_keys)
        #: What a request without a key may reach when there are keys: every other path
        #: (unknown ones too, so they cannot be probed) answers 401 first.
        self.open_paths = {"/health", "/live"}
        if not self.settings.metrics_require_key:
            self.open_paths.add("/metrics")
        self._routes: dict[tuple[str, str], Route] = {
            ("POST", "/v1/chat/completions"): Route(self.chat_completions, "chat"),
            ("POST", "/v1/completions"): Route(self.completions, "completion"),
            ("POST", "/generate"): Route(
                lambda ex: generate.handle(self, ex), "generate", detail_errors=True
            ),
            ("POST", "/v1/audio/speech"): Route(lambda ex: speech.handle(self, ex), "speech"),
            ("POST", "/v1/images/generations"): Route(
                lambda ex: images.generations(self, ex), "image_generation"
            ),
            ("POST", "/v1/images/edits"): Route(lambda ex: images.edits(self, ex), "image_edit"),
            ("POST", "/v1/videos/generations"): Route(
                lambda ex: videos.handle(self, ex), "video_generation"
            ),
            ("GET", "/v1/models"): Route(self.list_models),
            ("GET", "/health"): Route(self.health),
            ("GET", "/live"): Route(self.live),
            ("GET", "/metrics"): Route(self.metrics),
        }
        self._paths = {path for _, path in self._routes}

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self._http(Exchange(scope, receive, send, self.state))
        elif kind == "lifespan":
            await _lifespan(receive, send)
        elif kind == "websocket":
            if scope["path"] == "/v1/ws":
                await self._websocket(scope, receive, send)
            else:
                await send({"type": "websocket.close", "code": POLICY_VIOLATION})

    async def _websocket(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        headers = scope["headers"]
        protocols = header_values(headers, b"sec-websocket-protocol")
        if not self._websocket_origin_allowed(headers):
            # A browser page of another site opening a socket with the user's network
            # position and cookies (cross-site WebSocket hijacking).
            error = HTTPError(
                403,
                "this origin may not open a WebSocket here (allow it with --cors-origin, or "
                "any origin with --ws-allow-any-origin)",
                "websocket_origin_not_allowed",
            )
            await _refuse_websocket(scope, receive, send, error)
            return
        try:
            key_index = self.api_keys.authenticate_websocket(
                header_values(headers, b"authorization"), protocols
            )
        except HTTPError as error:
            await _refuse_websocket(scope, receive, send, error)
            return
        connection = WebSocketConnection(
            self, receive, send, key_index=key_index, subprotocol=select_subprotocol(protocols)
        )
        await connection.serve()

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
        try:
            if self.cors.enabled:
                origin = exchange.header(b"origin")
                exchange.extra_headers = self.cors.response_headers(origin)
                if exchange.method == "OPTIONS" and exchange.header(
                    b"access-control-request-method"
                ):
                    await self._preflight(exchange, origin)
                    return
            if self.api_keys.enabled and exchange.path not in self.open_paths:
                exchange.key_index = self.api_keys.authenticate(
                    header_values(exchange.scope["headers"], b"authorization")
                )
            route = self._routes.get((exchange.method, exchange.path))
            if route is None:
                await self._fallback(exchange)(exchange)
            elif route.capability is None:
                await route.handler(exchange)
            else:
                exchange.detail_errors = route.detail_errors
                self.require_capability(route.capability, exchange)
                admission = self.admission
                admission.try_acquire()  # held until the last byte is sent
                try:
                    await route.handler(exchange)
                finally:
                    admission.release()
        except HTTPError as error:
            if not exchange.started:
                await exchange.respond_error(error)
        except ClientGone:
            pass

    async def _preflight(self, exchange: Exchange, origin: bytes | None) -> None:
        if not self.cors.allows(origin):
            raise HTTPError(403, "this origin is not allowed (CORS)", "cors_origin_not_allowed")
        requested = exchange.header(b"access-control-request-headers")
        headers = self.cors.preflight_headers(origin, requested)
        exchange.extra_headers = []
        await exchange.respond(204, b"", headers)

    def require_capability(self, capability: str, exchange: Exchange) -> None:
        """404 when the connected engines do not do what the route needs (no engine at
        all is a 503, later, like for every generation route)."""
        engines = self.engines
        if engines.offers(capability) or not engines.ready:
            return
        declared = engines.capabilities()
        raise HTTPError(
            404,
            f"{exchange.method} {exchange.path} is not available: no connected engine "
            f"supports {CAPABILITY_NAMES.get(capability, capability)} (capability "
            f"{capability!r}; the engines declare: {', '.join(sorted(declared))})",
            "route_not_supported",
        )

    def _fallback(self, exchange: Exchange) -> Handler:
        path = exchange.path
        if path.startswith("/v1/requests/") and exchange.method == "DELETE":
            return self.cancel_request
        if path in self._paths or path.startswith("/v1/requests/"):
            allowed = sorted(m for m, p in self._routes if p == path) or ["DELETE"]
            raise HTTPError(
                405,
                f"method {exchange.method} not allowed on {path}",
                "method_not_allowed",
                headers=[(b"allow", ", ".join(allowed).encode())],
            )
        raise HTTPError(404, f"no route {exchange.method} {path}", "not_found")

    # -- generation ----------------------------------------------------------------------

    async def chat_completions(self, exchange: Exchange) -> None:
        await self._generate(exchange, "chat")

    async def completions(self, exchange: Exchange) -> None:
        await self._generate(exchange, "completion")

    async def _json_body(self, exchange: Exchange) -> dict[str, Any]:
        raw = await exchange.read_body(self.settings.max_body_bytes, self.settings.body_timeout)
        body = parse_json(raw)
        if not isinstance(body, dict):
            raise invalid([{"loc": "$", "msg": "the body must be a JSON object"}])
        return body

    def resolve_model(self, requested: str | None) -> str:
        engines = self.engines
        if requested is None:
            default = engines.default_model()
            if default is not None:
                return default
        elif engines.serves_model(requested):
            return requested
        models = [card.id for card in self.engines.models()]
        if not models:
            raise HTTPError(503, "no engine is connected", "engine_unavailable")
        if requested is None:
            return models[0]
        if requested not in models:
            raise HTTPError(
                404,
                f"model {requested!r} is not served here (available: {', '.join(models)})",
                "model_not_found",
            )
        return requested

    def timeout(self, requested: Any, what: str) -> float:
        """The deadline to use: the server's, or a client's (capped), in seconds."""
        settings = self.settings
        if requested is None:
            return settings.request_timeout
        try:
            value = float(requested)
        except (TypeError, ValueError):
            value = -1.0
        if not value > 0 or value != value:
            raise HTTPError(
                400, f"{what} must be a positive number of seconds", "invalid_request_timeout"
            )
        return min(value, settings.max_request_timeout)

    def check_accepting(self) -> None:
        if self.state.finished:
            raise HTTPError(503, "the server is shutting down", "server_shutting_down")

    def begin(self, exchange: Exchange) -> float:
        """Checks every generation route makes before reading its body; the deadline."""
        self.check_accepting()
        return self.timeout(exchange.header(b"x-request-timeout"), "X-Request-Timeout")

    def media_fetcher(self) -> MediaFetcher:
        settings = self.settings
        return MediaFetcher(
            allow_remote=settings.allow_remote_media,
            max_bytes=settings.remote_media_max_bytes,
            timeout=settings.remote_media_timeout,
        )

    def uploads(self) -> Uploads:
        return Uploads(self.settings.upload_dir)

    async def read_form(
        self,
        exchange: Exchange,
        *,
        uploads: Uploads | None,
        accepted: tuple[str, ...] = (MULTIPART, URLENCODED, JSON),
    ) -> Body:
        """The request body by its Content-Type, under the server's size and time limits."""
        settings = self.settings
        return await read_body(
            exchange,
            limit=settings.max_body_bytes,
            timeout=settings.body_timeout,
            uploads=uploads,
            accepted=accepted,
        )

    async def run(
        self,
        exchange: Exchange,
        submit: Submit,
        capability: str,
        writer: Writer,
        timeout: float,
        *,
        keepalive: float = 0,
    ) -> None:
        """One generation request of ``exchange``, through the request lifecycle."""
        await run_generation(
            engines=self.engines,
            registry=self.registry,
            submit=submit,
            capability=capability,
            writer=writer,
            timeout=timeout,
            buffer=self.settings.stream_buffer,
            wait_disconnect=exchange.wait_disconnect,
            watch_disconnect=exchange.watch_disconnect,
            handle=RequestHandle(submit.request_id, owner=exchange.key_index),
            keepalive=keepalive,
        )

    async def _generate(self, exchange: Exchange, capability: str) -> None:
        timeout = self.begin(exchange)
        body = await self._json_body(exchange)
        generation = parse_generation(capability, body, exchange.request_id, self.resolve_model)
        generation = await resolve_chat_media(generation, self.media_fetcher())
        fmt = generation.stream_format()
        if generation.n > 1:
            submits = generation.choices()
            stream = None
            if generation.stream:
                formats = [generation.stream_format() for _ in submits]
                for index, choice_format in enumerate(formats):
                    choice_format.index = index
                stream = StreamingGroup(exchange, formats, generation.include_usage)

            async def answer(collected: list[Collected]) -> None:
                if stream is not None:
                    await stream.finish(collected)
                    return
                choices = [("".join(c.text), c.finish_reason, c.usage) for c in collected]
                await exchange.respond(200, fmt.complete_choices(choices), JSON_HEADERS)

            await run_group(self, exchange, submits, capability, timeout, answer, stream=stream)
            return
        if generation.stream:
            writer: Writer = SSEWriter(exchange, fmt)
            keepalive = self.settings.sse_keepalive
        else:
            writer, keepalive = JSONWriter(exchange, fmt), 0
        await self.run(
            exchange, generation.submit, capability, writer, timeout, keepalive=keepalive
        )

    def end_all(self, reason: str) -> int:
        """End every request in flight (the drain deadline); returns how many."""
        self.state.finished = True
        ended = self.registry.end_all(reason)
        for connection in list(self.websockets):
            connection.close(GOING_AWAY)
        return ended

    async def cancel_request(self, exchange: Exchange) -> None:
        request_id = exchange.path.removeprefix("/v1/requests/")
        # Another key's request answers as an unknown one: its existence is not revealed.
        handle = self.registry.owned(request_id, exchange.key_index)
        if handle is None:
            raise HTTPError(404, f"no request {request_id!r} is in flight", "request_not_found")
        handle.end("cancel")
        await exchange.respond_json(200, {"id": request_id, "object": "request", "cancelled": True})

    # -- operations ----------------------------------------------------------------------

    async def list_models(self, exchange: Exchange) -> None:
        data = [
            {"id": card.id, "object": "model", "created": 0, "owned_by": card.owned_by}
            for card in self.engines.models()
        ]
        await exchange.respond_json(200, {"object": "list", "data": data})

    async def health(self, exchange: Exchange) -> None:
        """Readiness: an engine is connected and the server is not draining."""
        if self.state.draining:
            await exchange.respond_json(503, {"status": "draining"})
        elif not self.engines.ready:
            await exchange.respond_json(503, {"status": "no_engine"})
        else:
            await exchange.respond_json(200, {"status": "ok"})

    async def live(self, exchange: Exchange) -> None:
        await exchange.respond_json(200, {"status": "alive"})

    async def metrics(self, exchange: Exchange) -> None:
        body, content_type = metrics.render()
        await exchange.respond(200, body, [(b"content-type", content_type.encode())])


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
        body = error.body()
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
