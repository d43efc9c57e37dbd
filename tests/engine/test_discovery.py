"""Engines found by DNS: a DNS server run by the test on 127.0.0.1 answers, the test
changes its answers, and the engine client's connections follow. Engines listen on
127.0.0.2 and 127.0.0.3 (loopback too) with one port, as pods of a headless Service do."""

from __future__ import annotations

import socket
from functools import partial

import pytest
import trio

from tests.helpers.dns_server import start_dns_server
from tests.helpers.frontends import start_engine
from tests.helpers.waiting import wait_until
from trioserve import metrics
from trioserve.ends import EndReason
from trioserve.engine.discovery import (
    Discovery,
    NameserverResolver,
    SystemResolver,
    engine_address,
    make_resolver,
    parse_dns,
    parse_server,
)
from trioserve.engine_programs.mock import MockBackend, expected_text
from trioserve.links.protocol_client import open_protocol_client
from trioserve.protocol import Submit
from trioserve.sdk import serve_engine

NAME = "engines.trioserve.test"
REFRESH = 0.05


def test_dns_addresses_are_parsed_and_bad_ones_refused():
    assert parse_dns("tcp://127.0.0.1:5555") is None
    dns = parse_dns("dns://engines.ns.svc.cluster.local:5555")
    assert dns is not None and (dns.name, dns.port) == ("engines.ns.svc.cluster.local", 5555)
    for bad in (
        "dns://engines",
        "dns://:5555",
        "dns://engines:0",
        "dns://engines:x",
        "dns://a/b:1",
    ):
        with pytest.raises(ValueError, match="dns://NAME:PORT"):
            parse_dns(bad)
    assert parse_server("10.0.0.10") == ("10.0.0.10", 53)
    assert parse_server("127.0.0.1:5353") == ("127.0.0.1", 5353)
    assert parse_server("[::1]:5353") == ("::1", 5353)
    for bad in ("dns.example:53", "127.0.0.1:0", "[::1]x"):
        with pytest.raises(ValueError):
            parse_server(bad)
    assert engine_address("10.1.2.3", 5555) == "tcp://10.1.2.3:5555"
    assert engine_address("fd00::1", 5555) == "tcp://[fd00::1]:5555"
    assert isinstance(make_resolver(""), SystemResolver)
    assert isinstance(make_resolver("127.0.0.1:53"), NameserverResolver)


async def test_a_dns_server_s_answers_are_every_address_or_none(nursery):
    dns = await start_dns_server(nursery, **{NAME: ["127.0.0.2", "::1", "127.0.0.3"]})
    resolver = NameserverResolver("127.0.0.1", dns.port)
    assert sorted(await resolver.resolve(NAME)) == ["127.0.0.2", "127.0.0.3", "::1"]
    assert await resolver.resolve("unknown.trioserve.test") == []  # NXDOMAIN: no engines
    dns.records[NAME] = []
    assert await resolver.resolve(NAME) == []  # the name, no address: no engines
    dns.failing = True
    assert await resolver.resolve(NAME) is None  # failed: keep what was known


async def test_the_system_resolver_reads_the_hosts_file():
    assert "127.0.0.1" in await SystemResolver().resolve("localhost")
    assert await SystemResolver().resolve("no-such-host.invalid") in ([], None)


def two_loopback_addresses_one_port() -> int:
    """A port free on both 127.0.0.2 and 127.0.0.3 (each engine binds its own)."""
    while True:
        with socket.socket() as first, socket.socket() as second:
            first.bind(("127.0.0.2", 0))
            port = first.getsockname()[1]
            try:
                second.bind(("127.0.0.3", port))
            except OSError:
                continue
            return port


async def start_engine_at(nursery: trio.Nursery, ip: str, port: int):
    backend = MockBackend(tokens_per_second=400.0, ttft_ms=2.0, allow_fault_injection=True)
    return await nursery.start(
        partial(serve_engine, backend, f"tcp://{ip}:{port}", track_ends=True)
    )


def addresses(client) -> list[str]:
    return sorted(conn.address for conn in client.links)


