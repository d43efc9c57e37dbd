"""Engine rollouts under load lose nothing: two frontends (`trioserve run` processes)
share mock engines (processes) while clients stream and wait for answers through both;
each engine in turn gets SIGTERM and is replaced. Every request must complete with its
exact text, streams included, and every engine request must end exactly once as its
engine counted it (submitted = finished + aborted + orphaned, with no aborts).

Twice: engines at fixed addresses, the replacement on the same address; and engines found
by DNS (a headless Service's rollout: the new engine's address joins the name, the old
one's leaves it as it is told to drain), with a DNS server run by the test."""

from __future__ import annotations

import json
import re
import signal
import socket

import attrs
import httpx
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers.dns_server import start_dns_server
from tests.helpers.processes import Proc, free_port, start_frontend_process, start_mock_engine
from tests.helpers.waiting import HANG_GUARD
from trioserve.engine_programs.mock import expected_text

pytestmark = pytest.mark.integration

#: Tokens of a worker's answers (50 tokens/s): workers whose requests end at different
#: times, so that an engine is rarely caught between two waves of requests.
MAX_TOKENS = (30, 45, 60, 75)
#: Clients per frontend.
WORKERS = 4
#: Requests that must complete between two steps of a rollout.
PROGRESS = 12


async def start_mock(nursery: trio.Nursery, address: str) -> Proc:
    return await start_mock_engine(
        nursery, address, "--grace-period", "30", tokens_per_second=50, ttft_ms=5
    )


def engine_accounts(engine: Proc) -> tuple[int, dict[str, int]]:
    """(requests running when the drain began, the final Stats) from the engine's log."""
    began = re.search(rb"finishing (\d+);", engine.output)
    stats = re.findall(rb"drained: Stats\((.*?)\)", engine.output)
    assert began and stats, engine.output.decode()[-2000:]
    pairs = (pair.split("=") for pair in stats[-1].decode().split(", "))
    return int(began.group(1)), {k: int(v) for k, v in pairs}


def sse_text(body: str) -> str:
    text = ""
    for event in body.split("\n\n"):
        if event.startswith("data: {"):
            text += json.loads(event.removeprefix("data: "))["choices"][0].get("text") or ""
    return text


@attrs.define
class Load:
    """Clients sending completions (streamed and not, in turn) through every frontend."""

    urls: list[str]
    done: int = 0
    streams: int = 0
    failures: list[str] = attrs.Factory(list)
    _progress: trio.Event = attrs.Factory(trio.Event)

    async def run(self, stop: trio.Event) -> None:
        async with trio.open_nursery() as nursery:
            for url in self.urls:
                for worker in range(WORKERS):
                    nursery.start_soon(self._worker, url, worker, stop)

    async def _worker(self, url: str, worker: int, stop: trio.Event) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            i = 0
            while not stop.is_set():
                i += 1
                prompt = f"{url[-5:]}-{worker}-{i}"
                stream = i % 2 == 0
                tokens = MAX_TOKENS[worker % len(MAX_TOKENS)]
                body = {"prompt": prompt, "max_tokens": tokens, "stream": stream}
                expected = expected_text(prompt, tokens)
                try:
                    response = await client.post("/v1/completions", json=body)
                except httpx.HTTPError as exc:
                    self.failures.append(f"{prompt}: {type(exc).__name__}: {exc}")
                    continue
                if response.status_code != 200:
                    self.failures.append(f"{prompt}: {response.status_code} {response.text[:300]}")
                elif stream and not (
                    response.text.endswith("data: [DONE]\n\n")
                    and sse_text(response.text) == expected
                ):
                    self.failures.append(f"{prompt}: truncated stream {response.text[-300:]!r}")
                elif not stream and response.json()["choices"][0]["text"] != expected:
                    self.failures.append(f"{prompt}: wrong text {response.text[:300]}")
                else:
                    self.done += 1
                    self.streams += stream
                    self._progress.set()
                    self._progress = trio.Event()

    async def progress(self, count: int = PROGRESS) -> None:
        """Until ``count`` more requests have completed."""
        target = self.done + count
        with trio.fail_after(3 * HANG_GUARD):
            while self.done < target:
                await self._progress.wait()


async def sample(url: str, name: str, labels: dict[str, str]) -> float | None:
    async with httpx.AsyncClient(base_url=url, timeout=HANG_GUARD) as client:
        text = (await client.get("/metrics")).text
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return None


async def wait_serving(urls: list[str], address: str) -> None:
    """Until every frontend has the engine at ``address`` connected and not draining."""
    with trio.fail_after(3 * HANG_GUARD):
        for url in urls:
            while not (
                await sample(url, "trioserve_engine_connected", {"engine": address}) == 1
                and await sample(url, "trioserve_engine_draining", {"engine": address}) == 0
            ):
                await trio.sleep(0.05)


