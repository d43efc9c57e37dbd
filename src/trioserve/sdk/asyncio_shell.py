"""Serve a backend over the engine protocol on asyncio, where most model runners live.

The same :class:`~trioserve.sdk.core.EngineCore` as the trio shell; only the socket
plumbing differs. The ZeroMQ descriptor is watched with ``loop.add_reader`` and the socket
is only ever touched from :meth:`AsyncioEngine._pump`, which runs on the loop thread: it
reads until ``EAGAIN``, sends what the step produced, and re-checks ``ZMQ_EVENTS`` before
returning (the descriptor is edge-triggered).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import signal
from collections.abc import Sequence
from typing import cast

import zmq

from ..protocol import Limits, Submit
from ..transport.keys import CurveServerKeys
from ..transport.zmq_pump import bound_router
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

RECV_BATCH = 512
OUTBOX_LIMIT = 16_384


class AsyncioEngine:
    def __init__(self, core: EngineCore, sock: zmq.Socket[bytes]) -> None:
        self.core = core
        self.sock = sock
        self.address: str = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._tasks: dict[Key, asyncio.Task[None]] = {}
        self._outbox: collections.deque[list[bytes]] = collections.deque()
        self._scheduled = False
        self._loop = asyncio.get_running_loop()
        #: Set when :meth:`serve` should return (a drain on a signal has completed).
        self._stop = asyncio.Event()
        #: While draining: set when the last running request has ended.
        self._idle: asyncio.Event | None = None
        #: Set by :meth:`end_grace`: the drain stops waiting for running requests.
        self._hurry = False
        self._drain_task: asyncio.Task[None] | None = None
        self._linger_ms = 0

    @property
    def stats(self) -> Stats:
        return self.core.stats

    def wake(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._pump)

    def _pump(self) -> None:
        self._scheduled = False
        sock, core = self.sock, self.core
        for _ in range(RECV_BATCH):
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            if len(frames) != 2:
                core.stats.malformed_frames += 1
                continue
            self._apply(core.handle(frames[0], frames[1], self._loop.time()))
        for identity, frame in core.flush():
            if len(self._outbox) < OUTBOX_LIMIT:
                self._outbox.append([identity, frame])
            else:
                log.warning("dropping output frame: send queue full")
        while self._outbox:
            try:
                sock.send_multipart(self._outbox[0], zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            self._outbox.popleft()
        if self._idle is not None and core.idle:
            self._idle.set()
        # pyzmq's stubs type every option as int | bytes; ZMQ_EVENTS and ZMQ_FD are ints.
        if cast(int, sock.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
            self.wake()

    def _apply(self, actions: Sequence[Start | Cancel]) -> None:
        for action in actions:
            if isinstance(action, Start):
                task = self._loop.create_task(self._generate(action.key, action.request))
                self._tasks[action.key] = task
            else:
                running = self._tasks.pop(action.key, None)
                if running is not None:
                    running.cancel()

    async def _generate(self, key: Key, request: Submit) -> None:
        try:
            await self.core.run_generation(key, request, self.wake)
        finally:
            self._tasks.pop(key, None)

    async def _sweep(self) -> None:
        period = max(self.core.frontend_timeout / 4, 0.05)
        while True:
            await asyncio.sleep(period)
            self._apply(self.core.expire(self._loop.time()))

    async def drain(self, grace_period: float) -> None:
        """As :meth:`TrioEngine.drain <trioserve.sdk.trio_shell.TrioEngine.drain>`: tell
        the frontends, refuse new requests, let the running ones finish for up to
        ``grace_period`` seconds (:meth:`end_grace` cuts it short), end the rest, and
        return once the last frames have left."""
        core = self.core
        core.drain()
        self.wake()
        deadline = self._loop.time() + grace_period
        while not core.idle and not self._hurry:
            self._idle = asyncio.Event()
            try:
                await asyncio.wait_for(self._idle.wait(), deadline - self._loop.time())
            except TimeoutError:
                break
        self._idle = None
        self._apply(core.cut_off())
        self._pump()  # what is left leaves now (or waits in the outbox, watched below)
        # Nothing waits for the outbox to empty but this: poll it, briefly and bounded.
        deadline = self._loop.time() + DRAIN_FLUSH_TIMEOUT
        while self._outbox and self._loop.time() < deadline:
            await asyncio.sleep(0.01)
            self.wake()
        self._linger_ms = DRAIN_LINGER_MS
        log.info("drained: %s", core.stats)

    def end_grace(self) -> None:
        """End a drain's grace period now (a second signal)."""
        self._hurry = True
        if self._idle is not None:
            self._idle.set()

    def _on_signal(self, signum: int, grace_period: float) -> None:
        name = signal.Signals(signum).name
        if self._drain_task is not None:
            log.warning("%s again: ending the grace period now", name)
            self.end_grace()
            return
        log.log(
            logging.INFO if self.core.running else logging.DEBUG,
            "%s: draining (grace period %g s)",
            name,
            grace_period,
        )

        async def drain_then_stop() -> None:
            await self.drain(grace_period)
            self._stop.set()

        self._drain_task = self._loop.create_task(drain_then_stop())

    async def serve(
        self,
        started: asyncio.Future[AsyncioEngine] | None = None,
        *,
        drain_on_signals: bool = False,
        grace_period: float = 30.0,
    ) -> None:
        fd = cast(int, self.sock.getsockopt(zmq.FD))
        self._loop.add_reader(fd, self._pump)
        sweep = self._loop.create_task(self._sweep())
        if drain_on_signals:
            for sig in DRAIN_SIGNALS:
                self._loop.add_signal_handler(sig, self._on_signal, sig, grace_period)
        if started is not None:
            started.set_result(self)
        self.wake()
        try:
            await self._stop.wait()
        finally:
            if drain_on_signals:
                for sig in DRAIN_SIGNALS:
                    self._loop.remove_signal_handler(sig)
            self._loop.remove_reader(fd)
            sweep.cancel()
            if self._drain_task is not None:
                self._drain_task.cancel()
            for task in list(self._tasks.values()):
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sweep
            self.sock.close(linger=self._linger_ms)


async def serve_engine_asyncio(
    backend: Backend,
    address: str,
    *,
    frontend_timeout: float = 5.0,
    log_aborts: bool = False,
    track_ends: bool = False,
    limits: Limits | None = None,
    context: zmq.Context[zmq.Socket[bytes]] | None = None,
    started: asyncio.Future[AsyncioEngine] | None = None,
    curve: CurveServerKeys | None = None,
    drain_on_signals: bool = False,
    grace_period: float = 30.0,
) -> None:
    """Serve ``backend`` on a ROUTER bound to ``address`` until cancelled (asyncio).

    ``started`` (optional) receives the :class:`AsyncioEngine` once bound. ``curve``: as
    :func:`~trioserve.sdk.trio_shell.serve_engine`'s. With ``drain_on_signals``, SIGTERM
    or SIGINT drains the engine (:meth:`AsyncioEngine.drain` with ``grace_period``; a
    second signal ends the grace period) and then this returns; the handlers are the
    loop's (``add_signal_handler``) while it serves.
    """
    core = EngineCore(
        backend,
        frontend_timeout=frontend_timeout,
        log_aborts=log_aborts,
        track_ends=track_ends,
        limits=limits,
    )
    with bound_router(context, address, curve=curve) as sock:
        await AsyncioEngine(core, sock).serve(
            started, drain_on_signals=drain_on_signals, grace_period=grace_period
        )
