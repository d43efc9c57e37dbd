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
- ``responses_store_bytes``: everything held, as Python holds it (:func:`held_bytes`
  of the echoed request fields and of the conversation, each text part and retained
  event with its header, :data:`RECORD_OVERHEAD` per response);
- ``responses_store_bytes_per_key``: what one API key may hold of it (by default an
  equal share per configured key). Room is made by dropping that key's own finished
  responses, oldest first; a record that still finds no room is refused to that key
  (a background one: 503 ``response_store_full``; a running one fails with it), never
  taken from another key's share.

The interface the routes use is :meth:`~ResponseStore.get`, :meth:`~ResponseStore.keep`,
:meth:`~ResponseStore.start_background`, :meth:`~ResponseStore.delete` and the
:class:`StoredResponse` they return: another store (shared between frontends) would
implement those.
"""

from __future__ import annotations

import collections
import logging
import math
import sys
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import trio

from ..ends import EndReason
from ..protocol import OutputItem
from .errors import HTTPError, WriterRefused
from .lifecycle import RequestHandle
from .memory import RETRY_AFTER
from .writers.openai import text_of
from .writers.response_events import ResponseEvents
from .writers.response_items import Event
from .writers.stream import Sink, WriterBase

log = logging.getLogger("trioserve.responses")

#: Bytes counted for each stored response besides what :func:`held_bytes` counts of its
#: echoed fields, its text parts and its events: the objects every record has (the
#: record, its ``ResponseEvents``, their attribute dicts, its ``trio.Event`` and parking
#: lot, its ids, its entries in the store's dicts). Set from RSS measured per record
#: (``tools/store_overhead.py``; the figures in docs/benchmarks.md), with a margin.
RECORD_OVERHEAD = 2048
#: Bytes of a retained event besides ``sys.getsizeof`` of its JSON: its ``(kind, data)``
#: tuple (56), its slot in the list (8), and the allocator's rounding and the list's
#: growth, as measured with the record's overhead.
EVENT_SLOT = 96
#: Bytes of a text part besides ``sys.getsizeof`` of the string: its slot in the list.
PART_SLOT = 8
#: The kind of event the writer renders without orjson (see :func:`retainable`).
DELTA = "response.output_text.delta"
#: Seconds between two sweeps for expired responses (each access sweeps too).
SWEEP_INTERVAL = 10.0


def held_bytes(value: Any) -> int:
    """What ``value`` (JSON-like: dicts, lists, strings, numbers) holds in memory, by
    ``sys.getsizeof`` of each object in it, shared ones once. Iterative: a value nested
    any depth is measured without recursion."""
    total = 0
    seen: set[int] = set()
    stack = [value]
    while stack:
        item = stack.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        total += sys.getsizeof(item)
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return total


def echo_bytes(value: Any) -> int:
    """What a response's echoed request fields (or its conversation) hold, with the
    allocator's slack as for text parts (measured alike)."""
    return held_bytes(value) * 5 // 4


def retainable(events: list[Event]) -> list[Event]:
    """``events`` as they are worth keeping: orjson leaves the bytes it returns in an
    allocation of at least 4 KiB whatever their length (``sys.getsizeof`` does not see
    it), so a retained lifecycle event held four to eight times its size; a copy is
    exact. (The deltas are joined here already, exactly.)"""
    return [(kind, data if kind == DELTA else memoryview(data).tobytes()) for kind, data in events]


def events_bytes(events: Iterable[Event]) -> int:
    """What retained ``events`` hold."""
    return sum(sys.getsizeof(data) + EVENT_SLOT for _, data in events)


