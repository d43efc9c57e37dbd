"""One accounting of the memory clients make the server hold: a :class:`MemoryBudget` per
bound (request bodies, their parsed JSON and WebSocket messages, in assembly and parsed:
``--max-body-memory-mb``), and a :class:`Holding` per holder (a
request, a stored record) that gives back all it took, once, however it ends.

Sans-io, synchronous, no locks: everything runs on one trio loop. A budget counts bytes
as the holder says it holds them (the body bytes read, the fields kept), so the figures a
budget bounds are measured against RSS in docs/security.md, not assumed.

    budget = MemoryBudget(64 * 2**20, "request bodies", "body_memory_exhausted")
    holding = Holding(budget)
    holding.take(len(chunk))       # 503 body_memory_exhausted past the bound, nothing taken
    ...
    holding.release()              # idempotent: the request's end gives back all of it
"""

from __future__ import annotations

from sys import getsizeof

from .. import metrics
from .errors import HTTPError

#: Seconds a refused client is asked to wait before trying again.
RETRY_AFTER = 1


class MemoryBudget:
    """Bytes held across all holders, and their bound (``limit``). ``what`` names what is
    held in the 503's message; ``code`` is the 503's machine-readable code."""

    __slots__ = ("code", "held", "limit", "what")

    def __init__(self, limit: int, what: str, code: str) -> None:
        self.limit = limit
        self.what = what
        self.code = code
        self.held = 0

    def exhausted(self) -> HTTPError:
        return HTTPError(
            503,
            f"the server holds its limit of {self.limit} bytes of {self.what}; retry later",
            self.code,
            headers=[(b"retry-after", str(RETRY_AFTER).encode())],
        )

    def try_take(self, size: int) -> bool:
        """Count ``size`` more bytes if they fit under the bound; False (nothing counted)
        if not."""
        if self.held + size > self.limit:
            return False
        self.held += size
        return True

    def take(self, size: int) -> None:
        """Count ``size`` more bytes, or raise the 503 (nothing counted) past the bound."""
        if not self.try_take(size):
            metrics.ADMISSION_REFUSED.inc()
            raise self.exhausted()

    def give_back(self, size: int) -> None:
        self.held -= size


class Holding:
    """What one holder holds of a budget (None: counted nowhere, as on routes without a
    body budget): :meth:`take` adds to it, :meth:`release` gives all of it back."""

    __slots__ = ("budget", "held")

    def __init__(self, budget: MemoryBudget | None) -> None:
        self.budget = budget
        self.held = 0

    def take(self, size: int) -> None:
        """Hold ``size`` more bytes; the budget's 503 past its bound (nothing taken)."""
        if self.budget is not None:
            self.budget.take(size)
            self.held += size

    def hand_over(self) -> Holding:
        """A new holding with all this one holds, for another holder (a request's task)
        to release; this one then holds nothing."""
        successor = Holding(self.budget)
        successor.held, self.held = self.held, 0
        return successor

    def release(self) -> None:
        """Give back everything held (idempotent)."""
        if self.budget is not None and self.held:
            self.budget.give_back(self.held)
            self.held = 0


def body_budget(limit: int) -> MemoryBudget:
    """The budget of request bodies held in memory (``--max-body-memory-mb``)."""
    return MemoryBudget(limit, "request bodies", "body_memory_exhausted")


def held_by(value: object) -> int:
    """The bytes Python holds for a parsed JSON document (``orjson.loads``): each
    object's own size, containers and what they hold, walked once (no recursion: depth
    is the client's choice). Counted rather than estimated from the text, whose size
    says little: ``[{},{}]`` holds 24 times its bytes, an ASCII string with one emoji in
    it four times, prose about once (``tests/http/test_memory.py`` holds it to
    tracemalloc)."""
    total = 0
    pending = [value]
    while pending:
        item = pending.pop()
        total += getsizeof(item)
        if type(item) is dict:
            pending.extend(item.keys())
            pending.extend(item.values())
        elif type(item) is list:
            pending.extend(item)
    return total
