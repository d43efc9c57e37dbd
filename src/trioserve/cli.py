"""``trioserve``: the command line.

- ``trioserve run``: the frontend (starts the mock engine as a child when no --engine);
- ``trioserve client``: stream one answer to the terminal;
- ``trioserve engine mock``: the mock engine alone;
- ``trioserve engine vllm MODEL``: a vLLM engine (``sdk/vllm_engine.py``; needs vllm);
- ``trioserve keygen PREFIX``: a CURVE key pair for the engine link.
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
import socket
import sys
import tempfile
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar
from urllib.parse import urlsplit

import trio

from . import __version__, logs
from .config import Settings
from .engine import discovery, routing
from .errors import CommandError
from .sdk.curve_options import add_curve_arguments
from .transport.zmtp import parse_address

if TYPE_CHECKING:
    import zmq

    from .sdk.asyncio_shell import AsyncioEngine

log = logging.getLogger("trioserve")

DEFAULTS = Settings()

#: Exit statuses: the command line is wrong (fix what was typed), or something it names
#: cannot be used (a port, a host, a file, a server, an engine address).
USAGE_ERROR = 2
ENVIRONMENT_ERROR = 1
#: After Ctrl-C before the server could take it over, as shells report a SIGINT.
INTERRUPTED = 130

#: How long Kubernetes must give a frontend pod, the one formula of the help and of
#: docs/deployment.md: ``--graceful-timeout`` counts from the signal, and the last error
#: events have ERROR_WRITE_TIMEOUT (5 s) plus a second to leave (``hard_stop_after``).
GRACE_RULE = "terminationGracePeriodSeconds > preStop + max(--drain-delay, --graceful-timeout) + 6"


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error in one line that says where the help is (argparse
    prints the whole usage first: for ``run``, thirty lines above the one that matters)."""

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE_ERROR, f"{self.prog}: error: {message} (see: {self.prog} --help)\n")


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Each default said once: not appended where the help already tells it, nor when
    there is none to tell (None, off, empty)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        nothing = action.default is None or action.default is False or action.default in ([], "")
        if "default" in text or nothing:
            return text
        return super()._get_help_string(action) or text


_Number = TypeVar("_Number", int, float)


