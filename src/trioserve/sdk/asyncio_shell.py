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
from collections.abc import Sequence
from typing import cast

import zmq

from ..protocol import Limits
from ..transport.keys import CurveServerKeys
from ..transport.zmq_pump import bound_router
from .core import Backend, Cancel, EngineCore, Key, RequestError, Start

log = logging.getLogger("trioserve.engine")

RECV_BATCH = 512
OUTBOX_LIMIT = 16_384


class AsyncioEngine:
    def __init__(self, core: EngineCore, sock: zmq.Socket) -> None:
        self.core = core
        self.sock = sock
        self.address: str = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._tasks: dict[Key, asyncio.Task[None]] = {}
        self._outbox: collections.deque[list[bytes]] = collections.deque()
        self._scheduled = False
        self._loop = asyncio.get_running_loop()

    @property
    def stats(self):
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

    async def _generate(self, key: Key, request) -> None:
        core = self.core
        try:
            try:
                async for out in core.backend.generate(request):
                    if not core.output(key, out):
                        break
                    self.wake()
            except RequestError as exc:
                core.fail(key, exc)
            except Exception as exc:
                log.exception("backend failed on %s", key[1])
                core.fail(key, RequestError(500, f"backend error: {type(exc).__name__}"))
            core.generation_ended(key)
            self.wake()
        finally:
            self._tasks.pop(key, None)

    async def _sweep(self) -> None:
        period = max(self.core.frontend_timeout / 4, 0.05)
        while True:
            await asyncio.sleep(period)
            self._apply(self.core.expire(self._loop.time()))

    async def serve(self, started: asyncio.Future[AsyncioEngine] | None = None) -> None:
        fd = cast(int, self.sock.getsockopt(zmq.FD))
        self._loop.add_reader(fd, self._pump)
        sweep = self._loop.create_task(self._sweep())
        if started is not None:
            started.set_result(self)
        self.wake()
        try:
            await asyncio.Event().wait()
        finally:
            self._loop.remove_reader(fd)
            sweep.cancel()
            for task in list(self._tasks.values()):
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sweep
            self.sock.close(linger=0)


async def serve_engine_asyncio(
    backend: Backend,
    address: str,
    *,
    frontend_timeout: float = 5.0,
    log_aborts: bool = False,
    track_ends: bool = False,
    limits: Limits | None = None,
    context: zmq.Context | None = None,
    started: asyncio.Future[AsyncioEngine] | None = None,
    curve: CurveServerKeys | None = None,
) -> None:
    """Serve ``backend`` on a ROUTER bound to ``address`` until cancelled (asyncio).

    ``started`` (optional) receives the :class:`AsyncioEngine` once bound. ``curve``: as
    :func:`~trioserve.sdk.trio_shell.serve_engine`'s.
    """
    core = EngineCore(
        backend,
        frontend_timeout=frontend_timeout,
        log_aborts=log_aborts,
        track_ends=track_ends,
        limits=limits,
    )
    with bound_router(context, address, curve=curve) as sock:
        await AsyncioEngine(core, sock).serve(started)
