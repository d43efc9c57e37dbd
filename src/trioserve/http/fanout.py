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

from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any

import attrs
import trio

from ..ends import EndReason
from ..protocol import OutputItem, Submit, Usage
from . import error_bodies
from .errors import HTTPError
from .exchange import Exchange
from .lifecycle import DisconnectWatch, RequestHandle, connection_watches
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
)
from .writers.websocket import MessageSink, WebSocketWriter


@attrs.define(eq=False)
class GroupHandle:
    """What the registry holds for the whole group: ending it ends every member."""

    id: str
    members: list[RequestHandle] = attrs.Factory(list)
    end_reason: EndReason | None = None
    #: The index of the API key that started it (see ``RequestHandle.owner``).
    owner: int | None = None

    @property
    def arrived(self) -> float:
        """When the client's request arrived (its members'), for the access log."""
        return self.members[0].arrived

    @property
    def completed(self) -> bool:
        """Every member has completed."""
        return bool(self.members) and all(member.completed for member in self.members)

    def end(self, reason: EndReason) -> None:
        if self.end_reason is None:
            self.end_reason = reason
        for member in self.members:
            member.end(reason)


def new_group(
    group_id: str, submits: list[Submit], *, owner: int | None, **handle_fields: Any
) -> GroupHandle:
    """The group of ``submits``' engine requests, one handle each (``handle_fields``: what
    the route tells the live view and the access log, as for a lone request)."""
    group = GroupHandle(group_id, owner=owner)
    group.members = [
        RequestHandle(submit.request_id, owner=owner, group=group_id, **handle_fields)
        for submit in submits
    ]
    return group


@attrs.define
class GroupResult:
    collected: list[Collected | None]
    #: The first member's failure, if any (the answer to the client).
    error: HTTPError | None = None

    def complete(self) -> list[Collected] | None:
        """Every member's output, when every member completed."""
        collected = [c for c in self.collected if c is not None]
        return collected if len(collected) == len(self.collected) else None


def group_usage(collected: list[Collected]) -> Usage | None:
    """The usage of ``n`` choices: the prompt counted once, the completions summed."""
    if collected[0].usage is None:
        return None
    completion = sum(c.usage.completion_tokens for c in collected if c.usage)
    return Usage(collected[0].usage.prompt_tokens, completion)


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
        group = new_group(
            exchange.request_id,
            submits,
            owner=exchange.key_index,
            route=exchange.path,
            transport="json" if stream is None else "sse",
            client=exchange.head.client,
            headers=exchange.headers,
            arrived=exchange.arrived,
        )
        exchange.handle = group
        result = GroupResult([None] * len(submits))
        writers: list[Writer] = [
            _MemberWriter(exchange, result, index, group)
            if stream is None
            else _StreamingMember(stream, result, index, group)
            for index in range(len(submits))
        ]
        # One watch for the group (ASGI receive() has one reader); it ends every member.
        await run_members(
            services,
            group,
            submits,
            capability,
            timeout,
            result,
            writers,
            watch_disconnect=exchange.watch_disconnect,
        )
        if group.end_reason is EndReason.DISCONNECT:
            return
        if result.error is not None:
            if stream is not None:
                await stream.fail(result.error)
            else:
                await exchange.respond_error(result.error)
            return
        collected = result.complete()
        if collected is not None:
            await answer(collected)


async def run_members(
    services: Services,
    group: GroupHandle,
    submits: list[Submit],
    capability: str,
    timeout: float,
    result: GroupResult,
    writers: Sequence[Writer],
    *,
    watch_disconnect: DisconnectWatch = connection_watches,
) -> None:
    """Run the group's members at once, member ``i`` writing to ``writers[i]``, the group
    registered under its id (for ``DELETE /v1/requests/{id}`` and the drain) while they
    run; ``watch_disconnect`` ends them all when the client goes (by default none: the
    connection ends the group through its handle)."""
    services.registry.add(group)
    try:
        async with (
            watch_disconnect(partial(group.end, EndReason.DISCONNECT)),
            trio.open_nursery() as members,
        ):
            for index, submit in enumerate(submits):
                members.start_soon(
                    _member,
                    services,
                    submit,
                    capability,
                    timeout,
                    group,
                    result,
                    index,
                    writers[index],
                )
    finally:
        services.registry.remove(group)


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
        usage = group_usage(collected)
        if self.include_usage and usage is not None:
            out += (b"data: ", self.formats[0].usage(usage), b"\n\n")
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
            if chunk := fmt.item_delta(item, SSE_EVENT):  # (b"": nothing to send)
                out.append(chunk)
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


class _WebSocketMember(WebSocketWriter):
    """One choice of an ``n`` > 1 request on a WebSocket: its chunks go out as they come,
    tagged with its index; the request's one ``done`` or ``error`` is the group's."""

    def __init__(
        self,
        connection: MessageSink,
        client_id: str,
        fmt: StreamFormat,
        result: GroupResult,
        index: int,
        group: GroupHandle,
    ) -> None:
        super().__init__(connection, client_id, fmt)
        self.result = result
        self.index = index
        self.group = group

    async def finished(self, item: OutputItem) -> None:
        self.result.collected[self.index] = Collected(
            finish_reason=item.finish_reason, usage=item.usage, stop_reason=item.stop_reason
        )

    async def fail(self, error: HTTPError) -> None:
        _first_failure(self.result, error, self.group, self.index)


class WebSocketGroup:
    """The ``n`` choices of one request on a WebSocket (``group``'s members): each
    choice's chunks go out as they come, with its ``index``, then one ``done`` (the prompt
    counted once, the completions summed) or the first failure's ``error``. ``status``
    and ``sent`` are a writer's (the access log)."""

    def __init__(
        self,
        connection: MessageSink,
        client_id: str,
        formats: list[StreamFormat],
        group: GroupHandle,
    ) -> None:
        self.group = group
        self.result = GroupResult([None] * len(formats))
        self.members = [
            _WebSocketMember(connection, client_id, fmt, self.result, index, group)
            for index, fmt in enumerate(formats)
        ]

    @property
    def status(self) -> int | None:
        return self.members[0].status

    @property
    def sent(self) -> int:
        return sum(member.sent for member in self.members)

    async def run(
        self, services: Services, submits: list[Submit], capability: str, timeout: float
    ) -> None:
        await run_members(
            services, self.group, submits, capability, timeout, self.result, self.members
        )
        if self.result.error is not None:
            await self.members[0].send_error(self.result.error)
        elif (collected := self.result.complete()) is not None:
            await self.members[0].send_done(group_usage(collected))


def _first_failure(result: GroupResult, error: HTTPError, group: GroupHandle, index: int) -> None:
    """The first member to fail ends the others; its error is the group's answer."""
    if result.error is None:
        result.error = error
        for i, member in enumerate(group.members):
            if i != index:
                member.end(EndReason.ABANDONED)
