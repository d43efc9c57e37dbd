"""The ASGI application: routes, and the glue between an exchange and its lifecycle."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from .. import metrics
from ..config import Settings
from ..engine import EngineClient
from .errors import HTTPError
from .exchange import ClientGone, Exchange, Receive, Send, ServerState
from .lifecycle import Registry, run_generation
from .openai_api import (
    StreamFormat,
    chat_submit,
    completion_submit,
    parse_chat,
    parse_completion,
)
from .validation import invalid, parse_json
from .writers import JSONWriter, SSEWriter

log = logging.getLogger("trioserve.http")

Handler = Callable[[Exchange], Awaitable[None]]


class App:
    """trioserve's ASGI application. ``draining`` is flipped by the drain controller."""

    def __init__(self, engines: EngineClient, settings: Settings | None = None) -> None:
        self.engines = engines
        self.settings = settings or Settings()
        self.registry = Registry()
        self.state = ServerState()
        self._routes: dict[tuple[str, str], Handler] = {
            ("POST", "/v1/chat/completions"): self.chat_completions,
            ("POST", "/v1/completions"): self.completions,
            ("GET", "/v1/models"): self.list_models,
            ("GET", "/health"): self.health,
            ("GET", "/live"): self.live,
            ("GET", "/metrics"): self.metrics,
        }
        self._paths = {path for _, path in self._routes}

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self._http(Exchange(scope, receive, send, self.state))
        elif kind == "lifespan":
            await _lifespan(receive, send)
        elif kind == "websocket":
            await send({"type": "websocket.close", "code": 1008})

    async def _http(self, exchange: Exchange) -> None:
        try:
            handler = self._routes.get((exchange.method, exchange.path))
            if handler is None:
                handler = self._fallback(exchange)
            await handler(exchange)
        except HTTPError as error:
            if not exchange.started:
                await exchange.respond_error(error)
        except ClientGone:
            pass

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
        body = await self._json_body(exchange)
        req = parse_chat(body)
        model = self._model(req.model)
        submit = chat_submit(exchange.request_id, model, req, body)
        await self._generate(exchange, submit, "chat", bool(req.stream), req.stream_options)

    async def completions(self, exchange: Exchange) -> None:
        body = await self._json_body(exchange)
        req = parse_completion(body)
        model = self._model(req.model)
        submit = completion_submit(exchange.request_id, model, req, body)
        await self._generate(exchange, submit, "completion", bool(req.stream), req.stream_options)

    async def _json_body(self, exchange: Exchange) -> dict[str, Any]:
        raw = await exchange.read_body(self.settings.max_body_bytes)
        body = parse_json(raw)
        if not isinstance(body, dict):
            raise invalid([{"loc": "$", "msg": "the body must be a JSON object"}])
        return body

    def _model(self, requested: str | None) -> str:
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

    def _timeout(self, exchange: Exchange) -> float:
        settings = self.settings
        raw = exchange.header(b"x-request-timeout")
        if raw is None:
            return settings.request_timeout
        try:
            value = float(raw)
        except ValueError:
            value = -1.0
        if not value > 0 or value != value:
            raise HTTPError(
                400,
                "X-Request-Timeout must be a positive number of seconds",
                "invalid_request_timeout",
            )
        return min(value, settings.max_request_timeout)

    async def _generate(
        self, exchange: Exchange, submit: Any, capability: str, stream: bool, options: Any
    ) -> None:
        if self.state.finished:
            raise HTTPError(503, "the server is shutting down", "server_shutting_down")
        timeout = self._timeout(exchange)
        fmt = StreamFormat(
            capability,
            exchange.request_id,
            submit.model,
            include_usage=bool(options and options.include_usage),
        )
        writer = SSEWriter(exchange, fmt) if stream else JSONWriter(exchange, fmt)
        await run_generation(
            engines=self.engines,
            registry=self.registry,
            exchange=exchange,
            submit=submit,
            capability=capability,
            writer=writer,
            timeout=timeout,
            buffer=self.settings.stream_buffer,
        )

    def end_all(self, reason: str) -> int:
        """End every request in flight (the drain deadline); returns how many."""
        self.state.finished = True
        return self.registry.end_all(reason)

    async def cancel_request(self, exchange: Exchange) -> None:
        request_id = exchange.path.removeprefix("/v1/requests/")
        handle = self.registry.get(request_id)
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


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
        await trio.lowlevel.checkpoint()
