"""Response writers: how one request's engine outputs reach its client.

A writer gets batches of output items (everything that was waiting for the request when
it woke: adaptive coalescing, never a delay) and turns each batch into at most one write.
Transport framing lives here; the chunk objects come from
:class:`~trioserve.http.writers.openai.StreamFormat`, shared by every transport.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import attrs

from ...ends import EndReason
from ...protocol import OutputItem, Usage
from .. import error_bodies
from ..errors import EngineItemError, HTTPError, WriterRefused
from ..exchange import JSON_HEADERS, Exchange
from .openai import StreamFormat, TokenDetails, merge_logprobs, text_of

SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]
#: What wraps one chunk into an SSE event.
SSE_EVENT = (b"data: ", b"\n\n")
SSE_DONE = b"data: [DONE]\n\n"
SSE_KEEPALIVE = b": keepalive\n\n"

#: Largest payload (text and media together) a non-streaming response collects for one
#: engine request; past it, the request ends with 502 ``response_too_large`` and an abort.
MAX_COLLECTED_BYTES = 256 * 2**20


def engine_error(item: OutputItem) -> EngineItemError:
    assert item.error is not None
    error = item.error
    return EngineItemError(
        error_bodies.from_engine(error.status, error.message, error.type, error.param)
    )


Sink = Callable[[list[OutputItem]], list[OutputItem]]


class Writer(Protocol):
    """How one request's outputs reach its client (see the module docstring)."""

    #: How the response travels, as the live view and the traces name it: ``json``,
    #: ``sse``, ``ndjson``, ``ws``, ``stream`` (raw bytes: audio) or ``background`` (into
    #: the response store: ``responses_store.RecordWriter``).
    transport: str

    async def write(self, batch: list[OutputItem]) -> bool:
        """Send what ``batch`` adds; True once the final item has been written."""

    async def fail(self, error: HTTPError) -> None:
        """End the response with ``error``: as the status if nothing was sent yet."""

    def prepare(self) -> None:
        """Build what can be built before the first output (while the engine works)."""

    def sink(self) -> Sink | None:
        """A synchronous path for plain deltas (``Subscription.sink``), or None."""

    async def keepalive(self) -> None:
        """Keep a response with no output yet open (SSE comments); only asked of writers
        run with a keepalive interval."""


class WriterBase:
    """What most writers do for :class:`Writer`'s optional parts: nothing ahead of the
    first output, no synchronous path, no keepalive."""

    transport = "json"

    def prepare(self) -> None:
        pass

    def sink(self) -> Sink | None:
        return None

    async def keepalive(self) -> None:
        raise NotImplementedError(f"{type(self).__name__} has no keepalive")


class JSONWriter(WriterBase):
    """Non-streaming: collect the text, answer once with the whole body."""

    def __init__(self, exchange: Exchange, fmt: StreamFormat) -> None:
        self.exchange = exchange
        self.fmt = fmt
        self._parts: list[str] = []
        self._logprobs: Any = None
        self._details: TokenDetails | None = None

    def sink(self) -> Sink | None:
        """A synchronous path (``Subscription.sink``): every delta ahead of the final or an
        error item is collected here, in the engine connection's task, so the request's
        task wakes once, for the end, not once an engine step."""
        return self._collect

    def _collect(self, items: list[OutputItem]) -> list[OutputItem]:
        taken = 0
        for item in items:
            if item.finish_reason is not None or item.error is not None:
                break
            self._add(item)
            taken += 1
        return items[taken:]

    def _add(self, item: OutputItem) -> None:
        if item.data:
            self._parts.append(text_of(item.data))
        if item.logprobs is not None:
            self._logprobs = merge_logprobs(self._logprobs, item.logprobs)
        if item.token_ids is not None or item.prompt_token_ids or item.prompt_logprobs:
            if self._details is None:
                self._details = TokenDetails()
            self._details.add(item)

    async def write(self, batch: list[OutputItem]) -> bool:
        for item in batch:
            if item.error is not None:
                raise engine_error(item)
            self._add(item)
            if item.finish_reason is not None:
                text = "".join(self._parts)
                fmt = self.fmt
                body = fmt.complete(
                    text, item.finish_reason, item.usage, self._logprobs, item.stop_reason,
                    self._details,
                )  # fmt: skip
                await self.exchange.respond(200, body, JSON_HEADERS)
                return True
        return False

    async def fail(self, error: HTTPError) -> None:
        if not self.exchange.started:
            await self.exchange.respond_error(error)


