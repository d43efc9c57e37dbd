"""The engine client over trioserve's protocol: :class:`ProtocolLinks` makes a
:class:`~trioserve.links.protocol.ProtocolLink` per engine address, and
:func:`open_protocol_client` is the engine client over them alone."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Sequence

import attrs

from ..engine import EngineClient, open_engine_client
from ..engine.discovery import DEFAULT_REFRESH, Resolver
from ..engine.routing import Policy
from ..transport.curve import CurveClientKeys
from .protocol import HeartbeatConfig, ProtocolLink


@attrs.frozen
class ProtocolLinks:
    """The :data:`~trioserve.engine.link.LinkFactory` of trioserve's protocol.

    ``heartbeat``: how often engines are pinged and how long a silent one lasts.
    ``max_message``: the largest frame accepted from an engine (bytes; default
    :data:`trioserve.transport.zmtp_protocol.MAX_MESSAGE`); a larger one fails that
    engine. ``curve``: speak CURVE to every engine with these keys (None: NULL, clear
    text)."""

    heartbeat: HeartbeatConfig = attrs.Factory(HeartbeatConfig)
    max_message: int | None = None
    curve: CurveClientKeys | None = None

    def __call__(
        self, address: str, frontend_id: str, on_change: Callable[[], None]
    ) -> ProtocolLink:
        return ProtocolLink(
            address,
            frontend_id,
            self.heartbeat,
            on_change,
            max_message=self.max_message,
            curve=self.curve,
        )


@contextlib.asynccontextmanager
async def open_protocol_client(
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
    """The engine client over trioserve's protocol to every engine in ``addresses``
    (:func:`~trioserve.engine.open_engine_client` with :class:`ProtocolLinks`): one DEALER
    socket per engine, connected and kept alive until the context exits."""
    links = ProtocolLinks(heartbeat or HeartbeatConfig(), max_message, curve)
    async with open_engine_client(
        addresses,
        links,
        frontend_id=frontend_id,
        policy=policy,
        resolver=resolver,
        refresh=refresh,
    ) as client:
        yield client
