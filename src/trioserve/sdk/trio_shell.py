"""Serve a backend over the engine protocol on Trio."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import trio
import zmq

from ..protocol import Limits
from ..transport.keys import CurveServerKeys
from ..transport.zmq_pump import ZmqPump, bound_router
from .core import Backend, Cancel, EngineCore, Key, RequestError, Start

log = logging.getLogger("trioserve.engine")

#: Frames held while frozen (see :meth:`TrioEngine.freeze`); later ones are dropped.
FROZEN_HOLD_LIMIT = 100_000


class TrioEngine:
    """A bound ROUTER socket serving ``backend``; see :func:`serve_engine`."""

    def __init__(self, core: EngineCore, sock: zmq.Socket) -> None:
        self.core = core
        self.sock = sock
        self.address: str = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._scopes: dict[Key, trio.CancelScope] = {}
        self._pump = ZmqPump(sock, self._on_message, self._flush)
        self._nursery: trio.Nursery | None = None
        self._held: list[list[bytes]] | None = None

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
    def stats(self):
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

    async def _generate(self, key: Key, request, scope: trio.CancelScope) -> None:
        core = self.core
        wake = self._pump.wake
        try:
            with scope:
                try:
                    async for out in self.core.backend.generate(request):
                        if not core.output(key, out):
                            break
                        wake()
                except RequestError as exc:
                    core.fail(key, exc)
                except Exception as exc:
                    log.exception("backend failed on %s", key[1])
                    core.fail(key, RequestError(500, f"backend error: {type(exc).__name__}"))
                core.generation_ended(key)
                wake()
        finally:
            self._scopes.pop(key, None)

    def _flush(self) -> None:
        if self._held is not None:
            return
        send = self._pump.send
        for identity, frame in self.core.flush():
            if not send([identity, frame]):
                log.warning("dropping output frame: send queue full")

    async def _sweep(self) -> None:
        period = max(self.core.frontend_timeout / 4, 0.05)
        while True:
            await trio.sleep(period)
            self._apply(self.core.expire(trio.current_time()))

    async def serve(self, *, task_status: trio.TaskStatus[TrioEngine]) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._pump.run)
                nursery.start_soon(self._sweep)
                task_status.started(self)
        finally:
            self.sock.close(linger=0)


async def serve_engine(
    backend: Backend,
    address: str,
    *,
    frontend_timeout: float = 5.0,
    log_aborts: bool = False,
    track_ends: bool = False,
    limits: Limits | None = None,
    context: zmq.Context | None = None,
    curve: CurveServerKeys | None = None,
    task_status: trio.TaskStatus[TrioEngine] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``backend`` on a ROUTER bound to ``address`` until cancelled.

    ``task_status.started`` receives the :class:`TrioEngine` (its ``address`` is the bound
    endpoint, so ``tcp://127.0.0.1:*`` picks a free port). ``curve``: serve CURVE only,
    to the frontends whose keys it authorizes (``transport/zmq_pump.py``,
    ``bound_router``).
    """
    core = EngineCore(
        backend,
        frontend_timeout=frontend_timeout,
        log_aborts=log_aborts,
        track_ends=track_ends,
        limits=limits,
    )
    with bound_router(context, address, curve=curve) as sock:
        await TrioEngine(core, sock).serve(task_status=task_status)
