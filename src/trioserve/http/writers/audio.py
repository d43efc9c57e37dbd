"""Speech answers: the engine's 16-bit PCM as WAV (a RIFF header) or raw PCM, streamed."""

from __future__ import annotations

import struct

from ...ends import EndReason
from ...protocol import OutputItem
from ..errors import EngineItemError, HTTPError, WriterRefused
from ..exchange import Exchange
from .stream import WriterBase, engine_error

DEFAULT_RATE = 24_000
SAMPLE_BITS = 16
#: RIFF/data sizes of a WAV whose length is not known when its header is sent.
UNKNOWN_SIZE = 0xFFFFFFFF


def wav_header(data_size: int | None, rate: int, channels: int) -> bytes:
    """A 44-byte PCM WAV header; ``data_size`` None: unknown length (a stream)."""
    block_align = channels * SAMPLE_BITS // 8
    data = UNKNOWN_SIZE if data_size is None else data_size
    riff = UNKNOWN_SIZE if data_size is None else 36 + data_size
    return struct.pack(
        "<4sI4s4sIHHIIHH4sI",
        b"RIFF",
        riff,
        b"WAVE",
        b"fmt ",
        16,
        1,  # PCM
        channels,
        rate,
        rate * block_align,
        block_align,
        SAMPLE_BITS,
        b"data",
        data,
    )


def pcm_format(mime_type: str | None) -> tuple[int, int]:
    """(sample rate, channels) from an engine's ``audio/pcm;rate=…;channels=…``."""
    rate, channels = DEFAULT_RATE, 1
    if mime_type:
        essence, *params = (p.strip() for p in mime_type.split(";"))
        if essence.lower() not in ("audio/pcm", "audio/l16"):
            raise WriterRefused(
                HTTPError(
                    502, f"the engine sent {essence!r} audio; speech needs PCM", "engine_bad_audio"
                ),
                EndReason.BAD_ENGINE_OUTPUT,
            )
        for param in params:
            key, _, value = param.partition("=")
            if key.strip().lower() == "rate" and value.strip().isdigit():
                rate = int(value)
            elif key.strip().lower() == "channels" and value.strip().isdigit():
                channels = int(value)
    return rate, channels


def content_type(fmt: str, rate: int, channels: int) -> bytes:
    if fmt == "wav":
        return b"audio/wav"
    return f"audio/pcm;rate={rate};channels={channels}".encode()


class AudioStreamWriter(WriterBase):
    """The audio as it comes: the response starts with the first chunk (a WAV header of
    unknown length first, for ``wav``). A failure after that cuts the connection without
    the final chunk, so the client sees a broken body rather than a short clip."""

    transport = "stream"

    def __init__(self, exchange: Exchange, fmt: str) -> None:
        self.exchange = exchange
        self.fmt = fmt

    async def write(self, batch: list[OutputItem]) -> bool:
        exchange = self.exchange
        for item in batch:
            if item.error is not None:
                raise engine_error(item)
            if isinstance(item.data, bytes) and item.data and item.modality == "audio":
                if not exchange.started:
                    rate, channels = pcm_format(item.mime_type)
                    headers = [
                        (b"content-type", content_type(self.fmt, rate, channels)),
                        (b"cache-control", b"no-cache"),
                        (b"x-accel-buffering", b"no"),
                    ]
                    await exchange.start(200, headers)
                    if self.fmt == "wav":
                        await exchange.body(wav_header(None, rate, channels))
                await exchange.body(item.data)
            if item.finish_reason is not None:
                if not exchange.started:
                    raise EngineItemError(
                        HTTPError(502, "the engine sent no audio", "engine_no_audio")
                    )
                await exchange.body(b"", more=False)
                return True
        return False

    async def fail(self, error: HTTPError) -> None:
        if not self.exchange.started:
            await self.exchange.respond_error(error)
        # else: leave the body unfinished; the server closes the connection.
