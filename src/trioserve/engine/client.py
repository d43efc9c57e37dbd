"""``open_engine_client``: the frontend's handle on all of its engines.

The engine client holds one :class:`~trioserve.engine.connection.EngineConnection` per
engine address; the addresses are the fixed ``--engine`` ones plus what each
``dns://NAME:PORT`` resolves to now (:mod:`~trioserve.engine.discovery`), so connections
come and go while it runs: an address that appears is connected to, one that vanishes is
let go of once its requests have ended. A request goes to an engine chosen by the routing
policy (:mod:`~trioserve.engine.routing`) among those that accept requests; if that engine
refuses it or is lost before any output was delivered, it is submitted once more, to
another (see :mod:`~trioserve.engine.subscription`, *Failover*), counted in
``trioserve_engine_failovers_total``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence

import trio

from .. import metrics
from ..errors import (
    EngineOverloadedError,
    NoEngineError,
    ProtocolVersionError,
    TrioserveError,
)
from ..protocol import ModelCard, Submit
from ..transport.curve import CurveClientKeys
from .connection import EngineConnection, HeartbeatConfig, new_frontend_id
from .discovery import DEFAULT_REFRESH, Discovery, Resolver
from .routing import LeastLoad, Policy
from .subscription import DEFAULT_BUFFER, Subscription

log = logging.getLogger(__name__)


class EngineClient:
    """Routes requests to connected engines. Obtain one with :func:`open_engine_client`."""

    def __init__(
        self,
        frontend_id: str | None = None,
        heartbeat: HeartbeatConfig | None = None,
        *,
        max_message: int | None = None,
        policy: Policy | None = None,
        curve: CurveClientKeys | None = None,
    ) -> None:
        self.frontend_id = frontend_id or new_frontend_id()
        self.heartbeat = heartbeat or HeartbeatConfig()
        self.max_message = max_message
        self.curve = curve
        self.policy: Policy = policy or LeastLoad()
        #: Every engine connection, in the order their addresses were first given.
        self.connections: list[EngineConnection] = []
        self._changed = trio.Event()
        self._nursery: trio.Nursery | None = None

    def _notify(self) -> None:
        """Some engine connected, was lost, refused us, began draining, or was let go."""
        self._changed.set()
        self._changed = trio.Event()

    @property
    def ready(self) -> bool:
        """True while at least one engine accepts requests (welcomed, not draining)."""
        return any(conn.accepting for conn in self.connections)

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
        """Whether a connected engine serves ``model`` (every request asks: no list built).
        A draining one counts: its model is known, its requests get a retryable 503."""
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

    # -- requests ------------------------------------------------------------------------

    def _candidates(
        self, model: str | None, capability: str, exclude: object = None
    ) -> list[EngineConnection]:
        return [
            conn
            for conn in self.connections
            if conn.accepting and conn is not exclude and conn.serves(model, capability)
        ]

    def submit(
        self,
        message: Submit,
        capability: str,
        *,
        buffer: int = DEFAULT_BUFFER,
        on_failure: Callable[[TrioserveError], None] | None = None,
    ) -> Subscription:
        """Send ``message`` to the engine the routing policy picks among those that serve
        its model and task and accept requests.

        Returns the subscription at once; its owner ends it with ``abort(reason)`` unless
        the engine finished it (``on_failure``, called when the link fails it, should end
        the request the same way). Raises :class:`NoEngineError` when no such engine is
        connected. If the engine refuses the request or is lost before any output was
        delivered, the subscription moves to another engine by itself, once, and neither
        its owner nor ``on_failure`` hears of it.
        """
        candidates = self._candidates(message.model, capability)
        if not candidates:
            raise self._no_engine(message.model, capability)
        engine = self.policy.choose(candidates, message)
        try:
            sub = engine.submit(message, buffer, on_failure)
        except EngineOverloadedError:
            # Its link takes nothing more (the engine is not reading): another engine, once.
            candidates.remove(engine)
            if not candidates:
                raise
            metrics.engine_failovers("overloaded").inc()
            log.info(
                "request %s: engine %s is not reading; submitting to another",
                message.request_id,
                engine.address,
            )
            return self.policy.choose(candidates, message).submit(message, buffer, on_failure)

        def retry(sub: Subscription, reason: str) -> bool:
            return self._fail_over(sub, message, capability, reason)

        sub.retry = retry
        return sub

    def _fail_over(self, sub: Subscription, message: Submit, capability: str, reason: str) -> bool:
        """Submit ``sub``'s request to another engine than its own; True if one took it."""
        old = sub.engine
        candidates = self._candidates(message.model, capability, exclude=old)
        if not candidates:
            return False
        engine = self.policy.choose(candidates, message)
        try:
            engine.adopt(sub, message)
        except TrioserveError:
            return False
        metrics.engine_failovers(reason).inc()
        log.info(
            "request %s: engine %s did not serve it (%s); submitted to %s",
            message.request_id,
            old.address,
            reason,
            engine.address,
        )
        return True

    def _no_engine(self, model: str, capability: str) -> NoEngineError:
        serving = [
            c for c in self.connections if c.welcome is not None and c.serves(model, capability)
        ]
        if serving and all(c.draining for c in serving):
            return NoEngineError(f"every engine that serves model {model!r} is draining")
        if not self.ready:
            return NoEngineError("no engine is connected")
        return NoEngineError(f"no connected engine serves model {model!r}")

    def failures(self) -> dict[str, str]:
        """Why each engine that is out of service failed, by address."""
        return {c.address: c.failure for c in self.connections if c.failure is not None}

    async def wait_ready(self) -> None:
        """Wait until every engine has welcomed us or failed (a failed engine is tried
        again in the background; see :meth:`failures`). Raises nothing: no engine can
        stop the frontend."""
        while not all(
            conn.ready or conn.failure is not None or conn.retiring for conn in self.connections
        ):
            await self._changed.wait()

    # -- membership ----------------------------------------------------------------------

    def set_addresses(self, addresses: Sequence[str]) -> None:
        """Serve exactly the engines at ``addresses`` from now on: connect to the new
        ones, let go of the others once their requests have ended."""
        assert self._nursery is not None, "set_addresses needs a running client"
        wanted = dict.fromkeys(addresses)
        known = {conn.address: conn for conn in self.connections}
        for conn in self.connections:
            if conn.address in wanted:
                conn.unretire()
            else:
                conn.retire()
        for address in wanted:
            old = known.get(address)
            if old is None or old.scope.cancel_called:
                conn = EngineConnection(
                    address,
                    self.frontend_id,
                    self.heartbeat,
                    self._notify,
                    max_message=self.max_message,
                    curve=self.curve,
                )
                self.connections.append(conn)
                self._nursery.start_soon(self._serve_connection, conn)
        self._notify()

    async def _serve_connection(self, conn: EngineConnection) -> None:
        try:
            await conn.serve()
        finally:
            # A connection let go of leaves the list (and /metrics); when the client
            # itself closes, the list stays as it was, for whoever looks afterwards.
            if conn.retiring and conn.scope.cancel_called:
                if conn in self.connections:
                    self.connections.remove(conn)
                if not any(c.address == conn.address for c in self.connections):
                    conn.remove_gauges()
                log.debug("engine %s: connection closed", conn.address)
                self._notify()


