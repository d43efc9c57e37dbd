"""The drain controller: what SIGTERM (or SIGINT) does, step by step.

::

    t0 = signal ─ readiness 503 ──── drain_delay ─── stop accepting ─── graceful_timeout ─┐
                  (keep serving)                      Connection: close    (t0 + timeout)  │
                                                      idle conns closed    end what is     │
                                                      in-flight finish     left: "drain"   │
                                                                           aborts, exit 0 ◀┘

SIGINT (Ctrl-C at a terminal) skips the drain delay: the delay is there for load balancers
to stop routing here, and a person who pressed Ctrl-C wants the server gone. The rest of the
sequence keeps its length (in-flight requests get ``graceful_timeout - drain_delay``), so the
HTTP servers' own hard stop, counted from the listener's closing, still comes after ours. A
second signal skips straight to the last step. The HTTP server is told to stop accepting
through :attr:`DrainController.stop_accepting`; the application reads ``services.state``.
"""

from __future__ import annotations

import logging
import signal
from functools import partial

import trio

from .. import metrics
from ..ends import EndReason
from ..http.services import Services

log = logging.getLogger("trioserve.drain")


class DrainController:
    def __init__(self, services: Services, *, drain_delay: float, graceful_timeout: float) -> None:
        self.services = services
        self.drain_delay = drain_delay
        self.graceful_timeout = graceful_timeout
        #: Set when the listener must close (after the drain delay, or at once).
        self.stop_accepting = trio.Event()
        #: Set when the grace period is over and what is left has been ended.
        self.deadline_reached = trio.Event()
        self._skip = trio.Event()
        self._started = False
        #: Ctrl-C found nothing in flight and said so: the stop needs no more lines.
        self.quiet = False
        metrics.DRAINING.set(0)

    def begin(self, *, skip_delay: bool = False) -> None:
        """Start draining (first call), or skip to the deadline (any later call).
        ``skip_delay``: close the listener at once (Ctrl-C) instead of after the delay."""
        if self._started:
            log.warning("second signal: ending what is left now")
            self._skip.set()
            return
        self._started = True
        self.services.state.draining = True
        metrics.DRAINING.set(1)
        if skip_delay:
            running = self._in_flight()
            if not running:  # what a person at a terminal wants to read: one line
                self.quiet = True
                log.info("Ctrl-C: nothing in flight; stopping")
                return
            log.info(
                "Ctrl-C: readiness is now 503 and the listener closes (the drain delay is "
                "for load balancers; SIGTERM waits it); finishing %d request(s) in flight for "
                "up to %g s (Ctrl-C again to stop now)",
                running,
                max(self.graceful_timeout - self.drain_delay, 0.0),
            )
            return
        log.info(
            "draining: readiness is now 503; serving for %g s more, then finishing in-flight "
            "requests for up to %g s in all (signal again to stop now)",
            self.drain_delay,
            self.graceful_timeout,
        )

    def _in_flight(self) -> int:
        """Requests running now: those of clients, and the background responses."""
        return len(self.services.registry) + self.services.responses.running

    async def run(self, signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT)) -> None:
        """Wait for signals and run the sequence. Never returns; cancel it."""
        with trio.open_signal_receiver(*signals) as receiver:
            async with trio.open_nursery() as nursery:
                async for signum in receiver:
                    if not self._started:
                        # Begun here, not in the task: a second signal read before the task
                        # runs is then a second signal, not a second drain.
                        skip_delay = signum == signal.SIGINT
                        self.begin(skip_delay=skip_delay)
                        nursery.start_soon(partial(self._sequence, skip_delay=skip_delay))
                    else:
                        self.begin()

    async def drain(self, *, skip_delay: bool = False) -> None:
        """The whole sequence, from the first signal to the end of the grace period."""
        self.begin(skip_delay=skip_delay)
        await self._sequence(skip_delay=skip_delay)

    async def _sequence(self, *, skip_delay: bool) -> None:
        """What follows :meth:`begin`: the delay, the listener's closing, the grace period."""
        t0 = trio.current_time()
        if skip_delay:
            t0 -= self.drain_delay  # as if the delay were over
        with trio.move_on_at(t0 + self.drain_delay):
            await self._skip.wait()
        self.services.state.closing = True
        self.stop_accepting.set()
        running = self._in_flight()
        # Said when it tells something: with nothing in flight, the stop follows at once.
        log.log(
            logging.INFO if running else logging.DEBUG,
            "draining: listener closed; %d request(s) in flight",
            running,
        )
        with trio.move_on_at(t0 + self.graceful_timeout):
            await self._skip.wait()
        ended = self.services.end_all(EndReason.DRAIN)
        if ended:
            log.warning("drain deadline: ended %d request(s) still in flight", ended)
        self.deadline_reached.set()
