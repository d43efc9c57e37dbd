"""The request lifecycle: one cancel scope per generation request, written once.

::

    request scope (deadline)
      prepare            the engine link's (rendering, tokenization): owes no abort
      submit             the engine request, inside the scope whose exit ends it
      disconnect watch   the server's: a callback from the built-in server's one hang-up
                         watcher, or a task reading ASGI receive() (hypercorn); none of
                         its own on a WebSocket, whose connection ends its requests
        relay            subscription -> writer, until the last output

Every way a request ends early is :meth:`RequestHandle.end` with a reason: the client
disconnected, the deadline passed, ``DELETE /v1/requests/{id}``, the client fell behind
its buffer bound, the engine was lost or failed, the drain deadline came, a writer
failed (each an :class:`~trioserve.ends.EndReason`; what the client is told of each is
``http/errors.py``'s ``END_ANSWERS``).
It is the one place the request's abort leaves (synchronously: it only queues it, so it
cannot be cancelled half-way or hang; a no-op when the engine already ended the request),
and it cancels the scope. After the scope, the client is told why (unless it is gone).
The one successful end the frontend decides itself, a stop string its text pipeline
matched, is the engine link's: it concludes the subscription
(``Subscription.conclude``: one abort, reason ``stop_string``) with a last item the
writer finishes the response with, as it does the engine's own.

What is watched from outside (metrics, traces, the live view of ``GET /debug/requests``)
reads the :class:`RequestHandle` and its subscription; an :class:`Observer` is told when a
request begins and when it has ended (``http/observe.py``), nothing in between.
"""

from __future__ import annotations

import collections
import contextlib
import os
from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager
from functools import partial
from time import perf_counter
from typing import Any, Protocol

import attrs
import trio

from .. import metrics
from ..ends import Ending, EndReason, Outcome, Refusal, State
from ..engine import EngineClient, Prepared, Preparer, Subscription
from ..errors import EngineError, InputError, SlowClientError, WriterFailedError
from ..protocol import OutputItem, Submit
from .errors import (
    END_ANSWERS,
    EngineItemError,
    HTTPError,
    WriterRefused,
    end_error,
    http_error,
)
from .writers.stream import Writer

#: How long telling a client why its request ended may take, at most.
ERROR_WRITE_TIMEOUT = 5.0


@attrs.define(eq=False)
class RequestHandle:
    """A running generation request, as other parts of the server can see and end it."""

    id: str
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    end_reason: EndReason | None = None
    #: Set once the response is complete; ending the request is then a no-op.
    completed: bool = False
    #: The index of the API key that started it (``http/auth.py``; None: no keys):
    #: only that key may cancel it.
    owner: int | None = None
    #: Its engine request, once submitted.
    sub: Subscription | None = None
    # What it is, for metrics, traces, the access log and the live view (set by whoever
    # starts it): the route, how its response travels (json, sse, ndjson, ws, stream), the
    # client's address, the WebSocket (its connection number) or the fan-out group (the
    # client's request id) it belongs to, and the request's headers (a trace parent).
    route: str = ""
    transport: str = "json"
    client: tuple[str, int] | None = None
    socket: int | None = None
    group: str | None = None
    headers: Mapping[bytes, bytes] | None = None
    #: When the client's request arrived (``time.perf_counter``).
    arrived: float = attrs.field(factory=perf_counter)
    #: When it was ended early (``end``; 0: it was not).
    ended_at: float = 0.0
    #: How it ended, once it has (``ends.Ending``).
    outcome: Ending | None = None
    #: What went to the engine (set when it is submitted).
    submit: Submit | None = None
    #: The observer's own record of the request (a trace's span), if it keeps one.
    trace: Any = None

    def end(self, reason: EndReason) -> None:
        """End the request early (first reason wins). Synchronous and idempotent.

        The one place every abort of a request leaves, whoever decides the end (the
        client's hang-up, the deadline, a cancel, the drain, the engine link): the
        subscription queues it at once, unless the engine already ended the request.
        Then a relay waiting for the engine's next output (most of a request's life) is
        woken with nothing and returns; one parked anywhere else (a socket write) is
        cancelled by the scope. Waking costs a fraction of delivering a cancellation (an
        exception built, raised and caught per request), which matters when thousands of
        clients hang up at once.
        """
        if self.end_reason is None and not self.completed:
            self.end_reason = reason
            self.ended_at = perf_counter()
            sub = self.sub
            if sub is not None:
                sub.abort(reason)
                sub.interrupt()
            self.scope.cancel()

    @property
    def phase(self) -> str:
        """Where the request is (the live view): ``submitting`` (being prepared or
        submitted), ``waiting`` for the engine's first output, ``streaming`` (waiting for
        the next), ``writing`` (a write to the client in progress) or ``ending``. Read
        from the state, never recorded."""
        if self.end_reason is not None or self.completed:
            return "ending"
        sub = self.sub
        if sub is None:
            return "submitting"
        if sub.done:
            return "writing" if sub.state is State.FINISHED else "ending"
        if not sub.outputs:
            return "waiting"
        return "streaming" if sub.parked else "writing"


