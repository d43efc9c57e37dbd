"""``trioserve run --vllm MODEL`` on the direct path (the default, ``--vllm-path direct``):
this process is the client of vLLM's EngineCore, which it starts headless as a child (the
process tree: this frontend, vLLM's launcher, EngineCore, its worker), with the model's
text pipeline in this process (docs/engines.md).

With ``--workers N`` this process is the supervisor and client 0 of the engine (the
handshake, a heartbeat, the engine's death); it starts the engine with N + 1 clients'
addresses, and worker *i* is client *i* + 1, opened on addresses the engine already has
with the ready response the supervisor received (:class:`WorkerEngine`): a restarted
worker binds them again and the engine re-joins it.

When the EngineCore dies, every request in flight ends at once with one ``engine_lost``
error (its link fails them), ``/health`` answers 503, and once the errors are written
(at most :data:`LOST_GRACE` seconds) the server stops with status 1.
"""

from __future__ import annotations

import argparse
import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import attrs
import trio

from ..enginecore import codec
from ..enginecore.client import HEARTBEAT_TIMEOUT, ClientAddresses, open_enginecore_client
from ..enginecore.server_options import (
    model_directory,
    refuse_unserved_options,
    vllm_server_options,
)
from ..errors import CommandError, EngineLostError, PeerProtocolError, ProtocolVersionError
from ..text.assets import ModelText, ModelTextError
from ..text.engine_options import engine_limits
from ..text.sampling import EngineLimits

if TYPE_CHECKING:
    from ..enginecore.client import EngineCoreClient
    from ..http import App
    from ..links.vllm import VllmLinks
    from ..server.workers import WorkerSpec

log = logging.getLogger("trioserve.cli")

#: Seconds the requests of a lost engine have to tell their clients why, before the server
#: stops.
LOST_GRACE = 5.0
#: Seconds a worker waits for the engine to connect to its addresses (it reconnects to
#: them every 0.1 s): past it, the worker exits and the supervisor restarts it.
WORKER_CONNECT_TIMEOUT = 20.0


@attrs.define
class WorkerEngine:
    """What each worker of ``--workers N`` is told of the EngineCore the supervisor
    started (:attr:`~trioserve.server.workers.WorkerSpec.engine`, as JSON)."""

    #: Every client's addresses, by client index (``[input, output]``); 0 is the
    #: supervisor's, worker *i*'s is *i* + 1.
    pairs: list[list[str]]
    #: The engine's ready response, msgpack as it came (hex): read with the codec's checks.
    ready: str
    model: str
    vllm_args: list[str]
    heartbeat_timeout: float = HEARTBEAT_TIMEOUT

    def client_index(self, worker: int) -> int:
        return worker + 1


def _limits(options: argparse.Namespace, ready: codec.EngineCoreReadyResponse) -> EngineLimits:
    return engine_limits(options, ready.max_model_len)


async def _load_text(model: str, options: argparse.Namespace) -> ModelText:
    directory = model_directory(model, options.tokenizer, otherwise="use --vllm-path asyncllm")
    try:
        return await trio.to_thread.run_sync(ModelText.load, directory)
    except ModelTextError as exc:
        raise CommandError(
            f"the direct vLLM path cannot read {directory}'s tokenizer ({exc}); "
            "use --vllm-path asyncllm"
        ) from None


class _Served:
    """One process's direct link to the engine, and the names it serves the model by."""

    def __init__(
        self, client: EngineCoreClient, text: ModelText, model: str, options: argparse.Namespace
    ) -> None:
        from ..links.vllm import VllmLinks, VllmText

        self.text = text
        self.limits = _limits(options, client.ready)
        self.names: list[str] = options.served_model_name or [model]
        self.links: VllmLinks = VllmLinks(client, VllmText(text, self.limits), self.names)
        self.address = f"vllm://{self.names[0]}"

    def attach(self, client: EngineCoreClient, options: argparse.Namespace) -> None:
        """Serve through ``client``, a new EngineCore in place of the lost one."""
        self.limits = _limits(options, client.ready)
        from ..links.vllm import VllmText

        self.links.attach(client, VllmText(self.text, self.limits))

    def register(self, app: App) -> None:
        """/tokenize and the render routes read the model's text from here."""
        for name in self.names:
            app.services.texts.register(name, self.text, self.limits)


