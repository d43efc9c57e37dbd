"""Text work in worker threads runs below the priority of the thread that streams tokens.

A long prompt is rendered and tokenized in a worker thread so that the event loop's thread
goes on writing the other requests' tokens meanwhile. When the frontend has one core (a
container's CPU limit, ``taskset``, a busy machine) both threads share it, and the kernel
splits it evenly between them: tens of milliseconds of tokenization then take half the
core from every running stream for twice as long. A worker thread doing text work runs
:data:`BACKGROUND_NICE` steps nicer than it was (on Linux the nice value is per thread), so
while both want the core the event loop's thread gets most of it, and the worker all of it
once the loop is idle.

Raising a thread's nice value needs no privilege; lowering it again does, so a worker
thread stays nicer once it has done text work. Trio's worker threads only ever do work
that can wait (text, files, name lookups).
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable
from typing import ParamSpec, TypeVar

#: How much nicer a worker thread doing text work runs (of the 40 steps from -20 to 19;
#: 10 steps is about a tenth of the CPU share of a thread at the old value).
BACKGROUND_NICE = 10

P = ParamSpec("P")
T = TypeVar("T")

_thread = threading.local()


def background(fn: Callable[P, T]) -> Callable[P, T]:
    """``fn``, run in the calling thread after making that thread nicer, once per thread
    (for the worker thread of ``trio.to_thread.run_sync``)."""

    @functools.wraps(fn)
    def in_background(*args: P.args, **kwargs: P.kwargs) -> T:
        if not getattr(_thread, "niced", False):
            _thread.niced = True
            lower_priority()
        return fn(*args, **kwargs)

    return in_background


def lower_priority() -> None:
    """Make the calling thread :data:`BACKGROUND_NICE` steps nicer (up to 19), where the
    platform allows it (Linux: the nice value is the thread's own)."""
    try:
        tid = threading.get_native_id()
        current = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, min(19, current + BACKGROUND_NICE))
    except (AttributeError, OSError):  # no such call here, or not allowed: as it was
        pass


__all__ = ["BACKGROUND_NICE", "background", "lower_priority"]
