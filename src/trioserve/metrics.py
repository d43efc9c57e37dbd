"""Prometheus metrics (prometheus-client), in one registry of trioserve's own."""

from __future__ import annotations

import functools
import weakref
from collections.abc import Sized

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

REGISTRY = CollectorRegistry(auto_describe=True)

REQUESTS_IN_FLIGHT = Gauge(
    "trioserve_requests_in_flight",
    "Generation requests being served right now (submitted or about to be).",
    registry=REGISTRY,
)
# Read when scraped, from the registries of in-flight requests: nothing to count (and no
# lock to take) on each request's way to the engine.
_IN_FLIGHT: weakref.WeakSet[Sized] = weakref.WeakSet()
REQUESTS_IN_FLIGHT.set_function(lambda: sum(len(r) for r in list(_IN_FLIGHT)))


def count_in_flight(registry: Sized) -> None:
    """Count ``registry`` (its ``len``) in ``trioserve_requests_in_flight`` while it lives."""
    _IN_FLIGHT.add(registry)


REQUESTS = Counter(
    "trioserve_requests",
    "Generation requests by how they ended.",
    ["outcome"],
    registry=REGISTRY,
)
ENGINE_ABORTS = Counter(
    "trioserve_engine_aborts",
    "Aborts sent to engines, by why the request ended early.",
    ["reason"],
    registry=REGISTRY,
)


# Per request: labels() validates and takes a lock on every call; the label sets are small
# and fixed (outcomes and end reasons), so each child is looked up once.
@functools.cache
def requests_ended(outcome: str) -> Counter:
    """The ``REQUESTS`` counter of one outcome."""
    return REQUESTS.labels(outcome=outcome)


@functools.cache
def engine_aborts(reason: str) -> Counter:
    """The ``ENGINE_ABORTS`` counter of one reason."""
    return ENGINE_ABORTS.labels(reason=reason)


ENGINE_RUNNING = Gauge(
    "trioserve_engine_requests_running",
    "Requests each engine reports running in its last pong.",
    ["engine"],
    registry=REGISTRY,
)
ENGINE_QUEUED = Gauge(
    "trioserve_engine_requests_queued",
    "Requests each engine reports queued in its last pong.",
    ["engine"],
    registry=REGISTRY,
)
ENGINE_KV_CACHE_USAGE = Gauge(
    "trioserve_engine_kv_cache_usage",
    "Fraction of its KV cache each engine reports in use in its last pong (engines that "
    "have one, e.g. vLLM).",
    ["engine"],
    registry=REGISTRY,
)
ENGINE_CONNECTED = Gauge(
    "trioserve_engine_connected",
    "1 while the engine at this address has completed its handshake and answers pings.",
    ["engine"],
    registry=REGISTRY,
)
ADMISSION_REFUSED = Counter(
    "trioserve_admission_refused",
    "Generation requests refused with 503 because --max-concurrent-requests were running.",
    registry=REGISTRY,
)
DRAINING = Gauge("trioserve_draining", "1 once a drain (SIGTERM) has begun.", registry=REGISTRY)

ABORT_REASONS = (
    "disconnect",
    "deadline",
    "engine_lost",
    "cancel",
    "slow_client",
    "drain",
    "abandoned",
    "response_too_large",
    "bad_engine_output",
)
for _reason in ABORT_REASONS:
    ENGINE_ABORTS.labels(reason=_reason)


def render() -> tuple[bytes, str]:
    """The exposition text and its content type."""
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST
