"""Settings shared by the CLI, the server and the application.

Each field is also an option of ``trioserve run``: its metadata (``options.option``) gives
the flag, help, group and unit, and ``cli/`` derives the command line from them. To add an
option, add a field here (its group one of ``cli.run.GROUPS``); nothing else is written.
"""

from __future__ import annotations

import attrs

from .options import KIB, MIB, SECONDS, option
from .text.agents import REASONING_PARSERS, TOOL_CALL_PARSERS

#: Kubernetes must give a frontend pod this much, the one formula of the help and of
#: docs/deployment.md: ``--graceful-timeout`` counts from the signal, and the last error
#: events have ERROR_WRITE_TIMEOUT (5 s) plus a second to leave (``hard_stop_after``).
GRACE_RULE = "terminationGracePeriodSeconds > preStop + max(--drain-delay, --graceful-timeout) + 6"


def default_max_connections() -> int:
    """``--max-connections 0``: three quarters of ``RLIMIT_NOFILE``. The rest is for
    engine sockets, uploads, logs and the connections being turned away, so accept(2)
    never meets EMFILE."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return 1024
    if soft == resource.RLIM_INFINITY or soft <= 0:
        return 65536
    return max(soft * 3 // 4, 16)


def per_key_bound(explicit: int, limit: int, keys: int) -> int:
    """A per-API-key bound: ``explicit`` if set, else an equal share of ``limit`` (at
    least 1) when there are two keys or more, so that every key can have its share
    however busy the others are; else 0, no bound per key."""
    if explicit:
        return explicit
    return max(limit // keys, 1) if keys > 1 else 0


def connections_per_key(settings: Settings) -> int:
    """The connections one API key may hold open (``--max-connections-per-key``, else its
    share of ``--max-connections``), on either server; 0: no bound per key."""
    return per_key_bound(
        settings.max_connections_per_key,
        settings.max_connections or default_max_connections(),
        len(settings.api_keys),
    )


@attrs.define
class Settings:
    # -- listening and serving
    host: str = option("127.0.0.1", group="serving", help="address to listen on")
    port: int = option(
        8000, group="serving", kind="port", help="port to listen on (0: any free one)"
    )
    #: The HTTP server: "builtin" (trioserve's own, HTTP/1.1) or "hypercorn" (HTTP/2, TLS).
    server: str = option(
        "builtin",
        group="serving",
        kind="server_name",
        choices=("builtin", "hypercorn"),
        help="HTTP server: builtin, trioserve's own lean HTTP/1.1 server (`h11` is accepted "
        "as its old name), or hypercorn's trio worker (adds HTTP/2 over TLS); see "
        "docs/benchmarks.md",
    )
    max_connections: int = option(
        0,
        group="serving",
        kind="non_negative",
        metavar="N",
        help="connections open at once; past it a new one gets 503 and is closed (built-in "
        "server; 0: three quarters of the open-file limit)",
    )
    max_connections_per_key: int = option(
        0,
        group="serving",
        kind="non_negative",
        metavar="N",
        help="connections one API key may hold open (a connection counts against the key of "
        "its first request that carries one, until it closes; WebSockets included); past "
        "it, 429 and the connection closes (under hypercorn's HTTP/2, the refused stream "
        "only; 0: --max-connections divided by the number of keys)",
    )
    write_timeout: float = option(
        30.0,
        group="serving",
        kind="positive",
        unit=SECONDS,
        help="seconds one socket write may take before the connection is dropped (built-in "
        "server; hypercorn has no such bound)",
    )
    keep_alive_timeout: float = option(
        5.0,
        group="serving",
        kind="positive",
        unit=SECONDS,
        help="seconds an idle keep-alive connection stays open",
    )

    # -- engines
    #: Empty: `trioserve run` starts the built-in mock engine.
    engines: list[str] = option(
        [],
        group="engines",
        flag="--engine",
        kind="engine_address",
        metavar="ADDRESS",
        help="ZeroMQ address of an engine, tcp://HOST:PORT or ipc://PATH, e.g. "
        "tcp://10.0.0.5:5555, or dns://NAME:PORT for an engine at every address of NAME "
        "(a Kubernetes headless Service), followed as it changes (repeatable)",
    )
    engine_refresh: float = option(
        5.0,
        group="engines",
        kind="positive",
        unit=SECONDS,
        help="seconds between two resolutions of the dns:// engine names",
    )
    #: The text assets /tokenize, /detokenize and the render routes serve (``text/``).
    tokenizer: str = option(
        "",
        group="engines",
        metavar="PATH",
        help="a model directory (tokenizer.json, tokenizer_config.json, ...) whose tokenizer "
        "and chat template serve /tokenize, /detokenize and the /render routes for every "
        "model, whatever the engine (the mock's included)",
    )
    #: "": the system's resolver (``engine/discovery.py``).
    engine_dns_server: str = option(
        "",
        group="engines",
        kind="dns_server",
        metavar="HOST:PORT",
        help="resolve dns:// engine names with this DNS server (full names, no search "
        "domains) instead of the system's resolver",
    )
    #: ``engine/routing.py`` (its POLICIES are these choices).
    routing: str = option(
        "least-load",
        group="engines",
        choices=("least-load", "affinity"),
        help="least-load: the engine with the fewest requests running and waiting, then "
        "the emptiest KV cache; affinity: the same session (X-Session-Id, else the body's "
        "user) or prompt prefix to the same engine while its load stays within "
        "--affinity-load-factor of the mean, so engines reuse cached prefixes",
    )
    affinity_load_factor: float = option(
        1.25,
        group="engines",
        kind="load_factor",
        metavar="FACTOR",
        help="--routing affinity: an engine keeps its sessions while its load is at most "
        "this many times the mean load",
    )
    heartbeat_interval: float = option(
        1.0,
        group="engines",
        kind="positive",
        unit=SECONDS,
        help="seconds between pings to each engine",
    )
    heartbeat_timeout: float = option(
        3.0,
        group="engines",
        kind="positive",
        unit=SECONDS,
        help="seconds of engine silence before its requests fail with 503 and it is reconnected",
    )
    #: ``zmtp.MAX_MESSAGE``.
    engine_max_message_bytes: int = option(
        128 * 2**20,
        group="engines",
        flag="--engine-max-frame-mb",
        kind="positive",
        unit=MIB,
        help="largest frame accepted from an engine, in MiB; a larger one fails that engine "
        "(docs/protocol.md)",
    )

    # -- requests
    request_timeout: float = option(
        600.0,
        group="requests",
        kind="non_negative",
        unit=SECONDS,
        help="deadline of every generation request in seconds (0: none); a client may "
        "ask for another with the X-Request-Timeout header",
    )
    max_request_timeout: float = option(
        3600.0,
        group="requests",
        kind="positive",
        unit=SECONDS,
        help="the largest X-Request-Timeout honoured, in seconds",
    )
    #: HTTP and WebSocket alike.
    max_concurrent_requests: int = option(
        256,
        group="requests",
        kind="positive",
        metavar="N",
        help="generation requests served at once; past it, 503 with Retry-After at once",
    )
    #: 0: ``max_concurrent_requests`` divided by the number of API keys (``http/admission.py``).
    max_requests_per_key: int = option(
        0,
        group="requests",
        kind="non_negative",
        metavar="N",
        help="generation requests one API key may have in flight; past it, 429 with "
        "Retry-After (0: --max-concurrent-requests divided by the number of keys)",
    )
    stream_buffer: int = option(
        256,
        group="requests",
        kind="positive",
        metavar="ITEMS",
        help="engine outputs buffered per request; a client further behind is ended "
        "with a slow_client error and its engine request aborted",
    )
    sse_keepalive: float = option(
        15.0,
        group="requests",
        kind="non_negative",
        unit=SECONDS,
        help="seconds of silence after which an SSE stream gets a comment line, so "
        "proxies keep it open while the engine prefills (0: never)",
    )

    # -- request bodies and media
    max_body_bytes: int = option(
        128 * 2**20,
        group="bodies",
        flag="--max-body-mb",
        kind="positive",
        unit=MIB,
        help="largest request body in MiB (413 past it)",
    )
    max_body_memory_bytes: int = option(
        1024 * 2**20,
        group="bodies",
        flag="--max-body-memory-mb",
        kind="positive",
        unit=MIB,
        help="request bodies held in memory across all requests at once, in MiB, with their "
        "parsed JSON and WebSocket messages (in assembly and parsed); past it a request is "
        "refused with 503 body_memory_exhausted (multipart uploads go to disk and do not "
        "count)",
    )
    body_timeout: float = option(
        30.0,
        group="bodies",
        kind="non_negative",
        unit=SECONDS,
        help="seconds a request body may stall before the request ends with 408 (0: none)",
    )
    body_deadline: float = option(
        120.0,
        group="bodies",
        kind="non_negative",
        unit=SECONDS,
        help="seconds from a request's head to the end of its body, 408 past it (built-in "
        "server; 0: none)",
    )
    upload_dir: str = option(
        "",
        group="bodies",
        metavar="DIR",
        help="directory for uploaded files while their request runs (default: a private "
        "directory of this process, made fresh under the system temp dir, mode 0700)",
    )
    #: Off: the SSRF surface.
    allow_remote_media: bool = option(
        False,
        group="bodies",
        help="fetch http(s) media URLs given in requests (off by default: the server "
        "would fetch any URL a client names)",
    )
    #: ``http/bodies/media.py``: loopback, private, link-local and multicast addresses are
    #: refused unless in one of these networks.
    remote_media_allow: list[str] = option(
        [],
        group="bodies",
        kind="network",
        metavar="CIDR",
        help="a network remote media may come from although it is not public (repeatable; "
        "by default loopback, private, link-local and multicast addresses are refused, "
        "after DNS resolution and on every redirect)",
    )
    remote_media_max_bytes: int = option(
        32 * 2**20,
        group="bodies",
        flag="--remote-media-max-mb",
        kind="positive",
        unit=MIB,
        help="largest total of remote media fetched for one request, in MiB",
    )
    remote_media_timeout: float = option(
        10.0,
        group="bodies",
        kind="positive",
        unit=SECONDS,
        help="seconds one remote media fetch may take",
    )

    # -- API keys and browsers
    #: ``http/auth.py``; `trioserve run` adds the keys of --api-key-file and
    #: TRIOSERVE_API_KEY.
    #: What each of ``api_keys`` is called in the access log and ``/debug/requests``
    #: (its label in the key file, else ``key-N``; never the key): set by `trioserve run`.
    api_key_labels: list[str] = option(
        [],
        group="access",
        flag="--api-key-label",
        metavar="LABEL",
        help="what the access log and /debug/requests call the API keys, in the order "
        "they are configured (--api-key values first; a key file names its own with "
        "'LABEL: KEY' lines; default key-N), never the key (repeatable)",
    )
    api_keys: list[str] = option(
        [],
        group="access",
        flag="--api-key",
        kind="api_key",
        metavar="KEY",
        repr=False,  # never in a log line
        help="require 'Authorization: Bearer KEY' on every route but /health, /live and "
        "/metrics (repeatable: any listed key passes; on the command line a key is "
        "visible to other local users: prefer --api-key-file or TRIOSERVE_API_KEY, "
        "which adds one more key)",
    )
    metrics_require_key: bool = option(
        False, group="access", help="/metrics requires an API key too (when keys are set)"
    )
    #: ``*``: any, never with credentials.
    cors_origins: list[str] = option(
        [],
        group="access",
        flag="--cors-origin",
        kind="origin",
        metavar="ORIGIN",
        help="allow browser requests from this origin, e.g. https://app.example "
        "(repeatable; '*' for any origin, without credentials)",
    )
    cors_allow_credentials: bool = option(
        False,
        group="access",
        help="let browsers send cookies/authorization to the --cors-origin origins (not with '*')",
    )
    #: See WebSocketHandshakes.origin_allowed (http/websocket_handshake.py).
    ws_allow_any_origin: bool = option(
        False,
        group="access",
        help="let a browser page of any origin open /v1/ws; without it, only origins "
        "--cors-origin allows and this server's own (clients that are not browsers send "
        "no Origin and are not affected)",
    )
    playground: bool = option(
        True,
        group="access",
        flag="--no-playground",
        help="serve no chat page at / (it is a 404 then); /docs and /openapi.json stay",
    )

    # -- WebSocket
    ws_max_requests: int = option(
        64,
        group="websocket",
        kind="positive",
        metavar="N",
        help="generation requests one WebSocket may run at once",
    )
    ws_max_message_bytes: int = option(
        1024 * 1024,
        group="websocket",
        flag="--ws-max-message-kb",
        kind="positive",
        unit=KIB,
        help="largest WebSocket message; a larger one closes the socket with 1009",
    )
    ws_ping_interval: float = option(
        20.0,
        group="websocket",
        kind="non_negative",
        unit=SECONDS,
        help="seconds between WebSocket pings (0: none)",
    )
    #: ``http/websocket.py``: what a WebSocket that carries nothing holds (a connection
    #: slot, its buffers) is given back, as nginx's ``proxy_read_timeout`` does.
    max_websockets_per_key: int = option(
        0,
        group="websocket",
        kind="non_negative",
        metavar="N",
        help="WebSockets one API key may hold open; past it, the handshake gets 429 (both "
        "servers; 0: --max-connections divided by the number of keys)",
    )
    ws_idle_timeout: float = option(
        300.0,
        group="websocket",
        kind="non_negative",
        unit=SECONDS,
        help="seconds a WebSocket may stay open with no request in flight; then it is "
        "closed with 1001 (0: never)",
    )

    # -- the Responses API's store
    responses_ttl: float = option(
        600.0,
        group="responses",
        kind="positive",
        unit=SECONDS,
        help="seconds a finished response stays retrievable (GET /v1/responses/{id}); "
        "responses live in this process's memory only",
    )
    responses_max_events: int = option(
        16384,
        group="responses",
        kind="positive",
        metavar="N",
        help="events a background response retains for replay; past it the response fails "
        "(response_events_overflow) and its engine request is aborted",
    )
    max_background_responses: int = option(
        64,
        group="responses",
        kind="positive",
        metavar="N",
        help="background responses (background: true) generating at once; past it, 503",
    )
    #: Events, texts and finished responses together.
    responses_store_bytes: int = option(
        256 * 2**20,
        group="responses",
        flag="--responses-store-mb",
        kind="positive",
        unit=MIB,
        help="memory the response store may hold, in MiB; finished responses are dropped "
        "oldest first to stay under it",
    )
    #: 0: ``responses_store_bytes`` divided by the number of keys (``http/responses_store.py``).
    responses_store_bytes_per_key: int = option(
        0,
        group="responses",
        flag="--responses-store-mb-per-key",
        kind="non_negative",
        unit=MIB,
        help="memory one API key's responses may hold, in MiB; past it that key's own "
        "oldest are dropped, then its new ones refused (0: the store's size divided by the "
        "number of keys)",
    )

    # -- stopping
    drain_delay: float = option(
        5.0,
        group="stopping",
        kind="non_negative",
        unit=SECONDS,
        help="seconds to keep serving after SIGTERM, so load balancers stop routing here "
        "before the listener closes (SIGINT, Ctrl-C at a terminal, skips it)",
    )
    graceful_timeout: float = option(
        30.0,
        group="stopping",
        kind="non_negative",
        unit=SECONDS,
        help="seconds from SIGTERM (or SIGINT) until requests still running are ended; it "
        f"includes --drain-delay. In Kubernetes: {GRACE_RULE} (docs/deployment.md)",
    )

    # -- observability
    access_log: bool = option(
        True,
        group="observability",
        flag="--no-access-log",
        help="no line per request on the trioserve.access logger (on by default, at info)",
    )
    #: "": no tracing, and nothing of OpenTelemetry is imported.
    otlp_traces_endpoint: str = option(
        "",
        group="observability",
        metavar="URL",
        help="send OpenTelemetry traces of generation requests over OTLP/HTTP to URL, e.g. "
        "http://collector:4318 (/v1/traces is added to a URL without a path); needs "
        "pip install 'trioserve[tracing]'",
    )
    debug_endpoints: bool = option(
        False,
        group="observability",
        help="serve GET /debug/requests, the requests in flight and where each one is: "
        "client addresses, request ids, models, engines, not prompts (behind the API key "
        "when keys are set)",
    )

    # -- TLS (``server/tls.py``)
    ssl_certfile: str = option(
        "",
        group="tls",
        metavar="PEM",
        help="serve HTTPS with this certificate (chain); needs --ssl-keyfile",
    )
    ssl_keyfile: str = option("", group="tls", metavar="PEM", help="the certificate's private key")
    #: "": no client certificate is asked for.
    ssl_ca_certs: str = option(
        "",
        group="tls",
        metavar="PEM",
        help="mutual TLS: accept client certificates signed by these CAs",
    )
    ssl_client_cert: str = option(
        "required",
        group="tls",
        choices=("required", "optional"),
        unset=True,  # given without --ssl-ca-certs is a mistake to say
        help="with --ssl-ca-certs: must clients present a certificate (default: required)",
    )

    # -- the engine link's CURVE (``transport/keys.py`` reads the files); none: NULL
    engine_curve_server_key: str = option(
        "",
        group="curve",
        metavar="FILE",
        help="speak CURVE to every --engine, which must hold the secret key of this public "
        "key (PREFIX.key from `trioserve keygen PREFIX`, or a bare Z85 key); needs "
        "--engine-curve-secret-key",
    )
    engine_curve_secret_key: str = option(
        "",
        group="curve",
        metavar="FILE",
        help="this frontend's secret key (PREFIX.key_secret; its public key must be in the "
        "engines' --curve-authorized-keys)",
    )

    # -- tool calls and reasoning, parsed out of chat answers (``text/agents``)
    tool_call_parser: str = option(
        "",
        group="agents",
        metavar="NAME",
        choices=tuple(sorted(TOOL_CALL_PARSERS)),
        help="parse tool calls out of chat answers in this format, as vLLM names it "
        '(every engine); turns on tool_choice "auto" (without it, "auto" is refused)',
    )
    tool_strict_level: str = option(
        "auto",
        group="agents",
        choices=("auto", "function", "parameter"),
        help="what a tool-call format's structural tag holds the model to, as vLLM's "
        "--tool-strict-level: `auto` (forced calls; with tool_choice auto only a tool "
        "that says strict: true or parallel_tool_calls false), `function` (the call's "
        "envelope for every request with tools), `parameter` (also every tool's arguments, "
        "as if each said strict: true)",
    )
    reasoning_parser: str = option(
        "",
        group="agents",
        metavar="NAME",
        choices=tuple(sorted(REASONING_PARSERS)),
        help="split the reasoning from chat answers in this format, as vLLM names it "
        "(every engine)",
    )
