"""The ASGI application: CORS, API keys, admission, and dispatch to the routes.

What the routes need is in :class:`~trioserve.http.services.Services`; this module only
decides which route serves an exchange and under which checks.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from time import perf_counter
from typing import Any

import attrs
import trio

from ..config import Settings
from ..engine import EngineClient
from ..errors import HTTPError
from . import openapi as api
from .auth import ApiKeys, header_values, select_subprotocol
from .bodies.anthropic import CountTokensRequest, MessagesRequest
from .bodies.embeddings import EmbeddingRequest
from .bodies.openai import ChatCompletionRequest, CompletionRequest
from .bodies.responses import ResponsesRequest
from .bodies.tokenize import DetokenizeRequest, TokenizeRequest
from .channel import AsgiChannel, Receive, RequestHead, ResponseChannel, Send, head_of
from .cors import CorsPolicy
from .exchange import JSON_HEADERS, ClientGone, Exchange
from .memory import Holding
from .observe import WEBSOCKET_ROUTE, Observer
from .openapi import JSON, MULTIPART, URLENCODED, Doc, json_body
from .routes import (
    anthropic,
    debug,
    embeddings,
    generate,
    images,
    openai,
    operations,
    pages,
    responses,
    speech,
    tokenize,
    videos,
)
from .services import Services
from .websocket import POLICY_VIOLATION, WebSocketConnection

log = logging.getLogger("trioserve.http")

RouteHandler = Callable[[Services, Exchange], Awaitable[None]]


@attrs.frozen
class Route:
    handler: RouteHandler
    #: What ``/openapi.json`` says about it (``openapi.py``).
    doc: Doc
    #: The engine capability the route needs; generation routes take an admission slot.
    capability: str | None = None
    #: The shape of its errors (``Exchange.error_shape``): ``openai``, ``detail`` (the
    #: native ``{"detail": ...}``) or ``anthropic``.
    error_shape: str = "openai"


def _generation(operation_id: str, summary: str, body: type, ok: dict, **more: object) -> Doc:
    return Doc(operation_id, summary, "generation", body, ok=ok, generation=True, **more)  # type: ignore[arg-type]


_NEEDS_TOKENIZER = (
    "Served from the model's text assets (an engine that takes token ids, or trioserve run "
    "--tokenizer PATH); without them, 501 tokenizer_unavailable."
)

ROUTES: dict[tuple[str, str], Route] = {
    ("POST", "/v1/chat/completions"): Route(
        openai.chat_completions,
        _generation(
            "createChatCompletion",
            "Chat completion, JSON or streamed (SSE)",
            ChatCompletionRequest,
            {**json_body("ChatCompletion"), "text/event-stream": api.sse("ChatCompletionChunk")},
            example={"messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 16},
        ),
        "chat",
    ),
    ("POST", "/v1/completions"): Route(
        openai.completions,
        _generation(
            "createCompletion",
            "Text completion, JSON or streamed (SSE)",
            CompletionRequest,
            {**json_body("Completion"), "text/event-stream": api.sse("CompletionChunk")},
            example={"prompt": "Once upon a time", "max_tokens": 16},
        ),
        "completion",
    ),
    ("POST", "/v1/responses"): Route(
        responses.create,
        _generation(
            "createResponse",
            "A response (the Responses API): JSON, or typed events (SSE)",
            ResponsesRequest,
            {**json_body("Response"), "text/event-stream": api.sse_events("ResponseEvent")},
            description="With background: true it runs in the server, not in this "
            "connection: the answer is the queued Response (or, streamed, its events), "
            "and GET /v1/responses/{id} follows it. More 503 codes here: "
            "too_many_background_responses, response_store_full.",
            example={"input": "Hello!", "max_output_tokens": 16},
            links={
                name: (operation, "$response.body#/id")
                for name, operation in (
                    ("retrieve", "retrieveResponse"),
                    ("cancel", "cancelResponse"),
                    ("delete", "deleteResponse"),
                )
            },
        ),
        "chat",
    ),
    ("POST", "/v1/messages"): Route(
        anthropic.messages,
        _generation(
            "createMessage",
            "A message (Anthropic's Messages API): JSON, or its events (SSE)",
            MessagesRequest,
            {**json_body("Message"), "text/event-stream": api.sse_events("MessageEvent")},
            description="Errors are in Anthropic's shape (AnthropicError), with 400 where "
            "the other routes say 422; the key may come as X-Api-Key.",
            example={"max_tokens": 16, "messages": [{"role": "user", "content": "Hello!"}]},
        ),
        "chat",
        error_shape="anthropic",
    ),
    ("POST", "/v1/messages/count_tokens"): Route(
        anthropic.count_tokens,
        Doc(
            "countMessageTokens",
            "The input tokens of a message (Anthropic's Messages API)",
            "generation",
            CountTokensRequest,
            ok=json_body("MessageTokensCount"),
            example={"messages": [{"role": "user", "content": "Hello!"}]},
        ),
        "chat",
        error_shape="anthropic",
    ),
    ("POST", "/v1/embeddings"): Route(
        embeddings.handle,
        _generation(
            "createEmbedding",
            "Embeddings of one input or a batch",
            EmbeddingRequest,
            json_body("EmbeddingList"),
            example={"input": ["first text", "second text"], "dimensions": 8},
        ),
        "embedding",
    ),
    ("POST", "/generate"): Route(
        generate.handle,
        _generation(
            "generate",
            "Native generation: JSON, form or multipart with uploads; JSON or NDJSON",
            generate.GenerateRequest,
            {**json_body("Generation"), "application/x-ndjson": {"schema": api.STREAM}},
            content=(JSON, URLENCODED, MULTIPART),
            example={"prompt": "Hello", "max_tokens": 8},
        ),
        "generate",
        error_shape="detail",
    ),
    ("POST", "/v1/audio/speech"): Route(
        speech.handle,
        _generation(
            "createSpeech",
            "Text to speech: WAV or raw PCM, whole or streamed",
            speech.SpeechRequest,
            {"audio/wav": {"schema": api.BINARY}, "audio/pcm": {"schema": api.BINARY}},
            example={"input": "Hello there", "response_format": "wav"},
        ),
        "speech",
    ),
    ("POST", "/v1/images/generations"): Route(
        images.generations,
        _generation(
            "createImage",
            "n images",
            images.ImageRequest,
            json_body("Images"),
            example={"prompt": "a red square", "n": 2, "size": "32x32"},
        ),
        "image_generation",
    ),
    ("POST", "/v1/images/edits"): Route(
        images.edits,
        _generation(
            "createImageEdit",
            "n edits of an uploaded image",
            images.ImageRequest,
            json_body("Images"),
            content=(MULTIPART,),
            files=("image", "mask"),
            required_files=("image",),
        ),
        "image_edit",
    ),
    ("POST", "/v1/videos/generations"): Route(
        videos.handle,
        _generation(
            "createVideo",
            "Text to video, or video conditioned on an image or a video",
            videos.VideoRequest,
            json_body("Videos"),
            content=(JSON, MULTIPART),
            files=("image", "video"),
            example={"prompt": "waves", "num_frames": 4},
        ),
        "video_generation",
    ),
    ("POST", "/tokenize"): Route(
        tokenize.tokenize,
        Doc(
            "tokenize",
            "Token ids of a prompt, or of messages rendered by the model's chat template",
            "text",
            TokenizeRequest,
            ok=json_body("Tokenized"),
            description=_NEEDS_TOKENIZER,
            example={"prompt": "Hello, world"},
        ),
    ),
    ("POST", "/detokenize"): Route(
        tokenize.detokenize,
        Doc(
            "detokenize",
            "The text of token ids",
            "text",
            DetokenizeRequest,
            ok=json_body("Detokenized"),
            description=_NEEDS_TOKENIZER,
            example={"tokens": [1, 2, 3]},
        ),
    ),
    ("POST", "/v1/chat/completions/render"): Route(
        tokenize.render_chat,
        Doc(
            "renderChatCompletion",
            "The token ids and sampling parameters a chat request would be submitted with",
            "text",
            ChatCompletionRequest,
            ok=json_body("RenderedRequest"),
            description=_NEEDS_TOKENIZER,
            example={"messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 16},
        ),
    ),
    ("POST", "/v1/completions/render"): Route(
        tokenize.render_completion,
        Doc(
            "renderCompletion",
            "The token ids and sampling parameters a completion request would be "
            "submitted with (a list: one per prompt)",
            "text",
            CompletionRequest,
            ok={JSON: {"schema": {"type": "array", "items": api.ref("RenderedRequest")}}},
            description=_NEEDS_TOKENIZER,
            example={"prompt": "Once upon a time", "max_tokens": 16},
        ),
    ),
    ("GET", "/v1/models"): Route(
        operations.list_models,
        Doc("listModels", "Models of the connected engines", "models", ok=json_body("ModelList")),
    ),
    ("GET", "/health"): Route(
        operations.health,
        Doc(
            "health",
            "Readiness: an engine is connected and the server is not draining",
            "operations",
            ok=json_body("Status"),
            others={503: ("draining, or no engine connected", json_body("Status"))},
        ),
    ),
    ("GET", "/live"): Route(
        operations.live, Doc("live", "Liveness", "operations", ok=json_body("Status"))
    ),
    ("GET", "/metrics"): Route(
        operations.render_metrics,
        Doc(
            "metrics",
            "Prometheus metrics (docs/metrics.md)",
            "operations",
            ok={"text/plain": {"schema": {"type": "string"}}},
        ),
    ),
    ("GET", "/openapi.json"): Route(
        pages.openapi_json,
        Doc(
            "openapi",
            "This description of the API",
            "pages",
            ok={JSON: {"schema": {"type": "object"}}},
        ),
    ),
    ("GET", "/docs"): Route(
        pages.docs,
        Doc("docs", "The API's documentation, to read and try", "pages", ok=pages.HTML),
    ),
    ("GET", "/favicon.ico"): Route(
        pages.favicon,
        Doc("favicon", "The pages' icon (SVG)", "pages", ok=pages.ICON),
    ),
    ("GET", "/"): Route(
        pages.playground,
        Doc(
            "playground",
            "A page to chat with a model (a 404 with --no-playground)",
            "pages",
            ok=pages.HTML,
        ),
    ),
}
_RESPONSE_ID = "the response's id (resp_...)"
_RESPONSE_NOT_FOUND = (
    "no such response for this key on this frontend, or it expired (response_not_found)",
    json_body("Error"),
)
#: Routes whose path holds a parameter, ``{id}``: at least one character, "/" included
#: (model ids such as "org/name"), at the end of the path or before a fixed suffix
#: (``/v1/responses/{id}/cancel``).
TEMPLATED: dict[tuple[str, str], Route] = {
    ("GET", "/v1/models/{id}"): Route(
        operations.retrieve_model,
        Doc(
            "retrieveModel",
            "One model of the connected engines",
            "models",
            ok=json_body("Model"),
            parameter="the model's id (it may hold '/')",
            others={404: ("no connected engine serves it (model_not_found)", json_body("Error"))},
        ),
    ),
    ("DELETE", "/v1/requests/{id}"): Route(
        operations.cancel_request,
        Doc(
            "cancelRequest",
            "Cancel a generation request in flight (its engine request gets one abort)",
            "operations",
            ok=json_body("Cancelled"),
            parameter="the request's X-Request-Id",
            others={
                404: ("no request of this id is in flight (request_not_found)", json_body("Error"))
            },
        ),
    ),
    ("GET", "/v1/responses/{id}"): Route(
        responses.retrieve,
        Doc(
            "retrieveResponse",
            "A stored response as of now; with stream=true, a background response's events",
            "responses",
            ok={**json_body("Response"), "text/event-stream": api.sse_events("ResponseEvent")},
            parameter=_RESPONSE_ID,
            query={
                "stream": (
                    {"type": "boolean"},
                    "replay the retained events, then follow the live ones (SSE)",
                ),
                "starting_after": (
                    {"type": "integer", "minimum": 0, "maximum": 2**63 - 1},
                    "with stream: only the events after this sequence_number",
                ),
            },
            others={
                400: (
                    "the query does not read (invalid_query_parameter), or stream of a "
                    "response not made in the background (response_not_streamable)",
                    json_body("Error"),
                ),
                404: _RESPONSE_NOT_FOUND,
            },
        ),
    ),
    ("POST", "/v1/responses/{id}/cancel"): Route(
        responses.cancel,
        Doc(
            "cancelResponse",
            "Cancel a background response (its engine request gets one abort)",
            "responses",
            ok=json_body("Response"),
            parameter=_RESPONSE_ID,
            others={
                400: ("not a background response (response_not_background)", json_body("Error")),
                404: _RESPONSE_NOT_FOUND,
                409: ("it ended otherwise (response_already_finished)", json_body("Error")),
            },
        ),
    ),
    ("DELETE", "/v1/responses/{id}"): Route(
        responses.delete,
        Doc(
            "deleteResponse",
            "Forget a stored response (a background one still running is cancelled first)",
            "responses",
            ok=json_body("ResponseDeleted"),
            parameter=_RESPONSE_ID,
            others={404: _RESPONSE_NOT_FOUND},
        ),
    ),
}
#: Served only with ``--debug-endpoints`` (else unknown paths: 404), and not described in
#: ``/openapi.json``: an operator's view, not the API.
DEBUG_ROUTES: dict[tuple[str, str], Route] = {
    ("GET", "/debug/requests"): Route(
        debug.requests_in_flight,
        Doc("debugRequests", "The requests in flight (--debug-endpoints)", "operations"),
    ),
}
_PATHS = {path for _, path in ROUTES}
#: Paths whose every answer is in Anthropic's error shape (their 401 and 405 included).
_ANTHROPIC_PATHS = {path for (_, path), route in ROUTES.items() if route.error_shape == "anthropic"}


@attrs.frozen
class _Template:
    """A path of :data:`TEMPLATED`, split around its parameter."""

    method: str
    path: str
    prefix: str
    suffix: str
    route: Route

    def matches(self, path: str) -> bool:
        prefix, suffix = self.prefix, self.suffix
        return (
            len(path) > len(prefix) + len(suffix)
            and path.startswith(prefix)
            and path.endswith(suffix)
        )


def _template(method: str, path: str, route: Route) -> _Template:
    prefix, _, suffix = path.partition("{id}")
    return _Template(method, path, prefix, suffix, route)


#: The longest suffix first, so ``/v1/responses/x/cancel`` is the cancel of ``x``, not
#: ``x/cancel``.
_TEMPLATES = sorted(
    (_template(method, path, route) for (method, path), route in TEMPLATED.items()),
    key=lambda template: -len(template.suffix),
)


def _templates(method: str, path: str) -> tuple[_Template | None, list[_Template]]:
    """The template that serves ``method`` on ``path`` (or None), and every template
    ``path`` matches."""
    matching = [template for template in _TEMPLATES if template.matches(path)]
    serving = next((t for t in matching if t.method == method), None)
    return serving, matching


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
        return api.build_spec(
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
        except HTTPError as error:
            await self._refuse_websocket(scope, receive, send, error, arrived)
            return
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
        if path in _PATHS or (exchange.method, path) in self.routes:
            return path
        serving, matching = _templates(exchange.method, path)
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
            if exchange.path in _ANTHROPIC_PATHS:
                exchange.error_shape = "anthropic"  # before the key's check: its 401 too
            if self.api_keys.enabled and exchange.path not in self.open_paths:
                headers = exchange.head.headers
                exchange.key_index = self.api_keys.authenticate(
                    header_values(headers, b"authorization"), header_values(headers, b"x-api-key")
                )
            route = self.routes.get((exchange.method, exchange.path)) or _fallback(exchange)
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


def _fallback(exchange: Exchange) -> Route:
    """A templated route (``/v1/models/{id}``), else the 405 or 404 for a path no route
    serves."""
    path = exchange.path
    serving, matching = _templates(exchange.method, path)
    if serving is not None:
        return serving.route
    allowed = {m for m, p in ROUTES if p == path} | {t.method for t in matching}
    if allowed:
        raise HTTPError(
            405,
            f"method {exchange.method} not allowed on {path}",
            "method_not_allowed",
            headers=[(b"allow", ", ".join(sorted(allowed)).encode())],
        )
    raise HTTPError(404, f"no route {exchange.method} {path}", "not_found")


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
