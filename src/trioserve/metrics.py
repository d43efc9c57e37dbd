"""Prometheus metrics (prometheus-client), in one registry of trioserve's own.

docs/metrics.md is the reference of every metric here; a test holds the two together.

Under ``trioserve run --workers N`` each worker process writes its figures to files in a
directory the supervisor made (prometheus-client's multiprocess mode: the supervisor sets
``PROMETHEUS_MULTIPROC_DIR`` before the worker starts, which is when prometheus-client
chooses where values live), and whichever worker answers ``/metrics`` renders them all
(:func:`aggregate_workers`): counters and histograms summed over every worker that ever
ran, gauges as each one's ``multiprocess_mode`` says over the live workers.
"""

from __future__ import annotations

import bisect
import functools
import math
import os
import warnings
import weakref
from collections.abc import Callable, Iterator, Sequence, Sized
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest, multiprocess
from prometheus_client import values as prometheus_values
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from .ends import EndReason

REGISTRY = CollectorRegistry(auto_describe=True)

REQUESTS_IN_FLIGHT = Gauge(
    "trioserve_requests_in_flight",
    "Generation requests being served right now (submitted or about to be).",
    registry=REGISTRY,
    multiprocess_mode="livesum",
)
# Read when scraped, from the registries of in-flight requests: nothing to count (and no
# lock to take) on each request's way to the engine.
_IN_FLIGHT: weakref.WeakSet[Sized] = weakref.WeakSet()
REQUESTS_IN_FLIGHT.set_function(lambda: sum(len(r) for r in list(_IN_FLIGHT)))


def count_in_flight(registry: Sized) -> None:
    """Count ``registry`` (its ``len``) in ``trioserve_requests_in_flight`` while it lives."""
    _IN_FLIGHT.add(registry)


def sample_in_flight() -> None:
    """Write this process's in-flight count where the other workers read it.

    Across processes the gauge cannot be read when scraped (a worker cannot call another's
    function), so each worker samples it (``server/workers.py``), and the worker that
    answers ``/metrics`` samples its own first.
    """
    REQUESTS_IN_FLIGHT.set(sum(len(r) for r in list(_IN_FLIGHT)))


REQUESTS = Counter(
    "trioserve_requests",
    "Engine requests by how they ended: completed, engine_error, or the reason of an early "
    "end (disconnect, deadline, cancel, ...).",
    ["model", "route", "outcome"],
    registry=REGISTRY,
)
ENGINE_ABORTS = Counter(
    "trioserve_engine_aborts",
    "Aborts sent to engines, by why the request ended (early, or at a stop string the "
    "frontend matched).",
    ["reason"],
    registry=REGISTRY,
)


# Per request: labels() validates and takes a lock on every call; the label sets are small
# (models an engine serves, routes, outcomes and end reasons), so each child is looked up
# once.
@functools.cache
def requests_ended(model: str, route: str, outcome: str) -> Counter:
    """The ``REQUESTS`` counter of one model, route and outcome."""
    return REQUESTS.labels(model=model, route=route, outcome=outcome)


@functools.cache
def engine_aborts(reason: str) -> Counter:
    """The ``ENGINE_ABORTS`` counter of one reason."""
    return ENGINE_ABORTS.labels(reason=reason)


