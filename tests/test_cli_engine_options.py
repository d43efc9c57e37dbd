"""The engine options of issue 21 on the command line: dns:// engines, the resolver,
routing, and the engine's drain and prefix cache."""

from __future__ import annotations

import pytest

from trioserve.cli import build_parser


def test_dns_engines_sit_beside_fixed_ones_with_their_defaults():
    args = build_parser().parse_args(
        ["run", "--engine", "tcp://10.0.0.5:5555", "--engine", "dns://engines.ns.svc:5555"]
    )
    assert args.engine == ["tcp://10.0.0.5:5555", "dns://engines.ns.svc:5555"]
    assert (args.engine_refresh, args.engine_dns_server) == (5.0, None)
    assert (args.routing, args.affinity_load_factor) == ("least-load", 1.25)


def test_routing_and_resolver_options():
    args = build_parser().parse_args(
        ["run", "--routing", "affinity", "--affinity-load-factor", "2", "--engine-refresh",
         "0.5", "--engine-dns-server", "127.0.0.1:5353"]
    )  # fmt: skip
    assert (args.routing, args.affinity_load_factor) == ("affinity", 2.0)
    assert (args.engine_refresh, args.engine_dns_server) == (0.5, "127.0.0.1:5353")


@pytest.mark.parametrize(
    ("option", "value", "says"),
    [
        ("--engine", "dns://engines", "dns://NAME:PORT"),
        ("--engine", "dns://engines:99999", "dns://NAME:PORT"),
        ("--engine-dns-server", "dns.example:53", "IP address"),
        ("--routing", "random", "invalid choice"),
        ("--affinity-load-factor", "0.5", "1 or more"),
        ("--engine-refresh", "0", "must be positive"),
    ],
)
def test_bad_values_are_refused_when_parsed(capsys, option, value, says):
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["run", option, value])
    assert exit_.value.code == 2 and says in capsys.readouterr().err


def test_the_mock_engine_takes_a_grace_period_and_a_prefix_cache():
    args = build_parser().parse_args(["engine", "mock"])
    assert (args.grace_period, args.prefix_cache) == (30.0, 0)
    args = build_parser().parse_args(
        ["engine", "mock", "--grace-period", "0", "--prefix-cache", "512"]
    )
    assert (args.grace_period, args.prefix_cache) == (0.0, 512)
