"""Helpers for tests that run trioserve as real processes (engine, frontend)."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import trio

from tests.helpers.waiting import HANG_GUARD


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Proc:
    """A trioserve subprocess (or a tool's: ``program``) whose stderr is collected as it
    runs."""

    def __init__(self, process: trio.Process) -> None:
        self.process = process
        self.output = b""
        self._lines = trio.Event()
        self._eof = trio.Event()

    @classmethod
    async def start(
        cls,
        nursery: trio.Nursery,
        *args: str,
        program: tuple[str, ...] = ("-m", "trioserve"),
        python: str = sys.executable,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> Proc:
        process = await trio.lowlevel.open_process(
            [python, *program, *args],
            cwd=cwd,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env={**(env or os.environ), "PYTHONUNBUFFERED": "1"},
            start_new_session=True,
        )
        proc = cls(process)
        nursery.start_soon(proc._read)
        return proc

    async def _read(self) -> None:
        """Collect stderr; when the test's nursery ends, kill the process (no leftovers)."""
        assert self.process.stderr is not None
        try:
            async for chunk in self.process.stderr:
                self.output += chunk
                self._lines.set()
                self._lines = trio.Event()
            self._eof.set()
            await trio.sleep_forever()
        finally:
            if self.process.returncode is None:
                os.killpg(self.process.pid, signal.SIGKILL)  # its children too

    async def wait_for_output(self, pattern: str, guard: float = HANG_GUARD) -> re.Match[bytes]:
        with trio.fail_after(guard):
            while (match := re.search(pattern.encode(), self.output)) is None:
                if self._eof.is_set():
                    raise AssertionError(f"process exited: {self.output.decode()[-2000:]}")
                if self.process.returncode is not None:
                    await self._eof.wait()  # what it wrote last may not be read yet
                    continue
                await self._lines.wait()
        return match

    def signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    async def wait(self) -> int:
        with trio.fail_after(HANG_GUARD):
            return await self.process.wait()

    async def all_output(self) -> bytes:
        """Everything it wrote, once its stderr is closed (by it and by every child that
        shared it): what it wrote last may still be in the pipe when it has exited."""
        with trio.fail_after(HANG_GUARD):
            await self._eof.wait()
        return self.output

    async def stop(self) -> None:
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGKILL)
            await self.process.wait()


async def start_mock_engine(
    nursery: trio.Nursery,
    address: str,
    *extra: str,
    tokens_per_second: float = 200,
    ttft_ms: float = 2,
) -> Proc:
    """``trioserve engine mock --bind address``, once it serves."""
    engine = await Proc.start(
        nursery,
        "engine",
        "mock",
        "--bind",
        address,
        "--tokens-per-second",
        f"{tokens_per_second:g}",
        "--ttft-ms",
        f"{ttft_ms:g}",
        *extra,
    )
    await engine.wait_for_output("mock engine serving")
    return engine


async def start_engine_process(nursery: trio.Nursery, port: int, *extra: str) -> Proc:
    # The tests drive faults through the mock's knobs.
    return await start_mock_engine(
        nursery, f"tcp://127.0.0.1:{port}", "--allow-fault-injection", *extra
    )


async def start_frontend_process(nursery: trio.Nursery, *args: str) -> tuple[Proc, str]:
    frontend = await Proc.start(nursery, "run", "--port", "0", *args)
    match = await frontend.wait_for_output(r"Running on (http://127\.0\.0\.1:\d+)")
    return frontend, match.group(1).decode()