ENGINE_RUNNING = Gauge(
    "trioserve_engine_requests_running",
    "Requests each engine reports running in its last pong.",
    ["engine"],
    registry=REGISTRY,
    # Every worker hears the same engine's pongs: the latest is the freshest figure.
    multiprocess_mode="livemostrecent",
)
ENGINE_QUEUED = Gauge(
    "trioserve_engine_requests_queued",
    "Requests each engine reports queued in its last pong.",
    ["engine"],
    registry=REGISTRY,
    multiprocess_mode="livemostrecent",
)
ENGINE_KV_CACHE_USAGE = Gauge(
    "trioserve_engine_kv_cache_usage",
    "Fraction of its KV cache each engine reports in use in its last pong (engines that "
    "have one, e.g. vLLM).",
    ["engine"],
    registry=REGISTRY,
    multiprocess_mode="livemostrecent",
)
ENGINE_CONNECTED = Gauge(
    "trioserve_engine_connected",
    "1 while the engine at this address has completed its handshake and answers pings.",
    ["engine"],
    registry=REGISTRY,
    # With workers: 1 only while every worker's link to it is up.
    multiprocess_mode="livemin",
)
ENGINE_DRAINING = Gauge(
    "trioserve_engine_draining",
    "1 while the engine at this address says it is draining (nothing new is routed to it).",
    ["engine"],
    registry=REGISTRY,
    # With workers: 1 once any worker has heard it.
    multiprocess_mode="livemax",
)
ENGINE_GENERATION_TOKENS = Counter(
    "trioserve_engine_generation_tokens",
    "Tokens each engine generated, counted step by step as its outputs arrive (engines "
    "whose outputs carry token ids: vLLM's EngineCore on the direct path), as vLLM counts "
    "vllm:generation_tokens_total; trioserve_generation_tokens counts a request when it ends.",
    ["engine"],
    registry=REGISTRY,
)
ENGINE_FAILOVERS = Counter(
    "trioserve_engine_failovers",
    "Requests submitted to another engine before any output reached the client, by why the "
    "first engine did not serve them (draining, refused: a 503 before any output, "
    "overloaded: its link would not take the submit, engine_lost, engine_failed).",
    ["reason"],
    registry=REGISTRY,
)
FAILOVER_REASONS = ("draining", "refused", "overloaded", "engine_lost", "engine_failed")
for _reason in FAILOVER_REASONS:
    ENGINE_FAILOVERS.labels(reason=_reason)


@functools.cache
def engine_failovers(reason: str) -> Counter:
    """The ``ENGINE_FAILOVERS`` counter of one reason."""
    return ENGINE_FAILOVERS.labels(reason=reason)


ADMISSION_REFUSED = Counter(
    "trioserve_admission_refused",
    "Generation requests refused with 503 because --max-concurrent-requests were running.",
    registry=REGISTRY,
)
DRAINING = Gauge(
    "trioserve_draining",
    "1 once a drain (SIGTERM) has begun.",
    registry=REGISTRY,
    multiprocess_mode="livemax",
)

#: Every reason an abort can leave for (the end-reason table), rendered from the start.
ABORT_REASONS = tuple(EndReason)
for _reason in ABORT_REASONS:
    ENGINE_ABORTS.labels(reason=_reason)


# -- latency and token figures -------------------------------------------------------------


class FastHistogram(Collector):
    """A Prometheus histogram whose ``observe`` costs a bisection and two additions.

    prometheus-client's ``Histogram.observe`` takes a lock for its sum and one for the
    bucket (about 1.2 µs here, warm), and the inter-token latency is observed on every
    write of a stream's outputs: a few per cent of the CPU a relayed token costs. Only the
    event loop's thread observes and scrapes, so plain integers do. The exposition is the
    library's (``HistogramMetricFamily``), the same text a ``Histogram`` renders.
    """

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        buckets: Sequence[float],
        registry: CollectorRegistry = REGISTRY,
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self.bounds = tuple(buckets)
        self._children: dict[tuple[str, ...], FastHistogram.Child] = {}
        #: Under --workers: where each child's figures are written for the other workers.
        self._written: dict[tuple[str, ...], list[Any]] = {}
        registry.register(self)
        _FAST_HISTOGRAMS.append(self)

    class Child:
        __slots__ = ("bounds", "counts", "total")

        def __init__(self, bounds: tuple[float, ...]) -> None:
            self.bounds = bounds
            #: One count per bucket, the last for +Inf; not cumulative (see collect).
            self.counts = [0] * (len(bounds) + 1)
            self.total = 0.0

        def observe(self, value: float) -> None:
            self.counts[bisect.bisect_left(self.bounds, value)] += 1
            self.total += value

    def labels(self, *values: str) -> FastHistogram.Child:
        child = self._children.get(values)
        if child is None:
            if len(values) != len(self.labelnames):
                raise ValueError(f"{self.name} takes labels {self.labelnames}")
            child = self._children[values] = FastHistogram.Child(self.bounds)
        return child

    def describe(self) -> Iterator[HistogramMetricFamily]:
        yield HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for values, child in list(self._children.items()):
            running = 0
            buckets = []
            for bound, count in zip((*self.bounds, math.inf), child.counts, strict=True):
                running += count
                buckets.append((_bound_text(bound), running))
            family.add_metric(list(values), buckets, child.total)
        yield family

    def write(self) -> None:
        """Write every child's figures to this worker's file (``--workers``), as
        prometheus-client's own histogram would have: a count per bucket, and the sum."""
        for key, child in list(self._children.items()):
            written = self._written.get(key)
            if written is None:
                written = self._written[key] = [
                    prometheus_values.ValueClass(
                        "histogram",
                        self.name,
                        self.name + "_bucket",
                        (*self.labelnames, "le"),
                        (*key, _bound_text(bound)),
                        self.documentation,
                    )
                    for bound in (*self.bounds, math.inf)
                ] + [
                    prometheus_values.ValueClass(
                        "histogram",
                        self.name,
                        self.name + "_sum",
                        self.labelnames,
                        key,
                        self.documentation,
                    )
                ]
            for value, count in zip(written, (*child.counts, child.total), strict=True):
                value.set(count)


