"""The drain controller: what SIGTERM (or SIGINT) does, step by step.

::

    t0 = signal ─ readiness 503 ──── drain_delay ─── stop accepting ─── graceful_timeout ─┐
                  (keep serving)                      Connection: close    (t0 + timeout)  │
                                                      idle conns closed    end what is     │
                                                      in-flight finish     left: "drain"   │
                                                                           aborts, exit 0 ◀┘

A second signal skips straight to the last step. The HTTP server is told to stop
accepting through :attr:`DrainController.stop_accepting`; the application reads ``services.state``.
"""

from __future__ import annotations

import logging
import signal

import trio

from .. import metrics
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

    def begin(self) -> None:
        """Start draining (first call), or skip to the deadline (any later call)."""
        if self._started:
            log.warning("second signal: ending what is left now")
            self._skip.set()
            return
        self._started = True
        self.services.state.draining = True
        metrics.DRAINING.set(1)
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
                async for _ in receiver:
                    if not self._started:
                        nursery.start_soon(self.drain)
                    else:
                        self.begin()

    async def drain(self) -> None:
        """The whole sequence, from the first signal to the end of the grace period."""
        self.begin()
        t0 = trio.current_time()
        with trio.move_on_at(t0 + self.drain_delay):
            await self._skip.wait()
        self.services.state.closing = True
        self.stop_accepting.set()
        log.info("draining: listener closed; %d request(s) in flight", len(self.services.registry))
        with trio.move_on_at(t0 + self.graceful_timeout):
            await self._skip.wait()
        ended = self.services.end_all("drain")
        if ended:
            log.warning("drain deadline: ended %d request(s) still in flight", ended)
        self.deadline_reached.set()
