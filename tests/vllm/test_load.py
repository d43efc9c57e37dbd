"""vLLM's own load figures reach the frontend: pongs carry its scheduler's running and
waiting counts and KV-cache usage, which /metrics exports and routing uses."""

from __future__ import annotations

import json
import re

import pytest
import trio

from tests.helpers.http import raw_request, read_until
from tests.helpers.vllm import LONG, SETTLE_GUARD, client, figures, frontend_on, settled
from tests.helpers.vllm_session import Vllm

pytestmark = pytest.mark.integration


async def read_on(stream: trio.SocketStream) -> None:
    """Read whatever comes until the stream closes (or is closed under us)."""
    try:
        while await stream.receive_some(65536):
            pass
    except (trio.ClosedResourceError, trio.BrokenResourceError):
        pass


def gauge(text: str, name: str) -> float:
    match = re.search(rf"^{name}\{{[^}}]*\}} ([0-9.eE+-]+)$", text, re.M)
    assert match, name
    return float(match[1])


async def test_vllms_running_count_and_kv_cache_reach_the_frontends_metrics(vllm: Vllm, nursery):
    frontend = await frontend_on(nursery, vllm, heartbeat_interval=0.1)
    await settled(vllm)
    stream = await raw_request(
        frontend, "POST", "/v1/completions", json.dumps({**LONG, "stream": True}).encode()
    )
    await read_until(stream, b'"text"')
    nursery.start_soon(read_on, stream)  # a client that keeps reading (not a slow one)
    async with client(frontend.url) as http:
        with trio.fail_after(SETTLE_GUARD):
            while True:
                text = (await http.get("/metrics")).text
                running = gauge(text, "trioserve_engine_requests_running")
                kv = gauge(text, "trioserve_engine_kv_cache_usage")
                if running == 1 and kv > 0:
                    break

                await trio.sleep(0.05)
        connection = frontend.app.services.engines.links[0]
        assert connection.load >= 1
        await stream.aclose()
        await settled(vllm)
        with trio.fail_after(SETTLE_GUARD):
            while True:
                text = (await http.get("/metrics")).text
                if gauge(text, "trioserve_engine_requests_running") == 0:
                    break
                await trio.sleep(0.05)
        assert gauge(text, "trioserve_engine_kv_cache_usage") == 0


async def test_frontends_sharing_two_vllm_engines_route_by_vllms_own_load(
    vllm: Vllm, second_vllm_engine, nursery
):
    """Two frontends, two engines. The first frontend starts a long answer on one engine;
    the second frontend has sent nothing, so its own in-flight counts are equal, but
    vLLM's figures (in pongs) say which engine is busy: its request goes to the other.
    Checked in each engine's own vLLM running count."""
    engines = [vllm.address, second_vllm_engine.address]
    first = await frontend_on(nursery, vllm, engines=engines, heartbeat_interval=0.1)
    second = await frontend_on(nursery, vllm, engines=engines, heartbeat_interval=0.1)
    await settled(vllm)
    stream = await raw_request(
        first, "POST", "/v1/completions", json.dumps({**LONG, "stream": True}).encode()
    )
    await read_until(stream, b'"text"')
    nursery.start_soon(read_on, stream)
    busy = next(c for c in first.app.services.engines.links if c.in_flight == 1)
    with trio.fail_after(SETTLE_GUARD):  # the second frontend hears of it in a pong
        while not any(c.running == 1 for c in second.app.services.engines.links):
            await trio.sleep(0.05)
    other = await raw_request(
        second, "POST", "/v1/completions", json.dumps({**LONG, "stream": True}).encode()
    )
    await read_until(other, b'"text"')
    nursery.start_soon(read_on, other)
    chosen = next(c for c in second.app.services.engines.links if c.in_flight == 1)
    assert chosen.address != busy.address
    # vLLM's side: one request running on each engine.
    with trio.fail_after(SETTLE_GUARD):
        while True:
            counts = [
                (await figures(vllm))["vllm:num_requests_running"],
                await trio.to_thread.run_sync(second_vllm_engine.running),
            ]
            if counts == [1, 1]:
                break
            await trio.sleep(0.05)
    await stream.aclose()
    await other.aclose()
    await settled(vllm)
