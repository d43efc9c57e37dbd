"""``trioserve engine mock`` and ``trioserve engine vllm``: the engine programs' commands."""

from __future__ import annotations

import argparse
import asyncio
import errno
import logging
import os
import signal
from typing import TYPE_CHECKING

import trio

from ..errors import CommandError
from ..sdk.curve_options import add_curve_arguments
from .argument_types import non_negative, positive
from .parsers import HelpFormatter, Parser, log_level_option
from .preflight import leaves, no_vllm

if TYPE_CHECKING:
    import zmq

    from ..sdk.asyncio_shell import AsyncioEngine

log = logging.getLogger("trioserve")


def add_parser(commands: argparse._SubParsersAction[Parser]) -> None:
    engine = commands.add_parser(
        "engine", help="run an engine", description="Run an engine that frontends connect to."
    )
    log_level_option(engine, argparse.SUPPRESS)
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
        formatter_class=HelpFormatter,
    )
    log_level_option(mock_engine, argparse.SUPPRESS)
    mock_engine.add_argument(
        "--bind", default="tcp://127.0.0.1:5555", help="ZeroMQ address to bind (ROUTER)"
    )
    mock_engine.add_argument("--model", default="mock", help="model name to serve")
    mock_engine.add_argument(
        "--tokens-per-second",
        type=positive(float),
        default=50.0,
        help="tokens generated per second, per request",
    )
    mock_engine.add_argument(
        "--ttft-ms",
        type=non_negative(float),
        default=20.0,
        help="time to first token, in milliseconds",
    )
    mock_engine.add_argument(
        "--frontend-timeout",
        type=positive(float),
        default=5.0,
        help="seconds of frontend silence before its requests are aborted here",
    )
    mock_engine.add_argument("--log-aborts", action="store_true", help="log every abort received")
    mock_engine.add_argument(
        "--grace-period",
        type=non_negative(float),
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
        "--answer-tokens",
        type=int,
        default=0,
        metavar="N",
        help="end answers with finish_reason stop after N tokens (where max_tokens leaves "
        "room); 0: they run to max_tokens and end length",
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
    log_level_option(vllm_engine, argparse.SUPPRESS)
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


# -- trioserve engine vllm ---------------------------------------------------------------


def engine_vllm(argv: list[str]) -> int:
    try:
        from ..sdk import vllm_engine

        return vllm_engine.main(argv)
    except ImportError as exc:
        if exc.name is None or not exc.name.startswith("vllm"):
            raise
        raise CommandError(no_vllm(str(exc))) from exc


# -- trioserve engine mock ---------------------------------------------------------------


def engine_mock(args: argparse.Namespace) -> int:
    import zmq

    from ..sdk import MockBackend, serve_engine, serve_engine_asyncio
    from ..sdk.curve_options import curve_keys

    backend = MockBackend(
        model=args.model,
        tokens_per_second=args.tokens_per_second,
        ttft_ms=args.ttft_ms,
        allow_fault_injection=args.allow_fault_injection,
        prefix_cache=args.prefix_cache,
        answer_tokens=args.answer_tokens,
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
            [first, *_] = leaves(group)
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
