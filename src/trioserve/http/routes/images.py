"""``POST /v1/images/generations`` and ``POST /v1/images/edits``.

``n`` images are ``n`` engine requests (ids ``<request id>.<i>``) run at once by
:func:`~trioserve.http.fanout.run_group`, with seeds ``seed + i``: image 0 is the image the
same request with ``n = 1`` gets. Without a ``seed``, ``n = 1`` sends none and ``n > 1``
draws a random base seed. Images come back as ``b64_json`` (``url`` would need storage
this frontend does not have).
"""

from __future__ import annotations

import base64
import json
import secrets
import time
from typing import Any

import attrs

from ...protocol import Submit
from ..bodies.forms import JSON, MULTIPART, Body, extra_params, invalid_fields, structure_fields
from ..bodies.validation import bounded, check_bounds, documented
from ..errors import HTTPError
from ..exchange import JSON_HEADERS, Exchange
from ..fanout import run_group
from ..openapi.content import json_body
from ..services import Services
from ..writers.stream import Collected
from .route import Route, Routes, generation_doc

RESPONSE_FORMATS = ("b64_json",)
MAX_N = 10


@attrs.define
class ImageRequest:
    prompt: str
    model: str | None = None
    n: int | None = bounded(1, MAX_N)
    size: str | None = None
    quality: str | None = None
    style: str | None = None
    response_format: str | None = documented(enum=list(RESPONSE_FORMATS))
    seed: int | None = bounded()  # any int64
    user: str | None = None


def parse(body: Body) -> ImageRequest:
    req = structure_fields(body, ImageRequest)
    errors: list[dict[str, str]] = []
    check_bounds(req, errors)
    if errors:
        raise invalid_fields(body, errors)
    if req.response_format is not None and req.response_format not in RESPONSE_FORMATS:
        raise HTTPError(
            400,
            f"response_format {req.response_format!r} is not supported; supported: "
            + ", ".join(RESPONSE_FORMATS),
            "unsupported_response_format",
            param="response_format",
        )
    return req


def submits(
    request_id: str,
    model: str,
    task: str,
    req: ImageRequest,
    inputs: dict[str, Any],
    body: Body,
    exclude: frozenset[str] = frozenset(),
) -> list[Submit]:
    n = req.n or 1
    params = extra_params(body, ImageRequest, exclude)
    for name in ("size", "quality", "style"):
        if getattr(req, name) is not None:
            params[name] = getattr(req, name)
    seed = req.seed
    if seed is None and n > 1:
        seed = secrets.randbelow(2**31)
    out = []
    for i in range(n):
        member_params = dict(params)
        if seed is not None:
            member_params["seed"] = seed + i
        out.append(Submit(f"{request_id}.{i}", model, task, inputs, member_params))
    return out


async def _serve(
    services: Services, exchange: Exchange, group: list[Submit], task: str, timeout: float
) -> None:
    created = int(time.time())

    async def answer(results: list[Collected]) -> None:
        data = []
        for collected in results:
            image = collected.first("image")
            if image is None:
                raise HTTPError(502, "the engine sent no image", "engine_no_image")
            data.append({"b64_json": base64.b64encode(bytes(image.data)).decode()})
        body = json.dumps({"created": created, "data": data}, separators=(",", ":")).encode()
        await exchange.respond(200, body, JSON_HEADERS)

    await run_group(services, exchange, group, task, timeout, answer)


async def generations(services: Services, exchange: Exchange) -> None:
    timeout = services.begin(exchange)
    body = await services.read_form(exchange, uploads=None, accepted=(JSON,))
    req = parse(body)
    model = services.resolve_model(req.model)
    inputs = {"prompt": req.prompt}
    group = submits(exchange.request_id, model, "image_generation", req, inputs, body)
    await _serve(services, exchange, group, "image_generation", timeout)


async def edits(services: Services, exchange: Exchange) -> None:
    timeout = services.begin(exchange)
    with services.uploads() as uploads:
        body = await services.read_form(exchange, uploads=uploads, accepted=(MULTIPART,))
        images = body.files.get("image", []) + body.files.get("image[]", [])
        if not images:
            raise HTTPError(
                400,
                "an image file is required (multipart field 'image')",
                "missing_image",
                param="image",
            )
        req = parse(body)
        inputs: dict[str, Any] = {
            "prompt": req.prompt,
            "image": images[0].record(),
            "images": [m.record() for m in images],
        }
        masks = body.files.get("mask")
        if masks:
            inputs["mask"] = masks[0].record()
        model = services.resolve_model(req.model)
        group = submits(exchange.request_id, model, "image_edit", req, inputs, body)
        # The uploads stay on disk until every member has ended.
        await _serve(services, exchange, group, "image_edit", timeout)


# -- the routes ----------------------------------------------------------------------

ROUTES: Routes = {
    ("POST", "/v1/images/generations"): Route(
        generations,
        generation_doc(
            "createImage",
            "n images",
            ImageRequest,
            json_body("Images"),
            example={"prompt": "a red square", "n": 2, "size": "32x32"},
        ),
        "image_generation",
    ),
    ("POST", "/v1/images/edits"): Route(
        edits,
        generation_doc(
            "createImageEdit",
            "n edits of an uploaded image",
            ImageRequest,
            json_body("Images"),
            content=(MULTIPART,),
            files=("image", "mask"),
            required_files=("image",),
        ),
        "image_edit",
    ),
}
