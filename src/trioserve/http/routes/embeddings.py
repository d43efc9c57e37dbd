"""``POST /v1/embeddings``: one engine request for the whole batch (see
``bodies/embeddings.py`` for why), answered as JSON once every embedding has come."""

from __future__ import annotations

from ..bodies.embeddings import EmbeddingRequest, parse_embeddings
from ..exchange import Exchange
from ..openapi.content import json_body
from ..services import Services
from ..writers.embeddings import EmbeddingsWriter
from .route import Route, Routes, generation_doc


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


# -- the routes ----------------------------------------------------------------------

ROUTES: Routes = {
    ("POST", "/v1/embeddings"): Route(
        handle,
        generation_doc(
            "createEmbedding",
            "Embeddings of one input or a batch",
            EmbeddingRequest,
            json_body("EmbeddingList"),
            example={"input": ["first text", "second text"], "dimensions": 8},
        ),
        "embedding",
    ),
}
