"""The processes of ``tools.bench_vllm``: starting and stopping them, pinning their threads,
and what each thread used and where it ran (/proc), with the check that each side's
processes stayed on the cores they were put on.

CPU is counted per process, never per process tree: a side's top process (vLLM's API
server, trioserve's frontend) has the model (EngineCore, its Worker) below it, and a tree
count puts the model's CPU in the server's figure. (That is how ``--quick`` once reported
vLLM's API server at 150% of a core pinned to one: ``toolkit.procfs.CpuMeter`` counts a
"frontend" with its whole tree, for ``--workers``, and the API server's tree is the model.)
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tools.toolkit import processes
from tools.toolkit.processes import Proc, raise_fd_limit

CLK_TCK = os.sysconf("SC_CLK_TCK")
#: Seconds between two samples of the core each thread is on (the thread's ``processor``
#: in /proc/PID/task/TID/stat): often enough to catch a thread that runs elsewhere for a
#: while, rarely enough to cost the measuring process (on the servers' core) about 1% of it.
CORE_SAMPLE_S = 0.25


def _child_setup() -> None:
    raise_fd_limit()
    # Started on every core (this script's pinning is not theirs); pinned once up.
    os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))
    # SIGTERM to the child when this script dies, however it dies.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def spawn(name: str, command: list[str], workdir: Path, env: dict[str, str]) -> Proc:
    """``command`` in a process group of its own (so that its descendants end with it)."""
    return processes.spawn(name, command, workdir, env=env, setup=_child_setup, own_group=True)


def stop_group(proc: Proc, grace: float = 30) -> None:
    """SIGTERM (vLLM then shuts its EngineCore down), then SIGKILL to whatever is left of
    the process group this script started it in."""
    if proc.popen.poll() is None:
        proc.popen.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.popen.wait(grace)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.popen.wait(10)


def _stat_fields(path: str) -> list[str]:
    """The fields of a /proc stat file after the command name (field 3 of stat(5) first)."""
    with open(path) as f:
        return f.read().rsplit(")", 1)[1].split()


def group_gone(pgid: int, timeout: float = 10) -> bool:
    """Whether no live process (zombies aside) is left in process group ``pgid``."""
    deadline = time.monotonic() + timeout
    while True:
        left = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                with contextlib.suppress(OSError, IndexError, ValueError):
                    fields = _stat_fields(f"/proc/{entry}/stat")
                    if int(fields[2]) == pgid and fields[0] != "Z":
                        left.append(entry)
        if not left or time.monotonic() > deadline:
            return not left
        time.sleep(0.2)


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            ppid = int(_stat_fields(f"/proc/{entry}/stat")[1])
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def comm(pid: int, tid: int | None = None) -> str:
    path = f"/proc/{pid}/comm" if tid is None else f"/proc/{pid}/task/{tid}/comm"
    with contextlib.suppress(OSError):
        return Path(path).read_text().strip()
    return "?"


def pin_threads(pid: int, core: int) -> None:
    """Every thread of ``pid`` to ``core`` (threads it starts later inherit it)."""
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                os.sched_setaffinity(int(tid), {core})


def process_cpu_s(pid: int) -> float:
    """utime + stime of ``pid`` alone (its threads, the exited ones too; not its children)."""
    try:
        fields = _stat_fields(f"/proc/{pid}/stat")
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def _cores_text(cores: set[int]) -> str:
    return ",".join(map(str, sorted(cores)))


@dataclass
class ThreadState:
    comm: str
    cpu_ns: int  # time on a CPU (schedstat: nanoseconds, not ticks)
    allowed: set[int]
    on: int  # the core it last ran on


def _thread_state(pid: int, tid: int) -> ThreadState | None:
    base = f"/proc/{pid}/task/{tid}"
    try:
        with open(f"{base}/schedstat") as f:
            cpu_ns = int(f.read().split()[0])
        on = int(_stat_fields(f"{base}/stat")[36])  # field 39 of stat(5): processor
    except (OSError, IndexError, ValueError):
        return None
    try:
        allowed = os.sched_getaffinity(tid)
    except OSError:
        return None
    return ThreadState(comm(pid, tid), cpu_ns, allowed, on)


def _tids(pid: int) -> list[int]:
    with contextlib.suppress(OSError):
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    return []


@dataclass
class Watched:
    """One process of a side over a window: its role and the core it was put on."""

    pid: int
    name: str  # "frontend", "adapter", "model:EngineCore"...
    role: str  # "counted" (not the model) or "model"
    core: int | None  # None: not pinned
    cpu_s0: float = 0.0
    threads0: dict[int, ThreadState] = field(default_factory=dict)
    seen: dict[int, set[int]] = field(default_factory=dict)  # tid -> cores it ran on
    last_ns: dict[int, int] = field(default_factory=dict)  # tid -> its CPU at the last look


class ThreadMeter:
    """What every thread of a side's processes used over a window and where it ran.

    ``start`` and ``stop`` read each process's CPU (/proc/PID/stat, with its exited
    threads) and each thread's (schedstat, in ns) and affinity; in between, a thread samples
    the core each thread is on every :data:`CORE_SAMPLE_S`. ``stop`` returns the figures
    and the placement check: a thread allowed on, or seen on, a core other than its
    process's, or a process that appeared in or left the side's trees meanwhile.
    """

    def __init__(self, watched: list[Watched], tops: list[int]) -> None:
        self.watched = watched
        self.tops = tops  # the side's top processes: their trees are the side
        self._stop = threading.Event()
        self._sampler: threading.Thread | None = None
        self._members: set[int] = set()

    def _tree(self) -> set[int]:
        out = set(self.tops)
        for top in self.tops:
            out.update(descendants(top))
        return out

    def start(self) -> None:
        self._members = self._tree()
        for w in self.watched:
            w.cpu_s0 = process_cpu_s(w.pid)
            w.threads0 = {}
            w.seen = {}
            w.last_ns = {}
            for tid in _tids(w.pid):
                state = _thread_state(w.pid, tid)
                if state is not None:
                    w.threads0[tid] = state
                    w.last_ns[tid] = state.cpu_ns
        self._stop.clear()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()

    def _sample(self) -> None:
        while not self._stop.wait(CORE_SAMPLE_S):
            for w in self.watched:
                for tid in _tids(w.pid):
                    self._saw(w, tid, _thread_state(w.pid, tid))

    @staticmethod
    def _saw(w: Watched, tid: int, state: ThreadState | None) -> None:
        """The core ``tid`` is on, if it ran since the last look (or was started since the
        window began): a thread asleep since before it was pinned still names the core it
        last ran on."""
        if state is not None and state.cpu_ns != w.last_ns.get(tid):
            w.seen.setdefault(tid, set()).add(state.on)
            w.last_ns[tid] = state.cpu_ns

    def stop(self, wall: float) -> dict:
        self._stop.set()
        if self._sampler is not None:
            self._sampler.join(5)
        escaped: list[str] = []
        processes = {}
        for w in self.watched:
            cpu_s = process_cpu_s(w.pid) - w.cpu_s0
            threads = []
            for tid in _tids(w.pid):
                end = _thread_state(w.pid, tid)
                if end is None:
                    continue
                begin = w.threads0.get(tid)
                used = (end.cpu_ns - (begin.cpu_ns if begin else 0)) / 1e9
                self._saw(w, tid, end)
                cores = w.seen.get(tid, set())
                allowed = end.allowed | (begin.allowed if begin else set())
                if w.core is not None and (cores | allowed) != {w.core}:
                    escaped.append(
                        f"{w.name} {w.pid} thread {tid} ({end.comm}): ran on "
                        f"{_cores_text(cores)}, allowed {_cores_text(allowed)}, put on {w.core}"
                    )
                if used >= 0.001 or (w.core is not None and (cores | allowed) != {w.core}):
                    threads.append(
                        {
                            "tid": tid,
                            "comm": end.comm,
                            "cpu_s": round(used, 4),
                            "cpu_pct": round(100 * used / wall, 1) if wall else 0.0,
                            "cores": sorted(cores),
                            "allowed": _cores_text(allowed),
                            "new": begin is None,
                        }
                    )
            threads.sort(key=lambda t: -t["cpu_s"])
            processes[w.name] = {
                "pid": w.pid,
                "role": w.role,
                "put_on": w.core,
                "cpu_s": cpu_s,
                "cpu_pct": 100 * cpu_s / wall if wall else 0.0,
                "threads_alive": len(_tids(w.pid)),
                "threads": threads,
            }
        members = self._tree()
        appeared = sorted(members - self._members)
        gone = sorted(self._members - members)
        for pid in appeared:
            escaped.append(f"process {pid} ({comm(pid)}) appeared in the side's tree")
        for pid in gone:
            escaped.append(f"process {pid} left the side's tree")
        known = {w.pid for w in self.watched}
        for pid in sorted(members - known - set(appeared)):
            escaped.append(f"process {pid} ({comm(pid)}) is in the side's tree but not watched")
        return {"processes": processes, "placement_held": not escaped, "escaped": escaped}
