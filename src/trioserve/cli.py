"""``trioserve``: the command line.

- ``trioserve run``: the frontend (starts the mock engine as a child when no --engine);
- ``trioserve client``: stream one answer to the terminal;
- ``trioserve engine mock``: the mock engine alone;
- ``trioserve engine vllm MODEL``: a vLLM engine (``sdk/vllm_engine.py``; needs vllm).
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import gc
import logging
import os
import shlex
import signal
import sys
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import trio

from .config import Settings
from .transport.zmtp import parse_address

log = logging.getLogger("trioserve")

DEFAULTS = Settings()

_Number = TypeVar("_Number", int, float)


def _positive(kind: type[_Number]) -> Callable[[str], _Number]:
    def parse(text: str) -> _Number:
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {text}")
        return value

    parse.__name__ = kind.__name__
    return parse


def _server_name(value: str) -> str:
    """``--server``: ``h11`` is the built-in server's name before it left h11 for httptools."""
    return "builtin" if value == "h11" else value


def _non_negative(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be zero or more, got {text}")
    return value


def _engine_address(text: str) -> str:
    """Refused here, not with a traceback when the frontend starts."""
    try:
        parse_address(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trioserve",
        description=(
            "An HTTP frontend for model-inference engines, on Trio: OpenAI-compatible routes "
            "to clients, ZeroMQ to engines, and exactly one abort for every request that "
            "ends early."
        ),
    )
    parser.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"]
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = commands.add_parser(
        "run",
        help="serve the HTTP API (starts the mock engine when no --engine is given)",
        description=(
            "Serve the HTTP API. With no --engine, a mock engine is started as a child "
            "process and stopped with the server. SIGTERM or SIGINT drains: readiness turns "
            "503 at once, requests are still served for --drain-delay seconds, then the "
            "listener closes and in-flight requests may finish until --graceful-timeout "
            "(counted from the signal). A second signal ends what is left at once."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    run.add_argument("--host", default=DEFAULTS.host, help="address to listen on")
    run.add_argument("--port", type=int, default=DEFAULTS.port, help="port to listen on")
    run.add_argument(
        "--engine",
        action="append",
        default=[],
        type=_engine_address,
        metavar="ADDRESS",
        help="ZeroMQ address of an engine, tcp://HOST:PORT or ipc://PATH, e.g. "
        "tcp://10.0.0.5:5555 (repeatable)",
    )
    run.add_argument(
        "--request-timeout",
        type=_non_negative,
        default=DEFAULTS.request_timeout,
        help="deadline of every generation request in seconds (0: none); a client may "
        "ask for another with the X-Request-Timeout header",
    )
    run.add_argument(
        "--max-request-timeout",
        type=_positive(float),
        default=DEFAULTS.max_request_timeout,
        help="the largest X-Request-Timeout honoured, in seconds",
    )
    run.add_argument(
        "--stream-buffer",
        type=_positive(int),
        default=DEFAULTS.stream_buffer,
        metavar="ITEMS",
        help="engine outputs buffered per request; a client further behind is ended "
        "with a slow_client error and its engine request aborted",
    )
    run.add_argument(
        "--max-body-mb",
        type=_positive(float),
        default=DEFAULTS.max_body_bytes / 2**20,
        help="largest request body in MiB (413 past it)",
    )
    run.add_argument(
        "--body-timeout",
        type=_non_negative,
        default=DEFAULTS.body_timeout,
        help="seconds a request body may stall before the request ends with 408 (0: none)",
    )
    run.add_argument(
        "--body-deadline",
        type=_non_negative,
        default=DEFAULTS.body_deadline,
        help="seconds from a request's head to the end of its body, 408 past it (built-in server; "
        "0: none)",
    )
    run.add_argument(
        "--max-connections",
        type=_non_negative,
        default=DEFAULTS.max_connections,
        help="connections open at once; past it a new one gets 503 and is closed (built-in "
        "server; 0: three quarters of the open-file limit)",
    )
    run.add_argument(
        "--max-concurrent-requests",
        type=_positive(int),
        default=DEFAULTS.max_concurrent_requests,
        help="generation requests served at once; past it, 503 with Retry-After at once",
    )
    run.add_argument(
        "--cors-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="allow browser requests from this origin, e.g. https://app.example "
        "(repeatable; '*' for any origin, without credentials)",
    )
    run.add_argument(
        "--cors-allow-credentials",
        action="store_true",
        help="let browsers send cookies/authorization to the --cors-origin origins (not with '*')",
    )
    run.add_argument(
        "--api-key",
        action="append",
        default=[],
        metavar="KEY",
        help="require 'Authorization: Bearer KEY' on every route but /health, /live and "
        "/metrics (repeatable: any listed key passes; on the command line a key is "
        "visible to other local users: prefer --api-key-file or TRIOSERVE_API_KEY, "
        "which adds one more key)",
    )
    run.add_argument(
        "--api-key-file",
        metavar="PATH",
        help="read API keys from PATH, one a line (blank lines and # comments ignored)",
    )
    run.add_argument(
        "--metrics-require-key",
        action="store_true",
        help="/metrics requires an API key too (when keys are set)",
    )
    run.add_argument(
        "--sse-keepalive",
        type=_non_negative,
        default=DEFAULTS.sse_keepalive,
        help="seconds of silence after which an SSE stream gets a comment line, so "
        "proxies keep it open while the engine prefills (0: never)",
    )
    run.add_argument(
        "--upload-dir",
        default=DEFAULTS.upload_dir,
        help="directory for uploaded files while their request runs (default: a private "
        "directory of this process, made fresh under the system temp dir, mode 0700)",
    )
    run.add_argument(
        "--allow-remote-media",
        action="store_true",
        help="fetch http(s) media URLs given in requests (off by default: the server "
        "would fetch any URL a client names)",
    )
    run.add_argument(
        "--remote-media-max-mb",
        type=_positive(float),
        default=DEFAULTS.remote_media_max_bytes / 2**20,
        help="largest total of remote media fetched for one request, in MiB",
    )
    run.add_argument(
        "--remote-media-timeout",
        type=_positive(float),
        default=DEFAULTS.remote_media_timeout,
        help="seconds one remote media fetch may take",
    )
    run.add_argument(
        "--ws-max-requests",
        type=_positive(int),
        default=DEFAULTS.ws_max_requests,
        help="generation requests one WebSocket may run at once",
    )
    run.add_argument(
        "--ws-allow-any-origin",
        action="store_true",
        help="let a browser page of any origin open /v1/ws; without it, only origins "
        "--cors-origin allows and this server's own (clients that are not browsers send "
        "no Origin and are not affected)",
    )
    run.add_argument(
        "--ws-max-message-kb",
        type=_positive(float),
        default=DEFAULTS.ws_max_message_bytes / 1024,
        help="largest WebSocket message; a larger one closes the socket with 1009",
    )
    run.add_argument(
        "--ws-ping-interval",
        type=_non_negative,
        default=DEFAULTS.ws_ping_interval,
        help="seconds between WebSocket pings (0: none)",
    )
    run.add_argument(
        "--server",
        type=_server_name,
        choices=["builtin", "hypercorn"],
        default=DEFAULTS.server,
        help="HTTP server: builtin, trioserve's own lean HTTP/1.1 server (`h11` is accepted as "
        "its old name), or hypercorn's trio worker (adds HTTP/2 over TLS); see "
        "docs/benchmarks.md",
    )
    run.add_argument(
        "--write-timeout",
        type=_positive(float),
        default=DEFAULTS.write_timeout,
        help="seconds one socket write may take before the connection is dropped (built-in "
        "server; hypercorn has no such bound)",
    )
    run.add_argument(
        "--keep-alive-timeout",
        type=_positive(float),
        default=DEFAULTS.keep_alive_timeout,
        help="seconds an idle keep-alive connection stays open",
    )
    run.add_argument(
        "--heartbeat-interval",
        type=_positive(float),
        default=DEFAULTS.heartbeat_interval,
        help="seconds between pings to each engine",
    )
    run.add_argument(
        "--heartbeat-timeout",
        type=_positive(float),
        default=DEFAULTS.heartbeat_timeout,
        help="seconds of engine silence before its requests fail with 503 and it is reconnected",
    )
    run.add_argument(
        "--engine-max-frame-mb",
        type=_positive(float),
        default=DEFAULTS.engine_max_message_bytes / 2**20,
        help="largest frame accepted from an engine, in MiB; a larger one fails that engine "
        "(docs/protocol.md)",
    )
    run.add_argument(
        "--drain-delay",
        type=_non_negative,
        default=DEFAULTS.drain_delay,
        help="seconds to keep serving after SIGTERM, so load balancers stop routing here "
        "before the listener closes",
    )
    run.add_argument(
        "--graceful-timeout",
        type=_non_negative,
        default=DEFAULTS.graceful_timeout,
        help="seconds from SIGTERM until requests still running are ended (Kubernetes' "
        "terminationGracePeriodSeconds must exceed preStop + this + a margin)",
    )
    tls_options = run.add_argument_group("TLS (both servers; hypercorn adds HTTP/2 over it)")
    tls_options.add_argument(
        "--ssl-certfile",
        metavar="PEM",
        help="serve HTTPS with this certificate (chain); needs --ssl-keyfile",
    )
    tls_options.add_argument("--ssl-keyfile", metavar="PEM", help="the certificate's private key")
    tls_options.add_argument(
        "--ssl-ca-certs",
        metavar="PEM",
        help="mutual TLS: accept client certificates signed by these CAs",
    )
    tls_options.add_argument(
        "--ssl-client-cert",
        choices=["required", "optional"],
        help="with --ssl-ca-certs: must clients present a certificate (default: required)",
    )
    vllm = run.add_argument_group("a vLLM engine started as a child (needs vllm installed)")
    vllm.add_argument(
        "--vllm",
        metavar="MODEL",
        default=None,
        help="serve MODEL (a name or a path) with a vLLM engine started as a child "
        "process; the server listens once the model is loaded",
    )
    vllm.add_argument(
        "--vllm-args",
        default="",
        metavar="ARGS",
        help="more options for the vLLM engine, as `vllm serve` spells them, in one "
        "string, e.g. '--max-model-len 2048 --dtype bfloat16'",
    )
    vllm.add_argument(
        "--vllm-load-timeout",
        type=_positive(float),
        default=VLLM_LOAD_TIMEOUT,
        help="seconds to wait for the model to load before giving up",
    )
    mock = run.add_argument_group("built-in mock engine (only without --engine or --vllm)")
    mock.add_argument("--mock-tokens-per-second", type=_positive(float), default=50.0)
    mock.add_argument("--mock-ttft-ms", type=_non_negative, default=20.0)
    mock.add_argument("--mock-model", default="mock")
    mock.add_argument(
        "--mock-fault-injection",
        action="store_true",
        help="let clients use the mock's fault-injection knobs (mock_stall_s, …): any client "
        "could then stall the engine for everyone; for tests and benchmarks",
    )

    client = commands.add_parser(
        "client",
        help="send a prompt and print the answer as it streams",
        description="Send a prompt to a trioserve server and print tokens as they arrive, "
        "over WebSocket (default) or SSE. Ctrl-C cancels the request cleanly.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    client.add_argument("prompt", help="the prompt (a user message for chat)")
    client.add_argument("--url", default="http://127.0.0.1:8000", help="the server")
    client.add_argument("--sse", action="store_true", help="use SSE instead of WebSocket")
    client.add_argument(
        "--completion", action="store_true", help="use the completions endpoint, not chat"
    )
    client.add_argument("--max-tokens", type=_positive(int), default=None)
    client.add_argument("--model", default=None, help="model name (default: the server's first)")
    client.add_argument(
        "--api-key",
        default=os.environ.get("TRIOSERVE_API_KEY") or None,
        metavar="KEY",
        help="send 'Authorization: Bearer KEY' (default: $TRIOSERVE_API_KEY)",
    )

    engine = commands.add_parser("engine", help="run an engine")
    kinds = engine.add_subparsers(dest="engine_kind", required=True, metavar="KIND")
    mock_engine = kinds.add_parser(
        "mock",
        help="the deterministic mock engine",
        description="Run the mock engine: deterministic text at a fixed token rate, with "
        "faults on demand per request (see docs/protocol.md).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    mock_engine.add_argument(
        "--bind", default="tcp://127.0.0.1:5555", help="ZeroMQ address to bind (ROUTER)"
    )
    mock_engine.add_argument("--model", default="mock", help="model name to serve")
    mock_engine.add_argument(
        "--tokens-per-second", type=_positive(float), default=50.0, help="token rate"
    )
    mock_engine.add_argument(
        "--ttft-ms", type=_non_negative, default=20.0, help="time to first token"
    )
    mock_engine.add_argument(
        "--frontend-timeout",
        type=_positive(float),
        default=5.0,
        help="seconds of frontend silence before its requests are aborted here",
    )
    mock_engine.add_argument("--log-aborts", action="store_true", help="log every abort received")
    mock_engine.add_argument(
        "--allow-fault-injection",
        action="store_true",
        help="obey the mock_* params of requests (stalls, errors, timing); off, a request "
        "naming one gets a 400: any client could stall the engine for everyone",
    )
    mock_engine.add_argument(
        "--loop", choices=["trio", "asyncio"], default="trio", help="event loop to serve on"
    )
    # Everything after `engine vllm` is the vLLM engine's: trioserve's own options and
    # vLLM's (see sdk/vllm_engine.py, whose parser is vLLM's own).
    kinds.add_parser(
        "vllm",
        help="a vLLM engine (needs vllm installed): trioserve engine vllm MODEL --bind "
        "ADDRESS [vLLM's options]; `trioserve engine vllm --help` lists them",
        add_help=False,
    )
    mock_engine.add_argument(
        "--exit-with-parent",
        nargs="?",
        type=int,
        const=0,
        metavar="PID",
        help="exit when the parent process dies: PID, or the parent at start if none is "
        "given (`trioserve run` gives its own, so that an engine whose parent died while it "
        "was starting exits too)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if args.command == "engine" and args.engine_kind == "vllm":
        logging.basicConfig(
            level=args.log_level.upper(),
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
            stream=sys.stderr,
        )
        return _engine_vllm(extra)
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if args.command == "run":
        return _run(args)
    if args.command == "client":
        from .terminal_client import run_client

        return trio.run(
            partial(
                run_client,
                args.url,
                args.prompt,
                sse=args.sse,
                endpoint="completion" if args.completion else "chat",
                max_tokens=args.max_tokens,
                model=args.model,
                api_key=args.api_key,
            )
        )
    return _engine_mock(args)


# -- trioserve run --------------------------------------------------------------------------


def _tls_usage_error(args: argparse.Namespace) -> str | None:
    """What is wrong with the TLS options together, if anything."""
    if bool(args.ssl_certfile) != bool(args.ssl_keyfile):
        return "--ssl-certfile and --ssl-keyfile go together: give both, or neither"
    if args.ssl_ca_certs and not args.ssl_certfile:
        return "--ssl-ca-certs (mutual TLS) needs --ssl-certfile and --ssl-keyfile"
    if args.ssl_client_cert and not args.ssl_ca_certs:
        return "--ssl-client-cert needs --ssl-ca-certs (the CAs client certificates come from)"
    return None


def _tls_files_error(args: argparse.Namespace, settings: Settings) -> str | None:
    """What is wrong with the TLS files, if anything: checked before serving (each
    server builds its own context from them)."""
    if not settings.ssl_certfile:
        return None
    import ssl

    from .server import tls

    for option in ("ssl_certfile", "ssl_keyfile", "ssl_ca_certs"):
        path = getattr(args, option)
        try:
            if path:
                open(path, "rb").close()  # only: can it be read?
        except OSError as exc:
            return f"--{option.replace('_', '-')} {path}: {exc.strerror or exc}"
    try:
        tls.server_context(settings)
    except (OSError, ssl.SSLError) as exc:
        return f"TLS: the certificate, key or CA file cannot be used: {exc}"
    return None


def _run(args: argparse.Namespace) -> int:
    if args.cors_allow_credentials and "*" in args.cors_origin:
        log.error("--cors-allow-credentials needs explicit --cors-origin values, not '*'")
        return 2
    from .http import auth

    try:
        api_keys = auth.load_keys(args.api_key, args.api_key_file, os.environ)
    except ValueError as exc:
        log.error("%s", exc)
        return 2
    if api_keys:
        log.info("API keys required: %d configured", len(api_keys))
        for index, key in enumerate(api_keys):
            if not auth.subprotocol_safe(key):
                log.warning(
                    "API key #%d has characters a browser cannot send in a WebSocket "
                    "subprotocol (trioserve.bearer.<KEY>); it works in headers only",
                    index,
                )
    tls_error = _tls_usage_error(args)
    if tls_error:
        log.error("%s", tls_error)
        return 2
    from .server.frontend import serve_frontend

    settings = Settings(
        host=args.host,
        port=args.port,
        engines=list(args.engine),
        request_timeout=args.request_timeout,
        max_request_timeout=args.max_request_timeout,
        stream_buffer=args.stream_buffer,
        max_body_bytes=int(args.max_body_mb * 2**20),
        body_timeout=args.body_timeout,
        body_deadline=args.body_deadline,
        max_connections=int(args.max_connections),
        max_concurrent_requests=args.max_concurrent_requests,
        cors_origins=list(args.cors_origin),
        cors_allow_credentials=args.cors_allow_credentials,
        sse_keepalive=args.sse_keepalive,
        upload_dir=args.upload_dir,
        allow_remote_media=args.allow_remote_media,
        remote_media_max_bytes=int(args.remote_media_max_mb * 2**20),
        remote_media_timeout=args.remote_media_timeout,
        keep_alive_timeout=args.keep_alive_timeout,
        server=args.server,
        write_timeout=args.write_timeout,
        ws_max_requests=args.ws_max_requests,
        ws_allow_any_origin=args.ws_allow_any_origin,
        ws_max_message_bytes=int(args.ws_max_message_kb * 1024),
        ws_ping_interval=args.ws_ping_interval,
        heartbeat_interval=args.heartbeat_interval,
        heartbeat_timeout=args.heartbeat_timeout,
        engine_max_message_bytes=int(args.engine_max_frame_mb * 2**20),
        drain_delay=args.drain_delay,
        graceful_timeout=args.graceful_timeout,
        api_keys=api_keys,
        metrics_require_key=args.metrics_require_key,
        ssl_certfile=args.ssl_certfile or "",
        ssl_keyfile=args.ssl_keyfile or "",
        ssl_ca_certs=args.ssl_ca_certs or "",
        ssl_client_cert=args.ssl_client_cert or "required",
    )
    tls_error = _tls_files_error(args, settings)
    if tls_error:
        log.error("%s", tls_error)
        return 2
    status = 0

    async def main_task() -> None:
        if settings.engines:
            await serve_frontend(settings)
            return
        with tempfile.TemporaryDirectory(prefix="trioserve-") as tmp:
            address = f"ipc://{Path(tmp) / 'engine.sock'}"
            settings.engines = [address]
            common = [sys.executable, "-m", "trioserve", "--log-level", args.log_level]
            common_tail = ["--bind", address, "--exit-with-parent", str(os.getpid())]
            if args.vllm:
                child = ChildEngine(
                    f"the vLLM engine for {args.vllm}",
                    [*common, "engine", "vllm", args.vllm, *common_tail]
                    + shlex.split(args.vllm_args),
                    wait=args.vllm_load_timeout,
                    progress=True,
                )
            else:
                child = ChildEngine(
                    "the mock engine",
                    [
                        *common,
                        "engine",
                        "mock",
                        *common_tail,
                        "--model",
                        args.mock_model,
                        "--tokens-per-second",
                        str(args.mock_tokens_per_second),
                        "--ttft-ms",
                        str(args.mock_ttft_ms),
                        *(["--allow-fault-injection"] if args.mock_fault_injection else []),
                    ],
                    wait=MOCK_ENGINE_WAIT,
                )
            await child.serve(settings)
            nonlocal status
            status = child.status

    _tune_gc()
    try:
        trio.run(main_task)
    except* OSError as group:
        # A port in use (or not ours to take) is the operator's to fix: one line, no
        # traceback. Any other OSError is a bug worth its traceback.
        cannot_listen, others = group.split(lambda e: getattr(e, "errno", None) in LISTEN_ERRORS)
        if others is not None:
            raise others from None
        assert cannot_listen is not None
        reasons = {str(exc.strerror) for exc in _leaves(cannot_listen)}
        log.error("cannot listen on %s port %s: %s", args.host, args.port, "; ".join(reasons))
        status = 2
    return status


def _leaves(group: BaseExceptionGroup) -> list[Any]:
    """The exceptions of ``group`` and of the groups nested in it."""
    leaves: list[Any] = []
    for exc in group.exceptions:
        leaves += _leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc]
    return leaves


#: Errors of binding the listening socket, answered with one line and exit status 2.
LISTEN_ERRORS = frozenset({errno.EADDRINUSE, errno.EACCES, errno.EADDRNOTAVAIL})


#: The young generation is collected after this many new container objects (CPython's
#: default is 700).
GC_GEN0_THRESHOLD = 10_000


def _tune_gc() -> None:
    """Keep the garbage collector's full passes off the relay path.

    A full collection walks every tracked object, and after start-up most of them are
    modules, classes and functions that live as long as the process; under a CPU quota
    its passes became inter-token stalls for every open stream (the figures are in
    docs/benchmarks.md). So what is alive at start-up moves to the permanent generation,
    and the young generation is collected every GC_GEN0_THRESHOLD allocations.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_GEN0_THRESHOLD, 10, 10)


#: Seconds `trioserve run` waits for the mock engine it started before listening.
MOCK_ENGINE_WAIT = 10.0
#: Seconds `trioserve run --vllm` waits for vLLM to load the model (about a minute for a
#: small model on two cores) before listening anyway, with 503s until it is ready.
VLLM_LOAD_TIMEOUT = 600.0
#: Seconds between the lines that say the engine is still loading.
PROGRESS_INTERVAL = 15.0
#: Seconds a child engine has to stop after SIGTERM before it is killed (vLLM shuts its
#: EngineCore process down first).
CHILD_STOP_TIMEOUT = 10.0


class ChildEngine:
    """An engine that `trioserve run` starts, serves through, and stops last.

    The server listens once the engine has answered (or after ``wait`` seconds), so that
    "Running on" means ready; an engine that exits while the server runs stops the server
    with status 1 and a line that says so, rather than leaving it answering 503s.
    """

    def __init__(self, what: str, command: list[str], *, wait: float, progress: bool = False):
        self.what = what
        self.command = command
        self.wait = wait
        self.progress = progress
        self.status = 0

    async def serve(self, settings: Settings) -> None:
        from .server.frontend import serve_frontend

        # A session of its own: a Ctrl-C at the terminal reaches the frontend only,
        # which drains first and stops the engine last.
        process = await trio.lowlevel.open_process(self.command, start_new_session=True)
        log.info("started %s (pid %d)", self.what, process.pid)
        try:
            async with trio.open_nursery() as nursery:

                async def frontend(task_status: trio.TaskStatus[object]) -> None:
                    await serve_frontend(settings, engine_wait=self.wait, task_status=task_status)
                    nursery.cancel_scope.cancel()

                nursery.start_soon(self._watch, process, nursery.cancel_scope)
                loading = trio.CancelScope()
                if self.progress:
                    nursery.start_soon(self._say_loading, loading)
                await nursery.start(frontend)
                loading.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await self._stop(process)

    async def _say_loading(self, scope: trio.CancelScope) -> None:
        with scope:
            started = trio.current_time()
            while True:
                await trio.sleep(PROGRESS_INTERVAL)
                waited = trio.current_time() - started
                log.info(
                    "%s is still loading (%.0f s); listening once it is ready", self.what, waited
                )

    async def _watch(self, process: trio.Process, scope: trio.CancelScope) -> None:
        code = await process.wait()
        log.error("%s exited with code %s; stopping", self.what, code)
        self.status = 1
        scope.cancel()

    async def _stop(self, process: trio.Process) -> None:
        if process.returncode is None:
            process.terminate()
            with trio.move_on_after(CHILD_STOP_TIMEOUT):
                await process.wait()
            if process.returncode is None:
                log.warning("%s did not stop in %g s; killing it", self.what, CHILD_STOP_TIMEOUT)
                process.kill()
                await process.wait()
        log.info("%s stopped (exit code %s)", self.what, process.returncode)


# -- trioserve engine vllm ---------------------------------------------------------------


def _engine_vllm(argv: list[str]) -> int:
    try:
        from .sdk import vllm_engine

        return vllm_engine.main(argv)
    except ImportError as exc:
        if exc.name is None or not exc.name.startswith("vllm"):
            raise
        log.error(
            "the vLLM engine needs vllm installed beside trioserve (%s); see docs/engines.md",
            exc,
        )
        return 2


# -- trioserve engine mock ---------------------------------------------------------------


def _engine_mock(args: argparse.Namespace) -> int:
    from .sdk import MockBackend, serve_engine, serve_engine_asyncio

    backend = MockBackend(
        model=args.model,
        tokens_per_second=args.tokens_per_second,
        ttft_ms=args.ttft_ms,
        allow_fault_injection=args.allow_fault_injection,
    )
    options = {"frontend_timeout": args.frontend_timeout, "log_aborts": args.log_aborts}
    watch_parent = args.exit_with_parent is not None
    parent = args.exit_with_parent or os.getppid()
    log.info("mock engine serving model %r on %s (%s)", args.model, args.bind, args.loop)

    if args.loop == "trio":

        async def main_trio() -> None:
            async with trio.open_nursery() as nursery:
                await nursery.start(partial(serve_engine, backend, args.bind, **options))
                if watch_parent:
                    nursery.start_soon(_exit_with_parent_trio, parent, nursery.cancel_scope)
                with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                    async for _ in signals:
                        break
                nursery.cancel_scope.cancel()

        trio.run(main_trio)
    else:

        async def main_asyncio() -> None:
            loop = asyncio.get_running_loop()
            task = asyncio.current_task()
            assert task is not None
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, task.cancel)
            watcher = None
            if watch_parent:
                watcher = loop.create_task(_exit_with_parent_asyncio(parent, task))
            try:
                await serve_engine_asyncio(backend, args.bind, **options)
            except asyncio.CancelledError:
                pass
            finally:
                if watcher is not None:
                    watcher.cancel()

        asyncio.run(main_asyncio())
    log.info("mock engine stopped")
    return 0


async def _exit_with_parent_trio(parent: int, scope: trio.CancelScope) -> None:
    # Polling is the portable way to learn of a parent's death (no event exists for it).
    while os.getppid() == parent:  # noqa: ASYNC110
        await trio.sleep(0.5)
    log.warning("parent process %d is gone; stopping", parent)
    scope.cancel()


async def _exit_with_parent_asyncio(parent: int, task: asyncio.Task[object]) -> None:
    while os.getppid() == parent:  # noqa: ASYNC110
        await asyncio.sleep(0.5)
    log.warning("parent process %d is gone; stopping", parent)
    task.cancel()
