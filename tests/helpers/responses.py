"""Helpers of the Responses API tests (tests/http/test_responses*.py): an engine whose
answers end by themselves, SSE read by event name, abort counts, the shape of a stream."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from functools import partial
from typing import Any

import attrs
import trio

from trioserve import metrics
from trioserve.engine_programs.mock import MockBackend
from trioserve.protocol import Submit
from trioserve.sdk import Output, TrioEngine, serve_engine


class NaturalEndMock(MockBackend):
    """The mock engine, except that an answer not cut short by ``max_tokens`` ends with
    ``"stop"`` (the mock says ``"length"`` always): a model that finished by itself."""

    async def generate(self, request: Submit) -> AsyncIterator[Output]:
        async for output in super().generate(request):
            if output.finish_reason == "length" and "max_tokens" not in request.params:
                output = attrs.evolve(output, finish_reason="stop")
            yield output


async def start_natural_engine(nursery: trio.Nursery, **options: Any) -> TrioEngine:
    """A :class:`NaturalEndMock` engine, with the options of ``tests.conftest.start_engine``."""
    backend = NaturalEndMock(
        **{"tokens_per_second": 400.0, "ttft_ms": 2.0, "allow_fault_injection": True, **options}
    )
    return await nursery.start(partial(serve_engine, backend, "tcp://127.0.0.1:*", track_ends=True))


def named_events(text: str) -> list[tuple[str, dict]]:
    """The ``(event name, data)`` of every complete SSE event in ``text`` (comments and a
    trailing partial event left out)."""
    events = []
    for block in text.split("\n\n")[:-1]:
        fields = dict(line.split(": ", 1) for line in block.split("\n") if not line.startswith(":"))
        if fields:
            events.append((fields["event"], json.loads(fields["data"])))
    return events


def aborts_sent(reason: str) -> float:
    """How many aborts the frontend has sent for ``reason`` (trioserve_engine_aborts_total)."""
    sample = metrics.REGISTRY.get_sample_value("trioserve_engine_aborts_total", {"reason": reason})
    return sample or 0.0


#: The event types of a streamed response that ends by itself, in order (one delta
#: event per batch of engine outputs: how many depends on how they were batched).
OPENING = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
]
CLOSING = [
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
]


def check_sequence(types: list[str], last: str) -> None:
    """``types`` are a whole streamed response's, ending with ``last``."""
    deltas = len(types) - len(OPENING) - len(CLOSING) - 1
    assert deltas >= 1
    assert types == [*OPENING, *["response.output_text.delta"] * deltas, *CLOSING, last]


#: The request fields a Response object reports back, for a request that set none.
ECHO: dict[str, Any] = {
    "instructions": None,
    "max_output_tokens": None,
    "metadata": {},
    "parallel_tool_calls": True,
    "previous_response_id": None,
    "reasoning": None,
    "store": True,
    "temperature": None,
    "text": {"format": {"type": "text"}},
    "tool_choice": "auto",
    "tools": [],
    "top_p": None,
    "truncation": "disabled",
    "user": None,
}
