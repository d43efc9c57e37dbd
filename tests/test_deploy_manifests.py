"""The Kubernetes manifests, checked for structure and timing (no cluster runs here).

Arguments are parsed with the CLI's own parser, so a manifest cannot name an option the
CLI does not have, and the timing rule uses the values the pods will really run with.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from trioserve.cli import build_parser
from trioserve.config import Settings
from trioserve.server.frontend import hard_stop_after

DEPLOY = Path(__file__).parent.parent / "deploy" / "kubernetes"


def documents() -> dict[tuple[str, str], dict]:
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


def test_frontend_rolls_with_max_unavailable_zero(docs):
    strategy = docs[("Deployment", "trioserve")]["spec"]["strategy"]
    assert strategy["type"] == "RollingUpdate"
    assert strategy["rollingUpdate"]["maxUnavailable"] == 0
    assert strategy["rollingUpdate"]["maxSurge"] >= 1


def test_frontend_probes_and_ports_match_the_cli(docs):
    frontend = container(docs[("Deployment", "trioserve")])
    args = build_parser().parse_args(frontend["args"])
    assert args.command == "run"
    assert port_number(frontend, "http") == args.port
    assert args.host == "0.0.0.0"
    ready, live = frontend["readinessProbe"]["httpGet"], frontend["livenessProbe"]["httpGet"]
    assert ready["path"] == "/health" and live["path"] == "/live"
    assert port_number(frontend, ready["port"]) == port_number(frontend, live["port"]) == args.port


def test_termination_grace_covers_prestop_and_the_drain_to_the_hard_stop(docs):
    # cli.GRACE_RULE, in numbers: the server's hard stop comes hard_stop_after() seconds
    # after the listener closes, which is drain_delay seconds after the signal.
    pod = docs[("Deployment", "trioserve")]["spec"]["template"]["spec"]
    frontend = container(docs[("Deployment", "trioserve")])
    args = build_parser().parse_args(frontend["args"])
    pre_stop = frontend["lifecycle"]["preStop"]["sleep"]["seconds"]
    settings = Settings(drain_delay=args.drain_delay, graceful_timeout=args.graceful_timeout)
    needed = pre_stop + args.drain_delay + hard_stop_after(settings)
    assert pod["terminationGracePeriodSeconds"] > needed


def test_readiness_turns_red_well_within_the_drain_delay(docs):
    frontend = container(docs[("Deployment", "trioserve")])
    args = build_parser().parse_args(frontend["args"])
    probe = frontend["readinessProbe"]
    assert probe["periodSeconds"] * probe["failureThreshold"] < args.drain_delay


def test_services_select_their_pods_and_target_real_ports(docs):
    for service, workload in [
        (("Service", "trioserve"), ("Deployment", "trioserve")),
        (("Service", "trioserve-engine"), ("StatefulSet", "trioserve-engine")),
    ]:
        spec = docs[service]["spec"]
        labels = docs[workload]["spec"]["template"]["metadata"]["labels"]
        assert spec["selector"].items() <= labels.items()
        c = container(docs[workload])
        for port in spec["ports"]:
            port_number(c, port["targetPort"])  # raises if the container has no such port


def test_frontend_connects_to_the_engine_the_manifests_define(docs):
    frontend = build_parser().parse_args(container(docs[("Deployment", "trioserve")])["args"])
    engine_set = docs[("StatefulSet", "trioserve-engine")]
    engine = build_parser().parse_args(container(engine_set)["args"])
    assert engine.command == "engine" and engine.engine_kind == "mock"
    bind_port = int(engine.bind.rsplit(":", 1)[1])
    service = engine_set["spec"]["serviceName"]
    assert frontend.engine == [f"tcp://{engine_set['metadata']['name']}-0.{service}:{bind_port}"]
    assert docs[("Service", service)]["spec"]["clusterIP"] == "None"
