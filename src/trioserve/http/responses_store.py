"""The response store: responses kept beyond their request, in this process's memory.

What it keeps:

- **background responses** (``background: true``): each runs in a task of the store's own
  nursery (:meth:`ResponseStore.serve`), not in the connection of the client that
  created it, so it goes on when that client leaves. Its typed events are retained, so
  a client can replay them (``GET /v1/responses/{id}?stream=true&starting_after=N``)
  and follow the live ones; ``POST /v1/responses/{id}/cancel`` ends it with one abort.
  The request inside the task is an ordinary one: one cancel scope, in the registry
  (so the drain deadline and ``DELETE /v1/requests/{id}`` end it), one abort however it
  ends early.
- **finished foreground responses** with ``store: true`` (the default): their final
  ``Response`` object, for ``GET /v1/responses/{id}``.

Each keeps its conversation too (``ResponseEvents.inputs``: what it continued and its
input, counted in its size), so a next turn's ``previous_response_id`` continues it
(:meth:`StoredResponse.conversation`); ``store: false`` keeps nothing.

The bounds (``config.Settings``; docs/api.md):

- ``responses_ttl``: a finished response is kept this long after it finished;
- ``responses_max_events``: events a background response may retain; the one past it
  fails the response (``response_events_overflow``) and aborts its engine request; the
  ``response.failed`` that says so is always kept;
- ``max_background_responses``: background responses generating at once (503 past it);
- ``responses_store_bytes``: everything held (retained events, each response's text and
  conversation, :data:`RECORD_OVERHEAD` per response). Finished responses are dropped
  oldest first to make room; a running one that still finds no room fails (``response_store_full``).

The interface the routes use is :meth:`~ResponseStore.get`, :meth:`~ResponseStore.keep`,
:meth:`~ResponseStore.start_background`, :meth:`~ResponseStore.delete` and the
:class:`StoredResponse` they return: another store (shared between frontends) would
implement those.
"""

from __future__ import annotations

import collections
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from ..ends import EndReason
from ..errors import HTTPError, WriterRefused
from ..protocol import OutputItem
from .admission import RETRY_AFTER
from .lifecycle import RequestHandle
from .writers.responses import Event, ResponseEvents
from .writers.stream import Sink, WriterBase, text_of

log = logging.getLogger("trioserve.responses")

#: Bytes counted for each stored response besides its events and text (its state, its
#: entry in the store).
RECORD_OVERHEAD = 1024
#: Seconds between two sweeps for expired responses (each access sweeps too).
SWEEP_INTERVAL = 10.0


class StoredResponse:
    """A response the store holds: its state (``events``, which renders the ``Response``
    object), its retained events (``retained[n]`` has ``sequence_number`` n), and, while
    it runs in the background, the handle that ends it."""

    def __init__(
        self, events: ResponseEvents, owner: int | None, handle: RequestHandle | None = None
    ) -> None:
        self.id = events.id
        self.events = events
        #: The API key that created it (``http/auth.py``): only it may see or cancel it.
        self.owner = owner
        self.handle = handle
        self.retained: list[Event] = []
        self.size = RECORD_OVERHEAD + payload_bytes(events.inputs)
        self.finished_at: float | None = None
        #: Set once the response has finished (its last event is retained).
        self.done = trio.Event()
        self._lot = trio.lowlevel.ParkingLot()

    @property
    def background(self) -> bool:
        return self.events.background

    def conversation(self) -> list[dict[str, Any]]:
        """Its conversation as a next turn continues it (``previous_response_id``): what
        it continued, its input, and its answer, as chat messages."""
        return [*self.events.inputs, *self.events.output_messages()]

    @property
    def finished(self) -> bool:
        return self.finished_at is not None

    async def wait_beyond(self, count: int) -> None:
        """Return once more than ``count`` events are retained, or the response has
        finished."""
        if len(self.retained) > count or self.finished:
            await trio.lowlevel.checkpoint()
            return
        await self._lot.park()

    def _wake(self) -> None:
        self._lot.unpark_all()


def payload_bytes(value: Any) -> int:
    """The bytes of the text and binary data in ``value`` (chat messages: dicts, lists,
    strings, media records' bytes), and 8 for anything else; iterative, so any depth."""
    total = 0
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str | bytes | bytearray | memoryview):
            total += len(item)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
        else:
            total += 8
    return total


def events_overflow(limit: int) -> HTTPError:
    return HTTPError(
        500,
        f"the response exceeded the {limit} events a background response may retain "
        "(--responses-max-events)",
        "response_events_overflow",
    )


