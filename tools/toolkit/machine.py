"""Facts about the machine and the code a run measured: CPU, cores, memory, kernel,
Python, the packages' versions, and what source a frontend started now would run."""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path


def machine() -> dict[str, str]:
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem = ""
    with contextlib.suppress(OSError):
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f"{kb / 2**20:.0f} GiB"
    versions = {}
    for name in (
        "trio",
        "hypercorn",
        "h11",
        "pyzmq",
        "msgpack",
        "fastapi",
        "starlette",
        "uvicorn",
        "uvloop",
        "httptools",
        "pydantic",
        "orjson",
    ):
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[name] = metadata.version(name)
    return {
        "machine": platform.machine(),
        "cpu": model,
        "cores": str(os.cpu_count()),
        "memory": mem,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "packages": ", ".join(f"{k} {v}" for k, v in versions.items()),
    }


def source_state() -> str:
    """What code a frontend started now would run: git HEAD plus a hash of the package's
    files as they are on disk (others may be editing the working tree during a run)."""
    import hashlib

    import trioserve

    package = Path(trioserve.__file__).resolve().parent
    digest = hashlib.sha1()
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode())
        digest.update(path.read_bytes())
    head = ""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        head = subprocess.run(
            ["git", "-C", str(package), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    return f"{head or 'no git'}+src:{digest.hexdigest()[:10]}"


def source_code(state: str) -> str:
    """The package-contents part of :func:`source_state` (commits elsewhere don't count)."""
    return state.rpartition("+src:")[2]
