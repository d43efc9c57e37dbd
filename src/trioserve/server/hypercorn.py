"""The hypercorn adapter: trioserve's application under hypercorn's trio worker (HTTP/2
over TLS), through plain ASGI (``trioserve.http.channel.AsgiChannel``)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import trio
from hypercorn.config import Config
from hypercorn.trio import serve

from ..config import Settings
from ..http import App
from . import tls


def hypercorn_config(
    settings: Settings, hard_stop_after: float, listen_fds: Sequence[int] = ()
) -> Config:
    config = Config()
    # Inherited listening sockets (a worker of --workers), else bound here.
    config.bind = [f"fd://{fd}" for fd in listen_fds] or [f"{settings.host}:{settings.port}"]
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")
    config.include_server_header = False
    config.keep_alive_timeout = settings.keep_alive_timeout
    config.websocket_max_message_size = settings.ws_max_message_bytes
    config.websocket_ping_interval = settings.ws_ping_interval or None
    config.graceful_timeout = hard_stop_after
    if tls.enabled(settings):
        # hypercorn builds its context from these (TLS 1.2+, ALPN h2 and http/1.1).
        config.certfile = settings.ssl_certfile
        config.keyfile = settings.ssl_keyfile
        if settings.ssl_ca_certs:
            config.ca_certs = settings.ssl_ca_certs
            config.verify_mode = tls.CLIENT_CERT_MODES[settings.ssl_client_cert]
    return config


async def serve_hypercorn(
    app: App,
    settings: Settings,
    *,
    stop_accepting: trio.Event,
    hard_stop_after: float,
    listen_fds: Sequence[int] = (),
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` until ``stop_accepting`` is set and its connections have ended (or
    ``hard_stop_after`` seconds later). ``listen_fds``: listening sockets to accept on
    (inherited) instead of binding ``settings.host:port``."""
    await serve(
        # App speaks ASGI in plain dicts; hypercorn types each message as a TypedDict,
        # which no callable taking dict[str, Any] matches.
        app,  # type: ignore[arg-type]
        hypercorn_config(settings, hard_stop_after, listen_fds),
        shutdown_trigger=stop_accepting.wait,
        task_status=task_status,
    )
