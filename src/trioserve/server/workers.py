"""Several frontend processes behind one port: ``trioserve run --workers N``.

One process serves one core's worth of requests. With ``--workers N`` the ``trioserve
run`` process becomes a supervisor (:class:`Supervisor`) that binds the port and starts N
worker processes. Each worker is a whole frontend
(:func:`~trioserve.server.frontend.serve_frontend`: its own engine links, admission,
readiness and drain) accepting on a listening socket of its own, all of them in one
SO_REUSEPORT group: the kernel spreads new connections over the workers by a hash of
each connection's addresses.

Why a socket per worker rather than one socket they all accept from: with one shared
socket, whichever worker is awake takes every connection that arrives meanwhile, so a
burst of connections (a proxy opening its keep-alive pool, a load generator) lands on one
worker: 32 connections opened at once went 32 to 0 in a test. The hash spreads them
evenly, whatever each worker is doing. What that costs, and how it is bounded:

- a worker that dies leaves its socket to the supervisor, which holds every worker's
  socket and hands it to the replacement: connections hashed to it wait (about a second)
  instead of being reset;
- SO_REUSEPORT would let another process of the same user bind the port beside us and
  take a share of the connections (a second ``trioserve run`` started by mistake, say): so
  the supervisor first binds the address without SO_REUSEPORT, which fails with "address
  in use" if anything listens there, and holds that socket (never listening) until the
  group is bound.

What the supervisor does:

- sends each worker its settings as JSON on its stdin (API keys never on a command line)
  and keeps that pipe open: a worker whose supervisor is gone reads EOF and drains itself;
- learns that a worker is ready from a line on the worker's stdout, and says
  ``Running on`` once every worker is;
- on SIGTERM or SIGINT: closes its own copies of the sockets (the port closes once every
  worker has closed its own, after the drain delay, as a single process's does), sends
  the same signal to every worker (each drains as a single process does: SIGINT without
  the drain delay), and forwards a second signal too (each skips to the end); it exits 0
  once every worker has exited 0, and kills a worker still running past the drain's own
  bound;
- restarts a worker that exits while no drain is under way, after a delay that doubles
  with each of that worker's exits within :data:`RESTART_WINDOW` seconds (from
  :data:`RESTART_DELAY` up to :data:`MAX_RESTART_DELAY`), and goes on serving with the
  workers that are up meanwhile: one worker that keeps crashing (a request that kills
  it, a bad core) costs its share of the capacity, not the service. From its second
  quick exit on, the worker's sockets are closed while it waits, so that the kernel
  spreads new connections over the others instead of queueing them for a worker that
  is not there; its replacement gets new ones in the group. The supervisor gives up
  (drains what is left and exits 1, for the orchestrator to see) only when no worker is
  up and every one has exited more than :data:`RESTART_LIMIT` times in the window;
- writes how many workers are up (``workers.json`` in the metrics directory), which
  each worker's ``/health`` reports;
- makes the directory where workers keep their metrics (prometheus-client's multiprocess
  mode, ``metrics.aggregate_workers``), tells it when a worker is gone (its gauges leave
  the figures; its counts stay in the sums), and removes it at the end.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from functools import partial
from typing import IO, Any

import attrs
import trio

from .. import metrics
from ..config import Settings
from ..engine import LinkFactory
from ..http import App
from . import tls
from .frontend import hard_stop_after, serve_frontend
from .http1.serve import host_port

log = logging.getLogger("trioserve.workers")

#: Seconds a worker has to say it is ready, beyond the wait for the engine's handshake.
WORKER_START_TIMEOUT = 30.0
#: A worker that exited more than this many times ...
RESTART_LIMIT = 5
#: ... within this many seconds is crash-looping; when every worker is, and none is up,
#: the supervisor gives up (status 1).
RESTART_WINDOW = 60.0
#: Seconds between a worker's first exit and its replacement (a worker that dies at once
#: does not spin); doubled for each further exit within the window ...
RESTART_DELAY = 0.5
#: ... up to this.
MAX_RESTART_DELAY = 30.0
#: The file in the metrics directory that says how many workers are up.
WORKERS_FILE = "workers.json"
#: Seconds between a worker's writes of what the others cannot read in its memory (its
#: in-flight count, its histograms) for the figures /metrics sums.
SAMPLE_INTERVAL = 0.5
#: Seconds, past a worker's own hard stop, before the supervisor kills it during a drain.
STOP_MARGIN = 5.0
#: Seconds a worker has to exit once told to stop at once (the supervisor is cancelled),
#: before it is killed.
KILL_AFTER = 5.0
#: What a worker writes on its stdout once it accepts connections.
READY_LINE = b"ready\n"
#: listen(2) backlog of each worker's socket (the kernel caps it at net.core.somaxconn),
#: as trio's own listeners ask for.
BACKLOG = 0xFFFF


@attrs.define
class WorkerSpec:
    """What a worker is told on its stdin: who it is and what to serve."""

    index: int
    settings: Settings
    #: The listening sockets it inherited (file descriptor numbers).
    listen_fds: list[int]
    #: Seconds to wait for the engines' handshake before accepting (``serve_frontend``).
    engine_wait: float
    #: Where its metrics live (it was started with PROMETHEUS_MULTIPROC_DIR set to it).
    metrics_dir: str
    log_level: str = "info"
    #: ``text`` or ``json`` (``logs.configure``).
    log_format: str = "text"
    #: What the command that started the supervisor set up for its workers beside
    #: ``settings`` (JSON, read by that command's worker entry point: the direct vLLM
    #: path's EngineCore, ``cli/direct_vllm.py``); None for engines of ``settings``.
    engine: dict[str, Any] | None = None

    def to_json(self) -> bytes:
        return json.dumps(attrs.asdict(self)).encode() + b"\n"

    @classmethod
    def read(cls, stream: IO[bytes]) -> WorkerSpec:
        """The spec, from the first line of ``stream`` (the worker's stdin)."""
        data: dict[str, Any] = json.loads(stream.readline())
        data["settings"] = Settings(**data["settings"])
        return cls(**data)


# -- in the worker --------------------------------------------------------------------------


async def run_worker(
    spec: WorkerSpec,
    *,
    links: Sequence[tuple[str, LinkFactory]] = (),
    on_app: Callable[[App], None] | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve as worker ``spec.index`` until drained (SIGTERM from the supervisor, or the
    supervisor gone: EOF on stdin). Reports readiness on stdout (:data:`READY_LINE`), after
    ``on_app`` has seen the application. ``links``: as ``serve_frontend``'s (engine links
    the caller made, e.g. to the supervisor's EngineCore)."""
    metrics.aggregate_workers(spec.metrics_dir)
    async with trio.open_nursery() as nursery:

        async def frontend(task_status: trio.TaskStatus[object]) -> None:
            await serve_frontend(
                spec.settings,
                engine_wait=spec.engine_wait,
                listen_fds=spec.listen_fds,
                links=links,
                task_status=task_status,
            )
            nursery.cancel_scope.cancel()

        nursery.start_soon(_sample)
        nursery.start_soon(_drain_when_orphaned)
        app, _, _ = await nursery.start(frontend)
        app.services.workers = partial(read_workers_up, spec.metrics_dir)
        if on_app is not None:
            on_app(app)
        _report_ready()
        task_status.started()
        log.info("worker %d (pid %d) accepting", spec.index, os.getpid())


def read_workers_up(metrics_dir: str) -> dict[str, int] | None:
    """How many workers are up, of how many, as the supervisor last wrote it (None if it
    cannot be read)."""
    try:
        with open(os.path.join(metrics_dir, WORKERS_FILE)) as file:
            data = json.load(file)
        return {"up": int(data["up"]), "count": int(data["count"])}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _report_ready() -> None:
    os.write(1, READY_LINE)
    # Anything printed from here on goes to stderr, beside the logs; the supervisor reads
    # EOF and stops reading.
    os.dup2(2, 1)


async def _sample() -> None:
    while True:
        metrics.sample_worker()
        await trio.sleep(SAMPLE_INTERVAL)


async def _drain_when_orphaned() -> None:
    """The supervisor holds our stdin open while it lives: EOF means it is gone (killed),
    and then nobody would forward a signal. Drain as if it had sent SIGTERM."""
    stream = trio.lowlevel.FdStream(os.dup(0))
    async with stream:
        while await stream.receive_some(4096):
            pass
    log.warning("the supervisor is gone; draining")
    os.kill(os.getpid(), signal.SIGTERM)


# -- the supervisor -------------------------------------------------------------------------


class _StartFailed(Exception):
    pass


class Supervisor:
    """Serves ``settings`` with ``count`` worker processes, each started as ``command``
    (a Python that runs :func:`run_worker` on the spec it reads from stdin: the CLI's
    ``worker_main``). After :meth:`serve`, ``status`` is the exit status: 0 when every
    worker drained and exited 0, 1 otherwise."""

    def __init__(
        self,
        settings: Settings,
        count: int,
        command: list[str],
        *,
        log_level: str = "info",
        log_format: str = "text",
    ) -> None:
        self.settings = settings
        self.count = count
        self.command = command
        self.log_level = log_level
        self.log_format = log_format
        self.status = 0
        self.draining = False
        #: The live workers, by index.
        self.workers: dict[int, trio.Process] = {}
        #: Each worker's listening sockets (one per address), by index: held here too, so
        #: that a worker's replacement inherits what was queued for it.
        self._sockets: list[list[socket.socket]] = []
        self._metrics_dir = ""
        self._engine_wait = 0.0
        self._engine: dict[str, Any] | None = None
        #: When each worker exited unexpectedly, within the window, by index.
        self._exits: dict[int, collections.deque[float]] = {}
        #: Workers that said they are ready and have not exited.
        self.up: set[int] = set()
        #: Each listening socket's address, to bind a worker's sockets again.
        self._addresses: list[tuple[int, int, int, Any]] = []
        self._nursery: trio.Nursery | None = None

    async def serve(
        self,
        *,
        engine_wait: float = 0.0,
        engine: dict[str, Any] | None = None,
        handle_signals: bool = True,
        task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Bind, start the workers, and supervise them until they have drained.
        ``task_status`` gets the URLs once every worker is ready. ``engine``: what each
        worker is told of an engine the caller set up (:attr:`WorkerSpec.engine`). Raises
        OSError if the address cannot be bound (as a single process does). Cancelled, it
        stops the workers at once (bounded: :data:`KILL_AFTER`)."""
        self._engine_wait = engine_wait
        self._engine = engine
        self._sockets = await bind_group(self.settings.host, self.settings.port, self.count)
        self._addresses = [
            (sock.family, sock.type, sock.proto, sock.getsockname()) for sock in self._sockets[0]
        ]
        scheme = "https" if tls.enabled(self.settings) else "http"
        urls = [f"{scheme}://{host_port(sock.getsockname())}" for sock in self._sockets[0]]
        self._metrics_dir = tempfile.mkdtemp(prefix="trioserve-metrics-")
        self._write_up()
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                if handle_signals:
                    nursery.start_soon(self._forward_signals)
                try:
                    async with trio.open_nursery() as slots:
                        async with trio.open_nursery() as starting:
                            for index in range(self.count):
                                starting.start_soon(slots.start, self._slot, index)
                        for url in urls if not self.draining else []:
                            log.info(
                                "Running on %s with %d workers (CTRL + C to quit)", url, self.count
                            )
                        task_status.started(urls)
                except* _StartFailed:
                    self.status = 1
                # Every worker is gone: stop forwarding signals and bounding the drain.
                nursery.cancel_scope.cancel()
        finally:
            self._close_listeners()
            shutil.rmtree(self._metrics_dir, ignore_errors=True)

    def drain(self, signum: int = signal.SIGTERM) -> None:
        """What a signal does, forwarded to every worker: the first starts their drain (a
        SIGINT without the drain delay, as in a single process), a later one makes them
        skip to its end."""
        if not self.draining:
            self.draining = True
            # The port closes once every worker has closed its own too (after the drain
            # delay, as a single process closes its one), and no worker is restarted.
            self._close_listeners()
            if self._nursery is not None:
                self._nursery.start_soon(self._bound_the_drain)
            log.info("draining %d worker(s) (signal again to stop now)", len(self.workers))
        else:
            log.warning("second signal: the workers end what is left now")
        for process in list(self.workers.values()):
            _send(process, signum)

    async def _forward_signals(self) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as receiver:
            async for signum in receiver:
                self.drain(signum)

    async def _bound_the_drain(self) -> None:
        """Kill what still runs once every worker should have stopped by itself."""
        settings = self.settings
        await trio.sleep(settings.drain_delay + hard_stop_after(settings) + STOP_MARGIN)
        for index, process in list(self.workers.items()):
            log.error("worker %d (pid %d) is still running; killing it", index, process.pid)
            _send(process, signal.SIGKILL)
            self.status = 1

    async def _slot(self, index: int, task_status: trio.TaskStatus[None]) -> None:
        """Worker ``index``: started, and started again each time it exits unexpectedly."""
        started = False
        while not self.draining:
            if not self._sockets[index] and not self._bind_again(index):
                await trio.sleep(MAX_RESTART_DELAY)
                continue
            process = await self._spawn(index)
            try:
                ready = await self._send_spec(index, process) and await self._wait_ready(process)
                if not started:
                    if not ready and not self.draining:
                        log.error("worker %d did not start; stopping", index)
                        raise _StartFailed
                    # (Not ready, but a signal came first: the drain goes on without it.)
                    started = True
                    task_status.started()
                if ready:
                    self.up.add(index)
                    self._write_up()
                code = await process.wait()
            finally:
                with trio.CancelScope(shield=True):
                    await self._stop(process)
                    del self.workers[index]
                    if index in self.up:
                        self.up.discard(index)
                        self._write_up()
                    for pipe in (process.stdin, process.stdout):
                        if pipe is not None:
                            await pipe.aclose()
                    metrics.forget_worker(self._metrics_dir, process.pid)
            if self.draining:
                # (Killed by the signal itself: it came before the worker could drain.)
                if code in (0, -signal.SIGTERM, -signal.SIGINT):
                    log.info("worker %d (pid %d) stopped", index, process.pid)
                else:
                    log.error("worker %d (pid %d) exited with %s", index, process.pid, code)
                    self.status = 1
                return
            delay = self._restart_delay(index, process.pid, code)
            if delay is None:
                self.status = 1
                self.drain()
                return
            if delay > RESTART_DELAY and self.up:
                # It keeps dying: let the others take its connections while it waits.
                self._close_sockets(index)
            await trio.sleep(delay)

    async def _spawn(self, index: int) -> trio.Process:
        process = await trio.lowlevel.open_process(
            self.command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            pass_fds=[sock.fileno() for sock in self._sockets[index]],
            env={**os.environ, "PROMETHEUS_MULTIPROC_DIR": self._metrics_dir},
            # Its own session: a Ctrl-C at the terminal reaches the supervisor only, which
            # forwards it once (a worker that got it twice would skip its drain).
            start_new_session=True,
        )
        self.workers[index] = process
        log.info("started worker %d (pid %d)", index, process.pid)
        return process

    async def _send_spec(self, index: int, process: trio.Process) -> bool:
        """False if the worker is already gone (it died before reading: a broken install)."""
        spec = WorkerSpec(
            index=index,
            settings=self.settings,
            listen_fds=[sock.fileno() for sock in self._sockets[index]],
            engine_wait=self._engine_wait,
            metrics_dir=self._metrics_dir,
            log_level=self.log_level,
            log_format=self.log_format,
            engine=self._engine,
        )
        assert process.stdin is not None
        # It stays open while the worker runs: EOF tells the worker we are gone.
        try:
            await process.stdin.send_all(spec.to_json())
        except trio.BrokenResourceError:
            return False
        return True

    async def _wait_ready(self, process: trio.Process) -> bool:
        """Until the worker says it accepts (True), exits or takes too long (False)."""
        assert process.stdout is not None
        seen = b""
        with trio.move_on_after(self._engine_wait + WORKER_START_TIMEOUT):
            while READY_LINE not in seen:
                chunk = await process.stdout.receive_some(4096)
                if not chunk:
                    return False
                seen += chunk
            return True
        log.error("worker (pid %d) not ready after %g s", process.pid, WORKER_START_TIMEOUT)
        _send(process, signal.SIGKILL)
        return False

    def _restart_delay(self, index: int, pid: int, code: int | None) -> float | None:
        """Seconds to wait before worker ``index`` (pid ``pid``, gone with ``code``) is
        started again, or None when the supervisor gives up: no worker is up and every
        one is crash-looping."""
        now = trio.current_time()
        exits = self._exits.setdefault(index, collections.deque())
        while exits and exits[0] <= now - RESTART_WINDOW:
            exits.popleft()
        exits.append(now)
        if code is not None and code < 0:
            how = f"was killed by {_signal_name(-code)}"
        else:
            how = f"exited with {code}"
        if not self.up and all(self._crash_looping(i, now) for i in range(self.count)):
            log.error(
                "worker %d (pid %d) %s; no worker is up and every one exited more than %d "
                "times in %g s: giving up, stopping",
                index,
                pid,
                how,
                RESTART_LIMIT,
                RESTART_WINDOW,
            )
            return None
        delay = min(RESTART_DELAY * 2.0 ** (len(exits) - 1), MAX_RESTART_DELAY)
        log.error(
            "worker %d (pid %d) %s; restarting it in %g s (exit %d in %g s; %d of %d workers up)",
            index,
            pid,
            how,
            delay,
            len(exits),
            RESTART_WINDOW,
            len(self.up),
            self.count,
        )
        return delay

    def _crash_looping(self, index: int, now: float) -> bool:
        exits = self._exits.get(index, ())
        return sum(1 for t in exits if t > now - RESTART_WINDOW) > RESTART_LIMIT

    def _write_up(self) -> None:
        """Say how many workers are up, for their ``/health`` (replaced whole: a reader
        never sees half a file)."""
        if not self._metrics_dir:
            return
        path = os.path.join(self._metrics_dir, WORKERS_FILE)
        try:
            with open(path + ".tmp", "w") as file:
                json.dump({"up": len(self.up), "count": self.count}, file)
            os.replace(path + ".tmp", path)
        except OSError as exc:
            log.warning("cannot write %s: %s", path, exc)

    def _close_sockets(self, index: int) -> None:
        for sock in self._sockets[index]:
            sock.close()
        self._sockets[index] = []

    def _bind_again(self, index: int) -> bool:
        """New listening sockets for worker ``index`` in the group (its own were closed
        while it waited); False (logged) if the address cannot be bound now."""
        sockets: list[socket.socket] = []
        try:
            for family, kind, proto, address in self._addresses:
                sock = socket.socket(family, kind, proto)
                sockets.append(sock)
                _options(sock, reuse_port=True)
                sock.bind(address)
                sock.listen(BACKLOG)
        except OSError as exc:
            for sock in sockets:
                sock.close()
            log.error("cannot bind worker %d's sockets again: %s; retrying later", index, exc)
            return False
        self._sockets[index] = sockets
        return True

    async def _stop(self, process: trio.Process) -> None:
        """End ``process`` at once if it still runs (the supervisor is cancelled: its engine
        died, or another worker did not start): told twice, a worker ends its requests
        with errors and aborts; killed if it is not gone in :data:`KILL_AFTER` seconds."""
        if process.returncode is not None:
            return
        _send(process, signal.SIGTERM)
        with trio.move_on_after(KILL_AFTER):
            await trio.sleep(0.1)  # the first signal starts the drain, the second skips it
            _send(process, signal.SIGTERM)
            await process.wait()
        if process.returncode is None:
            log.warning("worker (pid %d) did not stop; killing it", process.pid)
            _send(process, signal.SIGKILL)
            await process.wait()

    def _close_listeners(self) -> None:
        for sockets in self._sockets:
            for sock in sockets:
                sock.close()


async def bind_group(host: str, port: int, count: int) -> list[list[socket.socket]]:
    """``count`` listening sockets on each address of ``host:port``, in one SO_REUSEPORT
    group per address: element ``i`` holds worker ``i``'s. Raises OSError (EADDRINUSE)
    if anything listens there already, SO_REUSEPORT or not."""
    infos = await trio.socket.getaddrinfo(
        host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )
    groups: list[list[socket.socket]] = [[] for _ in range(count)]
    try:
        for family, kind, proto, _, sockaddr in infos:
            # Bound without SO_REUSEPORT, and held (never listening) while the group binds:
            # it fails if anything listens there, and takes the port if port is 0.
            with socket.socket(family, kind, proto) as probe:
                _options(probe, reuse_port=False)
                probe.bind(sockaddr)
                address = probe.getsockname()
                for group in groups:
                    sock = socket.socket(family, kind, proto)
                    group.append(sock)
                    _options(sock, reuse_port=True)
                    sock.bind(address)
                    sock.listen(BACKLOG)
    except BaseException:
        for group in groups:
            for sock in group:
                sock.close()
        raise
    return groups


def _options(sock: socket.socket, *, reuse_port: bool) -> None:
    # SO_REUSEADDR as trio's listeners have it (a restart binds while old connections
    # linger in TIME_WAIT), and so that the probe and the group can bind together.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    if sock.family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)


def _send(process: trio.Process, signum: int) -> None:
    if process.returncode is None:
        try:
            process.send_signal(signum)
        except ProcessLookupError:
            pass


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def worker_command(entry: str) -> list[str]:
    """The command that runs a worker: ``entry``, a module-level function taking no
    argument that reads the spec and serves (``trioserve.cli:worker_main``)."""
    module, _, function = entry.partition(":")
    code = f"import sys; from {module} import {function}; sys.exit({function}())"
    return [sys.executable, "-c", code]
