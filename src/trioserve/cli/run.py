"""``trioserve run``: its options (``Settings``, and :class:`RunOptions` for what only this
command knows), and serving them: the checks, then the frontend, with the engine it starts
as its child when no --engine is given.

To add an option to ``trioserve run``: add a field to ``config.Settings`` (the server reads
it) or to :class:`RunOptions` (only this command does), made with ``options.option``: its
flag, help, group (a key of :data:`GROUPS`) and unit. Nothing else is written. The mock
engine's options offered here (``--mock-*``) are fields of its ``MockOptions``, passed on to
it as they were given.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import shlex
import sys
import tempfile
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path

import attrs
import trio

from .. import logs
from ..config import Settings
from ..engine_programs.mock_program import MockOptions
from ..engine_programs.process import ProcessOptions
from ..enginecore.client import HEARTBEAT_TIMEOUT, LOAD_TIMEOUT
from ..errors import CommandError
from ..options import SECONDS, add_options, argv_of, from_args, option
from . import agent_flags, preflight
from .argument_types import BY_KIND, vllm_cpus
from .child_engine import MOCK_ENGINE_WAIT, ChildEngine
from .parsers import USAGE_ERROR, HelpFormatter, Parser, log_format_option, log_level_option

log = logging.getLogger("trioserve")

#: The groups of ``run --help``, in the order shown: a field's ``group`` names one.
GROUPS = {
    "serving": "listening and serving",
    "engines": "engines (docs/engines.md)",
    "requests": "generation requests: deadlines and bounds",
    "bodies": "request bodies and media",
    "access": "API keys and browsers (docs/security.md)",
    "websocket": "the WebSocket, /v1/ws (docs/websocket.md)",
    "responses": "the Responses API's store (docs/api.md)",
    "stopping": "stopping: SIGTERM and SIGINT (docs/deployment.md)",
    "observability": "observability (docs/metrics.md)",
    "tls": "TLS (both servers; hypercorn adds HTTP/2 over it)",
    "curve": "the engine link's security: CURVE, encrypted and authenticated (docs/security.md)",
    "agents": "tool calls and reasoning (docs/api.md)",
    "vllm": "a vLLM engine started as a child (needs vllm installed)",
    "mock": "built-in mock engine (only without --engine or --vllm)",
}
#: The mock engine's options that ``run`` offers (``MockOptions``' ``offered``) are
#: ``--mock-*``, for the mock it starts.
MOCK_PREFIX = "mock-"


@attrs.define
class RunOptions:
    """The options of ``trioserve run`` that are not the server's settings."""

    workers: int = option(
        1,
        group="serving",
        kind="positive",
        metavar="N",
        help="frontend processes sharing the port, each with its own engine connections; "
        "a supervisor forwards signals, restarts a worker that dies and serves /metrics "
        "summed over them (docs/deployment.md); the mock engine, or --vllm's EngineCore "
        "(each worker its client), is started once for all",
    )
    api_key_file: str = option(
        "",
        group="access",
        metavar="PATH",
        help="read API keys from PATH, one a line (blank lines and # comments ignored)",
    )
    vllm: str = option(
        "",
        group="vllm",
        metavar="MODEL",
        help="serve MODEL (a name or a path) with a vLLM engine started as a child "
        "process; the server listens once the model is loaded",
    )
    vllm_args: str = option(
        "",
        group="vllm",
        metavar="ARGS",
        help="more options for the vLLM engine, as `vllm serve` spells them, in one "
        "string, e.g. '--max-model-len 2048 --dtype bfloat16'",
    )
    vllm_path: str = option(
        "direct",
        group="vllm",
        choices=("direct", "shared", "asyncllm"),
        help="how this process speaks to vLLM: `direct` (its EngineCore's client, with the "
        "tokenizer, chat template and detokenizer here: no process in between), `shared` "
        "(through `trioserve engine vllm`, itself EngineCore's client with the same text "
        "pipeline) or `asyncllm` (through `trioserve engine vllm --backend asyncllm`, "
        "vLLM's AsyncLLM: for what the others do not serve yet, multimodal inputs, LoRA, "
        "non-HF tokenizers; docs/engines.md)",
    )
    vllm_attach: str = option(
        "",
        group="vllm",
        metavar="HOST:PORT",
        help="the direct path to an EngineCore started elsewhere, not as a child: bind "
        "its handshake on HOST:PORT (an address of this host the engine can reach; its "
        "sockets take free ports of HOST) for `vllm serve MODEL --headless "
        "--data-parallel-address HOST --data-parallel-rpc-port PORT`; MODEL (--vllm) is "
        "still read here for its tokenizer and chat template. An engine lost is waited "
        "for (/health 503 meanwhile), not a reason to stop (docs/engines.md)",
    )
    vllm_cpus: str = option(
        "auto",
        group="vllm",
        kind="cpu_set",
        metavar="CPUS",
        help="the CPUs the vLLM engine may run on: `auto` (every CPU but the last, when "
        "there are two or more: vLLM's CPU backend keeps busy on every CPU it may use and "
        "would starve the frontend, whose aborts then come late), `all`, or a list such as "
        "`0-2,4`",
    )
    # With a child engine (`shared`, `asyncllm`), the server listens anyway once this is
    # over, answering 503s until the engine is ready.
    vllm_load_timeout: float = option(
        LOAD_TIMEOUT,
        group="vllm",
        kind="positive",
        unit=SECONDS,
        help="seconds to wait for the model to load before giving up",
    )
    vllm_heartbeat_timeout: float = option(
        HEARTBEAT_TIMEOUT,
        group="vllm",
        kind="positive",
        unit=SECONDS,
        help="the direct path: seconds vLLM's EngineCore may leave a heartbeat unanswered "
        "before it is declared lost (its requests end with 503 engine_lost and the server "
        "stops); it answers between two engine steps, so raise it where one step can take "
        "longer (long prompts on slow CPUs). A killed engine is noticed at once regardless",
    )
    enable_auto_tool_choice: bool = option(
        False,
        group="agents",
        help='vLLM\'s switch for tool_choice "auto": accepted, and needs --tool-call-parser '
        "(which turns it on by itself)",
    )