async def test_connections_follow_the_dns_answers(nursery):
    port = two_loopback_addresses_one_port()
    one = await start_engine_at(nursery, "127.0.0.2", port)
    two = await start_engine_at(nursery, "127.0.0.3", port)
    dns = await start_dns_server(nursery, **{NAME: ["127.0.0.2"]})
    a, b = f"tcp://127.0.0.2:{port}", f"tcp://127.0.0.3:{port}"
    async with open_protocol_client(
        [f"dns://{NAME}:{port}"],
        resolver=NameserverResolver("127.0.0.1", dns.port),
        refresh=REFRESH,
    ) as client:
        assert addresses(client) == [a]  # resolved before the client is handed out
        await client.wait_ready()
        # A second address appears: connected to.
        dns.records[NAME] = ["127.0.0.2", "127.0.0.3"]
        await wait_until(lambda: addresses(client) == [a, b], "the new engine's connection")
        await wait_until(lambda: all(c.accepting for c in client.links), "its welcome")
        # The first vanishes while a stream runs on it: the stream finishes there, then
        # the connection goes; nothing new is routed to it meanwhile.
        first = next(c for c in client.links if c.address == a)
        running = first.submit(
            Submit("long", "mock", "completion", {"prompt": "p"}, {"max_tokens": 40})
        )
        dns.records[NAME] = ["127.0.0.3"]
        await wait_until(lambda: first.retiring, "the vanished address let go of")
        assert first in client.links and not first.accepting
        later = client.submit(Submit("later", "mock", "completion", {"prompt": "q"}), "completion")
        assert later.engine.address == b
        items = []
        while batch := await running.receive_batch():
            items += batch
        assert "".join(i.data for i in items) == expected_text("p", 40)
        await wait_until(lambda: addresses(client) == [b], "the idle retired connection closed")
        assert one.core.ends[(client.frontend_id.encode(), "long")] == ["finished"]
        # Its series left /metrics with it.
        exposition = metrics.render()[0].decode()
        assert f'engine="{a}"' not in exposition and f'engine="{b}"' in exposition
        later.abort(EndReason.CANCEL)
        # An address that comes back is connected to afresh.
        dns.records[NAME] = ["127.0.0.2", "127.0.0.3"]
        await wait_until(lambda: addresses(client) == [a, b], "the address back")
        await client.wait_ready()
    assert two.stats.submitted == 1


async def test_a_failing_dns_server_changes_nothing_and_no_name_means_no_engines(nursery):
    port = two_loopback_addresses_one_port()
    await start_engine_at(nursery, "127.0.0.2", port)
    dns = await start_dns_server(nursery, **{NAME: ["127.0.0.2"]})
    fixed = await start_engine(nursery)
    async with open_protocol_client(
        [f"dns://{NAME}:{port}", fixed.address],
        resolver=NameserverResolver("127.0.0.1", dns.port),
        refresh=REFRESH,
    ) as client:
        await client.wait_ready()
        assert addresses(client) == sorted([f"tcp://127.0.0.2:{port}", fixed.address])
        dns.failing = True
        seen = dns.queries
        await wait_until(lambda: dns.queries >= seen + 6, "three more resolutions")
        assert len(client.links) == 2 and all(c.accepting for c in client.links)
        dns.failing = False
        del dns.records[NAME]  # NXDOMAIN: the name has no engines now; the fixed one stays
        await wait_until(lambda: addresses(client) == [fixed.address], "the engines let go")
        assert client.ready


async def test_discovery_lists_fixed_addresses_first_then_each_name_s():
    class Answers:
        async def resolve(self, name: str) -> list[str] | None:
            return {"a.test": ["10.0.0.2", "10.0.0.1"], "b.test": ["fd00::1"]}.get(name)

    discovery = Discovery(
        ["dns://a.test:1", "tcp://h:2", "dns://b.test:3", "dns://a.test:1"], resolver=Answers()
    )
    assert await discovery.resolve_all()
    assert discovery.addresses() == [
        "tcp://h:2",
        "tcp://10.0.0.1:1",
        "tcp://10.0.0.2:1",
        "tcp://[fd00::1]:3",
    ]
    assert not await discovery.resolve_all()  # unchanged


async def test_an_engine_found_by_its_aaaa_record_is_reached_over_ipv6(nursery):
    backend = MockBackend(tokens_per_second=400.0, ttft_ms=2.0)
    engine = await nursery.start(partial(serve_engine, backend, "tcp://[::1]:*"))
    port = int(engine.address.rsplit(":", 1)[1])
    dns = await start_dns_server(nursery, **{NAME: ["::1"]})
    async with open_protocol_client(
        [f"dns://{NAME}:{port}"], resolver=NameserverResolver("127.0.0.1", dns.port)
    ) as client:
        assert addresses(client) == [f"tcp://[::1]:{port}"]
        await client.wait_ready()
        sub = client.submit(
            Submit("r", "mock", "completion", {"prompt": "v6"}, {"max_tokens": 2}), "completion"
        )
        items = []
        while batch := await sub.receive_batch():
            items += batch
        assert "".join(i.data for i in items) == expected_text("v6", 2)
