"""Streams flow through a reverse proxy with its default settings (nginx, proxy_buffering on).

Deterministic, no timing: the mock engine sends two tokens and then hangs, so anything on
the way that held the response back (trioserve's writer or server, or the proxy) would
deliver nothing while the stream is open; the client must see both tokens (and, while the
engine is still prefilling, keepalive comments) through nginx. Measured here: nginx 1.22
forwards such chunks even without trioserve's ``X-Accel-Buffering: no`` (which is there
for proxies and configurations that do hold them back, and is asserted on directly in
tests/http/test_openai_routes.py), so this test guards trioserve's own flushing end to end.
"""

from __future__ import annotations

import httpx
import pytest
import trio

from tests.helpers.frontends import start_frontend
from tests.helpers.nginx import open_nginx
from tests.helpers.processes import free_port
from tests.helpers.waiting import HANG_GUARD

pytestmark = pytest.mark.integration


async def read_until_contains(response: httpx.Response, needle: str, count: int) -> str:
    text = ""
    with trio.fail_after(HANG_GUARD):
        async for chunk in response.aiter_text():
            text += chunk
            if text.count(needle) >= count:
                return text
    raise AssertionError(f"the stream ended before {count} x {needle!r}: {text!r}")


@pytest.fixture
async def proxied(nursery, tmp_path, engine, nginx):
    frontend = await start_frontend(nursery, engine, server="builtin", sse_keepalive=0.1)
    port = free_port()
    # proxy_buffering is left on (nginx's default).
    async with (
        open_nginx(tmp_path, port, [frontend.port]),
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=HANG_GUARD) as client,
    ):
        yield client


async def test_sse_tokens_pass_a_buffering_proxy_while_the_stream_is_open(proxied):
    body = {"prompt": "p", "max_tokens": 100, "stream": True, "mock_hang_after": 2}
    async with proxied.stream("POST", "/v1/completions", json=body) as response:
        text = await read_until_contains(response, "data: {", 2)
    assert text.count('"finish_reason":null') == 2


async def test_keepalive_comments_pass_a_buffering_proxy_while_prefilling(proxied):
    body = {"prompt": "p", "max_tokens": 5, "stream": True, "mock_ttft_ms": 600_000}
    async with proxied.stream("POST", "/v1/completions", json=body) as response:
        text = await read_until_contains(response, ": keepalive", 2)
    assert "data: " not in text
