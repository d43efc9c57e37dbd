"""The shared engine's latency histograms (``--metrics-port``) against ``vllm serve``'s own
for the same requests: the same number of observations of each (an inter-token latency per
output after the first; a queue, prefill, decode and inference time and a time per output
token per finished request), and figures that add up (prefill + decode = inference).
The values are each engine's own timing and are not compared."""

from __future__ import annotations

import pytest
import trio

from tests.helpers.vllm import COMPLETIONS, completion, frontend_on, post_json, settled
from tests.helpers.vllm_session import Vllm

HISTOGRAMS = [
    "vllm:inter_token_latency_seconds",
    "vllm:request_time_per_output_token_seconds",
    "vllm:request_queue_time_seconds",
    "vllm:request_prefill_time_seconds",
    "vllm:request_decode_time_seconds",
    "vllm:request_inference_time_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:time_to_first_token_seconds",
]
#: Greedy answers that run to max_tokens: the same number of engine steps on both sides.
BODIES = [
    completion("Count the engine's steps", max_tokens=9, temperature=0, ignore_eos=True),
    completion("Once", max_tokens=1, temperature=0, ignore_eos=True),  # one output: no gap
]


def deltas(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {
        f"{name}_{part}": after.get(f"{name}_{part}", 0.0) - before.get(f"{name}_{part}", 0.0)
        for name in HISTOGRAMS
        for part in ("count", "sum")
    }


async def test_the_shared_engines_histograms_count_what_vllm_serve_counts(
    vllm: Vllm, nursery
) -> None:
    frontend = await frontend_on(nursery, vllm)
    ours_before = await settled(vllm)
    theirs_before = await trio.to_thread.run_sync(vllm.reference_metrics)
    for body in BODIES:
        assert (await post_json(frontend.url, COMPLETIONS, body)).status_code == 200
        assert (await post_json(vllm.reference_url, COMPLETIONS, body)).status_code == 200
    ours = deltas(ours_before, await settled(vllm))
    theirs = deltas(theirs_before, await trio.to_thread.run_sync(vllm.reference_metrics))
    counts = {name: ours[f"{name}_count"] for name in HISTOGRAMS}
    assert counts == {name: theirs[f"{name}_count"] for name in HISTOGRAMS}
    assert counts["vllm:inter_token_latency_seconds"] == 8  # 9 outputs, then 1
    assert counts["vllm:request_inference_time_seconds"] == len(BODIES)
    for side in (ours, theirs):
        phases = [side[f"vllm:request_{p}_time_seconds_sum"] for p in ("prefill", "decode")]
        assert sum(phases) == pytest.approx(side["vllm:request_inference_time_seconds_sum"])
