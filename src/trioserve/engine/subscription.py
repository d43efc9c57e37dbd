"""A request's view of its engine outputs: a bounded channel plus exactly-once ending.

A :class:`Subscription` ends exactly once (its state leaves ``open`` once, by the table
in :mod:`trioserve.ends`), in one of four ways:

- ``finished``: the engine sent the request's last item (a finish reason or an error);
  the engine has ended it, so no abort is sent;
- ``concluded``: the frontend decided a successful end (a stop string matched in its text
  pipeline: :meth:`Subscription.conclude`); one abort is queued, and the consumer reads
  the frontend's last item as it would the engine's;
- ``aborted``: the frontend gave up on it (client gone, deadline, cancel, slow client,
  drain); one abort is queued to the engine;
- ``lost``: the engine stopped answering, or failed (broke the protocol); one abort is
  queued too, in case the engine was only hung and comes back.

Ending is synchronous (it only queues the abort for the socket's owner task), so it can
run in a ``finally`` under cancellation without awaiting anything, and it is idempotent.

**Failover.** Until an output has been delivered (to the queue or the sink: before that,
nothing of it can have reached the client), a subscription that its engine refuses (a
first item its link calls a refusal, :meth:`RequestLink.refusal`: draining, at its
limit) or loses (``engine_lost``, ``engine_failed``) is not ended:
:attr:`Subscription.retry` (set by the engine client) submits the request to another
engine, once, and the consumer never knows. The first engine needs no abort for a
refusal (its error item ended the request there) and gets one for a loss. From the first
delivered output on, or after one failover, the request ends as described above.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable
from time import perf_counter
from typing import Protocol

import trio

from .. import metrics
from ..ends import EndReason, State, ended_by, transition
from ..errors import EngineLostError, SlowClientError, TrioserveError, WriterFailedError
from ..protocol import ErrorInfo, OutputItem

log = logging.getLogger("trioserve.request")

#: Default bound of a subscription's channel, in output items (one token each for text).
DEFAULT_BUFFER = 256


class RequestLink(Protocol):
    """What a subscription needs of its engine's link (``engine.link.EngineLink``)."""

    #: The engine's address (logs).
    address: str

    def forget(self, request_id: str) -> None:
        """Deliver nothing more for ``request_id``."""

    def queue_abort(self, request_id: str) -> None:
        """Queue one abort of ``request_id`` (it leaves with the next flush)."""

    def hold(self, sub: Subscription) -> None:
        """Call ``sub.release()`` when the current read pass ends."""

    def refusal(self, error: ErrorInfo) -> str | None:
        """The failover reason if ``error``, a request's first item, is the engine
        refusing it before it began (it ended the request itself); else None."""


