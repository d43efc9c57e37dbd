"""The answer of ``POST /v1/embeddings``: one embedding per input, collected, then one body.

The engine sends each embedding as packed float32, little-endian (docs/protocol.md);
``encoding_format: "base64"`` is those very bytes in base64 (what OpenAI sends, and what
the official clients ask for by default), ``"float"`` a JSON list of numbers.
"""

from __future__ import annotations

import base64
import sys
from array import array
from typing import Any

import orjson

from ...ends import EndReason
from ...protocol import OutputItem, Usage
from ..errors import EngineItemError, HTTPError, WriterRefused
from ..exchange import JSON_HEADERS, Exchange
from .stream import MAX_COLLECTED_BYTES, WriterBase, engine_error

MODALITY = "embedding"


def _bad_output(message: str) -> WriterRefused:
    return WriterRefused(HTTPError(502, message, "bad_engine_output"), EndReason.BAD_ENGINE_OUTPUT)


def floats(packed: bytes) -> list[float]:
    """Packed float32 little-endian as Python floats."""
    values = array("f")
    values.frombytes(packed)
    if sys.byteorder == "big":
        values.byteswap()
    return values.tolist()


class EmbeddingsWriter(WriterBase):
    """Collects ``count`` embeddings (each checked: float32s, all of one length, of
    ``dimensions`` if the client asked), then answers with the whole list. An engine that
    sends more than ``count``, or a malformed one, ends the request with a 502 and an
    abort; one that finishes with fewer, with a 502."""

    def __init__(
        self,
        exchange: Exchange,
        model: str,
        count: int,
        encoding_format: str,
        dimensions: int | None,
        limit: int = MAX_COLLECTED_BYTES,
    ) -> None:
        self.exchange = exchange
        self.model = model
        self.count = count
        self.encoding_format = encoding_format
        self.dimensions = dimensions
        self.limit = limit
        self.vectors: list[bytes] = []
        self.size = 0

    def _add(self, item: OutputItem) -> None:
        data = item.data
        if item.modality != MODALITY or not isinstance(data, bytes):
            raise _bad_output(
                f"the engine sent {item.modality!r} output where embeddings (packed float32) belong"
            )
        if len(self.vectors) == self.count:
            raise _bad_output(f"the engine sent more than {self.count} embeddings")
        if not data or len(data) % 4:
            raise _bad_output(f"the engine sent an embedding of {len(data)} bytes (not float32s)")
        if self.dimensions is not None and len(data) != 4 * self.dimensions:
            raise _bad_output(
                f"the engine sent {len(data) // 4} dimensions where {self.dimensions} were asked"
            )
        if self.vectors and len(data) != len(self.vectors[0]):
            raise _bad_output("the engine sent embeddings of different lengths")
        self.size += len(data)
        if self.size > self.limit:
            raise WriterRefused(
                HTTPError(502, f"the embeddings exceed {self.limit} bytes", "response_too_large"),
                EndReason.RESPONSE_TOO_LARGE,
            )
        self.vectors.append(bytes(data))

    async def write(self, batch: list[OutputItem]) -> bool:
        for item in batch:
            if item.error is not None:
                raise engine_error(item)
            if item.data is not None:
                self._add(item)
            if item.finish_reason is not None:
                if len(self.vectors) != self.count:
                    # The engine has ended the request: no abort is owed, only the answer.
                    raise EngineItemError(
                        HTTPError(
                            502,
                            f"the engine sent {len(self.vectors)} embeddings for "
                            f"{self.count} inputs",
                            "bad_engine_output",
                        )
                    )
                await self.exchange.respond(200, self.body(item.usage), JSON_HEADERS)
                return True
        return False

    def body(self, usage: Usage | None) -> bytes:
        encode: Any = (
            floats
            if self.encoding_format == "float"
            else (lambda packed: base64.b64encode(packed).decode())
        )
        prompt_tokens = usage.prompt_tokens if usage is not None else 0
        return orjson.dumps(
            {
                "object": "list",
                "data": [
                    {"object": "embedding", "index": i, "embedding": encode(vector)}
                    for i, vector in enumerate(self.vectors)
                ],
                "model": self.model,
                "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
            }
        )

    async def fail(self, error: HTTPError) -> None:
        if not self.exchange.started:
            await self.exchange.respond_error(error)