def parts_bytes(parts: Iterable[str]) -> int:
    """What a response's text ``parts`` hold (a ``str`` of one non-Latin-1 character
    takes 2 or 4 bytes for every character: counted as held, not as UTF-8), and a
    quarter more: what the allocator keeps of the many small parts a text was joined
    from (measured with :data:`RECORD_OVERHEAD`)."""
    return sum(sys.getsizeof(part) * 5 // 4 + PART_SLOT for part in parts)


class StoredResponse:
    """A response the store holds: its state (``events``, which renders the ``Response``
    object), its retained events (``retained[n]`` has ``sequence_number`` n), and, while
    it runs in the background, the handle that ends it."""

    def __init__(
        self, events: ResponseEvents, owner: int | None, handle: RequestHandle | None = None
    ) -> None:
        self.id = events.id
        self.events = events
        #: The API key that created it (``http/auth.py``): only it may see or cancel it,
        #: and it counts against that key's share of the store.
        self.owner = owner
        self.handle = handle
        self.retained: list[Event] = []
        #: Bytes of its text parts (within ``size``).
        self.text_size = parts_bytes(events.parts)
        #: Everything it holds, as the store counts it (its conversation's messages may
        #: be shared with the response it continued: counted in both, never less).
        self.size = (
            RECORD_OVERHEAD + echo_bytes(events.echo) + echo_bytes(events.inputs) + self.text_size
        )
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

    def _compact(self) -> int:
        """Join its text parts into one string (a finished response's text no longer
        grows; one part per delta costs a string header each): the bytes it changes."""
        parts = self.events.parts
        if len(parts) <= 1:
            return 0
        parts[:] = ["".join(parts)]
        before, self.text_size = self.text_size, parts_bytes(parts)
        self.size += self.text_size - before
        return self.text_size - before


def events_overflow(limit: int) -> HTTPError:
    return HTTPError(
        500,
        f"the response exceeded the {limit} events a background response may retain "
        "(--responses-max-events)",
        "response_events_overflow",
    )


def store_full(limit: int, quota: int, shared: bool) -> HTTPError:
    if shared:
        message = (
            f"this API key's share of the response store is full ({quota} bytes, "
            "--responses-store-mb-per-key); delete responses or retry once they expire"
        )
    else:
        message = f"the response store is full ({limit} bytes, --responses-store-mb)"
    return HTTPError(503, message, "response_store_full")


def server_stopped() -> HTTPError:
    return HTTPError(503, "the server is shutting down", "server_shutting_down")


class _Tenant:
    """What one API key (or, without keys, everyone) holds in the store."""

    __slots__ = ("bytes", "finished")

    def __init__(self) -> None:
        self.bytes = 0
        #: Its finished responses in the order they finished: evicted first for its own.
        self.finished: collections.OrderedDict[str, StoredResponse] = collections.OrderedDict()


class ResponseStore:
    """In-memory responses of this process, within the bounds above. ``clock``: seconds,
    for the TTL (trio's clock by default, so a test can drive it with ``MockClock``).

    Tenants: each owner (API key) may hold ``quota`` bytes (default: ``max_bytes``
    divided by ``tenants``, the number of keys, so that every key can always have its
    share). Room for an owner is made by dropping *its own* finished responses, oldest
    first; when the whole store is full, an owner still under its fair share
    (``max_bytes / tenants``) may also drop the oldest finished responses of owners over
    theirs (possible only when ``quota`` is set above the fair share). Whatever still
    does not fit is refused (503 ``response_store_full``) to that owner, never taken
    from another.
    """

    def __init__(
        self,
        *,
        ttl: float,
        max_events: int,
        max_background: int,
        max_bytes: int,
        tenants: int = 1,
        quota: int = 0,
        clock: Callable[[], float] = trio.current_time,
    ) -> None:
        self.ttl = ttl
        self.max_events = max_events
        self.max_background = max_background
        self.max_bytes = max_bytes
        self.tenants = max(tenants, 1)
        #: Bytes one owner may hold at most in all.
        self.fair_share = max_bytes // self.tenants
        self.quota = quota if quota > 0 else self.fair_share
        self.clock = clock
        self._records: dict[str, StoredResponse] = {}
        #: Finished responses in the order they finished: the first expires first.
        self._finished: collections.OrderedDict[str, StoredResponse] = collections.OrderedDict()
        self._owners: dict[int | None, _Tenant] = {}
        #: Bytes held by the responses in ``_records``.
        self.bytes = 0
        #: Background responses generating now.
        self.running = 0
        self._nursery: trio.Nursery | None = None
        self._idle = trio.lowlevel.ParkingLot()

    def __len__(self) -> int:
        return len(self._records)

    def held_by(self, owner: int | None) -> int:
        """Bytes ``owner``'s responses hold."""
        tenant = self._owners.get(owner)
        return 0 if tenant is None else tenant.bytes

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
        not serving, its owner's share is full, or ``max_background_responses`` are
        running."""
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
            created = retainable(record.events.begin())
            record.retained.extend(created)
            record.size += events_bytes(created)
        self.expire()
        if not self._make_room(record.owner, record.size):
            raise self._full()
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
        """Keep a finished foreground response (its final ``Response`` object), unless
        its owner's share cannot make room for it (logged)."""
        record = StoredResponse(events, owner)
        record._compact()
        self.expire()
        if not self._make_room(owner, record.size):
            log.warning("response %s not kept: %s", record.id, self._full().message)
            return
        self._add(record)
        self._finish(record)

    def delete(self, record: StoredResponse) -> None:
        """Forget ``record``; a background response still running is cancelled first."""
        if record.handle is not None and not record.finished:
            record.handle.end(EndReason.CANCEL)
        self._drop(record)

    # -- what the background writer uses -------------------------------------------------

    def append(self, record: StoredResponse, events: list[Event], parts: list[str]) -> None:
        """Retain ``events`` (and count the text ``parts`` the response now holds more),
        or raise :class:`WriterRefused` past a bound, retaining nothing."""
        if len(record.retained) + len(events) > self.max_events:
            raise WriterRefused(events_overflow(self.max_events), EndReason.RESPONSE_OVERFLOW)
        events = retainable(events)
        text = parts_bytes(parts)
        added = text + events_bytes(events)
        if record.id in self._records:
            if not self._make_room(record.owner, added):
                raise WriterRefused(self._full(), EndReason.RESPONSE_OVERFLOW)
            self._count(record.owner, added)
        record.size += added
        record.text_size += text
        record.retained.extend(events)
        record._wake()

    def finish(self, record: StoredResponse) -> None:
        """``record`` has ended (its last event is retained): its TTL starts."""
        self._finish(record)

    def fail(self, record: StoredResponse, error: HTTPError) -> None:
        """End ``record`` with ``error`` (``response.failed``, kept past every bound)."""
        if record.finished:
            return
        events = retainable(record.events.fail(error))
        added = events_bytes(events)
        record.retained.extend(events)
        record.size += added
        if record.id in self._records:
            self._count(record.owner, added)
        self._finish(record)

    # -- bookkeeping ---------------------------------------------------------------------

    def _tenant(self, owner: int | None) -> _Tenant:
        tenant = self._owners.get(owner)
        if tenant is None:
            tenant = self._owners[owner] = _Tenant()
        return tenant

    def _count(self, owner: int | None, size: int) -> None:
        self.bytes += size
        self._tenant(owner).bytes += size

    def _full(self) -> HTTPError:
        return store_full(self.max_bytes, self.quota, self.tenants > 1)

    def _add(self, record: StoredResponse) -> None:
        self._records[record.id] = record
        self._count(record.owner, record.size)

    def _finish(self, record: StoredResponse) -> None:
        record.finished_at = self.clock()
        if self._records.get(record.id) is record:
            self._count(record.owner, record._compact())
            self._finished[record.id] = record
            self._tenant(record.owner).finished[record.id] = record
        else:
            record._compact()
        record.done.set()
        record._wake()
        self.expire()

    def _drop(self, record: StoredResponse) -> None:
        if self._records.get(record.id) is record:
            del self._records[record.id]
            self._finished.pop(record.id, None)
            tenant = self._tenant(record.owner)
            tenant.finished.pop(record.id, None)
            self._count(record.owner, -record.size)
            if not tenant.bytes and not tenant.finished:
                del self._owners[record.owner]

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

    def _make_room(self, owner: int | None, needed: int) -> bool:
        """Make room for ``needed`` more bytes of ``owner``'s (see the class docstring);
        whether they fit now."""
        own = self._tenant(owner)
        while own.finished and own.bytes + needed > self.quota:
            self._drop(next(iter(own.finished.values())))
        if own.bytes + needed > self.quota:
            return False
        while self.bytes + needed > self.max_bytes:
            # A key within its fair share takes back from those over theirs first.
            if own.bytes + needed <= self.fair_share and (victim := self._over_share()):
                self._drop(victim)
            elif own.finished:
                self._drop(next(iter(own.finished.values())))
            else:
                return False
        return True

    def _over_share(self) -> StoredResponse | None:
        """The oldest finished response of an owner over its fair share, if any."""
        over = [
            next(iter(t.finished.values()))
            for t in self._owners.values()
            if t.bytes > self.fair_share and t.finished
        ]
        return min(over, key=lambda r: r.finished_at or 0.0, default=None)


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
                self.store.append(self.record, events.output(text), [text])
            except WriterRefused:
                events.rollback(mark)
                return items  # write() meets the bound again, and fails the response
        return items[taken:]

    async def write(self, batch: list[OutputItem]) -> bool:
        events = self.record.events
        mark = events.mark()
        texts_before = len(events.parts)
        out, done, failure = events.take(batch)
        try:
            self.store.append(self.record, out, events.parts[texts_before:])
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
