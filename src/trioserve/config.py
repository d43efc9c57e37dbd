"""Settings shared by the CLI, the server and the application."""

from __future__ import annotations

import attrs


@attrs.define
class Settings:
    host: str = "127.0.0.1"
    port: int = 8000
    #: Engine addresses; empty means "start the built-in mock engine".
    engines: list[str] = attrs.Factory(list)
    #: Server-wide request deadline in seconds (0: none).
    request_timeout: float = 600.0
    #: Largest deadline a client may ask for with ``X-Request-Timeout``.
    max_request_timeout: float = 3600.0
    #: Per-request buffer of engine outputs (items) before the client counts as too slow.
    stream_buffer: int = 256
    max_body_bytes: int = 128 * 1024 * 1024
    #: The HTTP server: "h11" (trioserve's own, HTTP/1.1) or "hypercorn" (HTTP/2, TLS).
    server: str = "h11"
    #: Seconds one socket write may take before the connection is dropped (h11 server).
    write_timeout: float = 30.0
    #: Seconds an idle keep-alive connection stays open.
    keep_alive_timeout: float = 5.0
    #: Generation requests one WebSocket may run at once.
    ws_max_requests: int = 64
    #: Largest WebSocket message accepted; a larger one closes the socket with 1009.
    ws_max_message_bytes: int = 1024 * 1024
    #: Seconds between WebSocket pings (0: none).
    ws_ping_interval: float = 20.0
    heartbeat_interval: float = 1.0
    heartbeat_timeout: float = 3.0
    #: Seconds to keep serving after SIGTERM before the listener closes.
    drain_delay: float = 5.0
    #: Seconds from SIGTERM until what is still running is ended.
    graceful_timeout: float = 30.0
