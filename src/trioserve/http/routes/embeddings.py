"""``POST /v1/embeddings``: one engine request for the whole batch (see
``bodies/embeddings.py`` for why), answered as JSON once every embedding has come."""

from __future__ import annotations

from ..bodies.embeddings import parse_embeddings
from ..exchange import Exchange
from ..services import Services
from ..writers.embeddings import EmbeddingsWriter


async def handle(services: Services, exchange: Exchange) -> None:
    timeout = services.begin(exchange)
    body = await services.json_body(exchange)
    request = parse_embeddings(body, exchange.request_id, services.resolve_model)
    submit = request.submit
    writer = EmbeddingsWriter(
        exchange, submit.model, request.count, request.encoding_format, request.dimensions
    )
    # Every embedding may come in one engine step, and the writer takes them as they
    # come: room for all of them (bounded by MAX_INPUTS) and the final item.
    await services.run(exchange, submit, "embedding", writer, timeout, buffer=request.count + 1)