def check_options(vllm_args: Sequence[str]) -> argparse.Namespace:
    """The server options this process reads; :class:`CommandError` (status 2) for one
    the direct path does not serve (``--vllm-path asyncllm`` does)."""
    refuse_unserved_options(vllm_args, "on the direct vLLM path", "use --vllm-path asyncllm")
    options = vllm_server_options(vllm_args)
    _check_tokenizer_mode(options)
    return options


def _check_tokenizer_mode(options: argparse.Namespace) -> None:
    if options.tokenizer_mode not in ("auto", "hf"):
        raise CommandError(
            f"--tokenizer-mode {options.tokenizer_mode} is not served on the direct vLLM "
            "path (its tokenizer is HF's tokenizer.json); use --vllm-path asyncllm",
            2,
        )


async def _serve_until_lost(
    client: EngineCoreClient, frontend: Callable[..., Awaitable[None]]
) -> int:
    """Run ``frontend(task_status=...)`` until it returns (drained: 0) or the engine is
    lost (1, after :data:`LOST_GRACE`). The frontend is shielded from the engine's loss
    (which cancels the body of the engine's context) so that its requests can tell their
    clients why."""
    status = 0
    with trio.CancelScope(shield=True):
        async with trio.open_nursery() as nursery:

            async def stop_when_lost() -> None:
                await client.lost.wait()
                nonlocal status
                status = 1
                await trio.sleep(LOST_GRACE)
                nursery.cancel_scope.cancel()

            async def run(task_status: trio.TaskStatus[Any]) -> None:
                await frontend(task_status=task_status)
                nursery.cancel_scope.cancel()

            nursery.start_soon(stop_when_lost)
            await nursery.start(run)
    return status


async def serve_direct(
    model: str,
    vllm_args: Sequence[str],
    *,
    cpus: set[int] | None,
    load_timeout: float,
    serve: Callable[..., Awaitable[None]],
    workers: int = 1,
    heartbeat_timeout: float = HEARTBEAT_TIMEOUT,
) -> int:
    """Start the EngineCore, serve the frontend over it until it drains or the engine
    dies; the exit status (1: the engine died). ``serve`` is ``serve_frontend`` (given
    ``links=``) with one worker, else the supervisor's ``serve`` (given ``engine=``, what
    each worker is told: :class:`WorkerEngine`)."""
    from ..enginecore.launcher import open_child_engine

    options = check_options(vllm_args)
    try:
        async with open_child_engine(
            model,
            vllm_args,
            cpus=cpus,
            load_timeout=load_timeout,
            clients=1 if workers == 1 else workers + 1,
            heartbeat_timeout=heartbeat_timeout,
        ) as child:
            client = child.client
            if workers > 1:
                # Read here once, so that what the workers cannot read (the model's text,
                # a --generation-config) is one line here, not N workers that fail to start.
                await _load_text(model, options)
                _limits(options, client.ready)
                engine = WorkerEngine(
                    [[pair.input, pair.output] for pair in child.pairs],
                    codec.encode_ready_response(client.ready).hex(),
                    model,
                    list(vllm_args),
                    heartbeat_timeout,
                )
                # (engine_wait: a worker's start includes the engine connecting to it.)
                frontend = partial(
                    serve, engine=attrs.asdict(engine), engine_wait=WORKER_CONNECT_TIMEOUT
                )
                return await _serve_until_lost(client, frontend)
            served = _Served(client, await _load_text(model, options), model, options)

            async def single(task_status: trio.TaskStatus[Any]) -> None:
                async with trio.open_nursery() as nursery:
                    app, _, _ = await nursery.start(
                        partial(serve, links=[(served.address, served.links)])
                    )
                    served.register(app)
                    task_status.started()

            return await _serve_until_lost(client, single)
    except EngineLostError as exc:
        log.error("%s; stopping", exc)
        return 1


