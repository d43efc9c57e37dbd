"""The Kubernetes manifests, checked for structure and timing (no cluster runs here).

Arguments are parsed with the CLI's own parser, so a manifest cannot name an option the
CLI does not have, and the timing rules use the values the pods will really run with.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import yaml

from trioserve import metrics
from trioserve.cli import build_parser
from trioserve.config import Settings
from trioserve.server.frontend import hard_stop_after

DEPLOY = Path(__file__).parent.parent / "deploy" / "kubernetes"
#: Seconds of slack required beyond what the timing rules add up (the supervisor's own
#: exit, and a mock engine's, after the workers').
MARGIN = 5


def parse(argv: list[str]) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def documents() -> dict[tuple[str, str], dict]:
    """What ``kubectl apply -f deploy/kubernetes/`` applies (monitoring/ is apart)."""
    docs = {}
    for path in sorted(DEPLOY.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            docs[(doc["kind"], doc["metadata"]["name"])] = doc
    return docs


@pytest.fixture(scope="module")
def docs():
    return documents()


def container(workload: dict) -> dict:
    [only] = workload["spec"]["template"]["spec"]["containers"]
    return only


def port_number(c: dict, name_or_number: str | int) -> int:
    if isinstance(name_or_number, int):
        return name_or_number
    [port] = [p for p in c["ports"] if p["name"] == name_or_number]
    return port["containerPort"]


def frontend_args(docs) -> argparse.Namespace:
    return parse(container(docs[("Deployment", "trioserve")])["args"])


def engine_args(docs) -> argparse.Namespace:
    return parse(container(docs[("Deployment", "trioserve-engine")])["args"])


def longest_request(args: argparse.Namespace) -> float:
    """The longest a generation request may run on this frontend: its deadline, or a
    client's X-Request-Timeout up to --max-request-timeout."""
    assert args.request_timeout > 0, "--request-timeout 0: requests without a deadline"
    return max(args.request_timeout, args.max_request_timeout)


# -- the frontend ----------------------------------------------------------------------------


def test_frontend_rolls_with_max_unavailable_zero(docs):
    strategy = docs[("Deployment", "trioserve")]["spec"]["strategy"]
    assert strategy["type"] == "RollingUpdate"
    assert strategy["rollingUpdate"]["maxUnavailable"] == 0
    assert strategy["rollingUpdate"]["maxSurge"] >= 1


def test_frontend_probes_and_ports_match_the_cli(docs):
    frontend = container(docs[("Deployment", "trioserve")])
    args = frontend_args(docs)
    assert args.command == "run"
    assert port_number(frontend, "http") == args.port
    assert args.host == "0.0.0.0"
    ready, live = frontend["readinessProbe"]["httpGet"], frontend["livenessProbe"]["httpGet"]
    assert ready["path"] == "/health" and live["path"] == "/live"
    assert port_number(frontend, ready["port"]) == port_number(frontend, live["port"]) == args.port


def test_frontend_runs_a_worker_per_core_it_requests(docs):
    frontend = container(docs[("Deployment", "trioserve")])
    assert frontend_args(docs).workers == int(frontend["resources"]["requests"]["cpu"]) > 1
    # A CPU limit is a CFS quota, which stalls every stream at once when it throttles.
    assert "cpu" not in frontend["resources"].get("limits", {})


def test_a_frontend_drain_lets_every_admitted_request_run_to_its_deadline(docs):
    args = frontend_args(docs)
    # A request admitted just before the listener closes (drain delay) still has its whole
    # deadline before the grace period (counted from the signal) ends it.
    assert args.graceful_timeout >= args.drain_delay + longest_request(args)


def test_termination_grace_covers_prestop_and_the_drain_to_the_hard_stop(docs):
    # cli.GRACE_RULE, in numbers: the server's hard stop comes hard_stop_after() seconds
    # after the listener closes, which is drain_delay seconds after the signal.
    pod = docs[("Deployment", "trioserve")]["spec"]["template"]["spec"]
    frontend = container(docs[("Deployment", "trioserve")])
    args = frontend_args(docs)
    pre_stop = frontend["lifecycle"]["preStop"]["sleep"]["seconds"]
    settings = Settings(drain_delay=args.drain_delay, graceful_timeout=args.graceful_timeout)
    needed = pre_stop + args.drain_delay + hard_stop_after(settings)
    assert pod["terminationGracePeriodSeconds"] > needed + MARGIN


def test_readiness_turns_red_well_within_the_drain_delay(docs):
    frontend = container(docs[("Deployment", "trioserve")])
    args = frontend_args(docs)
    probe = frontend["readinessProbe"]
    assert probe["periodSeconds"] * probe["failureThreshold"] < args.drain_delay


def test_services_select_their_pods_and_target_real_ports(docs):
    for service, workload in [
        (("Service", "trioserve"), ("Deployment", "trioserve")),
        (("Service", "trioserve-engine"), ("Deployment", "trioserve-engine")),
    ]:
        spec = docs[service]["spec"]
        labels = docs[workload]["spec"]["template"]["metadata"]["labels"]
        assert spec["selector"].items() <= labels.items()
        assert docs[workload]["spec"]["selector"]["matchLabels"].items() <= labels.items()
        c = container(docs[workload])
        for port in spec["ports"]:
            port_number(c, port["targetPort"])  # raises if the container has no such port


# -- the engines -----------------------------------------------------------------------------


