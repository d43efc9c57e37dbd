"""Serving the application: engines, the HTTP server (built-in or hypercorn), signals and
the drain."""

from __future__ import annotations

import logging
import socket
from collections.abc import Sequence

import trio

from ..config import Settings, connections_per_key
from ..engine import LinkFactory, make_policy, make_resolver, open_engine_client
from ..http import App
from ..http.admission import PROBE_PATHS
from ..http.lifecycle import ERROR_WRITE_TIMEOUT
from ..links.protocol import HeartbeatConfig
from ..links.protocol_client import ProtocolLinks
from ..transport import keys
from ..transport.curve import CurveClientKeys
from . import tls
from .drain import DrainController
from .http1 import Http1Config, serve_http1
from .hypercorn import serve_hypercorn

log = logging.getLogger("trioserve")

#: Seconds the traces left at shutdown may take to leave (``Tracing.shutdown``).
TRACES_FLUSH_TIMEOUT = 12.0


def engine_curve_keys(settings: Settings) -> CurveClientKeys | None:
    """The engine link's CURVE keys from their files, or None (NULL) when none are set.
    Raises ValueError naming the file and what is wrong with it."""
    if not (settings.engine_curve_secret_key or settings.engine_curve_server_key):
        return None
    if not (settings.engine_curve_secret_key and settings.engine_curve_server_key):
        raise ValueError(
            "CURVE on the engine link needs both keys: this frontend's secret key and the "
            "engines' public key"
        )
    return keys.client_keys(settings.engine_curve_secret_key, settings.engine_curve_server_key)


def hard_stop_after(settings: Settings) -> float:
    """Seconds from the listener closing to the HTTP server's own hard stop.

    It comes after ours: the drain deadline ends what is left with proper error events and
    aborts, then the server finds nothing left to cut.
    """
    return max(settings.graceful_timeout - settings.drain_delay, 0.0) + ERROR_WRITE_TIMEOUT + 1.0


def http1_config(settings: Settings) -> Http1Config:
    return Http1Config(
        keep_alive_timeout=settings.keep_alive_timeout,
        write_timeout=settings.write_timeout,
        ws_max_message_bytes=settings.ws_max_message_bytes,
        ws_ping_interval=settings.ws_ping_interval,
        body_deadline=settings.body_deadline,
        max_connections=settings.max_connections,
        probe_paths=PROBE_PATHS,
        max_connections_per_key=connections_per_key(settings),
    )


async def _close_when_stopped(app: App) -> None:
    """Until the server stops; then what the app still holds leaves (the traces)."""
    try:
        await trio.sleep_forever()
    finally:
        with trio.CancelScope(shield=True, deadline=trio.current_time() + TRACES_FLUSH_TIMEOUT):
            await app.aclose()


def inherited_listener(fd: int) -> trio.SocketListener:
    """A listening socket this process inherited (its family and type read from it)."""
    return trio.SocketListener(trio.socket.from_stdlib_socket(socket.socket(fileno=fd)))


async def serve_frontend(
    settings: Settings,
    *,
    handle_signals: bool = True,
    engine_wait: float = 0.0,
    listen_fds: Sequence[int] = (),
    links: Sequence[tuple[str, LinkFactory]] = (),
    task_status: trio.TaskStatus[tuple[App, DrainController, list[str]]] = (
        trio.TASK_STATUS_IGNORED
    ),
) -> None:
    """Serve until drained. ``task_status`` gets ``(app, drain, bound_urls)``.

    ``listen_fds``: listening sockets to accept on, made by another process (a worker of
    ``--workers``, ``server/workers.py``), instead of binding ``settings.host:port``.

    With ``handle_signals`` false (tests), call ``drain.begin()``/``drain.drain()``
    yourself instead of sending signals. ``engine_wait``: seconds to wait for the
    engines' handshake before listening (for an engine started alongside, so that
    "Running on" means ready); past it, the server listens anyway and answers 503
    ``engine_unavailable`` until an engine connects, as it does for an engine that is
    not up yet. ``links``: ``(address, factory)`` of engine links of the caller's kind
    (an EngineCore it started), served beside those of ``settings.engines`` (which speak
    trioserve's protocol).
    """
    heartbeat = HeartbeatConfig(settings.heartbeat_interval, settings.heartbeat_timeout)
    async with open_engine_client(
        settings.engines,
        ProtocolLinks(heartbeat, settings.engine_max_message_bytes, engine_curve_keys(settings)),
        links=links,
        policy=make_policy(settings.routing, load_factor=settings.affinity_load_factor),
        resolver=make_resolver(settings.engine_dns_server),
        refresh=settings.engine_refresh,
    ) as engines:
        app = App(engines, settings)
        drain = DrainController(
            app.services,
            drain_delay=settings.drain_delay,
            graceful_timeout=settings.graceful_timeout,
        )
        async with trio.open_nursery() as nursery:
            if handle_signals:
                nursery.start_soon(drain.run)
            if app.services.observer.tracing is not None:
                nursery.start_soon(_close_when_stopped, app)

            async def serve_http(task_status: trio.TaskStatus[list[str]]) -> None:
                if settings.server == "hypercorn":
                    await serve_hypercorn(
                        app,
                        settings,
                        stop_accepting=drain.stop_accepting,
                        hard_stop_after=hard_stop_after(settings),
                        listen_fds=listen_fds,
                        task_status=task_status,
                    )
                else:
                    await serve_http1(
                        app,
                        settings.host,
                        settings.port,
                        config=http1_config(settings),
                        ssl_context=tls.server_context(settings) if tls.enabled(settings) else None,
                        stop_accepting=drain.stop_accepting,
                        graceful_deadline=lambda: trio.current_time() + hard_stop_after(settings),
                        listeners=[inherited_listener(fd) for fd in listen_fds] or None,
                        memory=app.services.body_budget,
                        task_status=task_status,
                    )
                # Background responses belong to no connection: they go on until they
                # end, or until the drain deadline ends them (as every request).
                responses = app.services.responses
                if responses.running:
                    log.info(
                        "all connections closed; waiting for %d background response(s)",
                        responses.running,
                    )
                    await responses.wait_idle()
                log.log(
                    logging.DEBUG if drain.quiet else logging.INFO,
                    "all connections closed; stopping",
                )
                nursery.cancel_scope.cancel()

            if engine_wait > 0:
                with trio.move_on_after(engine_wait) as waited:
                    await engines.wait_ready()
                if waited.cancelled_caught:
                    log.warning("no engine handshake after %g s; listening anyway", engine_wait)
            await nursery.start(app.services.responses.serve)
            binds = await nursery.start(serve_http)
            task_status.started((app, drain, binds))
