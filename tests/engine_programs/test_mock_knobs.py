"""The mock engine's fault-injection knobs obey only an engine that allows them."""

from __future__ import annotations

import pytest

from trioserve.engine_programs.mock import MockBackend
from trioserve.errors import RequestError
from trioserve.protocol import Submit


async def first_outputs(backend: MockBackend, **params: object) -> list:
    request = Submit("r", "mock", "completion", {"prompt": "p"}, {"max_tokens": 2, **params})
    return [output async for output in backend.generate(request)]


@pytest.mark.parametrize(
    "knobs",
    [
        {"mock_error_after": 0, "mock_error_status": 429},
        {"mock_stall_s": 0.001},
        {"mock_by_seed": {"1": {"mock_stall_s": 0.001}}, "seed": 1},
        {"mock_tokens_per_second": 0},
    ],
)
async def test_knobs_are_refused_unless_fault_injection_is_allowed(knobs):
    with pytest.raises(RequestError) as refused:
        await first_outputs(MockBackend(ttft_ms=0), **knobs)
    assert refused.value.status == 400 and "--allow-fault-injection" in refused.value.message


async def test_knobs_work_on_an_engine_that_allows_them():
    with pytest.raises(RequestError) as failed:
        await first_outputs(
            MockBackend(ttft_ms=0, allow_fault_injection=True),
            mock_error_after=0,
            mock_error_status=429,
        )
    assert failed.value.status == 429
    assert len(await first_outputs(MockBackend(ttft_ms=0), seed=1)) == 2  # no knob: served