async def stream_body(
    exchange: Exchange, headers: list[tuple[bytes, bytes]], data: bytes, more: bool
) -> None:
    """Send ``data`` on a streaming response, starting it (200, ``headers``) if need be."""
    if not exchange.started:
        await exchange.start(200, headers)
    await exchange.body(data, more)


async def end_batch(
    exchange: Exchange,
    headers: list[tuple[bytes, bytes]],
    out: list[bytes],
    done: bool,
    failure: EngineItemError | None,
) -> bool:
    """How a streaming writer finishes one batch: an engine error before any output is
    raised at once (the client gets its own status); what the batch produced leaves in
    one write; an error after that is raised for the writer's error line. Outputs ahead
    of the error in the same batch count as output: whether they reached the writer
    before the error or with it is timing, not what the engine said. Returns ``done``."""
    if failure is not None and not out and not exchange.started:
        raise failure
    if out:
        await stream_body(exchange, headers, b"".join(out), more=not done)
    if failure is not None:
        raise failure
    return done


class SSEWriter(WriterBase):
    """``text/event-stream``: one ``data:`` event per chunk, ``data: [DONE]`` at the end.

    The response starts with the first output, so an engine error before any token still
    becomes the error's own HTTP status.
    """

    transport = "sse"

    def __init__(self, exchange: Exchange, fmt: StreamFormat) -> None:
        self.exchange = exchange
        self.fmt = fmt

    async def write(self, batch: list[OutputItem]) -> bool:
        fmt = self.fmt
        out: list[bytes] = []
        done = False
        failure: EngineItemError | None = None
        for item in batch:
            if item.error is not None:
                failure = engine_error(item)
                break
            if chunk := fmt.item_delta(item, SSE_EVENT):  # (b"": nothing to send)
                out.append(chunk)
            if item.finish_reason is not None:
                out += (b"data: " + chunk + b"\n\n" for chunk in fmt.flush())
                out += (b"data: ", fmt.finish(item.finish_reason, item.stop_reason), b"\n\n")
                if fmt.include_usage:
                    out += (b"data: ", fmt.usage(item.usage), b"\n\n")
                out.append(SSE_DONE)
                done = True
                break
        return await end_batch(self.exchange, SSE_HEADERS, out, done, failure)

    def prepare(self) -> None:
        """What can be built before the first output: the chunk parts (see
        ``StreamFormat.prepare``) and the response's start (see ``Exchange.prepare_start``)."""
        self.fmt.prepare()
        self.exchange.prepare_start(200, SSE_HEADERS)

    def sink(self) -> Sink | None:
        """A synchronous path for deltas, the first one included.

        The socket owner calls it with what came for this request in one read of the
        engine's socket while its relay is parked and nothing is queued (see
        ``Subscription.sink``): the deltas go straight to the client socket in one write,
        with no task switch; the first one starts the response (200), even when it is
        also the last token (a one-token answer). It returns what is left for the
        awaiting path: everything when the server cannot take it at once, and the end of
        the stream (the finish, ``[DONE]``), which the last token leaves with. Error
        items stop it (an engine error before any token still becomes the response's
        own status). (Bound methods, not closures: every open stream holds its sink.)
        """
        exchange = self.exchange
        fmt = self.fmt
        if not exchange.writes_now or fmt.with_logprobs or fmt.with_token_ids:
            return None
        if fmt.parser is not None:
            return None
        return self._send_now if exchange.started else self._start_now

    def _deltas(self, items: list[OutputItem]) -> tuple[bytes, int]:
        """The event of the deltas that lead ``items`` (up to a final or error item), and
        how many items that is. Their texts leave as one delta, as vLLM's server merges
        the deltas that were waiting for a stream: a frontend behind its engine spends
        one chunk on several steps (the stream's opening, if not sent yet, before it)."""
        texts: list[str] = []
        opening = b""
        taken = 0
        for item in items:
            if item.finish_reason is not None or item.error is not None:
                break
            data = item.data
            if data:
                texts.append(data if type(data) is str else text_of(data))
            elif not texts and not self.fmt.started:
                opening = self.fmt.opening(SSE_EVENT)
            taken += 1
        if not texts:
            return opening, taken
        return opening + self.fmt.delta("".join(texts), SSE_EVENT), taken

    def _send_now(self, items: list[OutputItem]) -> list[OutputItem]:
        fmt = self.fmt
        started = fmt.started  # (False after a keepalive: the first delta names the role)
        data, taken = self._deltas(items)
        if data and not self.exchange.try_send(data):
            fmt.started = started
            return items
        return items[taken:]

    def _start_now(self, items: list[OutputItem]) -> list[OutputItem]:
        exchange = self.exchange
        if exchange.started:  # started by an earlier item, or by a keepalive
            return self._send_now(items)
        fmt = self.fmt
        data, taken = self._deltas(items)
        rest = items[taken:]
        if not data:
            last = rest[0] if rest else None
            if last is None or last.error is not None or not last.data:
                return rest  # nothing to relay yet
            # A one-token answer: its token starts the response; its end is left.
            data = fmt.delta(text_of(last.data), SSE_EVENT)
            rest = [attrs.evolve(last, data=None), *rest[1:]]
        if not exchange.try_start(200, SSE_HEADERS, data):
            fmt.started = False
            return items
        return rest

    async def keepalive(self) -> None:
        """A comment line (ignored by SSE clients) so that proxies keep a silent stream open.

        It starts the response: an error after it is an error event, not a status.
        """
        await stream_body(self.exchange, SSE_HEADERS, SSE_KEEPALIVE, more=True)

    async def fail(self, error: HTTPError) -> None:
        exchange = self.exchange
        if not exchange.started:
            await exchange.respond_error(error)
        else:
            # A plain data event (as other OpenAI-compatible servers send it) with an
            # "error" object, and no [DONE]: the official client raises APIError on it.
            await exchange.body(b"data: " + error_bodies.body(error) + b"\n\n", more=False)


