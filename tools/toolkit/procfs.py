"""What ``/proc`` says of processes and cores: CPU seconds of a process or its tree
(``/proc/PID/stat``), the tree below a process (a frontend's workers), resident memory, the
cores' busy and steal time (``/proc/stat``), and ``CpuMeter``, which reads them over a
measuring window."""

from __future__ import annotations

import os
import time

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int | None) -> float:
    """utime + stime of ``pid`` (all its threads), in seconds; 0 when unknown."""
    if not pid:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # fields 14 and 15 of stat(5)


def process_tree(pid: int) -> list[int]:
    """``pid`` and every process below it: a frontend's workers (``--workers N``)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(entry))
    tree, todo = [], [pid]
    while todo:
        tree.append(todo.pop())
        todo += children.get(tree[-1], [])
    return tree


def tree_cpu_seconds(pid: int | None) -> float:
    """:func:`cpu_seconds` of ``pid`` and the processes below it."""
    return sum(cpu_seconds(p) for p in process_tree(pid)) if pid else 0.0


def rss_bytes(pid: int) -> int:
    """Resident memory of ``pid`` and the processes below it (a frontend's workers)."""
    total = 0
    for member in process_tree(pid):
        with open(f"/proc/{member}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
                    break
            else:
                raise RuntimeError(f"no VmRSS for pid {member}")
    return total


def cpu_times() -> dict[str, tuple[int, int, int]]:
    """Per CPU (``cpu0``, ``cpu1``, ...): (busy, steal, total) jiffies from /proc/stat."""
    out = {}
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("cpu") and line[3].isdigit():
                name, *values = line.split()
                v = [int(x) for x in values[:8]]
                user, nice, system, _idle, _iowait, irq, softirq, steal = v
                out[name] = (user + nice + system + irq + softirq, steal, sum(v))
    return out


class CpuMeter:
    """CPU used over a window: by the frontend (with its workers, if it has any), the
    engine and this process (utime + stime from /proc/PID/stat, all threads), and per core
    and by everything else on the machine (/proc/stat): a run on a busy machine says so."""

    def __init__(self, frontend: int | None, engine: int | None) -> None:
        self.pids = {"frontend": frontend, "engine": engine, "loadgen": os.getpid()}
        self._start: dict[str, float] = {}
        self._cores: dict[str, tuple[int, int, int]] = {}
        self._t0 = 0.0
        self.result: dict[str, float] = {}

    def start(self) -> None:
        self._t0 = time.monotonic()
        self._start = {name: self._cpu(name, pid) for name, pid in self.pids.items()}
        self._cores = cpu_times()

    @staticmethod
    def _cpu(name: str, pid: int | None) -> float:
        return tree_cpu_seconds(pid) if name == "frontend" else cpu_seconds(pid)

    def stop(self) -> float:
        wall = time.monotonic() - self._t0
        ours = 0.0
        for name, pid in self.pids.items():
            used = self._cpu(name, pid) - self._start[name]
            ours += used
            self.result[f"{name}_cpu_s"] = used
            self.result[f"{name}_cpu_pct"] = 100 * used / wall if wall else 0.0
        busy_all = 0.0
        for name, (busy, steal, total) in cpu_times().items():
            b0, s0, t0 = self._cores.get(name, (busy, steal, total))
            span = max(total - t0, 1)
            self.result[f"{name}_busy_pct"] = 100 * (busy - b0) / span
            self.result[f"{name}_steal_pct"] = 100 * (steal - s0) / span
            busy_all += (busy - b0) / CLK_TCK
        # Everything else that ran meanwhile (other processes, the idle frontend), in % of
        # one core.
        self.result["other_cpu_pct"] = max(0.0, 100 * (busy_all - ours) / wall) if wall else 0.0
        self.result["window_s"] = wall
        return wall
