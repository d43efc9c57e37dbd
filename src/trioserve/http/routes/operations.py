"""Operations: models, readiness, liveness, metrics, and cancelling a request by id."""

from __future__ import annotations

from typing import Any

from ... import metrics
from ...ends import EndReason
from ...errors import HTTPError
from ...protocol import ModelCard
from ..exchange import Exchange
from ..services import Services

#: ``GET /v1/models/{id}``: the id is the rest of the path ("/" included: "org/name").
MODEL_PREFIX = "/v1/models/"


def _model(card: ModelCard) -> dict[str, Any]:
    return {"id": card.id, "object": "model", "created": 0, "owned_by": card.owned_by}


async def list_models(services: Services, exchange: Exchange) -> None:
    data = [_model(card) for card in services.engines.models()]
    await exchange.respond_json(200, {"object": "list", "data": data})


async def retrieve_model(services: Services, exchange: Exchange) -> None:
    """``GET /v1/models/{id}``: one model of the connected engines, or 404."""
    model_id = exchange.path.removeprefix(MODEL_PREFIX)
    cards = services.engines.models()
    for card in cards:
        if card.id == model_id:
            await exchange.respond_json(200, _model(card))
            return
    available = ", ".join(card.id for card in cards) or "none: no engine is connected"
    raise HTTPError(
        404,
        f"model {model_id!r} is not served here (available: {available})",
        "model_not_found",
    )


async def health(services: Services, exchange: Exchange) -> None:
    """Readiness: an engine is connected and the server is not draining. With
    ``--workers``, how many workers are up too (this one answers, so it is ready)."""
    body: dict[str, object]
    if services.state.draining:
        status, body = 503, {"status": "draining"}
    elif not services.engines.ready:
        status, body = 503, {"status": "no_engine"}
    else:
        status, body = 200, {"status": "ok"}
    if services.workers is not None:
        workers = services.workers()
        if workers is not None:
            body["workers"] = workers
    await exchange.respond_json(status, body)


async def live(services: Services, exchange: Exchange) -> None:
    await exchange.respond_json(200, {"status": "alive"})


async def render_metrics(services: Services, exchange: Exchange) -> None:
    body, content_type = metrics.render()
    await exchange.respond(200, body, [(b"content-type", content_type.encode())])


async def cancel_request(services: Services, exchange: Exchange) -> None:
    """``DELETE /v1/requests/{id}``: end a request in flight, with one abort."""
    request_id = exchange.path.removeprefix("/v1/requests/")
    # Another key's request answers as an unknown one: its existence is not revealed.
    handle = services.registry.owned(request_id, exchange.key_index)
    if handle is None:
        raise HTTPError(404, f"no request {request_id!r} is in flight", "request_not_found")
    handle.end(EndReason.CANCEL)
    await exchange.respond_json(200, {"id": request_id, "object": "request", "cancelled": True})
