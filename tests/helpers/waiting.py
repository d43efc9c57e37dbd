"""Waiting for an effect in another component, under a hang guard.

Waits are event-driven where possible; where a test must poll for an effect in another
component (an abort crossing ZeroMQ), ``wait_until`` polls under a generous ceiling that
only guards against hangs and never measures speed.
"""

from __future__ import annotations

from collections.abc import Callable

import trio

#: Ceiling for waiting on an effect that must happen; hitting it is a failure, not a timing.
HANG_GUARD = 20.0


async def wait_until(condition: Callable[[], bool], what: str = "condition") -> None:
    with trio.move_on_after(HANG_GUARD):
        while not condition():
            await trio.sleep(0.005)
        return
    raise AssertionError(f"gave up waiting for {what}")