def store_full(limit: int) -> HTTPError:
    return HTTPError(
        503,
        f"the response store is full ({limit} bytes, --responses-store-mb)",
        "response_store_full",
    )


def server_stopped() -> HTTPError:
    return HTTPError(503, "the server is shutting down", "server_shutting_down")


class ResponseStore:
    """In-memory responses of this process, within the bounds above. ``clock``: seconds,
    for the TTL (trio's clock by default, so a test can drive it with ``MockClock``)."""

    def __init__(
        self,
        *,
        ttl: float,
        max_events: int,
        max_background: int,
        max_bytes: int,
        clock: Callable[[], float] = trio.current_time,
    ) -> None:
        self.ttl = ttl
        self.max_events = max_events
        self.max_background = max_background
        self.max_bytes = max_bytes
        self.clock = clock
        self._records: dict[str, StoredResponse] = {}
        #: Finished responses in the order they finished: the first expires first.
        self._finished: collections.OrderedDict[str, StoredResponse] = collections.OrderedDict()
        #: Bytes held by the responses in ``_records``.
        self.bytes = 0
        #: Background responses generating now.
        self.running = 0
        self._nursery: trio.Nursery | None = None
        self._idle = trio.lowlevel.ParkingLot()

    def __len__(self) -> int:
        return len(self._records)

    # -- the task that owns background responses ----------------------------------------

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the background responses' tasks and sweep expired responses; never
        returns. Cancelling it ends what still runs (each with its one abort)."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            try:
                while True:
                    await trio.sleep(min(SWEEP_INTERVAL, self.ttl) if self.ttl > 0 else math.inf)
                    self.expire()
            finally:
                self._nursery = None

    async def wait_idle(self) -> None:
        """Return once no background response is generating."""
        while self.running:
            await self._idle.park()

    def start_background(self, record: StoredResponse, run: Callable[[], Awaitable[None]]) -> None:
        """Store ``record`` (with its ``response.created``) and run ``run()``, its
        generation, in the store's nursery. Raises the 503 to answer when the store is
        not serving, is full, or ``max_background_responses`` are running."""
        nursery = self._nursery
        if nursery is None:
            raise HTTPError(
                503,
                "background responses are not served here (the response store is not running)",
                "background_unavailable",
            )
        if self.running >= self.max_background:
            raise HTTPError(
                503,
                f"the server is running its limit of {self.max_background} background "
                "responses (--max-background-responses); retry later",
                "too_many_background_responses",
                headers=[(b"retry-after", str(RETRY_AFTER).encode())],
            )
        if not record.events.began:  # response.created: sequence number 0
            created = record.events.begin()
            record.retained.extend(created)
            record.size += sum(len(data) for _, data in created)
        self.expire()
        self._make_room(record.size)
        if self.bytes + record.size > self.max_bytes:
            raise store_full(self.max_bytes)
        self.running += 1
        self._add(record)
        nursery.start_soon(self._run, record, run)

    async def _run(self, record: StoredResponse, run: Callable[[], Awaitable[None]]) -> None:
        try:
            await run()
        except HTTPError as error:  # refused before it reached the engine
            self.fail(record, error)
        except Exception:
            # A fault in one response ends that response, never the store's nursery.
            log.exception("background response %s failed", record.id)
            self.fail(record, HTTPError(500, "internal error", "internal_error"))
        finally:
            self.running -= 1
            self._idle.unpark_all()
            if not record.finished:  # cancelled with the store (the server stopping)
                self.fail(record, server_stopped())

    # -- what routes use -----------------------------------------------------------------

    def get(self, response_id: str, owner: int | None) -> StoredResponse | None:
        """Response ``response_id`` if the key ``owner`` created it and it has not
        expired: to any other key, it does not exist."""
        self.expire()
        record = self._records.get(response_id)
        if record is None or record.owner != owner:
            return None
        return record

    def keep(self, events: ResponseEvents, owner: int | None) -> None:
        """Keep a finished foreground response (its final ``Response`` object)."""
        record = StoredResponse(events, owner)
        record.size += len(events.text.encode())
        self.expire()
        self._make_room(record.size)
        if self.bytes + record.size > self.max_bytes:
            log.warning("response %s not kept: the response store is full", record.id)
            return
        self._add(record)
        self._finish(record)

    def delete(self, record: StoredResponse) -> None:
        """Forget ``record``; a background response still running is cancelled first."""
        if record.handle is not None and not record.finished:
            record.handle.end(EndReason.CANCEL)
        self._drop(record)

    # -- what the background writer uses -------------------------------------------------

    def append(self, record: StoredResponse, events: list[Event], text_bytes: int) -> None:
        """Retain ``events`` (and count ``text_bytes`` of text the response now holds), or
        raise :class:`WriterRefused` past a bound, retaining nothing."""
        if len(record.retained) + len(events) > self.max_events:
            raise WriterRefused(events_overflow(self.max_events), EndReason.RESPONSE_OVERFLOW)
        added = text_bytes + sum(len(data) for _, data in events)
        if record.id in self._records:
            self._make_room(added)
            if self.bytes + added > self.max_bytes:
                raise WriterRefused(store_full(self.max_bytes), EndReason.RESPONSE_OVERFLOW)
            self.bytes += added
        record.size += added
        record.retained.extend(events)
        record._wake()

    def finish(self, record: StoredResponse) -> None:
        """``record`` has ended (its last event is retained): its TTL starts."""
        self._finish(record)

    def fail(self, record: StoredResponse, error: HTTPError) -> None:
        """End ``record`` with ``error`` (``response.failed``, kept past every bound)."""
        if record.finished:
            return
        events = record.events.fail(error)
        added = sum(len(data) for _, data in events)
        record.retained.extend(events)
        record.size += added
        if record.id in self._records:
            self.bytes += added
        self._finish(record)

    # -- bookkeeping ---------------------------------------------------------------------

    def _add(self, record: StoredResponse) -> None:
        self._records[record.id] = record
        self.bytes += record.size

    def _finish(self, record: StoredResponse) -> None:
        record.finished_at = self.clock()
        if self._records.get(record.id) is record:
            self._finished[record.id] = record
        record.done.set()
        record._wake()
        self.expire()
        self._make_room(0)

    def _drop(self, record: StoredResponse) -> None:
        if self._records.get(record.id) is record:
            del self._records[record.id]
            self.bytes -= record.size
            self._finished.pop(record.id, None)

    def expire(self) -> None:
        """Drop the finished responses older than the TTL."""
        finished = self._finished
        if not finished:
            return
        oldest = self.clock() - self.ttl
        while finished:
            record = next(iter(finished.values()))
            assert record.finished_at is not None
            if record.finished_at > oldest:
                return
            self._drop(record)

    def _make_room(self, needed: int) -> None:
        """Drop finished responses, oldest first, until ``needed`` more bytes fit."""
        finished = self._finished
        while finished and self.bytes + needed > self.max_bytes:
            self._drop(next(iter(finished.values())))


