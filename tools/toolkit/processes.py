"""The processes a measuring tool starts: spawned with their output in a log file,
pinned to a core, waited for (a log line, ``/health``), stopped with their workers, held
to a share of a core (``CpuQuota``), and measuring children that print their figures as
JSON."""

from __future__ import annotations

import contextlib
import json
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from . import procfs
from .progress import Progress

FRONTEND_CORE, LOAD_CORE = 0, 1
#: The repository's root: the directory the tools run from (``python -m tools.NAME``), and
#: so the one their children start in.
ROOT = Path(__file__).resolve().parents[2]


URL_RE = re.compile(r"Running on (http://127\.0\.0\.1:\d+)")


def tool_command(name: str, python: str = sys.executable) -> list[str]:
    """The command that runs the tool ``name`` (``loadgen``), started in :data:`ROOT`."""
    return [python, "-m", f"tools.{name}"]


def pin_prefix(core: int, pin: bool) -> list[str]:
    return ["taskset", "-c", str(core)] if pin else []


def raise_fd_limit() -> None:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    log_path: Path
    url: str = ""

    @property
    def pid(self) -> int:
        return self.popen.pid

    def log_tail(self, size: int = 3000) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-size:]
        return ""

    def stop(self, graceful: bool = False) -> None:
        if self.popen.poll() is None:
            # Killed, its workers (--workers) go too: they would drain on their own while
            # the next frontend is measured. Found before the supervisor goes (then they
            # are orphans), killed after it (else it would start others).
            workers = [] if graceful else procfs.process_tree(self.pid)[1:]
            self.popen.send_signal(signal.SIGTERM if graceful else signal.SIGKILL)
            for pid in workers:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(10)


class CpuQuota:
    """A cgroup with a CPU quota (``share`` of one core), that a process enters and leaves.

    cgroup v2 (``cpu.max``) or v1 (the ``cpu`` controller); :meth:`create` returns None
    where neither is writable (not root, no controller). The period is 10 ms, so a capped
    process waits at most that long for its share (a 100 ms period would show as stalls
    in the inter-token latency).
    """

    PERIOD_US = 10_000

    def __init__(self, base: Path, path: Path, share: float) -> None:
        self.base, self.path, self.share = base, path, share

    def set_share(self, share: float) -> None:
        """Change the quota to ``share`` of a core."""
        quota = max(1000, int(share * self.PERIOD_US))
        if (self.path / "cpu.max").exists():
            (self.path / "cpu.max").write_text(f"{quota} {self.PERIOD_US}")
        else:
            (self.path / "cpu.cfs_quota_us").write_text(str(quota))
        self.share = share

    @classmethod
    def create(cls, share: float) -> CpuQuota | None:
        name = f"trioserve-bench-{os.getpid()}"
        quota = max(1000, int(share * cls.PERIOD_US))
        for base, files in (
            (Path("/sys/fs/cgroup"), {"cpu.max": f"{quota} {cls.PERIOD_US}"}),
            (
                Path("/sys/fs/cgroup/cpu"),
                {"cpu.cfs_period_us": str(cls.PERIOD_US), "cpu.cfs_quota_us": str(quota)},
            ),
        ):
            path = base / name
            try:
                if base == Path("/sys/fs/cgroup"):
                    if not (base / "cgroup.controllers").exists():
                        continue
                    (base / "cgroup.subtree_control").write_text("+cpu")
                path.mkdir(exist_ok=True)
                for file, value in files.items():
                    (path / file).write_text(value)
            except OSError:
                with contextlib.suppress(OSError):
                    path.rmdir()
                continue
            return cls(base, path, share)
        return None

    def enter(self, pid: int) -> None:
        """``pid`` and the processes below it (a frontend's workers) enter the cgroup."""
        for member in procfs.process_tree(pid):
            (self.path / "cgroup.procs").write_text(str(member))

    def leave(self, pid: int) -> None:
        for member in procfs.process_tree(pid):
            with contextlib.suppress(OSError):  # the process may have exited
                (self.base / "cgroup.procs").write_text(str(member))

    def remove(self) -> None:
        with contextlib.suppress(OSError):
            self.path.rmdir()


def spawn(
    name: str,
    command: list[str],
    workdir: Path,
    *,
    env: Mapping[str, str] | None = None,
    setup: Callable[[], None] = raise_fd_limit,
    own_group: bool = False,
) -> Proc:
    """``command`` with its output in a log file in ``workdir``, in ``env`` (default: this
    process's), ``setup`` run in the child before it starts (default: the descriptor limit
    raised); with ``own_group``, in a session of its own, so that its descendants can be
    signalled with it. It starts in :data:`ROOT`, where the tools are found."""
    log_path = workdir / f"{name.replace(' ', '_').replace('/', '_')}-{uuid.uuid4().hex[:6]}.log"
    with open(log_path, "wb") as log_file:
        popen = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            cwd=ROOT,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env={**(os.environ if env is None else env), "PYTHONUNBUFFERED": "1"},
            preexec_fn=setup,
            start_new_session=own_group,
        )
    return Proc(name, popen, log_path)


def wait_for_log(proc: Proc, pattern: re.Pattern[str], timeout: float = 30) -> re.Match[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        match = pattern.search(proc.log_tail(100_000))
        if match:
            return match
        if proc.popen.poll() is not None:
            break
        time.sleep(0.05)
    raise RuntimeError(f"{proc.name} did not start:\n{proc.log_tail()}")


def wait_healthy(proc: Proc, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen(proc.url + "/health", timeout=2) as reply,
        ):
            if reply.status == 200:
                return
        if proc.popen.poll() is not None:
            break
        time.sleep(0.1)
    raise RuntimeError(f"{proc.name} never became healthy:\n{proc.log_tail()}")


def run_json_tool(
    command: list[str], progress: Progress, status: str, timeout: float, name: str
) -> dict:
    """Run a measuring process that prints its figures as JSON on its last line, showing
    ``status`` while it runs and killing it past ``timeout``; {"error": ...} if it fails.
    It starts in :data:`ROOT`, as :func:`spawn`'s processes do."""
    with tempfile.TemporaryFile() as err:
        popen = subprocess.Popen(
            command, cwd=ROOT, stdout=subprocess.PIPE, stderr=err, preexec_fn=raise_fd_limit
        )
        deadline = time.monotonic() + timeout
        while True:
            try:
                out, _ = popen.communicate(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                progress.show(status)
                if time.monotonic() > deadline:
                    popen.kill()
                    popen.communicate()
                    return {"error": f"timed out after {timeout:.0f} s"}
        err.seek(0)
        stderr = err.read().decode(errors="replace")
    if popen.returncode != 0:
        last = stderr.strip().splitlines()[-1:] or ["?"]
        return {"error": f"{name} exited {popen.returncode}: {last[0]}", "stderr": stderr[-3000:]}
    return json.loads(out.decode().strip().splitlines()[-1])
