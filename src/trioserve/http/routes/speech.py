"""``POST /v1/audio/speech``: text to speech, as WAV or raw PCM, whole or streamed.

The engine sends 16-bit little-endian PCM (``mime_type`` ``audio/pcm;rate=R[;channels=C]``,
24 kHz mono when it says nothing); the frontend wraps it: ``wav`` gets a RIFF header with
the exact sizes (streamed: the "unknown length" sizes 0xFFFFFFFF, as streaming encoders
write them), ``pcm`` is the samples as they are.
"""

from __future__ import annotations

from typing import Any

import attrs

from ...protocol import Submit
from ..bodies.forms import JSON, extra_params, structure_fields
from ..bodies.validation import bounded, check_bounds, documented, invalid
from ..errors import EngineItemError, HTTPError
from ..exchange import Exchange
from ..openapi.content import BINARY
from ..services import Services
from ..writers.audio import AudioStreamWriter, content_type, pcm_format, wav_header
from ..writers.stream import Collected, CollectingWriter
from .route import Route, Routes, generation_doc

FORMATS = ("wav", "pcm")


@attrs.define
class SpeechRequest:
    input: str
    model: str | None = None
    voice: str | None = None
    instructions: str | None = None
    response_format: str | None = documented(enum=list(FORMATS))
    speed: float | None = bounded(0.25, 4)
    stream: bool | None = None


def parse(body: Any) -> tuple[SpeechRequest, str]:
    req = structure_fields(body, SpeechRequest)
    fmt = (req.response_format or "wav").lower()
    if fmt not in FORMATS:
        raise HTTPError(
            400,
            f"response_format {req.response_format!r} is not supported; supported: "
            + ", ".join(FORMATS),
            "unsupported_response_format",
            param="response_format",
        )
    errors: list[dict[str, str]] = []
    check_bounds(req, errors)
    if errors:
        raise invalid(errors)
    return req, fmt


async def handle(services: Services, exchange: Exchange) -> None:
    timeout = services.begin(exchange)
    body = await services.read_form(exchange, uploads=None, accepted=(JSON,))
    req, fmt = parse(body)
    inputs: dict[str, Any] = {"input": req.input}
    if req.voice is not None:
        inputs["voice"] = req.voice
    if req.instructions is not None:
        inputs["instructions"] = req.instructions
    params = extra_params(body, SpeechRequest)
    if req.speed is not None:
        params["speed"] = req.speed
    model = services.resolve_model(req.model)
    submit = Submit(exchange.request_id, model, "speech", inputs, params)
    writer: Any
    if req.stream:
        writer = AudioStreamWriter(exchange, fmt)
    else:
        writer = CollectingWriter(exchange, _answer(exchange, fmt))
    await services.run(exchange, submit, "speech", writer, timeout)


def _answer(exchange: Exchange, fmt: str) -> Any:
    async def complete(collected: Collected) -> None:
        audio = collected.first("audio")
        if audio is None:
            raise EngineItemError(HTTPError(502, "the engine sent no audio", "engine_no_audio"))
        rate, channels = pcm_format(audio.mime_type)
        pcm = bytes(audio.data)
        body = wav_header(len(pcm), rate, channels) + pcm if fmt == "wav" else pcm
        await exchange.respond(200, body, [(b"content-type", content_type(fmt, rate, channels))])

    return complete


# -- the routes ----------------------------------------------------------------------

ROUTES: Routes = {
    ("POST", "/v1/audio/speech"): Route(
        handle,
        generation_doc(
            "createSpeech",
            "Text to speech: WAV or raw PCM, whole or streamed",
            SpeechRequest,
            {"audio/wav": {"schema": BINARY}, "audio/pcm": {"schema": BINARY}},
            example={"input": "Hello there", "response_format": "wav"},
        ),
        "speech",
    ),
}