class Observer(Protocol):
    """Told when each request begins and when it has ended (``http/observe.py``)."""

    def begin(self, handle: RequestHandle, submit: Submit) -> Submit:
        """The request is about to be submitted; returns the submit to send (with the
        trace context, when tracing)."""

    def submitted(self, handle: RequestHandle) -> None:
        """``handle.sub`` is the engine request now."""

    def ended(self, handle: RequestHandle, outcome: Ending) -> None:
        """The request is over: ``completed``, ``engine_error`` or an early end's reason."""


class Endable(Protocol):
    """What the registry holds: a request (:class:`RequestHandle`) or a fan-out group of
    them (``fanout.GroupHandle``), which its owner's cancel or the drain ends."""

    id: str
    owner: int | None

    def end(self, reason: EndReason) -> None: ...


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

    def handles(self) -> list[Endable]:
        """Every request (and fan-out group) in flight."""
        return list(self._handles.values())

    def end_all(self, reason: EndReason) -> int:
        handles = list(self._handles.values())
        for handle in handles:
            handle.end(reason)
        return len(handles)


#: How the request learns that its client went away: given the call that ends the
#: request, a context that watches while it is open (the exchange's ``watch_disconnect``;
#: ``connection_watches`` where the connection ends its requests itself: WebSocket, and
#: the members of a fan-out group).
DisconnectWatch = Callable[[Callable[[], None]], AbstractAsyncContextManager[object]]


def connection_watches(on_gone: Callable[[], None]) -> AbstractAsyncContextManager[object]:
    """No watch of its own: the request's connection (or group) ends it through its handle."""
    return contextlib.nullcontext()


@attrs.frozen
class Generations:
    """What every generation request of one server runs with, bound once
    (``Services.generations``), so that each route passes only what differs."""

    engines: EngineClient
    registry: Registry
    observer: Observer
    #: Outputs a request may have queued (``--stream-buffer``), unless it needs more.
    buffer: int

    async def run(
        self,
        handle: RequestHandle,
        submit: Submit,
        capability: str,
        writer: Writer,
        timeout: float,
        *,
        watch_disconnect: DisconnectWatch = connection_watches,
        keepalive: float = 0,
        buffer: int = 0,
    ) -> None:
        """:func:`run_generation` for ``handle``. ``watch_disconnect``: the exchange's,
        for a request that has a client of its own to watch; by default none (the
        connection or group ends it through its handle). ``buffer``: when the request
        needs more than ``--stream-buffer`` (an answer of a known number of items all
        made in one step)."""
        await run_generation(
            engines=self.engines,
            registry=self.registry,
            submit=submit,
            capability=capability,
            writer=writer,
            timeout=timeout,
            buffer=max(buffer, self.buffer),
            watch_disconnect=watch_disconnect,
            observer=self.observer,
            handle=handle,
            keepalive=keepalive,
        )


