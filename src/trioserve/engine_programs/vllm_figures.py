"""The shared vLLM engine's figures (``vllm_enginecore.py``), under vLLM's own Prometheus
names, for ``--metrics-port``: what dashboards and the tests read of ``vllm serve``.

- The scheduler's gauges (``vllm:num_requests_running``, ``..._waiting``,
  ``vllm:kv_cache_usage_perc``) and prefix-cache counters are the ``SchedulerStats``
  EngineCore sends with a step's outputs: vLLM's own count, not trioserve's.
- Requests by finish reason (``vllm:request_success_total``), tokens, time to first token,
  end-to-end latency, and the engine-clock figures (queue time from the QUEUED and
  SCHEDULED events; prefill, decode and inference times, time per output token and
  inter-token latency from the timestamp of the batch each output came in) are counted
  from EngineCore's outputs, where vLLM's output processor counts them in its API server:
  an abort of ours is ``abort``, a stop string matched here ``stop``; wall-clock times run
  from the ADD (vLLM's ``arrival_time``).
- The SDK's account of the requests it served (``trioserve_engine_*_total``).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import attrs
import prometheus_client
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ..enginecore import codec
from ..enginecore.events import RequestTimes
from ..sdk.core import EngineLoad, Stats

log = logging.getLogger(__name__)

#: vLLM's buckets (``vllm/v1/metrics/buckets.py``), so that the histograms read alike.
TIME_TO_FIRST_TOKEN_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
INTER_TOKEN_LATENCY_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
)  # fmt: skip
REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip


class EngineFigures:
    """One engine's figures; :attr:`registry` is what ``--metrics-port`` serves."""

    REASONS = codec.FINISH_REASON_NAMES

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self.running = 0
        self.waiting = 0
        self.kv_cache_usage = 0.0
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0
        self.finished = dict.fromkeys(self.REASONS, 0)
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.stats: Stats | None = None  # the SDK's, once it serves
        self.registry = prometheus_client.CollectorRegistry(auto_describe=True)
        latency, tokens = REQUEST_LATENCY_BUCKETS, INTER_TOKEN_LATENCY_BUCKETS
        histogram = self._histogram
        self.time_to_first_token = histogram(
            "time_to_first_token", "time to first token in seconds", TIME_TO_FIRST_TOKEN_BUCKETS
        )
        self.queue_time = histogram(
            "request_queue_time", "time spent in WAITING phase for request", latency
        )
        self.e2e_latency = histogram(
            "e2e_request_latency", "e2e request latency in seconds", latency
        )
        self.inter_token_latency = histogram(
            "inter_token_latency", "inter-token latency in seconds", tokens
        )
        self.time_per_output_token = histogram(
            "request_time_per_output_token", "time_per_output_token_seconds per request", tokens
        )
        self.phases = [
            histogram(f"request_{phase}_time", f"time spent in {state} phase for request", latency)
            for phase, state in (("prefill", "PREFILL"), ("decode", "DECODE"),
                                 ("inference", "RUNNING"))
        ]  # fmt: skip
        self.registry.register(_Collector(self))

    def _histogram(self, name: str, what: str, buckets: tuple[float, ...]) -> Any:
        """vLLM's histogram ``vllm:<name>_seconds`` (its help text "Histogram of <what>."),
        of this engine's model."""
        return prometheus_client.Histogram(
            f"vllm:{name}_seconds",
            f"Histogram of {what}.",
            ["model_name", "engine"],
            buckets=buckets,
            registry=self.registry,
        ).labels(self.model_name, "0")

    def on_stats(self, stats: codec.SchedulerStats) -> None:
        self.running = stats.num_running_reqs
        self.waiting = stats.num_waiting_reqs + stats.num_skipped_waiting_reqs
        self.kv_cache_usage = stats.kv_cache_usage
        self.prefix_cache_queries += stats.prefix_cache_stats.queries
        self.prefix_cache_hits += stats.prefix_cache_stats.hits

    def ended(self, reason: str) -> None:
        self.finished[reason] = self.finished.get(reason, 0) + 1

    def output(self, times: RequestTimes, timestamp: float) -> None:
        """An output of a request, in the engine's batch of ``timestamp``: the gap since its
        previous one is an inter-token latency, as vLLM's output processor counts it."""
        gap = times.output(timestamp)
        if gap is not None:
            self.inter_token_latency.observe(gap)

    def completed(self, reason: str, times: RequestTimes, arrival: float, generated: int) -> None:
        """A request ended by the engine or a stop string (not aborted), ``arrival`` its
        ADD's wall-clock time: its end-to-end, queue, prefill, decode and inference times
        and its time per output token, as vLLM observes them for a finished request."""
        self.ended(reason)
        self.e2e_latency.observe(time.time() - arrival)
        queue_time = times.queue_time
        if queue_time is not None:
            self.queue_time.observe(queue_time)
        phases = times.phases()
        if phases is not None:
            for histogram, seconds in zip(self.phases, phases, strict=True):
                histogram.observe(seconds)
            decode = phases[1]
            self.time_per_output_token.observe(decode / (generated - 1) if generated > 1 else 0.0)

    def load(self) -> EngineLoad:
        return EngineLoad(self.running, self.waiting, self.kv_cache_usage)

    def collect(self) -> Any:
        labels = ["model_name", "engine"]
        values = [self.model_name, "0"]
        for name, doc, gauge_value in (
            ("num_requests_running", "Number of requests in model execution batches.",
             self.running),
            ("num_requests_waiting", "Number of requests waiting to be processed.",
             self.waiting),
            ("kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
             self.kv_cache_usage),
        ):  # fmt: skip
            gauge = GaugeMetricFamily(f"vllm:{name}", doc, labels=labels)
            gauge.add_metric(values, gauge_value)
            yield gauge
        for name, doc, count in (
            ("prompt_tokens", "Number of prefill tokens processed.", self.prompt_tokens),
            ("generation_tokens", "Number of generation tokens processed.", self.generation_tokens),
            ("prefix_cache_queries", "Prefix cache queries, in tokens.", self.prefix_cache_queries),
            ("prefix_cache_hits", "Prefix cache hits, in tokens.", self.prefix_cache_hits),
        ):  # fmt: skip
            counter = CounterMetricFamily(f"vllm:{name}", doc, labels=labels)
            counter.add_metric(values, count)
            yield counter
        success = CounterMetricFamily(
            "vllm:request_success",
            "Count of successfully processed requests.",
            labels=[*labels, "finished_reason"],
        )
        for reason, count in self.finished.items():
            success.add_metric([*values, reason], count)
        yield success
        if self.stats is not None:
            for name, value in attrs.asdict(self.stats).items():
                yield CounterMetricFamily(
                    f"trioserve_engine_{name}", f"{name} (the engine SDK's Stats)", value=value
                )


class _Collector:
    def __init__(self, figures: EngineFigures) -> None:
        self.figures = figures

    def collect(self) -> Any:
        return self.figures.collect()


def serve_metrics(port: int, figures: EngineFigures, stats: Stats) -> None:
    """Serve ``figures`` and the SDK's ``stats`` on 127.0.0.1:``port`` (a thread of
    prometheus_client's; 0: any free port, logged)."""
    figures.stats = stats
    server, _thread = prometheus_client.start_http_server(
        port, addr="127.0.0.1", registry=figures.registry
    )
    log.info("metrics on http://127.0.0.1:%d/metrics", server.server_port)


__all__ = ["EngineFigures", "serve_metrics"]
