"""``POST /generate``: the native route, for clients of the Python servers it replaces.

Accepts ``multipart/form-data`` (fields and file uploads), ``application/x-www-form-urlencoded``
and JSON. Answers JSON, or NDJSON (one output per line) with ``stream``/``streaming``.
Errors use the ``{"detail": ..., "code": ...}`` shape (see docs/api.md).
"""

from __future__ import annotations

import base64
import json
import time
from typing import TYPE_CHECKING, Any

import attrs

from ..protocol import OutputItem, Submit
from .errors import HTTPError
from .exchange import JSON_HEADERS, Exchange
from .forms import Body, extra_params, invalid_fields, structure_fields
from .openai_api import usage_dict
from .writers import Collected, CollectingWriter, EngineItemError, end_batch, engine_error

if TYPE_CHECKING:
    from .app import App

NDJSON_HEADERS = [
    (b"content-type", b"application/x-ndjson"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


@attrs.define
class GenerateRequest:
    prompt: str
    model: str | None = None
    stream: bool | None = None
    streaming: bool | None = None  # the same, as the native clients spell it
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: Any = None


#: Fields about the exchange, not generation: never sent as params.
_NOT_PARAMS = frozenset({"prompt", "model", "stream", "streaming"})


def parse(body: Body) -> GenerateRequest:
    req = structure_fields(body, GenerateRequest)
    errors = []
    if req.max_tokens is not None and req.max_tokens < 1:
        errors.append({"loc": "$.max_tokens", "msg": "must be at least 1"})
    if req.temperature is not None and not 0 <= req.temperature <= 2:
        errors.append({"loc": "$.temperature", "msg": "must be between 0 and 2"})
    if req.top_p is not None and not 0 < req.top_p <= 1:
        errors.append({"loc": "$.top_p", "msg": "must be greater than 0 and at most 1"})
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


async def handle(app: App, exchange: Exchange) -> None:
    timeout = app.begin(exchange)
    with app.uploads() as uploads:
        body = await app.read_form(exchange, uploads=uploads)
        req = parse(body)
        stream = req.streaming if req.streaming is not None else req.stream
        submit = build_submit(exchange.request_id, app.resolve_model(req.model), req, body)
        if stream:
            writer: Any = NDJSONWriter(exchange, submit.request_id)
        else:
            writer = CollectingWriter(exchange, _answer(exchange, submit))
        # The uploads stay on disk until the request has ended, however it ends.
        await app.run(exchange, submit, "generate", writer, timeout)


def _media_json(modality: str, mime_type: str | None, data: bytes) -> dict[str, Any]:
    return {
        "modality": modality,
        "mime_type": mime_type,
        "data": base64.b64encode(data).decode(),
    }


def _answer(exchange: Exchange, submit: Submit) -> Any:
    created = int(time.time())

    async def complete(collected: Collected) -> None:
        body = {
            "id": submit.request_id,
            "object": "generation",
            "created": created,
            "model": submit.model,
            "text": "".join(collected.text),
            "media": [_media_json(m.modality, m.mime_type, bytes(m.data)) for m in collected.media],
            "finish_reason": collected.finish_reason,
            "usage": usage_dict(collected.usage),
        }
        await exchange.respond(200, json.dumps(body, separators=(",", ":")).encode(), JSON_HEADERS)

    return complete


def output_line(request_id: str, item: OutputItem) -> bytes:
    line: dict[str, Any] = {"id": request_id, "seq": item.seq, "modality": item.modality}
    data = item.data
    if isinstance(data, str) and item.modality == "text":
        line["text"] = data
    elif data is not None:
        raw = data.encode() if isinstance(data, str) else data
        line.update(_media_json(item.modality, item.mime_type, raw))
    if item.finish_reason is not None:
        line["finish_reason"] = item.finish_reason
        line["usage"] = usage_dict(item.usage)
    return json.dumps(line, separators=(",", ":")).encode() + b"\n"


class NDJSONWriter:
    """``application/x-ndjson``: one line per engine output; the last carries
    ``finish_reason`` and ``usage``. Starts with the first output, so an error before it
    keeps its status; after it, the stream ends with a ``{"detail", "code"}`` line."""

    def __init__(self, exchange: Exchange, request_id: str) -> None:
        self.exchange = exchange
        self.request_id = request_id

    async def write(self, batch: list[OutputItem]) -> bool:
        out: list[bytes] = []
        done = False
        failure: EngineItemError | None = None
        for item in batch:
            if item.error is not None:
                failure = engine_error(item)
                break
            if item.data is not None or item.finish_reason is not None:
                out.append(output_line(self.request_id, item))
            if item.finish_reason is not None:
                done = True
                break
        return await end_batch(self.exchange, NDJSON_HEADERS, out, done, failure)

    async def fail(self, error: HTTPError) -> None:
        exchange = self.exchange
        if not exchange.started:
            await exchange.respond_error(error)
        else:
            await exchange.body(error.detail_body() + b"\n", more=False)