async def run_generation(
    *,
    engines: EngineClient,
    registry: Registry,
    submit: Submit,
    capability: str,
    writer: Writer,
    timeout: float,
    buffer: int,
    watch_disconnect: DisconnectWatch,
    observer: Observer,
    handle: RequestHandle | None = None,
    keepalive: float = 0,
) -> None:
    """Serve one generation request from submit to last byte (or to its early end).

    The tree, the same for every route and server::

        request scope (deadline; RequestHandle.end cancels it)
          prepare           the engine link's (tokenization): cancellable, owes no abort
          submit            the subscription, inside the scope whose exit ends it
          disconnect watch  (calls handle.end(DISCONNECT))
            relay           subscription -> writer, until the last output

    What the prepare phase refuses (an :class:`~trioserve.errors.InputError`: a 400 for a
    prompt the text pipeline cannot take) is the response, as an engine refused before
    any engine heard of the request is.

    ``observer`` is told when the request begins and ends (metrics, traces).
    ``handle`` lets the caller keep a reference to end the request itself. With
    ``keepalive`` > 0, ``writer.keepalive()`` is called every that many seconds until the
    first output (SSE comment lines, so proxies keep a prefilling stream open).
    """
    handle = handle or RequestHandle(submit.request_id)
    # Counted in flight from here (metrics.REQUESTS_IN_FLIGHT).
    if registry.add(handle):
        # Another key's request has this id in flight: the engine tells them apart.
        submit = attrs.evolve(submit, request_id=f"{submit.request_id}.{os.urandom(6).hex()}")
    outcome: Ending = EndReason.ERROR  # until it is known: left by a bug
    error: HTTPError | None = None
    refused: Refusal | None = None
    try:
        submit = observer.begin(handle, submit)
        if timeout > 0:
            handle.scope.relative_deadline = timeout
        with handle.scope:
            try:
                preparer = engines.preparer_for(submit, capability)
                if preparer is None:
                    prepared = Prepared(submit)
                else:
                    prepared = await _prepare(preparer, submit, handle, watch_disconnect)
                handle.sub = engines.submit(
                    prepared, capability, buffer=buffer, on_failure=handle.end
                )
                observer.submitted(handle)
                writer.prepare()
                async with watch_disconnect(partial(handle.end, EndReason.DISCONNECT)):
                    error = await _relay(handle.sub, writer, handle, keepalive)
            except EngineError as exc:  # refused before it reached an engine
                error = http_error(exc)
                refused = Refusal(exc.code)
            except HTTPError as exc:  # the prepare phase refused it (a 400)
                error, refused = exc, Refusal(exc.code)
            finally:
                # However the scope is left, the request is over. Left without a reason:
                # the deadline, or a bug on the way out (its exception goes on up); either
                # way the one abort leaves from RequestHandle.end (a no-op once the engine
                # ended the request, or before it was submitted).
                if handle.end_reason is None and not handle.completed:
                    if handle.scope.cancel_called:
                        handle.end(EndReason.DEADLINE)
                    elif handle.sub is not None and not handle.sub.done:
                        handle.end(EndReason.ERROR)
        if handle.completed:
            outcome = Outcome.COMPLETED
            return
        reason = handle.end_reason
        outcome = reason or refused or Outcome.ENGINE_ERROR
        if reason is EndReason.DISCONNECT:
            return
        if error is None:
            reason = reason or EndReason.INTERNAL_ERROR
            message = None
            if reason is EndReason.DEADLINE:
                message = f"{END_ANSWERS[reason].message} of {timeout:g} s"
            error = end_error(reason, message)
        with trio.move_on_after(ERROR_WRITE_TIMEOUT):
            await writer.fail(error)
    finally:
        registry.remove(handle)
        handle.outcome = outcome
        observer.ended(handle, outcome)
        if handle.sub is not None:
            handle.sub.release_owner()  # no cycle left to wait for the garbage collector


async def _prepare(
    preparer: Preparer, submit: Submit, handle: RequestHandle, watch_disconnect: DisconnectWatch
) -> Prepared:
    """The prepare phase, watched for the client's hang-up (a long tokenization; a short
    one is done at once, unwatched: it cannot be waited for); its refusal is raised
    outside the watch, whose task group would wrap it, as the answer the client reads."""
    refusal: HTTPError | None = None
    try:
        prepared = preparer.prepare_at_once(submit)
    except (InputError, HTTPError) as exc:
        raise http_error(exc) from None
    if prepared is not None:
        return prepared
    async with watch_disconnect(partial(handle.end, EndReason.DISCONNECT)):
        try:
            return await preparer.prepare(submit)
        except (InputError, HTTPError) as exc:
            refusal = http_error(exc)
    raise refusal


async def _relay(
    sub: Subscription, writer: Writer, handle: RequestHandle, keepalive: float
) -> HTTPError | None:
    """Move outputs to the writer until the last one; the engine's error if it sent one."""
    try:
        # Plain deltas may skip this task from the first one on (a writer that can start
        # its response synchronously), or once the response has started.
        sub.sink = writer.sink()
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
        sub.sink = writer.sink()  # started now: the plain per-event sink from here on
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
    except (EngineError, SlowClientError, WriterFailedError) as exc:
        # The subscription failed (engine lost or failed, slow client, a writer's bug);
        # its on_failure has already ended the request with that reason.
        error = http_error(exc)
        return error if error.status == 500 else None


async def _first_batch(sub: Subscription, writer: Writer, keepalive: float) -> list[OutputItem]:
    while True:
        # Cancelling receive_batch loses nothing: its only checkpoint is the wait for the
        # first item, which a cancelled channel receive leaves queued.
        with trio.move_on_after(keepalive):
            return await sub.receive_batch()
        await writer.keepalive()
