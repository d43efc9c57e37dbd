"""vLLM's own load figures reach the frontend: pongs carry its scheduler's running and
waiting counts and KV-cache usage, which /metrics exports and routing uses."""

from __future__ import annotations

import json
import re

import pytest
import trio

from tests.conftest import raw_request, read_until

from .conftest import Vllm
from .helpers import LONG, SETTLE_GUARD, client, frontend_on, settled

pytestmark = pytest.mark.integration


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
    async with client(frontend.url) as http:
        with trio.fail_after(SETTLE_GUARD):
            while True:
                text = (await http.get("/metrics")).text
                running = gauge(text, "trioserve_engine_requests_running")
                kv = gauge(text, "trioserve_engine_kv_cache_usage")
                if running == 1 and kv > 0:
                    break
                await trio.sleep(0.05)
        connection = frontend.app.engines.connections[0]
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
