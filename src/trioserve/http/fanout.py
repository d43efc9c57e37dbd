"""One client request served by several engine requests (``n`` images).

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
from typing import TYPE_CHECKING

import attrs
import trio

from ..protocol import Submit
from .errors import HTTPError
from .exchange import Exchange
from .lifecycle import RequestHandle, run_generation
from .writers import Collected, CollectingWriter

if TYPE_CHECKING:
    from .app import App


@attrs.define(eq=False)
class GroupHandle:
    """What the registry holds for the whole group: ending it ends every member."""

    id: str
    members: list[RequestHandle] = attrs.Factory(list)
    end_reason: str | None = None
    completed: bool = False
    #: The index of the API key that started it (see ``RequestHandle.owner``).
    owner: int | None = None

    def end(self, reason: str) -> None:
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
        if self.result.error is None:
            self.result.error = error
            for i, member in enumerate(self.group.members):
                if i != self.index:
                    member.end("abandoned")


async def run_group(
    app: App,
    exchange: Exchange,
    submits: list[Submit],
    capability: str,
    timeout: float,
    answer: Callable[[list[Collected]], Awaitable[None]],
) -> None:
    """Run ``submits`` at once; ``answer`` gets every member's output if all succeed,
    else the client gets the first failure (unless it has gone)."""
    owner = exchange.key_index
    group = GroupHandle(exchange.request_id, owner=owner)
    group.members = [RequestHandle(submit.request_id, owner=owner) for submit in submits]
    result = GroupResult([None] * len(submits))
    app.registry.add(group)
    try:
        async with trio.open_nursery() as nursery:

            async def watch() -> None:
                await exchange.wait_disconnect()
                group.end("disconnect")

            nursery.start_soon(watch)
            async with trio.open_nursery() as members:
                for index, submit in enumerate(submits):
                    members.start_soon(
                        _member, app, submit, capability, timeout, group, result, index, exchange
                    )
            nursery.cancel_scope.cancel()
    finally:
        app.registry.remove(group)
    if group.end_reason == "disconnect":
        return
    if result.error is not None:
        await exchange.respond_error(result.error)
        return
    collected = [c for c in result.collected if c is not None]
    if len(collected) == len(submits):
        group.completed = True
        await answer(collected)


async def _member(
    app: App,
    submit: Submit,
    capability: str,
    timeout: float,
    group: GroupHandle,
    result: GroupResult,
    index: int,
    exchange: Exchange,
) -> None:
    try:
        await run_generation(
            engines=app.engines,
            registry=app.registry,
            submit=submit,
            capability=capability,
            writer=_MemberWriter(exchange, result, index, group),
            timeout=timeout,
            buffer=app.settings.stream_buffer,
            handle=group.members[index],
        )
    except HTTPError as error:  # refused before submission (e.g. a duplicate id)
        if result.error is None:
            result.error = error
        group.end("abandoned")
