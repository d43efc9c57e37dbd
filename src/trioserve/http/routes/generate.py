"""``POST /generate``: the native route, for clients of the Python servers it replaces.

Accepts ``multipart/form-data`` (fields and file uploads), ``application/x-www-form-urlencoded``
and JSON. Answers JSON, or NDJSON (one output per line) with ``stream``/``streaming``.
Errors use the ``{"detail": ..., "code": ...}`` shape (see docs/api.md).
"""

from __future__ import annotations

import json
import time
from typing import Any

import attrs

from ...protocol import Submit
from ..bodies.forms import Body, extra_params, invalid_fields, structure_fields
from ..bodies.openai import STOP_SCHEMA
from ..bodies.validation import bounded, check_bounds, documented
from ..exchange import JSON_HEADERS, Exchange
from ..openapi.content import JSON, MULTIPART, STREAM, URLENCODED, json_body
from ..services import Services
from ..writers.ndjson import NDJSONWriter, media_json
from ..writers.openai import usage_dict
from ..writers.stream import Collected, CollectingWriter
from .route import Route, Routes, generation_doc


@attrs.define
class GenerateRequest:
    prompt: str
    model: str | None = None
    stream: bool | None = None
    streaming: bool | None = None  # the same, as the native clients spell it
    max_tokens: int | None = bounded(1)
    temperature: float | None = bounded(0, 2)
    top_p: float | None = bounded(0, 1, exclusive_minimum=True)
    seed: int | None = bounded()  # any int64
    stop: Any = documented(**STOP_SCHEMA)


#: Fields about the exchange, not generation: never sent as params.
_NOT_PARAMS = frozenset({"prompt", "model", "stream", "streaming"})


def parse(body: Body) -> GenerateRequest:
    req = structure_fields(body, GenerateRequest)
    errors: list[dict[str, str]] = []
    check_bounds(req, errors)
    if req.stop is not None and not isinstance(req.stop, str | list):
        errors.append({"loc": "$.stop", "msg": "expected a string or a list of strings"})
    if errors:
        raise invalid_fields(body, errors)
    return req


def build_submit(request_id: str, model: str, req: GenerateRequest, body: Body) -> Submit:
    media = [m.record() for m in body.uploads]
    modalities = ["text"]
    for m in body.uploads:
        if m.modality not in modalities:
            modalities.append(m.modality)
    params = extra_params(body, GenerateRequest)
    for name in ("max_tokens", "temperature", "top_p", "seed", "stop"):
        value = getattr(req, name)
        if value is not None:
            params[name] = value
    inputs = {"prompt": req.prompt, "media": media, "modalities": modalities}
    return Submit(request_id, model, "generate", inputs, params)


async def handle(services: Services, exchange: Exchange) -> None:
    timeout = services.begin(exchange)
    with services.uploads() as uploads:
        body = await services.read_form(exchange, uploads=uploads)
        req = parse(body)
        stream = req.streaming if req.streaming is not None else req.stream
        submit = build_submit(exchange.request_id, services.resolve_model(req.model), req, body)
        if stream:
            writer: Any = NDJSONWriter(exchange, submit.request_id)
        else:
            writer = CollectingWriter(exchange, _answer(exchange, submit))
        # The uploads stay on disk until the request has ended, however it ends.
        await services.run(exchange, submit, "generate", writer, timeout)


def _answer(exchange: Exchange, submit: Submit) -> Any:
    created = int(time.time())

    async def complete(collected: Collected) -> None:
        body = {
            "id": submit.request_id,
            "object": "generation",
            "created": created,
            "model": submit.model,
            "text": "".join(collected.text),
            "media": [media_json(m.modality, m.mime_type, bytes(m.data)) for m in collected.media],
            "finish_reason": collected.finish_reason,
            # vLLM's field, as chat and completions carry it: the stop string or stop
            # token id that ended the answer, null otherwise.
            "stop_reason": collected.stop_reason,
            "usage": usage_dict(collected.usage),
        }
        await exchange.respond(200, json.dumps(body, separators=(",", ":")).encode(), JSON_HEADERS)

    return complete


# -- the routes ----------------------------------------------------------------------

ROUTES: Routes = {
    ("POST", "/generate"): Route(
        handle,
        generation_doc(
            "generate",
            "Native generation: JSON, form or multipart with uploads; JSON or NDJSON",
            GenerateRequest,
            {**json_body("Generation"), "application/x-ndjson": {"schema": STREAM}},
            content=(JSON, URLENCODED, MULTIPART),
            example={"prompt": "Hello", "max_tokens": 8},
        ),
        "generate",
        error_shape="detail",
    ),
}