def test_frontend_finds_every_engine_by_the_headless_service(docs):
    [address] = frontend_args(docs).engine
    assert address.startswith("dns://")
    name, port = address.removeprefix("dns://").rsplit(":", 1)
    service = docs[("Service", name)]["spec"]
    assert service["clusterIP"] == "None"  # one DNS record per engine pod, not one VIP
    [service_port] = [p for p in service["ports"] if p["port"] == int(port)]
    engine = container(docs[("Deployment", "trioserve-engine")])
    args = engine_args(docs)
    assert args.command == "engine" and args.engine_kind == "mock"
    bind_port = int(args.bind.rsplit(":", 1)[1])
    assert port_number(engine, service_port["targetPort"]) == bind_port
    assert args.bind.startswith("tcp://0.0.0.0:")


def test_an_engine_drain_outlasts_every_request_and_the_kubelet_waits_for_it(docs):
    pod = docs[("Deployment", "trioserve-engine")]["spec"]["template"]["spec"]
    engine = container(docs[("Deployment", "trioserve-engine")])
    grace = engine_args(docs).grace_period
    # What an engine runs when told to drain ends within a frontend's deadline, at most.
    assert grace >= longest_request(frontend_args(docs))
    # No preStop sleep: the engine tells its frontends itself; a sleep would only delay it.
    assert "lifecycle" not in engine
    assert pod["terminationGracePeriodSeconds"] > grace + MARGIN


def test_engines_roll_one_at_a_time_and_are_listed_once_they_serve(docs):
    deployment = docs[("Deployment", "trioserve-engine")]["spec"]
    assert deployment["replicas"] >= 2
    rolling = deployment["strategy"]["rollingUpdate"]
    assert rolling["maxUnavailable"] + rolling["maxSurge"] == 1
    engine = container(docs[("Deployment", "trioserve-engine")])
    probe = engine["readinessProbe"]["tcpSocket"]
    assert port_number(engine, probe["port"]) == int(engine_args(docs).bind.rsplit(":", 1)[1])


# -- disruptions and scaling -----------------------------------------------------------------


def test_evictions_take_one_frontend_at_a_time_and_never_the_last(docs):
    budget = docs[("PodDisruptionBudget", "trioserve")]["spec"]
    labels = docs[("Deployment", "trioserve")]["spec"]["template"]["metadata"]["labels"]
    assert budget["selector"]["matchLabels"].items() <= labels.items()
    assert budget["maxUnavailable"] == 1
    assert docs[("HorizontalPodAutoscaler", "trioserve")]["spec"]["minReplicas"] > 1


def test_the_autoscaler_scales_on_in_flight_requests_before_admission_refuses_them(docs):
    hpa = docs[("HorizontalPodAutoscaler", "trioserve")]["spec"]
    target = hpa["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", "trioserve")
    # The autoscaler owns the count: a replicas field would reset it at every apply.
    assert "replicas" not in docs[("Deployment", "trioserve")]["spec"]
    [metric] = hpa["metrics"]
    assert metric["type"] == "Pods"
    assert metric["pods"]["metric"]["name"] == metrics.REQUESTS_IN_FLIGHT._name
    args = frontend_args(docs)
    per_pod = float(metric["pods"]["target"]["averageValue"])
    # Admission is per worker (each is a whole frontend).
    assert 0 < per_pod < args.workers * args.max_concurrent_requests
    assert hpa["minReplicas"] <= hpa["maxReplicas"]
    # A scale-down drains a pod: slower than a scale-up.
    behavior = hpa["behavior"]
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] > 0
    assert behavior["scaleUp"]["stabilizationWindowSeconds"] == 0


def test_the_adapter_rule_serves_the_metric_the_autoscaler_asks_for(docs):
    values = yaml.safe_load((DEPLOY / "monitoring" / "prometheus-adapter-values.yaml").read_text())
    wanted = docs[("HorizontalPodAutoscaler", "trioserve")]["spec"]["metrics"][0]["pods"]
    [rule] = values["rules"]["custom"]
    assert rule["seriesQuery"].startswith(metrics.REQUESTS_IN_FLIGHT._name + "{")
    assert rule["name"]["as"] == wanted["metric"]["name"]
    overrides = rule["resources"]["overrides"]
    assert overrides == {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}
    assert "<<.Series>>" in rule["metricsQuery"] and "<<.GroupBy>>" in rule["metricsQuery"]


def test_the_pod_monitor_scrapes_every_frontends_metrics(docs):
    pod_monitor = yaml.safe_load((DEPLOY / "monitoring" / "podmonitor.yaml").read_text())
    assert (pod_monitor["kind"], pod_monitor["metadata"]["name"]) == ("PodMonitor", "trioserve")
    spec = pod_monitor["spec"]
    labels = docs[("Deployment", "trioserve")]["spec"]["template"]["metadata"]["labels"]
    assert spec["selector"]["matchLabels"].items() <= labels.items()
    [endpoint] = spec["podMetricsEndpoints"]
    frontend = container(docs[("Deployment", "trioserve")])
    assert port_number(frontend, endpoint["port"]) == frontend_args(docs).port
    assert endpoint["path"] == "/metrics"
    annotations = docs[("Deployment", "trioserve")]["spec"]["template"]["metadata"]["annotations"]
    assert int(annotations["prometheus.io/port"]) == frontend_args(docs).port