def add_parser(commands: argparse._SubParsersAction[Parser]) -> None:
    run = commands.add_parser(
        "run",
        usage="%(prog)s [OPTION ...]",
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
        formatter_class=HelpFormatter,
    )
    log_level_option(run, argparse.SUPPRESS)
    log_format_option(run, argparse.SUPPRESS)
    groups = {name: run.add_argument_group(title) for name, title in GROUPS.items()}
    add_options(groups, Settings, types=BY_KIND)
    add_options(groups, RunOptions, types=BY_KIND)
    add_options(groups, MockOptions, types=BY_KIND, prefix=MOCK_PREFIX)


def run(args: argparse.Namespace) -> int:
    options = from_args(RunOptions, args)
    if args.cors_allow_credentials and "*" in args.cors_origin:
        raise CommandError(
            "--cors-allow-credentials needs explicit --cors-origin values, not '*': name "
            "the origins, or leave --cors-allow-credentials out",
            USAGE_ERROR,
        )
    from ..http import auth

    try:
        auth.load_keys([], None, os.environ)  # the --api-key values are checked when parsed
    except ValueError as exc:
        raise CommandError(f"{exc}: set it to a valid key, or unset it", USAGE_ERROR) from exc
    try:
        api_keys = auth.load_keys(args.api_key, options.api_key_file or None, os.environ)
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
    tls_error = preflight.tls_usage_error(args)
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
    from ..server.frontend import serve_frontend

    settings = from_args(
        Settings,
        args,
        api_keys=api_keys,
        api_key_labels=[
            *args.api_key_label,
            *auth.key_labels(api_keys, options.api_key_file or None)[len(args.api_key_label) :],
        ],
    )
    if settings.debug_endpoints:
        log.warning(
            "--debug-endpoints: GET /debug/requests shows every request in flight (its "
            "client's address, request id, model and engine; not its prompt) to %s",
            "any holder of an API key" if api_keys else "anyone who can reach this server",
        )
    # Before --vllm-args are split and read below.
    preflight.check_vllm_attach(
        options.vllm_attach, options.vllm, options.vllm_path, options.workers
    )
    preflight.check_vllm_options(
        options.vllm, options.vllm_args, settings.engines, attach=bool(options.vllm_attach)
    )
    try:
        flags = agent_flags.resolve(
            settings.tool_call_parser,
            settings.reasoning_parser,
            options.enable_auto_tool_choice,
            shlex.split(options.vllm_args) if options.vllm else None,
            settings.tool_strict_level,
        )
    except agent_flags.FlagError as exc:
        raise CommandError(str(exc), USAGE_ERROR) from None
    settings.tool_call_parser = flags.tool_call_parser
    settings.reasoning_parser = flags.reasoning_parser
    settings.tool_strict_level = flags.tool_strict_level
    preflight.check_tls_files(settings)
    preflight.check_upload_dir(settings.upload_dir)
    preflight.check_tokenizer(settings.tokenizer)
    direct = bool(options.vllm) and not settings.engines and options.vllm_path == "direct"
    preflight.check_can_listen(settings.host, settings.port)
    preflight.check_engine_curve(settings)
    status = 0
    supervisor = None
    if options.workers > 1:
        from ..server.workers import Supervisor, worker_command

        supervisor = Supervisor(
            settings,
            options.workers,
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
        nonlocal status
        if settings.engines:
            await serve()
            return
        if direct and options.vllm_attach:
            from .direct_vllm import serve_attached

            status = await serve_attached(
                options.vllm,
                flags.engine_args,
                handshake=options.vllm_attach,
                load_timeout=options.vllm_load_timeout,
                serve=serve,
                heartbeat_timeout=options.vllm_heartbeat_timeout,
            )
            return
        if direct:
            from .direct_vllm import serve_direct

            status = await serve_direct(
                options.vllm,
                flags.engine_args,
                cpus=vllm_cpus(options.vllm_cpus),
                load_timeout=options.vllm_load_timeout,
                serve=serve,
                workers=options.workers,
                heartbeat_timeout=options.vllm_heartbeat_timeout,
            )
            return
        with tempfile.TemporaryDirectory(prefix="trioserve-") as tmp:
            address = f"ipc://{Path(tmp) / 'engine.sock'}"
            settings.engines = [address]
            child = _child_engine(args, options, address, flags.engine_args)
            await child.serve(serve)
            status = child.status

    tune_gc()
    try:
        trio.run(main_task)
    except* CommandError as group:
        # Said from inside a nursery: the one line all the same.
        raise preflight.leaves(group)[0] from None
    except* OSError as group:
        # A port taken after check_can_listen let it go is still the operator's to fix:
        # one line, no traceback. Any other OSError is a bug worth its traceback.
        cannot_listen, others = group.split(
            lambda e: getattr(e, "errno", None) in preflight.LISTEN_ERRORS
        )
        if others is not None:
            raise others from None
        assert cannot_listen is not None
        [first, *_] = preflight.leaves(cannot_listen)
        raise CommandError(
            preflight.listen_error(settings.host, settings.port, first)
        ) from cannot_listen
    if supervisor is not None:
        status = status or supervisor.status
    return status


def _child_engine(
    args: argparse.Namespace, options: RunOptions, address: str, vllm_args: list[str]
) -> ChildEngine:
    """The engine this process starts, bound to ``address``: vLLM with --vllm (given
    ``vllm_args``), else the mock (with the --mock-* options in ``args``)."""
    common = [sys.executable, "-m", "trioserve", "--log-level", args.log_level]
    common += ["--log-format", args.log_format]
    process = argv_of(ProcessOptions(bind=address, exit_with_parent=os.getpid()))
    if options.vllm:
        backend = ["--backend", "asyncllm"] if options.vllm_path == "asyncllm" else []
        return ChildEngine(
            f"the vLLM engine for {options.vllm}",
            [*common, "engine", "vllm", options.vllm, *process, *backend, *vllm_args],
            wait=options.vllm_load_timeout,
            progress=True,
            cpus=vllm_cpus(options.vllm_cpus),
        )
    mock = from_args(MockOptions, args, prefix=MOCK_PREFIX)
    return ChildEngine(
        "the mock engine",
        [*common, "engine", "mock", *process, *argv_of(mock)],
        wait=MOCK_ENGINE_WAIT,
    )


def worker_main() -> int:
    """A worker of ``trioserve run --workers N``: the supervisor starts it and sends it
    what to serve on its stdin (``server/workers.py``); not for running by hand."""
    from ..server import workers

    spec = workers.WorkerSpec.read(sys.stdin.buffer)
    logs.configure(spec.log_level, spec.log_format, worker=spec.index)
    tune_gc()
    if spec.engine is not None:
        from .direct_vllm import run_direct_worker

        return trio.run(run_direct_worker, spec)
    trio.run(workers.run_worker, spec)
    return 0


#: The young generation is collected after this many new container objects (CPython's
#: default is 700).
GC_GEN0_THRESHOLD = 10_000


def tune_gc() -> None:
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
