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
            log.info(
                "draining on SIGINT: readiness is now 503; skipping the drain delay (it is for "
                "load balancers; SIGTERM waits it); "
                "finishing in-flight requests for up to %g s (Ctrl-C again to stop now)",
                max(self.graceful_timeout - self.drain_delay, 0.0),
            )
            return
        log.info(
            "draining: readiness is now 503; serving for %g s more, then finishing in-flight "
            "requests for up to %g s in all (signal again to stop now)",
            self.drain_delay,
            self.graceful_timeout,
        )

    async def run(self, signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT)) -> None:
        """Wait for signals and run the sequence. Never returns; cancel it."""
        with trio.open_signal_receiver(*signals) as receiver:
            async with trio.open_nursery() as nursery:
                async for signum in receiver:
                    if not self._started:
                        nursery.start_soon(partial(self.drain, skip_delay=signum == signal.SIGINT))
                    else:
                        self.begin()

    async def drain(self, *, skip_delay: bool = False) -> None:
        """The whole sequence, from the first signal to the end of the grace period."""
        self.begin(skip_delay=skip_delay)
        t0 = trio.current_time()
        if skip_delay:
            t0 -= self.drain_delay  # as if the delay were over
        with trio.move_on_at(t0 + self.drain_delay):
            await self._skip.wait()
        self.services.state.closing = True
        self.stop_accepting.set()
        log.info("draining: listener closed; %d request(s) in flight", len(self.services.registry))
        with trio.move_on_at(t0 + self.graceful_timeout):
            await self._skip.wait()
        ended = self.services.end_all(EndReason.DRAIN)
        if ended:
            log.warning("drain deadline: ended %d request(s) still in flight", ended)
        self.deadline_reached.set()