async def serve_attached(
    model: str,
    vllm_args: Sequence[str],
    *,
    handshake: str,
    load_timeout: float,
    serve: Callable[..., Awaitable[None]],
    heartbeat_timeout: float = HEARTBEAT_TIMEOUT,
) -> int:
    """``--vllm-attach HOST:PORT``: serve an EngineCore started elsewhere (``vllm serve
    MODEL --headless --data-parallel-address HOST --data-parallel-rpc-port PORT``), binding
    its handshake on ``HOST:PORT`` and its client's sockets on free ports of ``HOST``. The
    frontend starts once the first engine is ready (within ``load_timeout``); when an
    engine is lost its requests end with ``engine_lost`` and ``/health`` answers 503, and
    the server waits for the next one to connect instead of stopping. Returns 0 once
    drained; an engine that does not come within ``load_timeout`` at the start is an error.
    """
    options = check_options(vllm_args)
    text = await _load_text(model, options)
    host = handshake.rsplit(":", 1)[0]
    pair = ClientAddresses(f"tcp://{host}:*", f"tcp://{host}:*")
    served: _Served | None = None
    async with trio.open_nursery() as nursery:

        async def frontend(task_status: trio.TaskStatus[None]) -> None:
            assert served is not None
            async with trio.open_nursery() as inner:
                app, _, _ = await inner.start(
                    partial(serve, links=[(served.address, served.links)])
                )
                served.register(app)
                task_status.started()
            nursery.cancel_scope.cancel()  # drained: stop waiting for engines

        while True:
            log.info("waiting for vLLM's EngineCore to connect to tcp://%s", handshake)
            try:
                async with open_enginecore_client(
                    [pair],
                    0,
                    handshake=f"tcp://{handshake}",
                    load_timeout=load_timeout if served is None else math.inf,
                    heartbeat_timeout=heartbeat_timeout,
                ) as client:
                    if served is None:
                        served = _Served(client, text, model, options)
                        await nursery.start(frontend)
                    else:
                        served.attach(client, options)
                    await trio.sleep_forever()  # cancelled when the engine is lost
            except EngineLostError as exc:
                log.error("%s; waiting for it to come back", exc)
            except (PeerProtocolError, ProtocolVersionError) as exc:
                if served is None:
                    raise CommandError(f"refused the EngineCore that connected: {exc}") from None
                log.error("refused the EngineCore that connected: %s", exc)
            except trio.TooSlowError:
                raise CommandError(
                    f"no vLLM EngineCore connected to tcp://{handshake} within "
                    f"{load_timeout:g} s (start it with `vllm serve {model} --headless "
                    f"--data-parallel-address {host} --data-parallel-rpc-port "
                    f"{handshake.rsplit(':', 1)[1]}`)"
                ) from None
    return 0


async def run_direct_worker(spec: WorkerSpec) -> int:
    """Worker ``spec.index`` of ``--workers N`` on the direct path: a client of the
    supervisor's EngineCore (``spec.engine``), serving until drained; its exit status (1:
    the engine was lost, or never connected)."""
    from ..server import workers

    assert spec.engine is not None
    engine = WorkerEngine(**spec.engine)
    options = vllm_server_options(engine.vllm_args)
    pairs = [ClientAddresses(*pair) for pair in engine.pairs]
    ready = codec.decode_ready_response(bytes.fromhex(engine.ready))
    index = engine.client_index(spec.index)
    text = await _load_text(engine.model, options)
    try:
        async with open_enginecore_client(
            pairs,
            index,
            known=ready,
            load_timeout=WORKER_CONNECT_TIMEOUT,
            heartbeat_timeout=engine.heartbeat_timeout,
        ) as client:
            served = _Served(client, text, engine.model, options)
            frontend = partial(
                workers.run_worker,
                spec,
                links=[(served.address, served.links)],
                on_app=served.register,
            )
            return await _serve_until_lost(client, frontend)
    except EngineLostError as exc:
        log.error("%s; stopping worker %d", exc, spec.index)
    except trio.TooSlowError:
        log.error(
            "vLLM's EngineCore did not connect to worker %d's sockets (client %d) within "
            "%g s; stopping it",
            spec.index,
            index,
            WORKER_CONNECT_TIMEOUT,
        )
    return 1


__all__ = ["WorkerEngine", "run_direct_worker", "serve_attached", "serve_direct"]
