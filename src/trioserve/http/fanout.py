"""One client request served by several engine requests (``n`` images, ``n`` choices).

Each engine request runs through :func:`~trioserve.http.lifecycle.run_generation` as usual
(its own cancel scope, subscription and one abort); the group adds what they share:

- one disconnect watcher for all (ASGI ``receive()`` must have one reader), which ends
  every member;
- one :class:`GroupHandle`, registered under the client's request id, so
  ``DELETE /v1/requests/{id}`` and the drain deadline end every member;
- the first member to fail ends the others (reason ``abandoned``: one abort each) and its
  error is the answer.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial

import attrs
import trio

from ..ends import EndReason
from ..protocol import OutputItem, Submit, Usage
from . import error_bodies
from .errors import HTTPError
from .exchange import Exchange
from .lifecycle import RequestHandle
from .services import Services
from .writers.openai import StreamFormat
from .writers.stream import (
    SSE_DONE,
    SSE_EVENT,
    SSE_HEADERS,
    Collected,
    CollectingWriter,
    Writer,
    WriterBase,
    engine_error,
    stream_body,
    text_of,
)


@attrs.define(eq=False)
class GroupHandle:
    """What the registry holds for the whole group: ending it ends every member."""

    id: str
    members: list[RequestHandle] = attrs.Factory(list)
    end_reason: EndReason | None = None
    #: The index of the API key that started it (see ``RequestHandle.owner``).
    owner: int | None = None

    def end(self, reason: EndReason) -> None:
        if self.end_reason is None:
            self.end_reason = reason
        for member in self.members:
            member.end(reason)


@attrs.define
class GroupResult:
    collected: list[Collected | None]
    #: The first member's failure, if any (the answer to the client).
    error: HTTPError | None = None


class _MemberWriter(CollectingWriter):
    def __init__(
        self, exchange: Exchange, result: GroupResult, index: int, group: GroupHandle
    ) -> None:
        async def complete(collected: Collected) -> None:
            result.collected[index] = collected

        super().__init__(exchange, complete)
        self.result = result
        self.index = index
        self.group = group

    async def fail(self, error: HTTPError) -> None:
        _first_failure(self.result, error, self.group, self.index)


async def run_group(
    services: Services,
    exchange: Exchange,
    submits: list[Submit],
    capability: str,
    timeout: float,
    answer: Callable[[list[Collected]], Awaitable[None]],
    *,
    stream: StreamingGroup | None = None,
) -> None:
    """Run ``submits`` at once; ``answer`` gets every member's output if all succeed,
    else the client gets the first failure (unless it has gone). With ``stream``, the
    members' chunks go to the client as they come (see :class:`StreamingGroup`), and the
    failure, if the response has begun, is its last event."""
    # One admission slot for the client's request, taken now that its body is complete
    # and held until its last byte.
    with services.admission.take(exchange.key_index):
        owner = exchange.key_index
        group = GroupHandle(exchange.request_id, owner=owner)
        transport = "json" if stream is None else "sse"
        group.members = [
            RequestHandle(
                submit.request_id,
                owner=owner,
                route=exchange.path,
                transport=transport,
                client=exchange.head.client,
                group=exchange.request_id,
                headers=exchange.headers,
                arrived=exchange.arrived,
            )
            for submit in submits
        ]
        exchange.handle = group
        result = GroupResult([None] * len(submits))
        services.registry.add(group)
        try:
            # One watch for the group (ASGI receive() has one reader); it ends every member.
            async with (
                exchange.watch_disconnect(partial(group.end, EndReason.DISCONNECT)),
                trio.open_nursery() as members,
            ):
                for index, submit in enumerate(submits):
                    writer: Writer = (
                        _MemberWriter(exchange, result, index, group)
                        if stream is None
                        else _StreamingMember(stream, result, index, group)
                    )
                    members.start_soon(
                        _member, services, submit, capability, timeout, group, result, index, writer
                    )
        finally:
            services.registry.remove(group)
        if group.end_reason is EndReason.DISCONNECT:
            return
        if result.error is not None:
            if stream is not None:
                await stream.fail(result.error)
            else:
                await exchange.respond_error(result.error)
            return
        collected = [c for c in result.collected if c is not None]
        if len(collected) == len(submits):
            await answer(collected)


async def _member(
    services: Services,
    submit: Submit,
    capability: str,
    timeout: float,
    group: GroupHandle,
    result: GroupResult,
    index: int,
    writer: Writer,
) -> None:
    try:
        await services.generations.run(group.members[index], submit, capability, writer, timeout)
    except HTTPError as error:  # refused before submission (e.g. a duplicate id)
        if result.error is None:
            result.error = error
        group.end(EndReason.ABANDONED)


@attrs.define(eq=False)
class StreamingGroup:
    """The response that ``n`` streamed choices share: one chunk format per choice
    (its ``index``), one lock so that chunks leave whole, and the end: the usage chunk
    if asked for (the prompt counted once, the completions summed), then ``[DONE]``."""

    exchange: Exchange
    formats: list[StreamFormat]
    include_usage: bool
    lock: trio.Lock = attrs.Factory(trio.Lock)

    async def send(self, data: bytes) -> None:
        async with self.lock:
            await stream_body(self.exchange, SSE_HEADERS, data, more=True)

    async def finish(self, collected: list[Collected]) -> None:
        out: list[bytes] = []
        if self.include_usage and collected[0].usage is not None:
            prompt = collected[0].usage.prompt_tokens
            completion = sum(c.usage.completion_tokens for c in collected if c.usage)
            out += (b"data: ", self.formats[0].usage(Usage(prompt, completion)), b"\n\n")
        async with self.lock:
            await stream_body(self.exchange, SSE_HEADERS, b"".join([*out, SSE_DONE]), more=False)

    async def fail(self, error: HTTPError) -> None:
        """The group's failure: its own status if nothing was sent, else the last event
        (as ``SSEWriter.fail``)."""
        async with self.lock:
            if not self.exchange.started:
                await self.exchange.respond_error(error)
            else:
                await self.exchange.body(b"data: " + error_bodies.body(error) + b"\n\n", more=False)


class _StreamingMember(WriterBase):
    """One choice of a streamed ``n`` > 1 answer: its deltas and finish go out as they
    come, tagged with its index; what the group's end needs is kept in the result."""

    transport = "sse"

    def __init__(
        self, stream: StreamingGroup, result: GroupResult, index: int, group: GroupHandle
    ) -> None:
        self.stream = stream
        self.fmt = stream.formats[index]
        self.result = result
        self.index = index
        self.group = group

    async def write(self, batch: list[OutputItem]) -> bool:
        fmt = self.fmt
        out: list[bytes] = []
        done = False
        for item in batch:
            if item.error is not None:
                if out:
                    await self.stream.send(b"".join(out))
                raise engine_error(item)
            if item.logprobs is not None or item.token_ids or item.prompt_token_ids:
                text = text_of(item.data or "")
                out.append(fmt.delta_with_logprobs(text, item.logprobs, SSE_EVENT, item))
            elif item.data:
                out.append(fmt.delta(text_of(item.data), SSE_EVENT))
            elif not fmt.started:
                out.append(fmt.opening(SSE_EVENT))
            if item.finish_reason is not None:
                out += (b"data: " + chunk + b"\n\n" for chunk in fmt.flush())
                out += (b"data: ", fmt.finish(item.finish_reason, item.stop_reason), b"\n\n")
                self.result.collected[self.index] = Collected(
                    finish_reason=item.finish_reason, usage=item.usage, stop_reason=item.stop_reason
                )
                done = True
                break
        if out:
            await self.stream.send(b"".join(out))
        return done

    async def fail(self, error: HTTPError) -> None:
        _first_failure(self.result, error, self.group, self.index)


def _first_failure(result: GroupResult, error: HTTPError, group: GroupHandle, index: int) -> None:
    """The first member to fail ends the others; its error is the group's answer."""
    if result.error is None:
        result.error = error
        for i, member in enumerate(group.members):
            if i != index:
                member.end(EndReason.ABANDONED)
