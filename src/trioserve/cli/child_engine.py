"""The engine `trioserve run` starts as its child (the mock, or vLLM with ``--vllm``): started
first, served through, stopped last."""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable
from functools import partial

import trio

from ..enginecore.launcher import STOP_TIMEOUT as LAUNCHER_STOP_TIMEOUT
from .parsers import USAGE_ERROR

log = logging.getLogger("trioserve")

#: Seconds `trioserve run` waits for the mock engine it started before listening.
MOCK_ENGINE_WAIT = 10.0
#: Seconds between the lines that say the engine is still loading.
PROGRESS_INTERVAL = 15.0
#: Seconds a child engine has to stop after SIGTERM before it is killed: the vLLM engine
#: first drains, then gives vLLM's launcher up to its own stop timeout before it kills it,
#: so that nothing of vLLM outlives it.
CHILD_STOP_TIMEOUT = LAUNCHER_STOP_TIMEOUT + 10.0


class ChildEngine:
    """An engine that `trioserve run` starts, serves through, and stops last.

    The server listens once the engine has answered (or after ``wait`` seconds), so that
    "Running on" means ready; an engine that exits while the server runs stops the server
    with status 1 and a line that says so, rather than leaving it answering 503s. An engine
    that refuses its command line before that (status 2, with its one line saying why: a
    bad value in ``--vllm-args``, say) ends the command with status 2 and no line more.
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
        #: The server listens: the engine was ready (or waited for long enough).
        self.ready = False

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
                self.ready = True
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
        if code == USAGE_ERROR and not self.ready:
            log.debug("%s refused its command line (its line above says why)", self.what)
            self.status = USAGE_ERROR
        else:
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
        log.log(
            logging.DEBUG if self.status == USAGE_ERROR else logging.INFO,
            "%s stopped (exit code %s)",
            self.what,
            process.returncode,
        )
