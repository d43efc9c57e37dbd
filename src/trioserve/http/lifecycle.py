"""The request lifecycle: one cancel scope and one nursery per generation request.

::

    request scope (deadline) ─┬─ relay: subscription → writer   (the request's work)
                              └─ disconnect watcher             (reads ASGI receive())

On trioserve's own HTTP server the disconnect watcher is not a task: the server's one
hang-up watcher calls back (``watch_disconnect``), and the relay runs in the request's
scope with no nursery at all.

Every way a request ends early is :meth:`RequestHandle.end` with a reason, which cancels
the scope: the client disconnected, the deadline passed, ``DELETE /v1/requests/{id}``, the
client fell behind its buffer bound, the engine was lost, the drain deadline came. The
``finally`` around the relay then ends the subscription, which queues exactly one abort
unless the engine already finished the request; it awaits nothing, so it cannot be
cancelled half-way or hang. After the scope, the client is told why (unless it is gone).
"""

from __future__ import annotations

import collections
import logging
import os
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Protocol

import attrs
import trio

from .. import metrics
from ..engine import EngineClient, Subscription
from ..errors import EngineError, EngineFailedError, SlowClientError, TrioserveError
from ..protocol import Submit
from .errors import HTTPError
from .writers.stream import EngineItemError, Writer, WriterRefused

log = logging.getLogger("trioserve.request")

#: How long telling a client why its request ended may take, at most.
ERROR_WRITE_TIMEOUT = 5.0

_END_ERRORS = {
    "deadline": (504, "deadline_exceeded", "the request exceeded its deadline"),
    "cancel": (499, "request_cancelled", "the request was cancelled"),
    "slow_client": (503, "slow_client", "the client fell behind its stream buffer"),
    "engine_lost": (503, "engine_lost", "the engine stopped responding"),
    "engine_failed": (
        503,
        "engine_failed",
        "the engine broke the protocol and is out of service until it recovers",
    ),
    "drain": (503, "server_shutting_down", "the server is shutting down"),
    "abandoned": (500, "request_abandoned", "another part of the same request failed"),
}


@attrs.define(eq=False)
class RequestHandle:
    """A running generation request, as other parts of the server can see and end it."""

    id: str
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    end_reason: str | None = None
    #: Set once the response is complete; ending the request is then a no-op.
    completed: bool = False
    #: Wakes the relay if it is waiting for the engine (``Subscription.interrupt``).
    interrupt: Callable[[], None] | None = None
    #: The index of the API key that started it (``http/auth.py``; None: no keys):
    #: only that key may cancel it.
    owner: int | None = None

    def end(self, reason: str) -> None:
        """End the request early (first reason wins). Synchronous and idempotent.

        A relay waiting for the engine's next output (most of a request's life) is woken
        with nothing and returns; one parked anywhere else (a socket write) is cancelled
        by the scope. Waking costs a fraction of delivering a cancellation (an exception
        built, raised and caught per request), which matters when thousands of clients
        hang up at once.
        """
        if self.end_reason is None and not self.completed:
            self.end_reason = reason
            if self.interrupt is not None:
                self.interrupt()
            self.scope.cancel()


class Endable(Protocol):
    """What the registry holds: a request (:class:`RequestHandle`) or a fan-out group of
    them (``fanout.GroupHandle``), which its owner's cancel or the drain ends."""

    id: str
    owner: int | None

    def end(self, reason: str) -> None: ...


class Registry:
    """In-flight requests by owner (the API key that started them) and id, for explicit
    cancel and the drain deadline, and the in-flight gauge, which reads every registry
    when scraped.

    Ids are per owner: a client-chosen id (``X-Request-Id``) in flight under another key
    is not refused, since a 409 would tell that client the id is in use; only the same
    key reusing its own id in flight gets one. (Without API keys every client is the same
    owner, and may cancel any request anyway.) Requests of two owners with one id reach
    the engine under distinct ids (see :meth:`add`)."""

    def __init__(self) -> None:
        self._handles: dict[tuple[int | None, str], Endable] = {}
        #: How many owners have a request of each id in flight.
        self._holders: collections.Counter[str] = collections.Counter()
        metrics.count_in_flight(self)

    def __len__(self) -> int:
        return len(self._handles)

    def get(self, request_id: str) -> Endable | None:
        """A request of id ``request_id``, whichever key started it (for tests and
        operators: what a client may see is :meth:`owned`)."""
        for (_, held), handle in self._handles.items():
            if held == request_id:
                return handle
        return None

    def owned(self, request_id: str, owner: int | None) -> Endable | None:
        """Request ``request_id`` if the key ``owner`` started it: to any other key,
        someone else's request does not exist (``DELETE /v1/requests/{id}``)."""
        return self._handles.get((owner, request_id))

    def add(self, handle: Endable) -> bool:
        """Register ``handle``; a 409 if its owner already has a request of that id in
        flight. True when another owner has one: the engine must then be given an id of
        its own for this request."""
        key = (handle.owner, handle.id)
        if key in self._handles:
            raise HTTPError(
                409, f"request id {handle.id!r} is already in flight", "duplicate_request_id"
            )
        self._handles[key] = handle
        self._holders[handle.id] += 1
        return self._holders[handle.id] > 1

    def remove(self, handle: Endable) -> None:
        key = (handle.owner, handle.id)
        if self._handles.get(key) is handle:
            del self._handles[key]
            if self._holders[handle.id] > 1:
                self._holders[handle.id] -= 1
            else:
                del self._holders[handle.id]

    def end_all(self, reason: str) -> int:
        handles = list(self._handles.values())
        for handle in handles:
            handle.end(reason)
        return len(handles)


