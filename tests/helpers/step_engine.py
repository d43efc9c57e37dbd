"""An engine whose outputs the test sends one at a time (a backend of the real SDK over
real ZeroMQ): what reaches the client, and when, is the test's to decide."""

from __future__ import annotations

from collections.abc import AsyncIterator
from functools import partial

import trio

from trioserve.protocol import ModelCard, Submit
from trioserve.sdk import Output, TrioEngine, serve_engine


class StepBackend:
    """Serves model ``steps``; each request's outputs are what :meth:`step` sends (one
    request at a time). ``requests``: every submit it was given, in order."""

    engine_id = "steps"
    models = [ModelCard("steps")]
    capabilities = ["chat", "completion"]

    def __init__(self) -> None:
        self.requests: list[Submit] = []
        self._send, self._receive = trio.open_memory_channel[Output](16)

    async def generate(self, request: Submit) -> AsyncIterator[Output]:
        self.requests.append(request)
        async for output in self._receive:
            yield output
            if output.finish_reason is not None:
                return

    async def step(self, output: Output) -> None:
        await self._send.send(output)


async def start_step_engine(nursery: trio.Nursery) -> tuple[TrioEngine, StepBackend]:
    backend = StepBackend()
    engine = await nursery.start(
        partial(serve_engine, backend, "tcp://127.0.0.1:*", track_ends=True)
    )
    return engine, backend
