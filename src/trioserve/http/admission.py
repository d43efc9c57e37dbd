"""Admission control: a bound on generation requests served at once.

A request past the bound is refused at once (503, ``Retry-After``), never queued: a queue
in front of the engines only hides overload from the load balancer and the client. The
slot is held for the whole handler, so a streaming response holds it until its last byte.
Operations routes (health, liveness, metrics, models) never take a slot.
"""

from __future__ import annotations

from .. import metrics
from ..errors import HTTPError

#: Seconds a refused client is asked to wait before trying again.
RETRY_AFTER = 1


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