async def run_generation(
    *,
    engines: EngineClient,
    registry: Registry,
    submit: Submit,
    capability: str,
    writer: Writer,
    timeout: float,
    buffer: int,
    wait_disconnect: Callable[[], Awaitable[None]] | None = None,
    watch_disconnect: Callable[[Callable[[], None]], Callable[[], None]] | None = None,
    handle: RequestHandle | None = None,
    keepalive: float = 0,
) -> None:
    """Serve one generation request from submit to last byte (or to its early end).

    ``wait_disconnect`` returns when the client has gone (HTTP: the ASGI receive channel);
    ``watch_disconnect``, preferred when given, registers a callback for the same and
    returns the call that unregisters it (no task needed). Without either (WebSocket), the
    connection ends its requests through their handles.
    ``handle`` lets the caller keep a reference to end the request itself. With
    ``keepalive`` > 0, ``writer.keepalive()`` is called every that many seconds until the
    first output (SSE comment lines, so proxies keep a prefilling stream open).
    """
    handle = handle or RequestHandle(submit.request_id)
    # Counted in flight from here (metrics.REQUESTS_IN_FLIGHT).
    if registry.add(handle):
        # Another key's request has this id in flight: the engine tells them apart.
        submit = attrs.evolve(submit, request_id=f"{submit.request_id}.{os.urandom(6).hex()}")
    outcome = "error"
    try:
        if timeout > 0:  # from when the scope is entered, after the submit has left
            handle.scope.relative_deadline = timeout

        def on_failure(error: TrioserveError) -> None:
            if isinstance(error, EngineFailedError):
                handle.end("engine_failed")
            else:
                handle.end("slow_client" if isinstance(error, SlowClientError) else "engine_lost")

        try:
            sub = engines.submit(submit, capability, buffer=buffer, on_failure=on_failure)
        except EngineError as exc:
            outcome = exc.code
            await writer.fail(HTTPError(exc.status, str(exc), exc.code))
            return
        handle.interrupt = sub.interrupt
        # Streaming writers build their chunk parts while the engine works, not on the
        # first token's way to the client.
        prepare = getattr(writer, "prepare", None)
        if prepare is not None:
            prepare()
        error: HTTPError | None = None
        with handle.scope:
            unwatch = None
            try:
                if watch_disconnect is not None:
                    unwatch = watch_disconnect(partial(handle.end, "disconnect"))
                    error = await _relay(sub, writer, handle, keepalive)
                elif wait_disconnect is not None:
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(_watch_disconnect, wait_disconnect, handle)
                        error = await _relay(sub, writer, handle, keepalive)
                        nursery.cancel_scope.cancel()
                else:
                    error = await _relay(sub, writer, handle, keepalive)
            finally:
                if unwatch is not None:
                    unwatch()
                # The one place an abort leaves for an early end; a no-op when the engine
                # ended the request itself (finish or error item).
                reason = handle.end_reason or (
                    "deadline" if handle.scope.cancel_called else "disconnect"
                )
                sub.abort(reason)
        if handle.completed:
            outcome = "completed"
            return
        if error is None and handle.end_reason is None and handle.scope.cancelled_caught:
            handle.end_reason = "deadline"
        outcome = handle.end_reason or "engine_error"
        if handle.end_reason == "disconnect":
            return
        if error is None:
            status, code, message = _END_ERRORS[handle.end_reason or "engine_lost"]
            if handle.end_reason == "deadline":
                message = f"{message} of {timeout:g} s"
            error = HTTPError(status, message, code)
        with trio.move_on_after(ERROR_WRITE_TIMEOUT):
            await writer.fail(error)
    finally:
        registry.remove(handle)
        metrics.requests_ended(outcome).inc()
        if outcome not in ("completed", "disconnect"):
            log.info("request %s ended: %s", handle.id, outcome)


async def _relay(
    sub: Subscription, writer: Writer, handle: RequestHandle, keepalive: float
) -> HTTPError | None:
    """Move outputs to the writer until the last one; the engine's error if it sent one."""
    try:
        # Plain deltas may skip this task from the first one on (a writer that can start
        # its response synchronously), or once the response has started.
        make_sink = getattr(writer, "sink", None)
        if make_sink is not None:
            sub.sink = make_sink()
        # Keepalive comments only while the engine is still prefilling (no output yet):
        # the per-event path below carries no timer scope.
        if keepalive > 0:
            batch = await _first_batch(sub, writer, keepalive)
        else:
            batch = await sub.receive_batch()
        if not batch:
            return None
        if await writer.write(batch):
            handle.completed = True
            return None
        if make_sink is not None:  # started now: the plain per-event sink from here on
            sub.sink = make_sink()
        while batch := await sub.receive_batch():
            if await writer.write(batch):
                handle.completed = True
                return None
        return None
    except EngineItemError as exc:
        return exc.error
    except WriterRefused as exc:
        # The response cannot take what the engine sends (too large): end the request
        # here, with one abort, and tell the client.
        handle.end(exc.reason)
        return exc.error
    except TrioserveError:
        # The subscription failed (slow client, engine lost); its on_failure callback has
        # already ended the request with that reason.
        return None


async def _first_batch(sub: Subscription, writer: Writer, keepalive: float) -> list:
    while True:
        # Cancelling receive_batch loses nothing: its only checkpoint is the wait for the
        # first item, which a cancelled channel receive leaves queued.
        with trio.move_on_after(keepalive):
            return await sub.receive_batch()
        await writer.keepalive()  # type: ignore[attr-defined]  # keepalive > 0: an SSEWriter


async def _watch_disconnect(
    wait_disconnect: Callable[[], Awaitable[None]], handle: RequestHandle
) -> None:
    await wait_disconnect()
    handle.end("disconnect")
