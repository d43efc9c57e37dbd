"""The shared vLLM engine's engine-clock figures, as vLLM's output processor counts them
(``vllm/v1/metrics/stats.py``): one inter-token latency per output after the first, and a
finished request's queue, prefill, decode and inference times and time per output token,
from its events and the timestamps of the batches its outputs came in."""

from __future__ import annotations

import prometheus_client
import pytest

from trioserve.engine_programs.vllm_figures import EngineFigures
from trioserve.enginecore import codec
from trioserve.enginecore.events import RequestTimes


def sums(figures: EngineFigures) -> dict[str, tuple[float, float]]:
    """Each histogram's (count, sum)."""
    text = prometheus_client.generate_latest(figures.registry).decode()
    found: dict[str, list[float]] = {}
    for line in text.splitlines():
        name, value = line.partition("{")[0], line.rsplit(" ", 1)[-1]
        for suffix, slot in (("_count", 0), ("_sum", 1)):
            if name.startswith("vllm:") and name.endswith(suffix):
                found.setdefault(name.removesuffix(suffix), [0.0, 0.0])[slot] = float(value)
    return {name: (count, total) for name, (count, total) in found.items()}


def test_a_finished_request_is_counted_as_vllm_counts_it():
    figures = EngineFigures("m")
    times = RequestTimes()
    times.update([codec.EngineCoreEvent(1, 10.0), codec.EngineCoreEvent(2, 10.5)])
    for stamp in (11.0, 11.25, 11.75, 12.0):  # four outputs: the first is the prefill's
        figures.output(times, stamp)
    figures.completed("length", times, arrival=0.0, generated=5)
    got = sums(figures)
    assert got["vllm:inter_token_latency_seconds"] == (3, pytest.approx(1.0))
    assert got["vllm:request_queue_time_seconds"] == (1, pytest.approx(0.5))
    assert got["vllm:request_prefill_time_seconds"] == (1, pytest.approx(0.5))
    assert got["vllm:request_decode_time_seconds"] == (1, pytest.approx(1.0))
    assert got["vllm:request_inference_time_seconds"] == (1, pytest.approx(1.5))
    # Decode over the tokens after the first: 1.0 s / 4.
    assert got["vllm:request_time_per_output_token_seconds"] == (1, pytest.approx(0.25))
    assert got["vllm:e2e_request_latency_seconds"][0] == 1
    assert figures.finished["length"] == 1


def test_without_the_engines_events_only_the_gaps_are_counted():
    # EngineCore sends no events with --disable-log-stats: no phase can be told, and
    # none is made up; the gaps between outputs still are the engine's.
    figures = EngineFigures("m")
    times = RequestTimes()
    for stamp in (5.0, 5.5):
        figures.output(times, stamp)
    figures.completed("stop", times, arrival=0.0, generated=2)
    got = sums(figures)
    assert got["vllm:inter_token_latency_seconds"] == (1, pytest.approx(0.5))
    for phase in ("prefill", "decode", "inference", "queue"):
        assert got[f"vllm:request_{phase}_time_seconds"] == (0, 0)
    assert got["vllm:request_time_per_output_token_seconds"] == (0, 0)


def test_a_one_token_answer_has_no_gap_and_no_time_per_token():
    figures = EngineFigures("m")
    times = RequestTimes()
    times.update([codec.EngineCoreEvent(1, 1.0), codec.EngineCoreEvent(2, 1.0)])
    figures.output(times, 2.0)
    figures.completed("length", times, arrival=0.0, generated=1)
    got = sums(figures)
    assert got["vllm:inter_token_latency_seconds"] == (0, 0)
    assert got["vllm:request_decode_time_seconds"] == (1, 0)
    assert got["vllm:request_time_per_output_token_seconds"] == (1, 0)  # vLLM observes 0