async def wait_running(url: str, address: str) -> None:
    """Until the engine at ``address`` reports requests running (in its pongs): roll it
    while streams run on it."""
    name = "trioserve_engine_requests_running"
    with trio.fail_after(3 * HANG_GUARD):
        while not (await sample(url, name, {"engine": address}) or 0) >= 2:
            await trio.sleep(0.02)


async def wait_let_go(urls: list[str], address: str) -> None:
    """Until no frontend has a connection to ``address`` (its series left /metrics)."""
    with trio.fail_after(3 * HANG_GUARD):
        for url in urls:
            while await sample(url, "trioserve_engine_connected", {"engine": address}) is not None:
                await trio.sleep(0.05)


async def start_frontends(nursery: trio.Nursery, *args: str) -> list[str]:
    urls = []
    for _ in range(2):
        _, url = await start_frontend_process(
            nursery, *args, "--heartbeat-interval", "0.2", "--heartbeat-timeout", "1"
        )
        urls.append(url)
    async with httpx.AsyncClient(timeout=HANG_GUARD) as client:
        with trio.fail_after(3 * HANG_GUARD):
            for url in urls:
                while (await client.get(f"{url}/health")).status_code != 200:
                    await trio.sleep(0.05)
    return urls


async def check_frontends(urls: list[str]) -> None:
    for url in urls:
        for outcome in ("engine_lost", "engine_failed", "engine_unavailable", "error"):
            lost = await sample(url, "trioserve_requests_total", {"outcome": outcome})
            assert not lost, (url, outcome, lost)


def check_engine(engine: Proc) -> None:
    running_at_sigterm, stats = engine_accounts(engine)
    assert running_at_sigterm > 0, engine.output.decode()  # streams ran on it when rolled
    assert stats["submitted"] == stats["finished"] + stats["aborted"] + stats["orphaned"]
    assert stats["aborted"] == stats["orphaned"] == stats["cut_off"] == 0, stats


async def test_engines_rolled_at_fixed_addresses_under_load_lose_nothing(nursery):
    addresses = [f"tcp://127.0.0.1:{free_port()}" for _ in range(2)]
    engines = {address: await start_mock(nursery, address) for address in addresses}
    urls = await start_frontends(
        nursery, *(a for address in addresses for a in ("--engine", address))
    )
    load, stop = Load(urls), trio.Event()
    rolled = []
    async with trio.open_nursery() as clients:
        clients.start_soon(load.run, stop)
        await load.progress()
        for address in addresses:
            old = engines[address]
            await wait_running(urls[0], address)
            old.signal(signal.SIGTERM)
            assert await old.wait() == 0
            rolled.append(old)
            engines[address] = await start_mock(nursery, address)
            await wait_serving(urls, address)
            await load.progress()
        stop.set()
    assert not load.failures, load.failures[:5]
    assert load.streams > 0 and load.done > 3 * PROGRESS
    for engine in rolled:
        check_engine(engine)
    await check_frontends(urls)


def loopback_port(hosts: list[str]) -> int:
    """A port free on every one of ``hosts`` (loopback addresses, one engine each)."""
    while True:
        port = free_port()
        try:
            for host in hosts:
                with socket.socket() as sock:
                    sock.bind((host, port))
        except OSError:
            continue
        return port


async def test_engines_found_by_dns_rolled_under_load_lose_nothing(nursery):
    name = "engines.roll.test"
    hosts = ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"]
    port = loopback_port(hosts)
    engines = {host: await start_mock(nursery, f"tcp://{host}:{port}") for host in hosts[:2]}
    dns = await start_dns_server(nursery, **{name: hosts[:2]})
    urls = await start_frontends(
        nursery,
        "--engine",
        f"dns://{name}:{port}",
        "--engine-dns-server",
        dns.address,
        "--engine-refresh",
        "0.2",
    )
    load, stop = Load(urls), trio.Event()
    rolled = []
    async with trio.open_nursery() as clients:
        clients.start_soon(load.run, stop)
        await load.progress()
        for old_host, new_host in ((hosts[0], hosts[2]), (hosts[1], hosts[3])):
            # As a Deployment rolls: the new pod is ready and joins the Service's name; the
            # old one leaves the name and gets SIGTERM at once.
            engines[new_host] = await start_mock(nursery, f"tcp://{new_host}:{port}")
            await wait_running(urls[0], f"tcp://{old_host}:{port}")
            dns.records[name] = [h for h in dns.records[name] if h != old_host] + [new_host]
            old = engines.pop(old_host)
            old.signal(signal.SIGTERM)
            assert await old.wait() == 0
            rolled.append(old)
            await wait_serving(urls, f"tcp://{new_host}:{port}")
            await wait_let_go(urls, f"tcp://{old_host}:{port}")
            await load.progress()
        stop.set()
    assert not load.failures, load.failures[:5]
    assert load.streams > 0 and load.done > 3 * PROGRESS
    for engine in rolled:
        check_engine(engine)
    await check_frontends(urls)
