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

import os
import subprocess

import httpx
import pytest
import trio

from tests.conftest import HANG_GUARD
from tests.processes import free_port
from tests.test_rolling_restart import nginx_binary

pytestmark = pytest.mark.integration

CONF = """
worker_processes 1;
daemon off;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
{user}
events {{ worker_connections 64; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://127.0.0.1:{upstream};
            proxy_http_version 1.1;
            # proxy_buffering is left on (nginx's default).
        }}
    }}
}}
"""


async def read_until_contains(response: httpx.Response, needle: str, count: int) -> str:
    text = ""
    with trio.fail_after(HANG_GUARD):
        async for chunk in response.aiter_text():
            text += chunk
            if text.count(needle) >= count:
                return text
    raise AssertionError(f"the stream ended before {count} x {needle!r}: {text!r}")


@pytest.fixture
async def proxied(nursery, tmp_path, engine):
    from tests.conftest import start_frontend

    frontend = await start_frontend(nursery, engine, sse_keepalive=0.1)
    port = free_port()
    conf = tmp_path / "nginx.conf"
    conf.write_text(
        CONF.format(
            tmp=tmp_path,
            port=port,
            upstream=frontend.port,
            user="user root;" if os.geteuid() == 0 else "",
        )
    )
    proxy = await trio.lowlevel.open_process(
        [nginx_binary(), "-c", str(conf), "-p", str(tmp_path)], stderr=subprocess.DEVNULL
    )
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=HANG_GUARD) as c:
            with trio.fail_after(HANG_GUARD):
                while True:
                    try:
                        if (await c.get("/live")).status_code == 200:
                            break
                    except httpx.TransportError:
                        pass
                    await trio.sleep(0.05)
            yield c
    finally:
        proxy.terminate()
        with trio.move_on_after(5):
            await proxy.wait()


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
