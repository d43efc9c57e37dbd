"""One task owns a socket: the loop and the wake-up both of trioserve's socket owners share.

:class:`~trioserve.transport.zmtp.ZmtpDealer` (the frontend's link to an engine) and
:class:`~trioserve.transport.zmq_pump.ZmqPump` (a pyzmq socket, in the SDK) differ in how they read,
send and wait; what they share is here. The owner task

1. reads and handles what is waiting, within a time budget (:meth:`_receive_available`),
   then lets its user finish what that pass began (``after_receive``: the engine
   connection writes the outputs it held back, several of one stream in one write),
2. lets its user add coalesced messages (``before_flush``) and sends its outbox,
3. goes round again at once if more may be waiting, or if someone asked for another
   flush pass meanwhile; otherwise it parks in a cancel scope (:meth:`_wait`), and when
   the socket wakes it, reads before it leaves that scope (leaving one costs, cold).

Other tasks append to the bounded outbox without waiting and call :meth:`wake`, which
cancels that scope, so a queued message never waits for the socket to become readable.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable
from typing import Generic, TypeVar

import trio

log = logging.getLogger(__name__)

#: Messages an outbox holds before sends are refused.
OUTBOX_LIMIT = 16_384
#: Seconds the owner may spend handling what it read before it lets other tasks run: one
#: engine frame can carry a whole step's outputs (a write to a client each), and an owner
#: that handled them all in a row starved every other task, heartbeats included.
#: (:class:`~trioserve.transport.zmtp.ZmtpDealer` counts its thread's CPU time, see its
#: ``_budget_spent``; :class:`~trioserve.transport.zmq_pump.ZmqPump` the wall clock.)
RECV_BUDGET = 0.005

M = TypeVar("M")


class SocketOwner(Generic[M]):
    """``on_message`` is called synchronously, in the owner task, with each message (a
    list of frames); ``after_receive`` (optional) after each pass that read, even one a
    failed read ended; ``before_flush`` (optional) before each send pass, so that its user
    can turn accumulated state (pending aborts, a step's outputs) into one message."""

    def __init__(
        self,
        on_message: Callable[[list[bytes]], None],
        before_flush: Callable[[], None] | None,
        outbox_limit: int,
        after_receive: Callable[[], None] | None = None,
    ) -> None:
        self._on_message = on_message
        self._before_flush = before_flush
        self._after_receive = after_receive
        self._outbox: collections.deque[M] = collections.deque()
        self._outbox_limit = outbox_limit
        #: The owner's parking scope while it waits on the socket (None otherwise).
        self._park: trio.CancelScope | None = None
        #: Set by :meth:`wake`; cleared at the start of each flush pass.
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

    async def _own(self) -> None:
        """The owner's loop, until cancelled."""
        cut_short = self._receive()
        while True:
            self._flush_wanted = False
            if self._before_flush is not None:
                self._before_flush()
            self._send_available()
            if cut_short or self._flush_wanted or self._more_waiting():
                # More is (or may be) waiting: go round again, letting others run first.
                await trio.lowlevel.checkpoint()
            else:
                with trio.CancelScope() as park:
                    self._park = park
                    await self._wait()
                    # Woken by the socket: what came is handled before the scope is left.
                    # Leaving a cancel scope is a fair part of a wake-up from cold; a
                    # first token should not wait for it. (Nothing here awaits, and
                    # wake() no longer cancels this scope.)
                    self._park = None
                    cut_short = self._receive()
                    continue
                self._park = None  # woken by wake()
            cut_short = self._receive()

    def _receive(self) -> bool:
        try:
            return self._receive_available()
        finally:
            if self._after_receive is not None:
                self._after_receive()

    def _handle(self, frames: list[bytes]) -> None:
        try:
            self._on_message(frames)
        except Exception:  # one bad message must never kill the socket's owner
            log.exception("dropping a message its handler could not process")

    # -- what each owner supplies --------------------------------------------------------

    def _receive_available(self) -> bool:
        """Read and handle what is waiting; True when a limit cut the pass short."""
        raise NotImplementedError

    def _send_available(self) -> None:
        """Send what is queued, as far as the socket takes it now."""
        raise NotImplementedError

    def _more_waiting(self) -> bool:
        """Whether something may be waiting that would not wake :meth:`_wait`."""
        return False

    async def _wait(self) -> None:
        """Park until the socket may have something for the owner."""
        raise NotImplementedError
