"""metrics.py under ``--workers``: every worker's figures from the files of
prometheus-client's multiprocess mode.

That mode is chosen when prometheus-client is imported, so each "worker" here is a Python
process started with ``PROMETHEUS_MULTIPROC_DIR`` set, as the supervisor starts them.
"""

from __future__ import annotations

import os
import subprocess
import sys

from prometheus_client.parser import text_string_to_metric_families

#: One worker's life: an engine kept and one let go of, two first tokens observed, the
#: figures rendered as the worker that answers /metrics would.
WORKER = """
import os, sys
from trioserve import metrics

metrics.aggregate_workers(os.environ["PROMETHEUS_MULTIPROC_DIR"])
for address in ("tcp://kept:1", "tcp://gone:1"):
    metrics.ENGINE_CONNECTED.labels(engine=address).set(1)
metrics.ENGINE_CONNECTED.remove("tcp://gone:1")
ttft = metrics.TIME_TO_FIRST_TOKEN.labels("mock", "/v1/completions")
ttft.observe(0.003)
ttft.observe(0.5)
sys.stdout.write(metrics.render()[0].decode())
"""


def run_worker(directory: str) -> tuple[dict[tuple[str, frozenset], float], str]:
    done = subprocess.run(
        [sys.executable, "-c", WORKER],
        env={**os.environ, "PROMETHEUS_MULTIPROC_DIR": directory},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    samples = {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(done.stdout)
        for s in family.samples
    }
    return samples, done.stderr


TTFT = "trioserve_time_to_first_token_seconds"
LABELS = {"model": "mock", "route": "/v1/completions"}


def sample(name: str, **labels: str) -> tuple[str, frozenset]:
    return name, frozenset(labels.items())


def test_the_histograms_of_every_worker_are_summed(tmp_path):
    run_worker(str(tmp_path))
    samples, _ = run_worker(str(tmp_path))  # a second worker: the first one's counts stay
    assert samples[sample(f"{TTFT}_count", **LABELS)] == 4
    assert samples[sample(f"{TTFT}_sum", **LABELS)] == 2 * 0.503
    assert samples[sample(f"{TTFT}_bucket", le="0.0025", **LABELS)] == 0
    assert samples[sample(f"{TTFT}_bucket", le="0.005", **LABELS)] == 2
    assert samples[sample(f"{TTFT}_bucket", le="+Inf", **LABELS)] == 4
    assert samples[sample("trioserve_worker_starts_total")] == 2


def test_an_engine_let_go_of_leaves_metrics_though_its_series_stay_in_the_files(tmp_path):
    samples, stderr = run_worker(str(tmp_path))
    engines = {
        dict(labels)["engine"] for (name, labels) in samples if name == "trioserve_engine_connected"
    }
    assert engines == {"tcp://kept:1"}
    assert "Removal of labels" not in stderr  # handled, not warned about at each let-go
