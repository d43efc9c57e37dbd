"""``POST /v1/videos/generations``: text to video, or video conditioned on an image or a
video (one of them: both at once is a 400).

JSON (conditioning as a data URI or, with ``--allow-remote-media``, an ``http(s)`` URL,
given as a string or ``{"url": ...}``) or multipart (conditioning as an uploaded ``image``
or ``video`` file). ``num_frames`` and ``fps`` are checked here and sent as params; every
other field the route does not know (``negative_prompt``, ``guidance_scale``, …) goes to
the engine verbatim. The answer is ``{"created", "data": [{"b64_json", "mime_type"}]}``.
"""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import attrs

from ...protocol import Submit
from ..bodies.forms import JSON, MULTIPART, Body, extra_params, invalid_fields, structure_fields
from ..bodies.media import Media
from ..bodies.validation import bounded, check_bounds, documented
from ..errors import EngineItemError, HTTPError
from ..exchange import JSON_HEADERS, Exchange
from ..openapi.content import json_body
from ..services import Services
from ..writers.stream import Collected, CollectingWriter
from .route import Route, Routes, generation_doc

#: Conditioning fields, and the modality each carries.
CONDITIONING = {"image": "image", "video": "video"}
_CONDITIONING_SCHEMA = {
    "anyOf": [
        {"type": "string", "description": "a data URI, or an http(s) URL"},
        {"type": "object", "properties": {"url": {"type": "string"}}, "required": ["url"]},
        {"type": "null"},
    ]
}


@attrs.define
class VideoRequest:
    prompt: str
    model: str | None = None
    num_frames: int | None = bounded(1)
    fps: float | None = bounded(0, exclusive_minimum=True)
    size: str | None = None
    seed: int | None = bounded()  # any int64
    # A data URI or URL, as a string or {"url": ...}; or (multipart) an uploaded file.
    image: Any = documented(**_CONDITIONING_SCHEMA)
    video: Any = documented(**_CONDITIONING_SCHEMA)


def parse(body: Body) -> VideoRequest:
    req = structure_fields(body, VideoRequest)
    errors: list[dict[str, str]] = []
    check_bounds(req, errors)
    if errors:
        raise invalid_fields(body, errors)
    return req


async def conditioning(services: Services, req: VideoRequest, body: Body) -> dict[str, Media]:
    given: dict[str, Media] = {}
    fetcher = services.media_fetcher()
    for name, modality in CONDITIONING.items():
        files = body.files.get(name)
        value = getattr(req, name)
        if files:
            given[name] = files[0]
        elif value is not None:
            url = value.get("url") if isinstance(value, dict) else value
            given[name] = await fetcher.resolve(url, modality, f"$.{name}")
    if len(given) > 1:
        raise HTTPError(
            400,
            "condition on an image or on a video, not both",
            "conflicting_conditioning",
            param="video",
        )
    return given


async def handle(services: Services, exchange: Exchange) -> None:
    timeout = services.begin(exchange)
    with services.uploads() as uploads:
        body = await services.read_form(exchange, uploads=uploads, accepted=(JSON, MULTIPART))
        req = parse(body)
        inputs: dict[str, Any] = {"prompt": req.prompt}
        for name, media in (await conditioning(services, req, body)).items():
            inputs[name] = media.record()
        params = extra_params(body, VideoRequest)
        for name in ("num_frames", "fps", "size", "seed"):
            if getattr(req, name) is not None:
                params[name] = getattr(req, name)
        submit = Submit(
            exchange.request_id,
            services.resolve_model(req.model),
            "video_generation",
            inputs,
            params,
        )
        writer = CollectingWriter(exchange, _answer(exchange))
        await services.run(exchange, submit, "video_generation", writer, timeout)


def _answer(exchange: Exchange) -> Any:
    created = int(time.time())

    async def complete(collected: Collected) -> None:
        video = collected.first("video")
        if video is None:
            raise EngineItemError(HTTPError(502, "the engine sent no video", "engine_no_video"))
        item = {
            "b64_json": base64.b64encode(bytes(video.data)).decode(),
            "mime_type": video.mime_type or "video/mp4",
        }
        body = json.dumps({"created": created, "data": [item]}, separators=(",", ":")).encode()
        await exchange.respond(200, body, JSON_HEADERS)

    return complete


# -- the routes ----------------------------------------------------------------------

ROUTES: Routes = {
    ("POST", "/v1/videos/generations"): Route(
        handle,
        generation_doc(
            "createVideo",
            "Text to video, or video conditioned on an image or a video",
            VideoRequest,
            json_body("Videos"),
            content=(JSON, MULTIPART),
            files=("image", "video"),
            example={"prompt": "waves", "num_frames": 4},
        ),
        "video_generation",
    ),
}
