"""What routes need, in one place: the engines, the settings, the requests in flight, the
drain's state, admission, and the checks every generation route makes.

Routes take a :class:`Services` and an :class:`~trioserve.http.exchange.Exchange`; the
application (``app.py``) only dispatches to them (the table of each is at the end of its
module, gathered in ``routes/table.py``), so no route reaches into it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import attrs

from ..config import Settings, default_max_connections, per_key_bound
from ..ends import EndReason
from ..engine import EngineClient
from ..protocol import Submit
from ..text.agents import ParserNames
from ..text.assets import ModelText
from ..text.registry import TextRegistry
from .admission import Admission, KeyShares
from .bodies.forms import JSON, MULTIPART, URLENCODED, Body, read_body
from .bodies.media import IPNetwork, MediaFetcher, parse_networks
from .bodies.uploads import Uploads
from .bodies.validation import invalid, parse_json
from .errors import HTTPError
from .exchange import Exchange, ServerState
from .lifecycle import Generations, Registry, RequestHandle
from .memory import MemoryBudget, body_budget, held_by
from .observe import Observer
from .responses_store import ResponseStore
from .writers.stream import Writer

#: What each capability an engine may declare is called in a 404 for a missing one.
CAPABILITY_NAMES = {
    "chat": "chat completions",
    "completion": "text completions",
    "generate": "native generation",
    "speech": "speech synthesis",
    "image_generation": "image generation",
    "image_edit": "image editing",
    "video_generation": "video generation",
    "embedding": "embeddings",
}


class Connection(Protocol):
    """A connection that carries several requests (a WebSocket): the drain ends it; the
    live view (``GET /debug/requests``) shows it."""

    #: Its number (the ``socket`` of its requests' handles), the client's address, and
    #: when it opened (``time.perf_counter``).
    number: int
    client: tuple[str, int] | None
    opened: float

    def end(self, reason: EndReason) -> None: ...


@attrs.define(eq=False)
class Services:
    engines: EngineClient
    settings: Settings = attrs.Factory(Settings)
    #: Requests in flight, for explicit cancel and the drain deadline.
    registry: Registry = attrs.Factory(Registry)
    #: What the drain controller has decided so far.
    state: ServerState = attrs.Factory(ServerState)
    #: Open WebSocket connections (each ends its own requests).
    connections: set[Connection] = attrs.Factory(set)
    #: Metrics, traces and the access log (``observe.py``).
    observer: Observer = attrs.Factory(Observer)
    admission: Admission = attrs.field(init=False)
    #: Each API key's share of open WebSockets (``--max-websockets-per-key``).
    websocket_shares: KeyShares = attrs.field(init=False)
    #: Request bodies held in memory across requests (``--max-body-memory-mb``).
    body_budget: MemoryBudget = attrs.field(init=False)
    #: The description of the API as JSON (``/openapi.json``): the application's, which
    #: knows the route table.
    openapi: Callable[[], bytes] | None = None
    #: With ``--workers``: how many workers are up, of how many (``server/workers.py``),
    #: for ``/health``.
    workers: Callable[[], dict[str, int] | None] | None = None
    #: Background and stored responses (``/v1/responses``); its ``serve`` runs in the
    #: server's nursery (``server/frontend.py``).
    responses: ResponseStore = attrs.field(init=False)
    #: The formats answers are parsed in for tool calls and reasoning (``text/agents``).
    parsers: ParserNames = attrs.field(init=False)
    #: The served models' text assets (``/tokenize`` and the render routes; an engine link
    #: that takes token ids registers its model's here): ``--tokenizer`` sets the default.
    texts: TextRegistry = attrs.Factory(TextRegistry)

    #: ``--remote-media-allow``, parsed once.
    media_allowed: list[IPNetwork] = attrs.field(init=False)
    #: The request lifecycle bound to these engines, registry, observer and stream
    #: buffer: every generation request runs through its ``run``.
    generations: Generations = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        settings = self.settings
        self.parsers = ParserNames(
            settings.tool_call_parser or None,
            settings.reasoning_parser or None,
            settings.tool_strict_level,
        )
        if settings.tokenizer and self.texts.default is None:
            self.texts.set_default(ModelText.load(settings.tokenizer))
        self.media_allowed = parse_networks(settings.remote_media_allow)
        self.admission = Admission(
            settings.max_concurrent_requests,
            keys=len(settings.api_keys),
            per_key=settings.max_requests_per_key,
        )
        self.body_budget = body_budget(settings.max_body_memory_bytes)
        self.websocket_shares = KeyShares(
            per_key_bound(
                settings.max_websockets_per_key,
                settings.max_connections or default_max_connections(),
                len(settings.api_keys),
            ),
            "WebSockets",
            "--max-websockets-per-key",
            "too_many_websockets_for_key",
            closes=False,
        )
        self.generations = Generations(
            self.engines, self.registry, self.observer, settings.stream_buffer
        )
        self.responses = ResponseStore(
            ttl=settings.responses_ttl,
            max_events=settings.responses_max_events,
            max_background=settings.max_background_responses,
            max_bytes=settings.responses_store_bytes,
            tenants=len(settings.api_keys),
            quota=settings.responses_store_bytes_per_key,
        )

    # -- checks every generation route makes ---------------------------------------------

    def check_accepting(self) -> None:
        if self.state.finished:
            raise HTTPError(503, "the server is shutting down", "server_shutting_down")

    def begin(self, exchange: Exchange) -> float:
        """Checks every generation route makes before reading its body; the deadline."""
        self.check_accepting()
        return self.timeout(exchange.header(b"x-request-timeout"), "X-Request-Timeout")

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

    def resolve_model(self, requested: str | None) -> str:
        engines = self.engines
        if requested is None:
            default = engines.default_model()
            if default is not None:
                return default
        elif engines.serves_model(requested):
            return requested
        models = [card.id for card in engines.models()]
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

    # -- request bodies ------------------------------------------------------------------

    async def json_body(self, exchange: Exchange) -> dict[str, Any]:
        raw = await exchange.read_body(self.settings.max_body_bytes, self.settings.body_timeout)
        body = parse_json(raw)
        exchange.memory.take(held_by(body))  # the parsed body, beside the bytes read
        if not isinstance(body, dict):
            raise invalid([{"loc": "$", "msg": "the body must be a JSON object"}])
        return body

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

    def media_fetcher(self) -> MediaFetcher:
        settings = self.settings
        return MediaFetcher(
            allow_remote=settings.allow_remote_media,
            max_bytes=settings.remote_media_max_bytes,
            timeout=settings.remote_media_timeout,
            allowed=self.media_allowed,
        )

    def uploads(self) -> Uploads:
        return Uploads(self.settings.upload_dir)

    # -- running requests ----------------------------------------------------------------

    async def run(
        self,
        exchange: Exchange,
        submit: Submit,
        capability: str,
        writer: Writer,
        timeout: float,
        *,
        keepalive: float = 0,
        buffer: int = 0,
    ) -> None:
        """One generation request of ``exchange``, through the request lifecycle, in an
        admission slot (taken now, its body complete). ``buffer``: outputs the request may
        have queued, when it needs more than ``--stream-buffer`` (an answer of a known
        number of items all made in one step)."""
        submit = with_session(exchange, submit)
        handle = RequestHandle(
            submit.request_id,
            owner=exchange.key_index,
            route=exchange.path,
            transport=writer.transport,
            client=exchange.head.client,
            headers=exchange.headers,
            arrived=exchange.arrived,
        )
        exchange.handle = handle
        with self.admission.take(exchange.key_index):
            await self.generations.run(
                handle,
                submit,
                capability,
                writer,
                timeout,
                watch_disconnect=exchange.watch_disconnect,
                keepalive=keepalive,
                buffer=buffer,
            )

    def end_all(self, reason: EndReason) -> int:
        """End every request in flight (the drain deadline); returns how many."""
        self.state.finished = True
        ended = self.registry.end_all(reason)
        for connection in list(self.connections):
            connection.end(reason)
        return ended


#: Characters of an ``X-Session-Id`` kept (a longer one routes by its start).
MAX_SESSION_KEY = 256


def with_session(exchange: Exchange, submit: Submit) -> Submit:
    """``submit`` with the client's ``X-Session-Id`` as its session key (over the body's
    ``user``): the key affinity routing keeps on one engine (engine/routing.py)."""
    session = exchange.header(b"x-session-id")
    if not session:
        return submit
    key = session.decode("latin-1")[:MAX_SESSION_KEY]
    return submit if key == submit.session_key else attrs.evolve(submit, session_key=key)