@attrs.define
class MediaPart:
    modality: str
    mime_type: str | None
    data: bytearray


@attrs.define
class Collected:
    """Everything one engine request produced: text, and media joined per run of items of
    the same modality and type (an image, or a clip streamed in chunks)."""

    limit: int = MAX_COLLECTED_BYTES
    text: list[str] = attrs.Factory(list)
    media: list[MediaPart] = attrs.Factory(list)
    size: int = 0
    finish_reason: str | None = None
    usage: Usage | None = None
    stop_reason: str | int | None = None
    #: The answer's logprobs, merged (:func:`merge_logprobs`), and what vLLM adds when
    #: asked (:class:`TokenDetails`), where the items carry them.
    logprobs: Any = None
    details: TokenDetails | None = None

    def add(self, item: OutputItem) -> None:
        if item.logprobs is not None:
            self.logprobs = merge_logprobs(self.logprobs, item.logprobs)
        if item.token_ids is not None or item.prompt_token_ids or item.prompt_logprobs:
            if self.details is None:
                self.details = TokenDetails()
            self.details.add(item)
        data = item.data
        if data:
            self.size += len(data)
            if self.size > self.limit:
                raise WriterRefused(
                    HTTPError(
                        502,
                        f"the engine's answer exceeds {self.limit} bytes; ask for it streamed",
                        "response_too_large",
                    ),
                    EndReason.RESPONSE_TOO_LARGE,
                )
            if isinstance(data, str) and item.modality == "text":
                self.text.append(data)
            else:
                raw = data.encode() if isinstance(data, str) else data
                last = self.media[-1] if self.media else None
                if last and (last.modality, last.mime_type) == (item.modality, item.mime_type):
                    last.data += raw
                else:
                    self.media.append(MediaPart(item.modality, item.mime_type, bytearray(raw)))
        if item.finish_reason is not None:
            self.finish_reason = item.finish_reason
            self.usage = item.usage
            self.stop_reason = item.stop_reason

    def first(self, modality: str) -> MediaPart | None:
        return next((m for m in self.media if m.modality == modality), None)


class CollectingWriter(WriterBase):
    """Non-streaming, any modality: collect every output, then hand the whole to
    ``complete`` (which answers the client, or stores the result for a group)."""

    def __init__(
        self,
        exchange: Exchange,
        complete: Callable[[Collected], Awaitable[None]],
        limit: int | None = None,
    ) -> None:
        self.exchange = exchange
        self.complete = complete
        self.collected = Collected(limit if limit is not None else MAX_COLLECTED_BYTES)

    async def write(self, batch: list[OutputItem]) -> bool:
        for item in batch:
            if item.error is not None:
                raise engine_error(item)
            self.collected.add(item)
            if item.finish_reason is not None:
                await self.complete(self.collected)
                return True
        return False

    async def fail(self, error: HTTPError) -> None:
        if not self.exchange.started:
            await self.exchange.respond_error(error)
