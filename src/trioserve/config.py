"""Settings shared by the CLI, the server and the application."""

from __future__ import annotations

import attrs


@attrs.define
class Settings:
    host: str = "127.0.0.1"
    port: int = 8000
    #: Engine addresses (``tcp://``, ``ipc://``, ``dns://NAME:PORT``); empty means "start
    #: the built-in mock engine".
    engines: list[str] = attrs.Factory(list)
    #: How requests are routed among engines: "least-load" or "affinity"
    #: (``engine/routing.py``).
    routing: str = "least-load"
    #: Affinity routing: an engine keeps its keys while its load is at most this many
    #: times the mean load.
    affinity_load_factor: float = 1.25
    #: Seconds between two resolutions of the ``dns://`` engine names.
    engine_refresh: float = 5.0
    #: The DNS server ``dns://`` names are resolved with (``HOST:PORT``); "": the system's
    #: resolver (``engine/discovery.py``).
    engine_dns_server: str = ""
    #: Server-wide request deadline in seconds (0: none).
    request_timeout: float = 600.0
    #: Largest deadline a client may ask for with ``X-Request-Timeout``.
    max_request_timeout: float = 3600.0
    #: Per-request buffer of engine outputs (items) before the client counts as too slow.
    stream_buffer: int = 256
    max_body_bytes: int = 128 * 1024 * 1024
    #: Request bodies (JSON, urlencoded) held in memory across all requests at once; past
    #: it, 503 ``body_memory_exhausted`` (multipart uploads go to disk and count nothing).
    max_body_memory_bytes: int = 1024 * 1024 * 1024
    #: Seconds a request body may stall between two pieces (408 past it; 0: no limit).
    body_timeout: float = 30.0
    #: Seconds from a request's head to the end of its body (408 past it; 0: no limit;
    #: built-in server).
    body_deadline: float = 120.0
    #: Connections open at once (built-in server; past it, 503 and close; 0: three quarters
    #: of the descriptor limit).
    max_connections: int = 0
    #: Generation requests served at once (HTTP and WebSocket); past it, 503 at once.
    max_concurrent_requests: int = 256
    #: Origins allowed by CORS (``*``: any, never with credentials); empty: no CORS.
    cors_origins: list[str] = attrs.Factory(list)
    cors_allow_credentials: bool = False
    #: Seconds of silence after which an SSE stream gets a comment line (0: never).
    sse_keepalive: float = 15.0
    #: Where uploaded files are written while their request runs ("": a private directory
    #: of this process, made fresh in the system's temporary directory).
    upload_dir: str = ""
    #: Fetch ``http(s)://`` media URLs in requests (off: the SSRF surface).
    allow_remote_media: bool = False
    #: Largest remote media fetched for one request, in bytes (all its URLs together).
    remote_media_max_bytes: int = 32 * 1024 * 1024
    #: Seconds one remote media fetch may take, from connect to last byte.
    remote_media_timeout: float = 10.0
    #: The HTTP server: "builtin" (trioserve's own, HTTP/1.1) or "hypercorn" (HTTP/2, TLS).
    server: str = "builtin"
    #: Seconds one socket write may take before the connection is dropped (built-in server).
    write_timeout: float = 30.0
    #: Seconds an idle keep-alive connection stays open.
    keep_alive_timeout: float = 5.0
    #: Generation requests one WebSocket may run at once.
    ws_max_requests: int = 64
    #: Let a browser page of any origin open /v1/ws (see App._websocket_origin_allowed).
    ws_allow_any_origin: bool = False
    #: Serve the chat page at ``/`` (``--no-playground``: a 404 there).
    playground: bool = True
    #: Largest WebSocket message accepted; a larger one closes the socket with 1009.
    ws_max_message_bytes: int = 1024 * 1024
    #: Seconds between WebSocket pings (0: none).
    ws_ping_interval: float = 20.0
    #: Seconds a finished response stays retrievable (``GET /v1/responses/{id}``).
    responses_ttl: float = 600.0
    #: Events one background response may retain for replay (``starting_after``); past
    #: it, the response fails (``response_events_overflow``) and its engine request is
    #: aborted.
    responses_max_events: int = 16384
    #: Background responses (``background: true``) generating at once; past it, 503.
    max_background_responses: int = 64
    #: Bytes the response store may hold in all (events, texts, finished responses);
    #: finished responses are dropped oldest first to stay under it.
    responses_store_bytes: int = 256 * 2**20
    heartbeat_interval: float = 1.0
    heartbeat_timeout: float = 3.0
    #: Largest frame accepted from an engine, in bytes (``zmtp.MAX_MESSAGE``); a larger
    #: one fails that engine.
    engine_max_message_bytes: int = 128 * 2**20
    #: CURVE on the engine link (``transport/keys.py`` reads them): this frontend's secret
    #: key file and the engines' public key file; none: NULL, clear text.
    engine_curve_secret_key: str = ""
    engine_curve_server_key: str = ""
    #: Seconds to keep serving after SIGTERM before the listener closes.
    drain_delay: float = 5.0
    #: Seconds from SIGTERM until what is still running is ended.
    graceful_timeout: float = 30.0
    #: API keys (``Authorization: Bearer``) every route but /health, /live and /metrics
    #: requires; empty: none required (``http/auth.py``).
    api_keys: list[str] = attrs.field(factory=list, repr=False)  # never in a log line
    #: /metrics requires a key too (when there are keys).
    metrics_require_key: bool = False
    #: TLS (``tls.py``): the server's certificate chain and its key, PEM files; no
    #: certificate: plain HTTP.
    ssl_certfile: str = ""
    ssl_keyfile: str = ""
    #: CAs whose client certificates are accepted (mutual TLS); none: no client
    #: certificate is asked for.
    ssl_ca_certs: str = ""
    #: With ``ssl_ca_certs``: a client certificate is "required" or "optional".
    ssl_client_cert: str = "required"
    #: One line per request on the ``trioserve.access`` logger (at INFO).
    access_log: bool = True
    #: Where to send OpenTelemetry traces (OTLP over HTTP, protobuf); "": no tracing, and
    #: nothing of OpenTelemetry is imported.
    otlp_traces_endpoint: str = ""
    #: Serve ``GET /debug/requests``, the live view of the requests in flight.
    debug_endpoints: bool = False