@contextlib.asynccontextmanager
async def open_engine_client(
    addresses: Sequence[str],
    *,
    heartbeat: HeartbeatConfig | None = None,
    frontend_id: str | None = None,
    max_message: int | None = None,
    curve: CurveClientKeys | None = None,
    policy: Policy | None = None,
    resolver: Resolver | None = None,
    refresh: float = DEFAULT_REFRESH,
) -> AsyncIterator[EngineClient]:
    """Connect to every engine in ``addresses`` and keep the connections alive.

    ``addresses``: ZeroMQ addresses (``tcp://``, ``ipc://``) and ``dns://NAME:PORT``
    names, resolved now (with ``resolver``, by default the system's) and every
    ``refresh`` seconds (:class:`~trioserve.engine.discovery.Discovery`). Owns one DEALER
    socket per engine and the tasks that serve them; all end when the context exits. Does
    not wait for handshakes (see :meth:`EngineClient.wait_ready`): engines may come up
    after the frontend, and reconnect on their own after a restart. ``max_message``: the
    largest frame accepted from an engine (bytes; default
    :data:`trioserve.transport.zmtp_protocol.MAX_MESSAGE`); a larger one fails that engine.
    ``curve``: speak CURVE to every engine with these keys (None: NULL, clear text).
    ``policy``: the routing policy (default :class:`~trioserve.engine.routing.LeastLoad`).
    """
    if not addresses:
        raise ValueError("open_engine_client needs at least one engine address")
    discovery = Discovery(addresses, resolver=resolver, refresh=refresh)
    client = EngineClient(
        frontend_id, heartbeat, max_message=max_message, policy=policy, curve=curve
    )
    async with trio.open_nursery() as nursery:
        client._nursery = nursery
        await nursery.start(discovery.serve, client.set_addresses)
        try:
            yield client
        finally:
            nursery.cancel_scope.cancel()


__all__ = ["EngineClient", "HeartbeatConfig", "ProtocolVersionError", "open_engine_client"]
