"""The native route's streamed answer: NDJSON, one line per engine output (``POST /generate``)."""

from __future__ import annotations

import base64
import json
from typing import Any

from ...protocol import OutputItem
from .. import error_bodies
from ..errors import EngineItemError, HTTPError
from ..exchange import Exchange
from .openai import usage_dict
from .stream import WriterBase, end_batch, engine_error

NDJSON_HEADERS = [
    (b"content-type", b"application/x-ndjson"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


def media_json(modality: str, mime_type: str | None, data: bytes) -> dict[str, Any]:
    return {
        "modality": modality,
        "mime_type": mime_type,
        "data": base64.b64encode(data).decode(),
    }


def output_line(request_id: str, item: OutputItem) -> bytes:
    line: dict[str, Any] = {"id": request_id, "seq": item.seq, "modality": item.modality}
    data = item.data
    if isinstance(data, str) and item.modality == "text":
        line["text"] = data
    elif data is not None:
        raw = data.encode() if isinstance(data, str) else data
        line.update(media_json(item.modality, item.mime_type, raw))
    if item.finish_reason is not None:
        line["finish_reason"] = item.finish_reason
        line["stop_reason"] = item.stop_reason
        line["usage"] = usage_dict(item.usage)
    return json.dumps(line, separators=(",", ":")).encode() + b"\n"


class NDJSONWriter(WriterBase):
    """``application/x-ndjson``: one line per engine output; the last carries
    ``finish_reason``, ``stop_reason`` and ``usage``. Starts with the first output, so an
    error before it keeps its status; after it, the stream ends with a
    ``{"detail", "code"}`` line."""

    transport = "ndjson"

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
            await exchange.body(error_bodies.detail_body(error) + b"\n", more=False)
