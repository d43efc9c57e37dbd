"""Checks that any socket owner must pass (the ZMTP dealer, the pyzmq pump)."""

from __future__ import annotations

import time
from collections.abc import Callable

import trio

from tests.helpers.waiting import wait_until


async def check_many_senders(send: Callable[[bytes], bool], heard: list[bytes]) -> None:
    """For a socket owner whose peer echoes: senders in many tasks send while the owner
    parks between bursts; every echo comes back (in ``heard``), each sender's in its
    order. A send that consumes a wake-up the owner needed would lose some."""
    senders, each = 20, 50

    async def sender(index: int) -> None:
        for n in range(each):
            assert send(b"%d:%d" % (index, n))
            if n % 7 == 0:
                await trio.sleep(0.001)  # let the owner park between bursts
            else:
                await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        for index in range(senders):
            nursery.start_soon(sender, index)
    await wait_until(lambda: len(heard) == senders * each, "every echo")
    for index in range(senders):
        mine = [m for m in heard if m.startswith(b"%d:" % index)]
        assert mine == [b"%d:%d" % (index, n) for n in range(each)]


class SlowFlood:
    """A flood of messages that each take a millisecond to handle (an engine frame
    carrying a step's outputs for hundreds of streams), for a socket owner's handler:
    another task (the heartbeat, a relay) must get its turn long before the owner has
    handled them all."""

    total = 300

    def __init__(self) -> None:
        self.handled: list[int] = []

    def handle(self, frames: list[bytes]) -> None:
        # Work, not a sleep: an owner's budget counts the CPU time it spends.
        end = time.thread_time() + 0.001
        while time.thread_time() < end:
            pass
        self.handled.append(int(frames[0]))

    def messages(self) -> list[bytes]:
        return [b"%d" % n for n in range(self.total)]

    async def check_others_ran(self, nursery: trio.Nursery) -> None:
        """Once every message has been sent: let them all arrive before the owner looks,
        then check another task ran many times while the owner handled them."""
        time.sleep(0.2)  # noqa: ASYNC251 - the whole thread waits, the owner too
        handled, total = self.handled, self.total
        seen_at: list[int] = []

        async def other() -> None:
            while len(handled) < total:
                seen_at.append(len(handled))
                await trio.lowlevel.checkpoint()

        nursery.start_soon(other)
        await wait_until(lambda: len(handled) == total, "every message handled")
        assert len([n for n in seen_at if 0 < n < total]) > 10
        assert handled == list(range(total))
