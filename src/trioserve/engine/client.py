"""``open_engine_client``: the frontend's handle on all of its engines."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence

import trio

from ..errors import NoEngineError, ProtocolVersionError, TrioserveError
from ..protocol import ModelCard, Submit
from ..transport.curve import CurveClientKeys
from .connection import EngineConnection, HeartbeatConfig, new_frontend_id
from .subscription import DEFAULT_BUFFER, Subscription

log = logging.getLogger(__name__)


class EngineClient:
    """Routes requests to connected engines. Obtain one with :func:`open_engine_client`."""

    def __init__(self) -> None:
        self.connections: list[EngineConnection] = []
        self._changed = trio.Event()

    def _notify(self) -> None:
        """Some engine connected, was lost, or refused us."""
        self._changed.set()
        self._changed = trio.Event()

    @property
    def ready(self) -> bool:
        """True while at least one engine has completed its handshake."""
        return any(conn.ready for conn in self.connections)

    def models(self) -> list[ModelCard]:
        seen: dict[str, ModelCard] = {}
        for conn in self.connections:
            if conn.welcome is not None:
                for card in conn.welcome.models:
                    seen.setdefault(card.id, card)
        return list(seen.values())

    def offers(self, capability: str) -> bool:
        """Whether a connected engine declares ``capability`` (every generation request
        asks: no set built)."""
        for conn in self.connections:
            welcome = conn.welcome
            if welcome is not None and capability in welcome.capabilities:
                return True
        return False

    def serves_model(self, model: str) -> bool:
        """Whether a connected engine serves ``model`` (every request asks: no list built)."""
        for conn in self.connections:  # noqa: SIM110 - no generator per request
            if conn.serves_model(model):
                return True
        return False

    def capabilities(self) -> set[str]:
        return {
            cap for conn in self.connections if conn.welcome for cap in conn.welcome.capabilities
        }

    def default_model(self) -> str | None:
        """The first model of the first connected engine (what ``models()[0]`` is)."""
        for conn in self.connections:
            if conn.welcome is not None and conn.welcome.models:
                return conn.welcome.models[0].id
        return None

    def submit(
        self,
        message: Submit,
        capability: str,
        *,
        buffer: int = DEFAULT_BUFFER,
        on_failure: Callable[[TrioserveError], None] | None = None,
    ) -> Subscription:
        """Send ``message`` to the least-loaded engine that serves its model.

        Returns the subscription at once; its owner ends it with ``abort(reason)`` unless
        the engine finished it (``on_failure``, called when the link fails it, should end
        the request the same way). Raises :class:`NoEngineError` when no connected engine
        serves the model.
        """
        engine = None
        best = (0, 0.0)
        for conn in self.connections:  # the least loaded of those that serve it
            if conn.serves(message.model, capability):
                # Fewest requests at the engine first, then the emptiest KV cache.
                load = (conn.load, conn.kv_cache_usage or 0.0)
                if engine is None or load < best:
                    engine, best = conn, load
        if engine is None:
            if not self.ready:
                raise NoEngineError("no engine is connected")
            raise NoEngineError(f"no connected engine serves model {message.model!r}")
        return engine.submit(message, buffer, on_failure)

    def failures(self) -> dict[str, str]:
        """Why each engine that is out of service failed, by address."""
        return {c.address: c.failure for c in self.connections if c.failure is not None}

    async def wait_ready(self) -> None:
        """Wait until every engine has welcomed us or failed (a failed engine is tried
        again in the background; see :meth:`failures`). Raises nothing: no engine can
        stop the frontend."""
        while not all(conn.ready or conn.failure is not None for conn in self.connections):
            await self._changed.wait()


@contextlib.asynccontextmanager
async def open_engine_client(
    addresses: Sequence[str],
    *,
    heartbeat: HeartbeatConfig | None = None,
    frontend_id: str | None = None,
    max_message: int | None = None,
    curve: CurveClientKeys | None = None,
) -> AsyncIterator[EngineClient]:
    """Connect to every engine in ``addresses`` and keep the connections alive.

    Owns one DEALER socket per engine and the tasks that serve them; both end when the
    context exits. Does not wait for handshakes (see :meth:`EngineClient.wait_ready`):
    engines may come up after the frontend, and reconnect on their own after a restart.
    ``max_message``: the largest frame accepted from an engine (bytes; default
    :data:`trioserve.transport.zmtp_protocol.MAX_MESSAGE`); a larger one fails that engine.
    ``curve``: speak CURVE to every engine with these keys (None: NULL, clear text).
    """
    if not addresses:
        raise ValueError("open_engine_client needs at least one engine address")
    frontend_id = frontend_id or new_frontend_id()
    heartbeat = heartbeat or HeartbeatConfig()
    client = EngineClient()
    client.connections = [
        EngineConnection(
            addr, frontend_id, heartbeat, client._notify, max_message=max_message, curve=curve
        )
        for addr in addresses
    ]
    async with trio.open_nursery() as nursery:
        for conn in client.connections:
            await nursery.start(conn.serve)
        try:
            yield client
        finally:
            nursery.cancel_scope.cancel()


__all__ = ["EngineClient", "HeartbeatConfig", "ProtocolVersionError", "open_engine_client"]
