"""Hang-up detection for every in-flight client socket of a server, in one task.

A request must end the moment its client goes away. Watching for that with a task per
request, parked in a read of the client's socket, costs a task, an epoll registration in
trio and a cancellation per request: on a short non-streaming request, a tenth of its
CPU. Here one epoll set holds every watched socket, registered for ``EPOLLRDHUP`` (the
peer closed or shut down its side; a reset comes as ``EPOLLHUP``/``EPOLLERR``, which epoll
always reports) and not for ``EPOLLIN``, so a pipelined next request sitting in the
socket does not count as a hang-up. One task waits for the set to become readable and
calls the callbacks. Watching and unwatching a socket are one ``epoll_ctl`` each.

Linux only (``select.epoll``): elsewhere :func:`available` is False and the server does
not offer the watch, so the application keeps a task per request.
"""

from __future__ import annotations

import logging
import select
from collections.abc import Callable

import trio

log = logging.getLogger("trioserve.hangups")

#: Events returned per ``epoll_wait``; more are left for the next round.
MAX_EVENTS = 1024


def available() -> bool:
    return hasattr(select, "epoll") and hasattr(select, "EPOLLRDHUP")


class HangupWatcher:
    """Calls a socket's callback once when its peer hangs up (from :meth:`run`'s task).

    The owner of a socket must :meth:`unwatch` it before closing it: the kernel forgets
    a closed descriptor, but its number is reused by the next connection.
    """

    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._callbacks: dict[int, Callable[[], None]] = {}

    def __len__(self) -> int:
        return len(self._callbacks)

    def watch(self, fd: int, callback: Callable[[], None]) -> None:
        if fd in self._callbacks:
            raise RuntimeError(f"descriptor {fd} is already watched")
        self._epoll.register(fd, select.EPOLLRDHUP)
        self._callbacks[fd] = callback

    def unwatch(self, fd: int) -> None:
        """Stop watching ``fd`` (a no-op if it is not watched, or has fired)."""
        if self._callbacks.pop(fd, None) is not None:
            try:
                self._epoll.unregister(fd)
            except (OSError, ValueError):
                # The descriptor is closed (the kernel has dropped it), or the watcher has
                # stopped and closed its epoll (a request ending as the server shuts down).
                pass

    async def run(self) -> None:
        """Deliver hang-ups until cancelled."""
        try:
            while True:
                await trio.lowlevel.wait_readable(self._epoll.fileno())
                for fd, _ in self._epoll.poll(0, MAX_EVENTS):
                    callback = self._callbacks.pop(fd, None)
                    if callback is None:
                        continue
                    self._epoll.unregister(fd)
                    try:
                        callback()
                    except Exception:  # one request's trouble must not stop the watcher
                        log.exception("hang-up callback failed")
        finally:
            self._epoll.close()
