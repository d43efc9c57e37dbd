"""Admission control: a bound on generation requests served at once, and on the request
bodies held in memory across requests.

A request past the bound is refused at once (503, ``Retry-After``), never queued: a queue
in front of the engines only hides overload from the load balancer and the client. The
slot is taken once the request's body is complete, just before its engine request is
submitted (a client sending its body slowly holds no slot), and held until its last byte.
Operations routes (health, liveness, metrics, models) never take a slot.

Request bodies held in memory draw on one budget for the whole server
(``--max-body-memory-mb``: ``memory.py``), held until their request ends.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from .. import metrics
from ..errors import HTTPError
from .memory import RETRY_AFTER


class Admission:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.in_use = 0

    def overloaded(self) -> HTTPError:
        return HTTPError(
            503,
            f"the server is serving its limit of {self.limit} concurrent requests; retry later",
            "server_overloaded",
            headers=[(b"retry-after", str(RETRY_AFTER).encode())],
        )

    def try_acquire(self) -> None:
        """Take a slot, or raise the 503 :class:`HTTPError`. Pair with :meth:`release`."""
        if self.in_use >= self.limit:
            metrics.ADMISSION_REFUSED.inc()
            raise self.overloaded()
        self.in_use += 1

    def release(self) -> None:
        self.in_use -= 1

    @contextmanager
    def slot(self) -> Iterator[None]:
        """A slot for the block (the 503 if there is none)."""
        self.try_acquire()
        try:
            yield
        finally:
            self.release()
