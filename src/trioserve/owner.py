"""What a socket's one owner task shares with the tasks that send on it.

Both of trioserve's socket owners (:class:`~trioserve.zmtp.ZmtpDealer`, the frontend's
link to an engine, and :class:`~trioserve.zmq_trio.ZmqPump`, a pyzmq socket in the SDK)
keep a bounded outbox that other tasks append to without waiting, and park in a cancel
scope that :meth:`SocketOwner.wake` cancels to make the owner run a flush pass.
"""

from __future__ import annotations

import collections
from typing import Generic, TypeVar

import trio

#: Messages an outbox holds before sends are refused.
OUTBOX_LIMIT = 16_384

M = TypeVar("M")


class SocketOwner(Generic[M]):
    def __init__(self, outbox_limit: int = OUTBOX_LIMIT) -> None:
        self._outbox: collections.deque[M] = collections.deque()
        self._outbox_limit = outbox_limit
        #: The owner's parking scope while it waits on the socket (None otherwise).
        self._park: trio.CancelScope | None = None
        #: Set by :meth:`wake`; the owner clears it at the start of each flush pass.
        self._flush_wanted = False

    def wake(self) -> None:
        """Ask the owner to run a flush pass soon (cheap; safe to call often)."""
        self._flush_wanted = True
        if self._park is not None:
            self._park.cancel()
            self._park = None

    @property
    def pending(self) -> int:
        """Messages queued for the owner to send."""
        return len(self._outbox)
