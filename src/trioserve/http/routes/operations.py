"""Operations: models, readiness, liveness, metrics, and cancelling a request by id."""

from __future__ import annotations

from typing import Any

from ... import metrics
from ...ends import EndReason
from ...protocol import ModelCard
from ..errors import HTTPError
from ..exchange import Exchange
from ..openapi.content import Doc, json_body
from ..services import Services
from .route import Route, Routes

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


# -- the routes ----------------------------------------------------------------------

ROUTES: Routes = {
    ("GET", "/v1/models"): Route(
        list_models,
        Doc("listModels", "Models of the connected engines", "models", ok=json_body("ModelList")),
    ),
    ("GET", "/health"): Route(
        health,
        Doc(
            "health",
            "Readiness: an engine is connected and the server is not draining",
            "operations",
            ok=json_body("Status"),
            others={503: ("draining, or no engine connected", json_body("Status"))},
        ),
    ),
    ("GET", "/live"): Route(live, Doc("live", "Liveness", "operations", ok=json_body("Status"))),
    ("GET", "/metrics"): Route(
        render_metrics,
        Doc(
            "metrics",
            "Prometheus metrics (docs/metrics.md)",
            "operations",
            ok={"text/plain": {"schema": {"type": "string"}}},
        ),
    ),
}

#: Routes whose path holds a parameter, ``{id}`` (``table.py`` matches them).
TEMPLATED: Routes = {
    ("GET", "/v1/models/{id}"): Route(
        retrieve_model,
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
        cancel_request,
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
}
