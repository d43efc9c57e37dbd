"""Serve a backend over the engine protocol on Trio."""

from __future__ import annotations

import logging
import signal
from collections.abc import Sequence

import trio
import zmq

from ..protocol import Limits, Submit
from ..transport.keys import CurveServerKeys
from ..transport.zmq_pump import ZmqPump, bound_router
from .core import (
    DRAIN_FLUSH_TIMEOUT,
    DRAIN_LINGER_MS,
    DRAIN_SIGNALS,
    Backend,
    Cancel,
    EngineCore,
    Key,
    Start,
    Stats,
)

log = logging.getLogger(__name__)

#: Frames held while frozen (see :meth:`TrioEngine.freeze`); later ones are dropped.
FROZEN_HOLD_LIMIT = 100_000


class TrioEngine:
    """A bound ROUTER socket serving ``backend``; see :func:`serve_engine`."""

    def __init__(self, core: EngineCore, sock: zmq.Socket[bytes]) -> None:
        self.core = core
        self.sock = sock
        self.address: str = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._scopes: dict[Key, trio.CancelScope] = {}
        self._pump = ZmqPump(sock, self._on_message, self._flush)
        self._nursery: trio.Nursery | None = None
        self._held: list[list[bytes]] | None = None
        #: While draining: set when the last running request has ended.
        self._idle: trio.Event | None = None
        #: While draining: the grace period's scope (cancelled by :meth:`end_grace`).
        self._grace: trio.CancelScope | None = None
        self._linger_ms = 0

    def freeze(self) -> None:
        """Act hung: hold every incoming frame and send nothing until :meth:`thaw`.

        Generations keep running and their outputs queue up, as on a GPU whose host
        process stopped answering. For fault drills and tests.
        """
        if self._held is None:
            self._held = []

    def thaw(self) -> None:
        """Process what arrived while frozen, in order, and resume sending."""
        held, self._held = self._held, None
        for frames in held or ():
            self._on_message(frames)
        self._pump.wake()

    @property
    def stats(self) -> Stats:
        return self.core.stats

    def _on_message(self, frames: list[bytes]) -> None:
        if self._held is not None:
            if len(self._held) < FROZEN_HOLD_LIMIT:
                self._held.append(frames)
            return
        if len(frames) != 2:
            self.core.stats.malformed_frames += 1
            return
        self._apply(self.core.handle(frames[0], frames[1], trio.current_time()))
        self._pump.wake()

    def _apply(self, actions: Sequence[Start | Cancel]) -> None:
        assert self._nursery is not None
        for action in actions:
            if isinstance(action, Start):
                scope = trio.CancelScope()
                self._scopes[action.key] = scope
                self._nursery.start_soon(self._generate, action.key, action.request, scope)
            else:
                running = self._scopes.pop(action.key, None)
                if running is not None:
                    running.cancel()

    async def _generate(self, key: Key, request: Submit, scope: trio.CancelScope) -> None:
        try:
            with scope:
                await self.core.run_generation(key, request, self._pump.wake)
        finally:
            self._scopes.pop(key, None)

    def _flush(self) -> None:
        if self._held is not None:
            return
        send = self._pump.send
        for identity, frame in self.core.flush():
            if not send([identity, frame]):
                log.warning("dropping output frame: send queue full")
        # After the sends: the last request's final item has left (or is queued) first.
        if self._idle is not None and self.core.idle:
            self._idle.set()

    async def drain(self, grace_period: float) -> None:
        """Drain: tell every frontend at once and refuse new requests (503
        ``engine_draining``, which frontends resubmit elsewhere); let the running ones
        finish for up to ``grace_period`` seconds (:meth:`end_grace` cuts it short), then
        end what is left with a 503 ``engine_stopped`` item each; return once the last
        frames have left (bounded by :data:`DRAIN_FLUSH_TIMEOUT`). The socket is still
        open: cancel :meth:`serve` afterwards."""
        core = self.core
        core.drain()
        self._pump.wake()
        with trio.move_on_after(grace_period) as self._grace:
            while not core.idle:
                self._idle = trio.Event()
                await self._idle.wait()
        self._grace = self._idle = None
        self._apply(core.cut_off())
        self._flush()  # what is left leaves now (or waits in the outbox, watched below)
        # Nothing waits for the outbox to empty but this: poll it, briefly and bounded.
        with trio.move_on_after(DRAIN_FLUSH_TIMEOUT):
            while self._pump.pending:  # noqa: ASYNC110 - the socket owner signals nothing
                await trio.sleep(0.01)
        self._linger_ms = DRAIN_LINGER_MS
        log.info("drained: %s", core.stats)

    def end_grace(self) -> None:
        """End a drain's grace period now (a second signal)."""
        if self._grace is not None:
            self._grace.cancel()

    async def _drain_on_signals(
        self, grace_period: float, stop: trio.CancelScope, task_status: trio.TaskStatus[None]
    ) -> None:
        with trio.open_signal_receiver(*DRAIN_SIGNALS) as signals:
            task_status.started()
            draining = False
            async for signum in signals:
                if draining:
                    name = signal.Signals(signum).name
                    log.warning("%s again: ending the grace period now", name)
                    self.end_grace()
                    continue
                draining = True
                log.log(
                    logging.INFO if self.core.running else logging.DEBUG,
                    "%s: draining (grace period %g s)",
                    signal.Signals(signum).name,
                    grace_period,
                )
                assert self._nursery is not None

                async def drain_then_stop() -> None:
                    await self.drain(grace_period)
                    stop.cancel()

                self._nursery.start_soon(drain_then_stop)

    async def _sweep(self) -> None:
        period = max(self.core.frontend_timeout / 4, 0.05)
        while True:
            await trio.sleep(period)
            self._apply(self.core.expire(trio.current_time()))

    async def serve(
        self,
        *,
        drain_on_signals: bool = False,
        grace_period: float = 30.0,
        task_status: trio.TaskStatus[TrioEngine],
    ) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._pump.run)
                nursery.start_soon(self._sweep)
                if drain_on_signals:
                    await nursery.start(self._drain_on_signals, grace_period, nursery.cancel_scope)
                task_status.started(self)
        finally:
            self.sock.close(linger=self._linger_ms)


async def serve_engine(
    backend: Backend,
    address: str,
    *,
    frontend_timeout: float = 5.0,
    log_aborts: bool = False,
    track_ends: bool = False,
    limits: Limits | None = None,
    context: zmq.Context[zmq.Socket[bytes]] | None = None,
    curve: CurveServerKeys | None = None,
    drain_on_signals: bool = False,
    grace_period: float = 30.0,
    task_status: trio.TaskStatus[TrioEngine] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``backend`` on a ROUTER bound to ``address`` until cancelled.

    ``task_status.started`` receives the :class:`TrioEngine` (its ``address`` is the bound
    endpoint, so ``tcp://127.0.0.1:*`` picks a free port). ``curve``: serve CURVE only,
    to the frontends whose keys it authorizes (``transport/zmq_pump.py``,
    ``bound_router``). With ``drain_on_signals`` (a program's main thread only), SIGTERM
    or SIGINT drains the engine (:meth:`TrioEngine.drain` with ``grace_period``; a second
    signal ends the grace period) and then this returns: the way for an engine to leave
    without failing a request.
    """
    core = EngineCore(
        backend,
        frontend_timeout=frontend_timeout,
        log_aborts=log_aborts,
        track_ends=track_ends,
        limits=limits,
    )
    with bound_router(context, address, curve=curve) as sock:
        await TrioEngine(core, sock).serve(
            drain_on_signals=drain_on_signals, grace_period=grace_period, task_status=task_status
        )