def _positive(kind: type[_Number]) -> Callable[[str], _Number]:
    def parse(text: str) -> _Number:
        value = _number(kind, text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {text}")
        return value

    parse.__name__ = kind.__name__
    return parse


def _number(kind: type[_Number], text: str) -> _Number:
    try:
        value = kind(text)
    except ValueError:
        what = "a whole number" if kind is int else "a number"
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def _port(text: str) -> int:
    value = _number(int, text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port, 0-65535 (0: any free one), got {text}")
    return value


def _cpu_set(text: str) -> str:
    """``--vllm-cpus``: checked here, resolved when the engine starts (:func:`vllm_cpus`)."""
    vllm_cpus(text)
    return text


def vllm_cpus(spec: str) -> set[int] | None:
    """The CPUs ``--vllm-cpus`` names; None: no restriction."""
    available = sorted(os.sched_getaffinity(0))
    if spec == "all":
        return None
    if spec == "auto":
        return set(available[:-1]) if len(available) > 1 else None
    cpus: set[int] = set()
    try:
        for part in spec.split(","):
            first, _, last = part.partition("-")
            cpus.update(range(int(first), int(last or first) + 1))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{spec!r} is not a CPU list: give auto, all, or numbers and ranges such as 0-2,4"
        ) from None
    if not cpus or not cpus <= set(available):
        raise argparse.ArgumentTypeError(
            f"{spec!r}: this process may use CPUs {','.join(map(str, available))} only"
        )
    return cpus


def _server_name(value: str) -> str:
    """``--server``: ``h11`` is the built-in server's name before it left h11 for httptools."""
    return "builtin" if value == "h11" else value


def _non_negative(text: str) -> float:
    value = _number(float, text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be zero or more, got {text}")
    return value


def _engine_address(text: str) -> str:
    """Refused here, not with a traceback when the frontend starts."""
    try:
        if discovery.parse_dns(text) is None:
            parse_address(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _dns_server(text: str) -> str:
    try:
        discovery.parse_server(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _load_factor(text: str) -> float:
    value = float(text)
    if not value >= 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {text}")
    return value


def _api_key(text: str) -> str:
    from .http.auth import check_key

    try:
        check_key(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _server_url(text: str) -> str:
    """``client --url``: http(s)://HOST[:PORT]; ``HOST:PORT`` alone is taken as http://."""
    url = text if "://" in text else f"http://{text}"
    parts = urlsplit(url)
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number 0-65535
    except ValueError:
        parts = parts._replace(netloc="")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(
            f"expected http://HOST:PORT or https://HOST:PORT (e.g. http://127.0.0.1:8000), "
            f"got {text!r}"
        )
    return url


def _log_level_option(parser: argparse.ArgumentParser, default: str) -> None:
    """``--log-level``, before the command or after it: the top level sets the default,
    the commands' copies leave the value alone unless given."""
    parser.add_argument(
        "--log-level",
        default=default,
        choices=["debug", "info", "warning", "error"],
        help="how much to log (debug: also the traceback of an error reported in one line)"
        + (" (default: info)" if default is argparse.SUPPRESS else ""),
    )


def _log_format_option(parser: argparse.ArgumentParser, default: str) -> None:
    """``--log-format``, before the command or after ``run`` (as ``--log-level``)."""
    parser.add_argument(
        "--log-format",
        default=default,
        choices=["text", "json"],
        help="how every log line is written: text, or one JSON object a line (the access "
        "log's fields as keys; docs/metrics.md)"
        + (" (default: text)" if default is argparse.SUPPRESS else ""),
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="trioserve",
        description=(
            "An HTTP frontend for model-inference engines, on Trio: OpenAI-compatible routes "
            "to clients, ZeroMQ to engines, and exactly one abort for every request that "
            "ends early."
        ),
        epilog="Exit status: 0 when done; 1 when something the command names cannot be used "
        "(a port, a host, a file, a server, an engine address); 2 when the command line is "
        "wrong. Either is one line on stderr, with the traceback under --log-level debug.",
        formatter_class=_HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"trioserve {__version__}")
    _log_level_option(parser, "info")
    _log_format_option(parser, "text")
    commands = parser.add_subparsers(
        dest="command",
        required=True,
        metavar="COMMAND",
        help="what to do; `trioserve COMMAND --help` for its options",
    )

    run = commands.add_parser(
        "run",
        help="serve the HTTP API (starts the mock engine when no --engine is given)",
        description=(
            "Serve the HTTP API. With no --engine, a mock engine is started as a child "
            "process and stopped with the server. SIGTERM drains: readiness turns 503 at "
            "once, requests are still served for --drain-delay seconds (so load balancers "
            "stop sending any), then the listener closes and in-flight requests may finish "
            "until --graceful-timeout (counted from the signal). SIGINT (Ctrl-C) drains the "
            "same way but skips --drain-delay: with nothing in flight, the server stops at "
            "once. A second signal ends what is left at once."
        ),
        formatter_class=_HelpFormatter,
    )
    _log_level_option(run, argparse.SUPPRESS)
    _log_format_option(run, argparse.SUPPRESS)
    run.add_argument("--host", default=DEFAULTS.host, help="address to listen on")
    run.add_argument(
        "--port", type=_port, default=DEFAULTS.port, help="port to listen on (0: any free one)"
    )
    run.add_argument(
        "--workers",
        type=_positive(int),
        default=1,
        metavar="N",
        help="frontend processes sharing the port, each with its own engine connections; "
        "a supervisor forwards signals, restarts a worker that dies and serves /metrics "
        "summed over them (docs/deployment.md); the mock engine is started once for all",
    )
    run.add_argument(
        "--engine",
        action="append",
        default=[],
        type=_engine_address,
        metavar="ADDRESS",
        help="ZeroMQ address of an engine, tcp://HOST:PORT or ipc://PATH, e.g. "
        "tcp://10.0.0.5:5555, or dns://NAME:PORT for an engine at every address of NAME "
        "(a Kubernetes headless Service), followed as it changes (repeatable)",
    )
    run.add_argument(
        "--engine-refresh",
        type=_positive(float),
        default=DEFAULTS.engine_refresh,
        metavar="SECONDS",
        help="seconds between two resolutions of the dns:// engine names",
    )
    run.add_argument(
        "--engine-dns-server",
        type=_dns_server,
        default=DEFAULTS.engine_dns_server or None,
        metavar="HOST:PORT",
        help="resolve dns:// engine names with this DNS server (full names, no search "
        "domains) instead of the system's resolver",
    )
    run.add_argument(
        "--routing",
        choices=routing.POLICIES,
        default=DEFAULTS.routing,
        help="least-load: the engine with the fewest requests running and waiting, then "
        "the emptiest KV cache; affinity: the same session (X-Session-Id, else the body's "
        "user) or prompt prefix to the same engine while its load stays within "
        "--affinity-load-factor of the mean, so engines reuse cached prefixes",
    )
    run.add_argument(
        "--affinity-load-factor",
        type=_load_factor,
        default=DEFAULTS.affinity_load_factor,
        help="--routing affinity: an engine keeps its sessions while its load is at most "
        "this many times the mean load",
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
        "--max-body-memory-mb",
        type=_positive(float),
        default=DEFAULTS.max_body_memory_bytes / 2**20,
        help="request bodies held in memory across all requests at once, in MiB; past it a "
        "request is refused with 503 body_memory_exhausted (multipart uploads go to disk "
        "and do not count)",
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
        type=_api_key,
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
        "--no-playground",
        action="store_true",
        help="serve no chat page at / (it is a 404 then); /docs and /openapi.json stay",
    )
    run.add_argument(
        "--responses-ttl",
        type=_positive(float),
        default=DEFAULTS.responses_ttl,
        help="seconds a finished response stays retrievable (GET /v1/responses/{id}); "
        "responses live in this process's memory only",
    )
    run.add_argument(
        "--responses-max-events",
        type=_positive(int),
        default=DEFAULTS.responses_max_events,
        help="events a background response retains for replay; past it the response fails "
        "(response_events_overflow) and its engine request is aborted",
    )
    run.add_argument(
        "--max-background-responses",
        type=_positive(int),
        default=DEFAULTS.max_background_responses,
        help="background responses (background: true) generating at once; past it, 503",
    )
    run.add_argument(
        "--responses-store-mb",
        type=_positive(float),
        default=DEFAULTS.responses_store_bytes / 2**20,
        help="memory the response store may hold, in MiB; finished responses are dropped "
        "oldest first to stay under it",
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
        "before the listener closes (SIGINT, Ctrl-C at a terminal, skips it)",
    )
    run.add_argument(
        "--graceful-timeout",
        type=_non_negative,
        default=DEFAULTS.graceful_timeout,
        help="seconds from SIGTERM (or SIGINT) until requests still running are ended; it "
        f"includes --drain-delay. In Kubernetes: {GRACE_RULE} (docs/deployment.md)",
    )
    observe = run.add_argument_group("observability (docs/metrics.md)")
    observe.add_argument(
        "--no-access-log",
        dest="access_log",
        action="store_false",
        help="no line per request on the trioserve.access logger (on by default, at info)",
    )
    observe.add_argument(
        "--otlp-traces-endpoint",
        metavar="URL",
        default="",
        help="send OpenTelemetry traces of generation requests over OTLP/HTTP to URL, e.g. "
        "http://collector:4318 (/v1/traces is added to a URL without a path); needs "
        "pip install 'trioserve[tracing]'",
    )
    observe.add_argument(
        "--debug-endpoints",
        action="store_true",
        help="serve GET /debug/requests, the requests in flight and where each one is "
        "(behind the API key when keys are set)",
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
    curve = run.add_argument_group(
        "the engine link's security: CURVE, encrypted and authenticated (docs/security.md)"
    )
    curve.add_argument(
        "--engine-curve-server-key",
        metavar="FILE",
        help="speak CURVE to every --engine, which must hold the secret key of this public "
        "key (PREFIX.key from `trioserve keygen PREFIX`, or a bare Z85 key); needs "
        "--engine-curve-secret-key",
    )
    curve.add_argument(
        "--engine-curve-secret-key",
        metavar="FILE",
        help="this frontend's secret key (PREFIX.key_secret; its public key must be in the "
        "engines' --curve-authorized-keys)",
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
        "--vllm-cpus",
        type=_cpu_set,
        default="auto",
        metavar="CPUS",
        help="the CPUs the vLLM engine may run on: `auto` (every CPU but the last, when "
        "there are two or more: vLLM's CPU backend keeps busy on every CPU it may use and "
        "would starve the frontend, whose aborts then come late), `all`, or a list such as "
        "`0-2,4`",
    )
    vllm.add_argument(
        "--vllm-load-timeout",
        type=_positive(float),
        default=VLLM_LOAD_TIMEOUT,
        help="seconds to wait for the model to load before giving up",
    )
    mock = run.add_argument_group("built-in mock engine (only without --engine or --vllm)")
    mock.add_argument(
        "--mock-tokens-per-second",
        type=_positive(float),
        default=50.0,
        help="tokens the mock generates per second, per request",
    )
    mock.add_argument(
        "--mock-ttft-ms",
        type=_non_negative,
        default=20.0,
        help="the mock's time to first token, in milliseconds",
    )
    mock.add_argument("--mock-model", default="mock", help="the model name the mock serves")
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
        formatter_class=_HelpFormatter,
    )
    _log_level_option(client, argparse.SUPPRESS)
    client.add_argument("prompt", help="the prompt (a user message for chat)")
    client.add_argument(
        "--url",
        type=_server_url,
        default=f"http://127.0.0.1:{DEFAULTS.port}",
        help="the server, http(s)://HOST:PORT (HOST:PORT alone means http://)",
    )
    client.add_argument("--sse", action="store_true", help="use SSE instead of WebSocket")
    client.add_argument(
        "--completion", action="store_true", help="use the completions endpoint, not chat"
    )
    client.add_argument(
        "--max-tokens",
        type=_positive(int),
        default=None,
        help="the most tokens to generate (default: the engine's limit)",
    )
    client.add_argument("--model", default=None, help="model name (default: the server's first)")
    client.add_argument(
        "--api-key",
        metavar="KEY",
        help="send 'Authorization: Bearer KEY' (default: $TRIOSERVE_API_KEY)",
    )

    keygen = commands.add_parser(
        "keygen",
        help="write a CURVE key pair for the engine link: PREFIX.key and PREFIX.key_secret",
        description="Write a CURVE key pair: PREFIX.key (the public certificate, to give the "
        "other side) and PREFIX.key_secret (mode 0600, to keep), as zmq.auth writes them. "
        "Existing files are not overwritten. See docs/security.md.",
    )
    _log_level_option(keygen, argparse.SUPPRESS)
    keygen.add_argument("prefix", metavar="PREFIX", help="path and name, e.g. keys/frontend")

    engine = commands.add_parser(
        "engine", help="run an engine", description="Run an engine that frontends connect to."
    )
    _log_level_option(engine, argparse.SUPPRESS)
    kinds = engine.add_subparsers(
        dest="engine_kind",
        required=True,
        metavar="KIND",
        help="which engine; `trioserve engine KIND --help` for its options",
    )
    mock_engine = kinds.add_parser(
        "mock",
        help="the deterministic mock engine",
        description="Run the mock engine: deterministic text at a fixed token rate, with "
        "faults on demand per request (see docs/protocol.md).",
        formatter_class=_HelpFormatter,
    )
    _log_level_option(mock_engine, argparse.SUPPRESS)
    mock_engine.add_argument(
        "--bind", default="tcp://127.0.0.1:5555", help="ZeroMQ address to bind (ROUTER)"
    )
    mock_engine.add_argument("--model", default="mock", help="model name to serve")
    mock_engine.add_argument(
        "--tokens-per-second",
        type=_positive(float),
        default=50.0,
        help="tokens generated per second, per request",
    )
    mock_engine.add_argument(
        "--ttft-ms", type=_non_negative, default=20.0, help="time to first token, in milliseconds"
    )
    mock_engine.add_argument(
        "--frontend-timeout",
        type=_positive(float),
        default=5.0,
        help="seconds of frontend silence before its requests are aborted here",
    )
    mock_engine.add_argument("--log-aborts", action="store_true", help="log every abort received")
    mock_engine.add_argument(
        "--grace-period",
        type=_non_negative,
        default=30.0,
        metavar="SECONDS",
        help="on SIGTERM or SIGINT the engine drains: it tells its frontends, refuses new "
        "requests (they go to another engine), lets those it has finish for up to this "
        "long, ends the rest, and exits 0; a second signal ends the grace period",
    )
    mock_engine.add_argument(
        "--prefix-cache",
        type=int,
        default=0,
        metavar="BLOCKS",
        help="simulate a prefix cache of this many blocks of 16 prompt words: a prompt "
        "whose start was seen before gets its first token sooner and reports cached "
        "tokens (0: none)",
    )
    mock_engine.add_argument(
        "--allow-fault-injection",
        action="store_true",
        help="obey the mock_* params of requests (stalls, errors, timing); off, a request "
        "naming one gets a 400: any client could stall the engine for everyone",
    )
    mock_engine.add_argument(
        "--loop", choices=["trio", "asyncio"], default="trio", help="event loop to serve on"
    )
    add_curve_arguments(mock_engine)
    # Everything after `engine vllm` is the vLLM engine's: trioserve's own options and
    # vLLM's (see sdk/vllm_engine.py, whose parser is vLLM's own).
    vllm_engine = kinds.add_parser(
        "vllm",
        help="a vLLM engine (needs vllm installed): trioserve engine vllm MODEL --bind "
        "ADDRESS [vLLM's options]; `trioserve engine vllm --help` lists them",
        add_help=False,
        allow_abbrev=False,  # vLLM's options pass through: none may be taken for ours
    )
    _log_level_option(vllm_engine, argparse.SUPPRESS)
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
    """Run the command ``argv`` names; returns the exit status. A usage error (the command
    line is wrong) is one line and status 2; an environment error (something the command
    line names cannot be used) one line and status 1; a traceback only for a bug, or
    under ``--log-level debug``."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    command = _command_parser(parser, args)
    if extra and not (args.command == "engine" and args.engine_kind == "vllm"):
        command.error(f"unrecognized arguments: {' '.join(extra)}")
    logs.configure(args.log_level, args.log_format)
    try:
        if args.command == "run":
            return _run(args)
        if args.command == "keygen":
            return _keygen(args.prefix)
        if args.command == "client":
            return _client(args)
        if args.engine_kind == "vllm":
            return _engine_vllm(extra)
        return _engine_mock(args)
    except CommandError as exc:
        if args.log_level == "debug":
            log.debug("the error below, with its traceback", exc_info=exc)
        log.error("%s", exc)
        return exc.exit_status
    except KeyboardInterrupt:
        # Ctrl-C before the command took signals over (the server then drains instead).
        return INTERRUPTED


def _command_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> _Parser:
    """The parser of the (sub)command ``args`` holds, for its usage errors."""
    names = [args.command, getattr(args, "engine_kind", None)]
    for name in names:
        subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subparsers or name is None:
            break
        parser = subparsers[0].choices[name]
    assert isinstance(parser, _Parser)
    return parser


def _client(args: argparse.Namespace) -> int:
    from .terminal_client import run_client

    if args.sse and not args.url.startswith("http://"):
        raise CommandError(
            "--sse speaks plain http:// only: use an http:// --url, or leave --sse out "
            "(the WebSocket speaks https:// too)",
            USAGE_ERROR,
        )
    return trio.run(
        partial(
            run_client,
            args.url,
            args.prompt,
            sse=args.sse,
            endpoint="completion" if args.completion else "chat",
            max_tokens=args.max_tokens,
            model=args.model,
            api_key=args.api_key or os.environ.get("TRIOSERVE_API_KEY") or None,
        )
    )


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


def _check_tls_files(args: argparse.Namespace, settings: Settings) -> None:
    """Refuse TLS files that cannot be used: checked before serving (each server builds
    its own context from them)."""
    if not settings.ssl_certfile:
        return
    import ssl

    from .server import tls

    for option in ("ssl_certfile", "ssl_keyfile", "ssl_ca_certs"):
        path = getattr(args, option)
        try:
            if path:
                open(path, "rb").close()  # only: can it be read?
        except OSError as exc:
            raise CommandError(
                f"--{option.replace('_', '-')} {path}: {exc.strerror or exc}; give the path "
                "of a readable PEM file"
            ) from exc
    try:
        tls.server_context(settings)
    except (OSError, ssl.SSLError) as exc:
        raise CommandError(
            f"TLS: the certificate, key or CA file cannot be used: {exc}; give PEM files: "
            "a certificate (chain), its own private key, and CA certificates"
        ) from exc


def _run(args: argparse.Namespace) -> int:
    if args.cors_allow_credentials and "*" in args.cors_origin:
        raise CommandError(
            "--cors-allow-credentials needs explicit --cors-origin values, not '*': name "
            "the origins, or leave --cors-allow-credentials out",
            USAGE_ERROR,
        )
    from .http import auth

    try:
        auth.load_keys([], None, os.environ)  # the --api-key values are checked when parsed
    except ValueError as exc:
        raise CommandError(f"{exc}: set it to a valid key, or unset it", USAGE_ERROR) from exc
    try:
        api_keys = auth.load_keys(args.api_key, args.api_key_file, os.environ)
    except ValueError as exc:  # the key file
        raise CommandError(
            f"{exc}; --api-key-file takes a readable file of keys, one a line"
        ) from exc
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
        raise CommandError(tls_error, USAGE_ERROR)
    if args.otlp_traces_endpoint:
        try:
            import opentelemetry.exporter.otlp.proto.http.trace_exporter
            import opentelemetry.sdk.trace  # noqa: F401
        except ImportError as exc:
            raise CommandError(
                f"--otlp-traces-endpoint needs OpenTelemetry's SDK and OTLP exporter ({exc}): "
                "pip install 'trioserve[tracing]'"
            ) from None
    from .server.frontend import serve_frontend

    settings = Settings(
        host=args.host,
        port=args.port,
        engines=list(args.engine),
        routing=args.routing,
        affinity_load_factor=args.affinity_load_factor,
        engine_refresh=args.engine_refresh,
        engine_dns_server=args.engine_dns_server or "",
        request_timeout=args.request_timeout,
        max_request_timeout=args.max_request_timeout,
        stream_buffer=args.stream_buffer,
        max_body_bytes=int(args.max_body_mb * 2**20),
        max_body_memory_bytes=int(args.max_body_memory_mb * 2**20),
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
        responses_ttl=args.responses_ttl,
        responses_max_events=args.responses_max_events,
        max_background_responses=args.max_background_responses,
        responses_store_bytes=int(args.responses_store_mb * 2**20),
        ws_max_requests=args.ws_max_requests,
        ws_allow_any_origin=args.ws_allow_any_origin,
        playground=not args.no_playground,
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
        access_log=args.access_log,
        otlp_traces_endpoint=args.otlp_traces_endpoint,
        debug_endpoints=args.debug_endpoints,
        engine_curve_secret_key=args.engine_curve_secret_key or "",
        engine_curve_server_key=args.engine_curve_server_key or "",
    )
    _check_tls_files(args, settings)
    _check_upload_dir(args.upload_dir)
    if args.vllm and not args.engine:
        _check_vllm_installed()
    _check_can_listen(args.host, args.port)
    _check_engine_curve(settings)
    status = 0
    supervisor = None
    if args.workers > 1:
        from .server.workers import Supervisor, worker_command

        supervisor = Supervisor(
            settings,
            args.workers,
            worker_command("trioserve.cli:worker_main"),
            log_level=args.log_level,
            log_format=args.log_format,
        )
    # The frontend: this process, or its workers (started with the engine's address,
    # which is only known below when this process starts the engine).
    serve: Callable[..., Awaitable[None]] = (
        partial(serve_frontend, settings) if supervisor is None else supervisor.serve
    )

    async def main_task() -> None:
        if settings.engines:
            await serve()
            return
        with tempfile.TemporaryDirectory(prefix="trioserve-") as tmp:
            address = f"ipc://{Path(tmp) / 'engine.sock'}"
            settings.engines = [address]
            common = [sys.executable, "-m", "trioserve", "--log-level", args.log_level]
            common += ["--log-format", args.log_format]
            common_tail = ["--bind", address, "--exit-with-parent", str(os.getpid())]
            if args.vllm:
                child = ChildEngine(
                    f"the vLLM engine for {args.vllm}",
                    [*common, "engine", "vllm", args.vllm, *common_tail]
                    + shlex.split(args.vllm_args),
                    wait=args.vllm_load_timeout,
                    progress=True,
                    cpus=vllm_cpus(args.vllm_cpus),
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
            await child.serve(serve)
            nonlocal status
            status = child.status

    _tune_gc()
    try:
        trio.run(main_task)
    except* OSError as group:
        # A port taken after _check_can_listen let it go is still the operator's to fix:
        # one line, no traceback. Any other OSError is a bug worth its traceback.
        cannot_listen, others = group.split(lambda e: getattr(e, "errno", None) in LISTEN_ERRORS)
        if others is not None:
            raise others from None
        assert cannot_listen is not None
        [first, *_] = _leaves(cannot_listen)
        raise CommandError(_listen_error(args.host, args.port, first)) from cannot_listen
    if supervisor is not None:
        status = status or supervisor.status
    return status


def worker_main() -> int:
    """A worker of ``trioserve run --workers N``: the supervisor starts it and sends it
    what to serve on its stdin (``server/workers.py``); not for running by hand."""
    from .server import workers

    spec = workers.WorkerSpec.read(sys.stdin.buffer)
    logs.configure(spec.log_level, spec.log_format, worker=spec.index)
    _tune_gc()
    trio.run(workers.run_worker, spec)
    return 0


def _check_upload_dir(path: str) -> None:
    """An ``--upload-dir`` that cannot hold files fails now, not at the first upload (the
    server would make it then: it is made now instead)."""
    if not path:
        return
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
        if not os.access(path, os.W_OK | os.X_OK):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
    except OSError as exc:
        raise CommandError(
            f"--upload-dir {path}: {exc.strerror or exc}; give a directory this user may "
            "write to, or leave the option out (a private directory is then made)"
        ) from exc


def _check_can_listen(host: str, port: int) -> None:
    """Bind what the server will bind, and let it go: a port in use or a host that is not
    this machine's is then one line before anything starts (the server binds for real once
    its engine is ready)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise CommandError(
            f"cannot listen on {host}: {exc.strerror}; --host takes an address or name of "
            "this machine (127.0.0.1, or 0.0.0.0 for every interface)"
        ) from exc
    for family, kind, proto, _, address in infos:
        try:
            sock = socket.socket(family, kind, proto)
        except OSError as exc:
            if exc.errno == errno.EAFNOSUPPORT:  # no IPv6 here: the servers skip it too
                continue
            raise
        with sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers do
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(address)
            except OSError as exc:
                if exc.errno not in LISTEN_ERRORS:
                    raise
                raise CommandError(_listen_error(host, port, exc)) from exc


def _listen_error(host: str, port: int, exc: OSError) -> str:
    fix = {
        errno.EADDRINUSE: "another process listens there: stop it, or choose another --port",
        errno.EACCES: "ports below 1024 need privileges: choose --port 1024 or above",
        errno.EADDRNOTAVAIL: f"{host} is not an address of this machine: give --host one "
        "of its addresses (127.0.0.1, or 0.0.0.0 for every interface)",
    }.get(exc.errno or 0, "check --host and --port")
    return f"cannot listen on {host} port {port}: {exc.strerror}; {fix}"


def _check_engine_curve(settings: Settings) -> None:
    """The engine link's CURVE options, checked (the key files read) before serving."""
    if not (settings.engine_curve_secret_key or settings.engine_curve_server_key):
        return
    if not settings.engines:
        raise CommandError(
            "--engine-curve-* keys are for --engine addresses; the engine `trioserve run` "
            "starts itself is reached over a private socket",
            USAGE_ERROR,
        )
    from .server.frontend import engine_curve_keys

    try:
        keys = engine_curve_keys(settings)
    except ValueError as exc:
        raise CommandError(f"--engine-curve-*: {exc}", USAGE_ERROR) from exc
    assert keys is not None
    log.info("engine link: CURVE to %d engine(s)", len(settings.engines))


def _keygen(prefix: str) -> int:
    from .transport.keys import read_public_key, write_keypair, z85_encode

    try:
        public, secret = write_keypair(prefix)
    except OSError as exc:
        raise CommandError(
            f"trioserve keygen: {exc}; give a PREFIX in a writable directory whose files do "
            "not exist yet (keys are never overwritten)",
            USAGE_ERROR,
        ) from exc
    print(f"{public}: the public key {z85_encode(read_public_key(public))} (give it out)")
    print(f"{secret}: the secret key (mode 0600; keep it)")
    return 0


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

    def __init__(
        self,
        what: str,
        command: list[str],
        *,
        wait: float,
        progress: bool = False,
        cpus: set[int] | None = None,
    ):
        self.what = what
        self.command = command
        self.wait = wait
        self.progress = progress
        #: The CPUs the engine may run on (None: any).
        self.cpus = cpus
        self.status = 0

    async def serve(self, frontend_serve: Callable[..., Awaitable[None]]) -> None:
        """Start the engine, then ``frontend_serve(engine_wait=..., task_status=...)``
        (``serve_frontend``, or the supervisor of ``--workers``); stop the engine last."""
        # A session of its own: a Ctrl-C at the terminal reaches the frontend only,
        # which drains first and stops the engine last.
        cpus = self.cpus
        process = await trio.lowlevel.open_process(
            self.command,
            start_new_session=True,
            preexec_fn=None if cpus is None else partial(os.sched_setaffinity, 0, cpus),
        )
        where = "" if cpus is None else f" on CPUs {','.join(map(str, sorted(cpus)))}"
        log.info("started %s (pid %d)%s", self.what, process.pid, where)
        try:
            async with trio.open_nursery() as nursery:

                async def frontend(task_status: trio.TaskStatus[object]) -> None:
                    await frontend_serve(engine_wait=self.wait, task_status=task_status)
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
        raise CommandError(_no_vllm(str(exc))) from exc


def _check_vllm_installed() -> None:
    """``run --vllm`` starts its engine with this interpreter: without vllm, say so before
    anything starts rather than after the child has failed."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        raise CommandError(_no_vllm(f"{sys.executable} has no module named 'vllm'"))


def _no_vllm(reason: str) -> str:
    return (
        f"the vLLM engine needs vllm installed beside trioserve ({reason}): install it "
        "(docs/engines.md), or run this trioserve from vLLM's environment"
    )


# -- trioserve engine mock ---------------------------------------------------------------


def _engine_mock(args: argparse.Namespace) -> int:
    import zmq

    from .sdk import MockBackend, serve_engine, serve_engine_asyncio
    from .sdk.curve_options import curve_keys

    backend = MockBackend(
        model=args.model,
        tokens_per_second=args.tokens_per_second,
        ttft_ms=args.ttft_ms,
        allow_fault_injection=args.allow_fault_injection,
        prefix_cache=args.prefix_cache,
    )
    try:
        curve = curve_keys(args)
    except ValueError as exc:
        log.error("%s", exc)
        return 2
    options = {
        "frontend_timeout": args.frontend_timeout,
        "log_aborts": args.log_aborts,
        "curve": curve,
        # SIGTERM or SIGINT drains the engine; serving returns once the drain is over.
        "drain_on_signals": True,
        "grace_period": args.grace_period,
    }
    watch_parent = args.exit_with_parent is not None
    parent = args.exit_with_parent or os.getppid()
    bound = False  # until then, a ZeroMQ error is the --bind address's
    security = f"CURVE, {len(curve.authorized)} frontend key(s) authorized" if curve else "NULL"

    if args.loop == "trio":

        async def main_trio() -> None:
            nonlocal bound
            async with trio.open_nursery() as nursery:

                async def serve(task_status: trio.TaskStatus[object]) -> None:
                    await serve_engine(backend, args.bind, task_status=task_status, **options)
                    nursery.cancel_scope.cancel()  # drained

                await nursery.start(serve)
                bound = True
                log.info(
                    "mock engine serving model %r on %s (%s; %s)",
                    args.model,
                    args.bind,
                    args.loop,
                    security,
                )
                if watch_parent:
                    nursery.start_soon(_exit_with_parent_trio, parent, nursery.cancel_scope)

        try:
            trio.run(main_trio)
        except* zmq.ZMQError as group:
            [first, *_] = _leaves(group)
            if bound:
                raise
            raise CommandError(_bind_error(args.bind, first)) from first
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
            started: asyncio.Future[AsyncioEngine] = loop.create_future()

            def on_bound(_: object) -> None:
                nonlocal bound
                bound = True
                log.info(
                    "mock engine serving model %r on %s (%s; %s)",
                    args.model,
                    args.bind,
                    args.loop,
                    security,
                )

            started.add_done_callback(on_bound)
            try:
                await serve_engine_asyncio(backend, args.bind, started=started, **options)
            except asyncio.CancelledError:
                pass
            finally:
                if watcher is not None:
                    watcher.cancel()

        try:
            asyncio.run(main_asyncio())
        except zmq.ZMQError as exc:
            if bound:
                raise
            raise CommandError(_bind_error(args.bind, exc)) from exc
    log.info("mock engine stopped")
    return 0


def _bind_error(address: str, exc: zmq.ZMQError) -> str:
    fix = {
        errno.EADDRINUSE: "another process is bound there: stop it, or choose another port",
        errno.EACCES: "permission denied: ports below 1024 need privileges, and an ipc:// "
        "path a directory this user may write to",
        errno.ENOENT: "the ipc:// path's directory does not exist: create it, or choose "
        "another path",
        errno.EADDRNOTAVAIL: "the host is not an address of this machine: bind one of its "
        "addresses, or tcp://0.0.0.0:PORT for every interface",
        errno.ENODEV: "the host is not an address or interface of this machine: bind one of "
        "its addresses, or tcp://0.0.0.0:PORT for every interface",
    }.get(exc.errno or 0, "choose another --bind address, tcp://HOST:PORT or ipc://PATH")
    import zmq

    reason = zmq.strerror(exc.errno) if exc.errno else str(exc)
    return f"cannot bind the engine to {address}: {reason}; {fix}"


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
