"""A rolling restart of two frontends sharing one vLLM engine, behind nginx, under
streaming load: no client sees a failure or a truncated stream, and vLLM is left running
nothing, every request it was given having finished there (none aborted)."""

from __future__ import annotations

import pytest

from tests.helpers.rolling import roll_under_load
from tests.helpers.vllm import settled
from tests.helpers.vllm_session import MODEL, Vllm

pytestmark = pytest.mark.integration


async def test_rolling_restart_with_vllm_untouched_drops_nothing(
    vllm: Vllm, nursery, tmp_path, nginx
):
    before = await settled(vllm)
    body = {"model": MODEL, "max_tokens": 32, "temperature": 0, "ignore_eos": True}
    outcome = await roll_under_load(nursery, tmp_path, vllm.address, body)
    assert not outcome.failures, outcome.failures[:10]
    assert outcome.streams_started == outcome.streams_completed > 0
    after = await settled(vllm)

    def delta(name: str) -> float:
        return after[name] - before[name]

    assert delta("trioserve_engine_submitted_total") >= outcome.ok
    assert delta("trioserve_engine_finished_total") == delta("trioserve_engine_submitted_total")
    assert delta("trioserve_engine_aborted_total") == delta("trioserve_engine_orphaned_total") == 0
    assert after["vllm:num_requests_running"] == 0
