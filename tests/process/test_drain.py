"""The drain with real signals, against `trioserve run` processes."""

from __future__ import annotations

import json
import os
import signal

import httpx
import pytest
import trio

from tests.helpers.frontends import start_engine
from tests.helpers.http import wait_health
from tests.helpers.processes import start_frontend_process
from tests.helpers.waiting import HANG_GUARD, wait_until
from trioserve.sdk import TrioEngine

pytestmark = pytest.mark.integration

LONG = {"prompt": "drain", "max_tokens": 100_000, "stream": True}


async def open_stream(url: str, results: dict, name: str) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=HANG_GUARD) as client:
        response = await client.post("/v1/completions", json=LONG, headers={"x-request-id": name})
        results[name] = response.text


def ends(engine: TrioEngine, name: str) -> list[str]:
    return [how for (_, rid), hows in engine.core.ends.items() if rid == name for how in hows]


async def test_sigterm_past_the_grace_period_sends_error_event_and_abort_and_exits_0(nursery):
    engine = await start_engine(nursery)
    grace = 1.0
    frontend, url = await start_frontend_process(
        nursery,
        "--engine",
        engine.address,
        "--drain-delay",
        "0.2",
        "--graceful-timeout",
        str(grace),
    )
    await wait_health(url)  # the engine handshake completes after the listener is up
    results: dict[str, str] = {}
    async with trio.open_nursery() as clients:
        clients.start_soon(open_stream, url, results, "long")
        await wait_until(lambda: any(r == "long" for _, r in engine.core.running), "the stream")
        frontend.signal(signal.SIGTERM)
        # Exits 0 once the grace period is over (the ceiling is the grace plus a margin).
        with trio.fail_after(grace + 10):
            assert await frontend.process.wait() == 0
    events = [e for e in results["long"].split("\n\n") if e]
    assert "data: [DONE]" not in events
    assert json.loads(events[-1].removeprefix("data: "))["error"]["code"] == "server_shutting_down"
    await wait_until(lambda: ends(engine, "long"), "the engine to receive the abort")
    assert ends(engine, "long") == ["aborted"]


async def test_second_sigterm_skips_to_the_end_and_the_mock_engine_stops_too(nursery):
    frontend, url = await start_frontend_process(
        nursery, "--drain-delay", "600", "--graceful-timeout", "600"
    )
    engine_pid = int(
        (await frontend.wait_for_output(r"started the mock engine \(pid (\d+)\)")).group(1)
    )
    await wait_health(url)  # the engine handshake completes after the listener is up
    async with httpx.AsyncClient(base_url=url, timeout=HANG_GUARD) as client:
        results: dict[str, str] = {}
        async with trio.open_nursery() as clients:
            clients.start_soon(open_stream, url, results, "s")
            with trio.fail_after(HANG_GUARD):
                while "trioserve_requests_in_flight 1.0" not in (await client.get("/metrics")).text:
                    await trio.sleep(0.02)
            frontend.signal(signal.SIGTERM)
            await frontend.wait_for_output("draining: readiness is now 503")
            assert (await client.get("/health")).status_code == 503
            assert (await client.get("/live")).status_code == 200
            frontend.signal(signal.SIGTERM)
            assert await frontend.wait() == 0
    assert "server_shutting_down" in results["s"]
    await frontend.wait_for_output(r"mock engine stopped \(exit code 0\)")
    with pytest.raises(ProcessLookupError):
        os.kill(engine_pid, 0)
