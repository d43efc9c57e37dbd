"""``trioserve engine mock``: the mock engine as a process, on trio or asyncio."""

from __future__ import annotations

import argparse
import asyncio
import logging
from typing import TYPE_CHECKING, Any

import attrs
import trio

from ..errors import CommandError
from ..options import Offered, add_options, from_args, option
from .process import (
    TYPES,
    ProcessOptions,
    bind_error,
    cancel_on_signals,
    exit_with_parent_asyncio,
    exit_with_parent_trio,
    security,
)

if TYPE_CHECKING:
    from ..sdk import AsyncioEngine

log = logging.getLogger(__name__)


@attrs.define
class MockOptions:
    """The mock's own options (``ProcessOptions`` has those every engine takes); those
    ``offered`` are ``trioserve run``'s too, as ``--mock-*``, for the mock it starts."""

    tokens_per_second: float = option(
        50.0,
        group="mock",
        kind="positive",
        metavar="N",
        help="tokens generated per second, per request",
        offered=Offered("tokens the mock generates per second, per request"),
    )
    ttft_ms: float = option(
        20.0,
        group="mock",
        kind="non_negative",
        metavar="MS",
        help="time to first token, in milliseconds",
        offered=Offered("the mock's time to first token, in milliseconds"),
    )
    model: str = option(
        "mock",
        group="mock",
        kind="name",
        metavar="NAME",
        help="model name to serve",
        offered=Offered("the model name the mock serves"),
    )
    prefix_cache: int = option(
        0,
        group="mock",
        kind="non_negative",
        metavar="BLOCKS",
        help="simulate a prefix cache of this many blocks of 16 prompt words: a prompt "
        "whose start was seen before gets its first token sooner and reports cached "
        "tokens (0: none)",
    )
    answer_tokens: int = option(
        0,
        group="mock",
        kind="non_negative",
        metavar="N",
        help="end answers with finish_reason stop after N tokens (where max_tokens leaves "
        "room); 0: they run to max_tokens and end length",
        offered=Offered(
            "end the mock's answers with finish_reason stop after N tokens (where "
            "max_tokens leaves room), as a model's end of sequence; 0: they run to "
            "max_tokens and end length"
        ),
    )
    allow_fault_injection: bool = option(
        False,
        group="mock",
        help="obey the mock_* params of requests (stalls, errors, timing); off, a request "
        "naming one gets a 400: any client could stall the engine for everyone",
        offered=Offered(
            "let clients use the mock's fault-injection knobs (mock_stall_s, …): any client "
            "could then stall the engine for everyone; for tests and benchmarks",
            flag="--mock-fault-injection",
        ),
    )
    loop: str = option(
        "trio", group="mock", choices=("trio", "asyncio"), help="event loop to serve on"
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    groups = {
        "engine": parser.add_argument_group("the engine process"),
        "mock": parser.add_argument_group("the mock"),
        "curve": parser.add_argument_group("CURVE on the engine link (docs/security.md)"),
    }
    ProcessOptions.add_to(groups)
    add_options(groups, MockOptions, types=TYPES)


def main(args: argparse.Namespace) -> int:
    """Serve the mock engine the options in ``args`` describe until a signal has drained
    it or its parent is gone. Raises CommandError for a key or an address it cannot use."""
    import zmq

    from ..sdk import serve_engine, serve_engine_asyncio
    from .mock import MockBackend

    process = ProcessOptions.read(args)
    mock = from_args(MockOptions, args)
    backend = MockBackend(
        model=mock.model,
        tokens_per_second=mock.tokens_per_second,
        ttft_ms=mock.ttft_ms,
        allow_fault_injection=mock.allow_fault_injection,
        prefix_cache=mock.prefix_cache,
        answer_tokens=mock.answer_tokens,
    )
    curve = process.curve()
    options: dict[str, Any] = {
        "frontend_timeout": process.frontend_timeout,
        "log_aborts": process.log_aborts,
        "curve": curve,
        # SIGTERM or SIGINT drains the engine; serving returns once the drain is over.
        "drain_on_signals": True,
        "grace_period": process.grace_period,
    }
    parent = process.parent()
    bound = False  # until then, a ZeroMQ error is the --bind address's

    def serving() -> None:
        nonlocal bound
        bound = True
        log.info(
            "mock engine serving model %r on %s (%s; %s)",
            mock.model,
            process.bind,
            mock.loop,
            security(curve),
        )

    if mock.loop == "trio":

        async def main_trio() -> None:
            async with trio.open_nursery() as nursery:

                async def serve(task_status: trio.TaskStatus[object]) -> None:
                    await serve_engine(backend, process.bind, task_status=task_status, **options)
                    nursery.cancel_scope.cancel()  # drained

                await nursery.start(serve)
                serving()
                if parent is not None:
                    nursery.start_soon(exit_with_parent_trio, parent, nursery.cancel_scope)

        try:
            trio.run(main_trio)
        except* zmq.ZMQError as group:
            if bound:
                raise
            raise _first_bind_error(process.bind, group) from group
    else:

        async def main_asyncio() -> None:
            task = asyncio.current_task()
            assert task is not None
            cancel_on_signals(task)
            watcher = None
            if parent is not None:
                watcher = asyncio.get_running_loop().create_task(
                    exit_with_parent_asyncio(parent, task)
                )
            started: asyncio.Future[AsyncioEngine] = asyncio.get_running_loop().create_future()
            started.add_done_callback(lambda _: serving())
            try:
                await serve_engine_asyncio(backend, process.bind, started=started, **options)
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
            raise bind_error(process.bind, exc) from exc
    # The child of `trioserve run` (it watches its parent): its parent says it stopped.
    log.log(logging.DEBUG if parent else logging.INFO, "mock engine stopped")
    return 0


def _first_bind_error(address: str, group: BaseExceptionGroup) -> CommandError:
    import zmq

    first: BaseException = group
    while isinstance(first, BaseExceptionGroup):
        first = first.exceptions[0]
    assert isinstance(first, zmq.ZMQError)
    return bind_error(address, first)