class Subscription:
    """Outputs of one submitted request: :meth:`receive_batch` them; :meth:`abort` it."""

    # (Slots: every open stream holds one.)
    __slots__ = (
        "_bound",
        "_closed",
        "_held",
        "_items",
        "_on_failure",
        "_waiter",
        "_woken",
        "engine",
        "error",
        "final",
        "first_output_at",
        "gaps",
        "last_output_at",
        "outputs",
        "request_id",
        "retry",
        "sink",
        "state",
    )

    def __init__(
        self,
        engine: RequestLink,
        request_id: str,
        buffer: int = DEFAULT_BUFFER,
        on_failure: Callable[[EndReason], None] | None = None,
    ) -> None:
        self.engine = engine
        self.request_id = request_id
        self.state = State.OPEN
        #: Set when the subscription failed (slow client, engine lost).
        self.error: TrioserveError | None = None
        self._on_failure = on_failure
        # A bounded queue and one parked consumer: what a memory channel does, without
        # its per-item bookkeeping (this is the per-token path).
        self._items: collections.deque[OutputItem] = collections.deque()
        self._bound = buffer
        self._closed = False  # no more items will be added
        self._waiter: trio.lowlevel.Task | None = None
        #: The consumer was woken from :meth:`receive_batch` and has not run since: what
        #: is queued meanwhile came in the socket owner's pass, not while it was behind.
        self._woken = False
        #: Optional synchronous consumer (see ``deliver``): given items, it returns what
        #: is left of them for the queue (``[]`` when it took them all). A final item (a
        #: finish) is never taken whole: at most its ``data`` goes, and the rest returns.
        self.sink: Callable[[list[OutputItem]], list[OutputItem]] | None = None
        #: Items held for the sink until the engine connection's read pass ends.
        self._held: list[OutputItem] | None = None
        # What the request's figures are made of (metrics, traces, the live view), kept
        # per write of outputs, not per item: when the first and the last output reached
        # the writer (``time.perf_counter``; 0: none yet) and how many items did.
        self.first_output_at = 0.0
        self.last_output_at = 0.0
        self.outputs = 0
        #: Given the gap since the previous write at every write but the first (the
        #: inter-token latency histogram), or None.
        self.gaps: Callable[[float], None] | None = None
        #: The request's last item (a finish or an error), once the engine sent it.
        self.final: OutputItem | None = None
        #: Set by the engine client: ``retry(sub, reason)`` submits the request to another
        #: engine, True if it did (module docstring). None once an output was delivered,
        #: or after one failover.
        self.retry: Callable[[Subscription, str], bool] | None = None

    # -- called by the engine connection (in its socket-owner task) --------------------

    def deliver(self, item: OutputItem) -> None:
        """Hand one item to the consumer, never blocking the caller."""
        if self.retry is not None:  # the first item: nothing delivered yet
            error = item.error
            if error is not None:
                refused = self.engine.refusal(error)
                if refused is not None and self._fail_over(refused):
                    return  # another engine has it; this one ended it itself: no abort
            self.retry = None
        held = self._held
        if held is not None:
            held.append(item)
            if len(held) >= self._bound:
                self.release()
            return
        # The per-token fast path: the consumer is parked with nothing queued, so this item
        # is next in order. It is held for the sink, which the engine connection calls at
        # the end of its read pass (``release``) with what came for this request meanwhile:
        # outputs of several engine steps leave in one write when the frontend is behind,
        # and the consumer stays asleep. Errors always go the consumer's way (before the
        # first token, they are the response's status).
        if not self._items and self._waiter is not None and item.error is None and self.sink:
            self._held = [item]
            self.engine.hold(self)
            return
        self._queue(item)

    def release(self) -> None:
        """Give the held items to the sink, and what it leaves to the consumer.

        Guarded: a sink that raises (a bug in one stream's writer) fails this request
        alone, with one abort; the engine connection goes on releasing the others and
        reading the engine."""
        held, self._held = self._held, None
        if not held or self.error is not None or self.state not in _DELIVERING:
            return  # (ended meanwhile: nothing is owed)
        sink = self.sink
        if sink is not None and self._waiter is not None:
            try:
                rest = sink(held)
            except Exception:
                log.exception("the writer of request %s failed; ending it", self.request_id)
                self.sink = None
                self.fail(WriterFailedError("the response writer failed"), EndReason.INTERNAL_ERROR)
                return
            if len(rest) < len(held):
                self._written(len(held) - len(rest))
            held = rest
        for item in held:
            self._queue(item)

    def _queue(self, item: OutputItem) -> None:
        # OutputItem.final and _wake, written out: this is the per-token path.
        items = self._items
        # The bound is on what a consumer leaves unread, not on what one read pass of the
        # socket owner brings while the consumer, woken, waits for its turn: a frontend
        # that was kept off the CPU for a while finds many engine steps waiting and
        # handles them before any consumer runs. Ending those requests as slow clients
        # would blame the client for the frontend's stall. (What a pass brings is itself
        # bounded: one read of the engine socket, and the consumer runs before the
        # owner's pass after next.)
        if len(items) >= self._bound and not self._woken:
            self.fail(
                SlowClientError("the client is not reading fast enough"), EndReason.SLOW_CLIENT
            )
            return
        items.append(item)
        if item.finish_reason is not None or item.error is not None:
            self.final = item
            if self.state is State.OPEN:  # (CONCLUDED: the frontend's own last item)
                self.state = State.FINISHED
            self.engine.forget(self.request_id)
            self._closed = True
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            self._woken = True
            trio.lowlevel.reschedule(waiter)

    def interrupt(self) -> None:
        """Wake a consumer waiting in :meth:`receive_batch`: it returns what is queued, or
        ``[]`` (the request is ending, and its owner aborts it)."""
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None:
            task, self._waiter = self._waiter, None
            self._woken = True
            trio.lowlevel.reschedule(task)

    def conclude(self, item: OutputItem) -> None:
        """End the request successfully here, with ``item`` (a finish) as its last output:
        the frontend decided it (a stop string matched). One abort leaves to the engine
        now, and nothing more it sends is delivered; the consumer reads ``item`` as it
        would the engine's own last. A no-op once the request has ended."""
        if not item.final:
            raise ValueError("a request is concluded with a final item")
        if not transition(self.state, State.CONCLUDED):
            return
        self.retry = None  # an output is being delivered: no failover from here
        self.state = State.CONCLUDED
        self.engine.forget(self.request_id)
        self.engine.queue_abort(self.request_id)
        metrics.engine_aborts(EndReason.STOP_STRING).inc()
        self.deliver(item)

    def fail(self, error: TrioserveError, reason: EndReason) -> None:
        """End the subscription with an error; the consumer sees ``error`` at once.

        The owner of the request decides how it ends: ``on_failure(reason)`` (the request
        lifecycle's ``RequestHandle.end``) aborts it, from the one place every abort of a
        request leaves. Without an owner, the subscription aborts itself.

        A lost engine before any output is not an end: the request goes to another engine
        (module docstring), and neither the consumer nor the owner hears of it.
        """
        if self.error is not None or self.state not in _DELIVERING:
            return
        if self._held:
            self.release()  # what came before the failure reaches the client before it
            if self.error is not None:
                return  # (the sink failed on it: that is the request's end)
        if self.retry is not None and reason.engine_gone:
            lost = self.engine
            if self._fail_over(reason):
                # In case the engine was only hung and comes back: one abort there.
                lost.queue_abort(self.request_id)
                metrics.engine_aborts(reason).inc()
                return
        self.error = error
        self.engine.forget(self.request_id)  # nothing more is delivered to it
        self._closed = True
        self._wake()
        if self._on_failure is not None:
            self._on_failure(reason)
        self.abort(reason)  # a no-op once the owner has aborted it (or it was concluded)

    def _fail_over(self, reason: str) -> bool:  # (a failover reason: metrics.FAILOVER_REASONS)
        """Hand the request to another engine (once); True if one took it."""
        retry, self.retry = self.retry, None
        old = self.engine
        if retry is None or not retry(self, reason):
            return False
        old.forget(self.request_id)
        return True

    # -- called by the consumer --------------------------------------------------------

    def release_owner(self) -> None:
        """The request is over: forget the owner's callbacks (``on_failure``, the sink).
        They refer back to the owner, which holds this subscription: a reference cycle
        that kept every request, its submitted inputs included, until the garbage
        collector ran (with the server's gc tuning, a 16 MiB prompt's 16 MiB per
        request, for many requests)."""
        self._on_failure = None
        self.sink = None

    def abort(self, reason: EndReason) -> bool:
        """End the request at the engine (one abort), unless it already ended. Idempotent."""
        new = ended_by(reason)
        if not transition(self.state, new):
            return False
        self.state = new
        self.engine.forget(self.request_id)
        self.engine.queue_abort(self.request_id)
        metrics.engine_aborts(reason).inc()
        self._closed = True
        self._wake()
        return True

    @property
    def done(self) -> bool:
        """The engine request has ended (what the consumer has left to read may not)."""
        return self.state is not State.OPEN

    async def receive_batch(self, limit: int = 64) -> list[OutputItem]:
        """Wait for at least one item, then take what else is already waiting (≤ limit).

        Returns ``[]`` at the end of a finished stream; raises the subscription's error if
        it failed.
        """
        if self.error is not None:
            raise self.error
        items = self._items
        if not items:
            if self._closed:
                await trio.lowlevel.checkpoint()
                return []
            if self._waiter is not None:
                raise trio.BusyResourceError("another task is already receiving")
            self._waiter = trio.lowlevel.current_task()

            def abort(_: object) -> trio.lowlevel.Abort:
                self._waiter = None
                return trio.lowlevel.Abort.SUCCEEDED

            await trio.lowlevel.wait_task_rescheduled(abort)
            self._woken = False
            if self.error is not None:
                raise self.error
            if not items:
                return []
        # No checkpoint when items are waiting: the consumer parks as soon as it has
        # taken them, and the items can only come from the task it then lets run.
        if len(items) <= limit:
            batch = list(items)
            items.clear()
        else:
            batch = [items.popleft() for _ in range(limit)]
        # An error item is the request's end, not an output: a request the engine refused
        # before any output has no time to first token and generated nothing.
        written = len(batch) - (batch[-1].error is not None)
        if written:
            self._written(written)
        return batch

    def _written(self, count: int) -> None:
        """``count`` outputs go to the writer now (the sink's, or the consumer's)."""
        now = perf_counter()
        if self.outputs:
            gaps = self.gaps
            if gaps is not None:
                gaps(now - self.last_output_at)
        else:
            self.first_output_at = now
        self.last_output_at = now
        self.outputs += count

    @property
    def parked(self) -> bool:
        """Whether the consumer is waiting for the engine's next output."""
        return self._waiter is not None


#: The states in which items still reach the consumer.
_DELIVERING = (State.OPEN, State.CONCLUDED)

__all__ = ["DEFAULT_BUFFER", "EngineLostError", "RequestLink", "Subscription"]
