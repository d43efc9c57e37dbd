"""vLLM's EngineCore started headless as a child, and a client of it.

The process tree is the frontend → vLLM's launcher (``vllm serve MODEL --headless``, run by
:mod:`~trioserve.enginecore.vllm_serve`) → EngineCore → its worker. The frontend binds the
handshake socket on a free loopback port and every client's sockets in a private directory,
starts the launcher with that port, and does the handshake
(:func:`~trioserve.enginecore.client.open_enginecore_client`).

- A usage error (an option vLLM refuses, a model directory that does not exist) is the one
  line the child wrote and exit status 2, as :class:`~trioserve.errors.CommandError`.
- The model must be loaded within ``load_timeout`` seconds; an engine that exits meanwhile
  is said with its exit code (vLLM's own log says why).
- Stopping is bounded: SIGTERM to the whole tree (vLLM's launcher shuts EngineCore down),
  then after ``stop_timeout`` seconds SIGKILL to what is left of it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import tempfile
from collections.abc import AsyncIterator, Mapping, Sequence
from functools import partial
from pathlib import Path

import attrs
import trio

from ..errors import CommandError, EngineLostError, ProtocolVersionError
from . import codec, vllm_serve
from .client import (
    HEARTBEAT_INTERVAL,
    HEARTBEAT_TIMEOUT,
    LOAD_TIMEOUT,
    ClientAddresses,
    EngineCoreClient,
    open_enginecore_client,
)

log = logging.getLogger(__name__)

#: Seconds the tree has to stop after SIGTERM before it is killed (vLLM's launcher stops
#: EngineCore first, which may finish a step).
STOP_TIMEOUT = 10.0


@attrs.define
class ChildEngine:
    """A running child engine: its launcher's process, every client's addresses (index 0 is
    this process's :attr:`client`), and the engine's ready response."""

    process: trio.Process
    pairs: list[ClientAddresses]
    client: EngineCoreClient

    @property
    def ready(self) -> codec.EngineCoreReadyResponse:
        return self.client.ready


def engine_command(
    python: str, model: str, handshake_port: int, vllm_args: Sequence[str]
) -> list[str]:
    """The command that starts vLLM's launcher, headless, for one engine on this host."""
    return [
        python,
        "-m",
        vllm_serve.__name__,
        model,
        *vllm_args,
        "--headless",
        "--data-parallel-address",
        "127.0.0.1",
        "--data-parallel-rpc-port",
        str(handshake_port),
        "--data-parallel-size-local",
        "1",
    ]


@contextlib.asynccontextmanager
async def open_child_engine(
    model: str,
    vllm_args: Sequence[str] = (),
    *,
    python: str = sys.executable,
    cpus: set[int] | None = None,
    clients: int = 1,
    env: Mapping[str, str] | None = None,
    load_timeout: float = LOAD_TIMEOUT,
    stop_timeout: float = STOP_TIMEOUT,
    heartbeat_interval: float = HEARTBEAT_INTERVAL,
    heartbeat_timeout: float = HEARTBEAT_TIMEOUT,
) -> AsyncIterator[ChildEngine]:
    """Start vLLM's EngineCore for ``model`` (``vllm_args``: vLLM's engine options, as
    ``vllm serve`` spells them) on ``cpus`` (None: any), and yield it once the model is
    loaded, with client 0 connected. ``clients``: how many clients the engine serves (the
    others open theirs with ``pairs`` and ``client_index`` 1, 2, …: see
    :func:`~trioserve.enginecore.client.open_enginecore_client`).

    Raises :class:`CommandError` (exit status 2) for a usage error of the engine's options,
    and (status 1) for an engine of a vLLM release the codec does not speak or one not ready
    within ``load_timeout``, each said in one line; :class:`EngineLostError` if the engine
    exits or is lost (before it is ready, or while the body runs: the body is cancelled).
    The tree is stopped on exit, within ``stop_timeout`` seconds and then killed."""
    with tempfile.TemporaryDirectory(prefix="trioserve-enginecore-") as directory:
        pairs = [ClientAddresses.ipc(directory, index) for index in range(clients)]
        error_file = Path(directory) / "usage-error"
        bound = trio.Event()
        handshake_at: list[str] = []
        ended: list[BaseException] = []
        engine: ChildEngine | None = None

        def on_bound(address: str) -> None:
            handshake_at.append(address)
            bound.set()

        async with trio.open_nursery() as nursery:

            async def run_engine() -> None:
                await bound.wait()
                port = int(handshake_at[0].rsplit(":", 1)[1])
                command = engine_command(python, model, port, vllm_args)
                process = await trio.lowlevel.open_process(
                    command,
                    start_new_session=True,  # its own group: stopped as a whole
                    env={**(env or os.environ), vllm_serve.ERROR_FILE_ENV: str(error_file)},
                    preexec_fn=None if cpus is None else partial(os.sched_setaffinity, 0, cpus),
                )
                processes.append(process)
                where = "" if cpus is None else f" on CPUs {','.join(map(str, sorted(cpus)))}"
                log.info("started vLLM's EngineCore for %s (pid %d)%s", model, process.pid, where)
                try:
                    code = await process.wait()
                finally:
                    with trio.CancelScope(shield=True):
                        await _stop(process, stop_timeout)
                error = _exit_error(code, error_file, ready=engine is not None)
                ended.append(error)
                if engine is not None:
                    engine.client.lose(str(error))  # its requests end now, with this reason
                nursery.cancel_scope.cancel()

            processes: list[trio.Process] = []
            nursery.start_soon(run_engine)
            try:
                async with open_enginecore_client(
                    pairs,
                    0,
                    handshake="tcp://127.0.0.1:*",
                    on_handshake_bound=on_bound,
                    load_timeout=load_timeout,
                    heartbeat_interval=heartbeat_interval,
                    heartbeat_timeout=heartbeat_timeout,
                ) as client:
                    engine = ChildEngine(processes[0], pairs, client)
                    yield engine
            except EngineLostError as exc:
                ended.append(exc)
            except ProtocolVersionError as exc:
                ended.append(CommandError(f"refused vLLM's EngineCore: {exc}"))
            except trio.TooSlowError:
                if engine is not None:
                    raise  # the body's own
                ended.append(
                    CommandError(
                        f"vLLM's EngineCore was not ready within {load_timeout:g} s (the load "
                        "timeout; its log above says how far it got)"
                    )
                )
            finally:
                # Only once the client has closed (and said why, if the engine was lost):
                # cancelling earlier would cut its exit short.
                nursery.cancel_scope.cancel()
        if ended:
            raise ended[0]


def _exit_error(code: int, error_file: Path, *, ready: bool) -> BaseException:
    if code == vllm_serve.USAGE_ERROR and error_file.exists():
        line = error_file.read_text(encoding="utf-8").strip()
        return CommandError(line or "vLLM refused its options", exit_status=2)
    when = "while it served" if ready else "while it loaded the model (its log says why)"
    return EngineLostError(f"vLLM's EngineCore exited with code {code} {when}")


async def _stop(process: trio.Process, timeout: float) -> None:
    """Stop the launcher's whole process group: SIGTERM, then SIGKILL after ``timeout``."""
    _signal_group(process, signal.SIGTERM)
    with trio.move_on_after(timeout):
        await process.wait()
    if process.returncode is None:
        log.warning("vLLM's EngineCore did not stop in %g s; killing it", timeout)
    # Whatever of the group is left (EngineCore, its worker) goes too, even when the
    # launcher itself did exit.
    _signal_group(process, signal.SIGKILL)
    await process.wait()


def _signal_group(process: trio.Process, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signum)