class RecordWriter(WriterBase):
    """A background response's writer: every batch's events retained in its record (one
    append, all or nothing), waking whoever follows it; nothing here waits on a
    client."""

    transport = "background"

    def __init__(self, store: ResponseStore, record: StoredResponse) -> None:
        self.store = store
        self.record = record

    def sink(self) -> Sink | None:
        """A synchronous path for plain deltas: the engine connection retains them in its
        read pass (``Subscription.sink``), and the response's task stays asleep. What
        ends the response (the finish, an engine error) and deltas that meet a bound are
        left to :meth:`write`, which ends the response as it must (``response.failed``,
        one abort). (A bound method: every running response holds its sink.) None when
        the answer is parsed (tool calls, reasoning): every delta goes through the parser."""
        return None if self.record.events.parser is not None else self._retain_now

    def _retain_now(self, items: list[OutputItem]) -> list[OutputItem]:
        texts: list[str] = []
        taken = 0
        for item in items:
            if item.finish_reason is not None or item.error is not None:
                break
            if item.data:
                texts.append(text_of(item.data))
            taken += 1
        if texts:
            events = self.record.events
            mark = events.mark()
            text = "".join(texts)
            try:
                self.store.append(self.record, events.output(text), len(text.encode()))
            except WriterRefused:
                events.rollback(mark)
                return items  # write() meets the bound again, and fails the response
        return items[taken:]

    async def write(self, batch: list[OutputItem]) -> bool:
        events = self.record.events
        mark = events.mark()
        texts_before = len(events.parts)
        out, done, failure = events.take(batch)
        text_bytes = sum(len(part.encode()) for part in events.parts[texts_before:])
        try:
            self.store.append(self.record, out, text_bytes)
        except WriterRefused:
            events.rollback(mark)
            raise
        if failure is not None:
            raise failure
        if done:
            self.store.finish(self.record)
        return done

    async def fail(self, error: HTTPError) -> None:
        self.store.fail(self.record, error)