#: Every FastHistogram, for :func:`sample_histograms`.
_FAST_HISTOGRAMS: list[FastHistogram] = []


def _bound_text(bound: float) -> str:
    return "+Inf" if bound == math.inf else repr(float(bound))


# Buckets after the OpenTelemetry GenAI semantic conventions' advice for
# gen_ai.server.time_to_first_token, .time_per_output_token and .request.duration, with a
# few more below (a mock engine answers in a millisecond) and above (a long queue).
TTFT_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
TOKEN_GAP_BUCKETS = (
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
    0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
DURATION_BUCKETS = (
    0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24,
    20.48, 40.96, 81.92, 163.84, 327.68, 655.36,
)  # fmt: skip

TIME_TO_FIRST_TOKEN = FastHistogram(
    "trioserve_time_to_first_token_seconds",
    "From the client's request arriving to its first output reaching the response writer "
    "(on its way to the client when streaming), per engine request.",
    ["model", "route"],
    TTFT_BUCKETS,
)
INTER_TOKEN_LATENCY = FastHistogram(
    "trioserve_inter_token_latency_seconds",
    "Gap between two consecutive writes of a request's outputs (one token each while the "
    "frontend keeps up; outputs that arrived together are one write).",
    ["model", "route"],
    TOKEN_GAP_BUCKETS,
)
TIME_PER_OUTPUT_TOKEN = FastHistogram(
    "trioserve_time_per_output_token_seconds",
    "Per completed request: (last output - first output) / (generated tokens - 1), "
    "OpenTelemetry's gen_ai.server.time_per_output_token.",
    ["model", "route"],
    TOKEN_GAP_BUCKETS,
)
REQUEST_DURATION = FastHistogram(
    "trioserve_request_duration_seconds",
    "From the client's request arriving to the end of its engine request's response "
    "(the last byte, or the error), however it ended.",
    ["model", "route", "outcome"],
    DURATION_BUCKETS,
)
QUEUE_TIME = FastHistogram(
    "trioserve_request_queue_time_seconds",
    "Time a request waited in the engine before its generation began, as the engine "
    "reports it (the output item's queue_time; engines that do not report it add nothing).",
    ["model"],
    TTFT_BUCKETS,
)
PROMPT_TOKENS = Counter(
    "trioserve_prompt_tokens",
    "Prompt tokens of completed engine requests (the engine's usage).",
    ["model", "route"],
    registry=REGISTRY,
)
GENERATION_TOKENS = Counter(
    "trioserve_generation_tokens",
    "Generated tokens: the engine's usage for completed requests, the outputs relayed "
    "for the others.",
    ["model", "route"],
    registry=REGISTRY,
)
HTTP_REQUESTS = Counter(
    "trioserve_http_requests",
    "HTTP requests (every route, and each request on a WebSocket) by response status; "
    "499: the client left before a response began.",
    ["route", "method", "status"],
    registry=REGISTRY,
)
CLIENT_DISCONNECTS = Counter(
    "trioserve_client_disconnects",
    "Client requests whose client went away before their response ended.",
    ["route"],
    registry=REGISTRY,
)


@functools.cache
def http_requests(route: str, method: str, status: int) -> Counter:
    return HTTP_REQUESTS.labels(route=route, method=method, status=str(status))


@functools.cache
def client_disconnects(route: str) -> Counter:
    return CLIENT_DISCONNECTS.labels(route=route)


@functools.cache
def tokens(model: str, route: str) -> tuple[Counter, Counter]:
    """The prompt and generated token counters of one model and route."""
    return PROMPT_TOKENS.labels(model=model, route=route), GENERATION_TOKENS.labels(
        model=model, route=route
    )


# -- several workers (--workers) -------------------------------------------------------------


def sample_histograms() -> None:
    """Write this worker's histograms where the other workers read them: they count in
    plain integers (``FastHistogram``), which no other process can see."""
    for histogram in _FAST_HISTOGRAMS:
        histogram.write()


#: Set by :func:`aggregate_workers`: what ``/metrics`` renders, every worker's figures.
_workers_registry: CollectorRegistry | None = None

#: The gauges labelled by engine address, whose series an engine let go of takes with it
#: (``remove``: the addresses DNS no longer lists must not pile up).
_ENGINE_GAUGES = (
    ENGINE_RUNNING,
    ENGINE_QUEUED,
    ENGINE_KV_CACHE_USAGE,
    ENGINE_CONNECTED,
    ENGINE_DRAINING,
)


def forget_engine(address: str) -> None:
    """Drop the series of the engine at ``address`` (let go of for good) from /metrics."""
    for gauge in _ENGINE_GAUGES:
        try:
            gauge.remove(address)
        except KeyError:
            pass


#: prometheus-client's multiprocess mode has no annotations: what this module calls of it,
#: with the types it takes and returns (a registry or None and the directory; a collector).
_files_collector: Callable[[CollectorRegistry | None, str], Collector] = (
    multiprocess.MultiProcessCollector
)
_mark_process_dead: Callable[[int, str], None] = multiprocess.mark_process_dead


class _WorkersCollector(Collector):
    """Every worker's figures, from the files of multiprocess mode.

    prometheus-client cannot take a series out of those files (``remove`` only warns), so
    the series of engines this worker has let go of are left out here: every worker
    follows the same engines (the same DNS names), and the one that answers speaks for
    them all.
    """

    def __init__(self, directory: str) -> None:
        self.files = _files_collector(None, directory)
        self.engine_gauges = {gauge._name for gauge in _ENGINE_GAUGES}

    def collect(self) -> Iterator[Metric]:
        # A gauge's children by label values (the engine's address), kept by the library.
        known = {key[0] for gauge in _ENGINE_GAUGES for key in list(gauge._metrics)}
        for family in self.files.collect():
            if family.name in self.engine_gauges:
                family.samples = [s for s in family.samples if s.labels.get("engine") in known]
            yield family


def aggregate_workers(directory: str) -> None:
    """Render every worker's figures from ``directory`` (this process is a worker of
    ``--workers N``, started with ``PROMETHEUS_MULTIPROC_DIR`` set to it), and count this
    worker's start in ``trioserve_worker_starts``: more starts than workers are restarts."""
    global _workers_registry
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR") != directory:
        # prometheus-client chose where values live when it was imported: too late now.
        raise RuntimeError("a worker's PROMETHEUS_MULTIPROC_DIR must be set before it starts")
    registry = CollectorRegistry()
    registry.register(_WorkersCollector(directory))
    _workers_registry = registry
    # What remove() cannot do in the files, _WorkersCollector does: no warning each time.
    warnings.filterwarnings("ignore", "Removal of labels has not been implemented", UserWarning)
    Counter(
        "trioserve_worker_starts",
        "Worker processes started (--workers): the worker count, plus one per restart.",
        registry=None,  # its value lives in the directory, as every other one's does
    ).inc()


def sample_worker() -> None:
    """What a worker writes for the others to read: its in-flight count and histograms."""
    sample_in_flight()
    sample_histograms()


def forget_worker(directory: str, pid: int) -> None:
    """Worker ``pid`` is gone: its gauges leave the figures (its counts stay in the sums)."""
    _mark_process_dead(pid, directory)


def render() -> tuple[bytes, str]:
    """The exposition text and its content type."""
    if _workers_registry is not None:
        sample_worker()
        return generate_latest(_workers_registry), CONTENT_TYPE_LATEST
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST
