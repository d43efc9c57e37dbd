"""Streams survive buffering proxies: SSE headers, and a comment line while prefilling."""

from __future__ import annotations

import json

import openai

from tests.helpers.frontends import start_engine, start_frontend
from tests.helpers.http import raw_request, read_until
from tests.helpers.waiting import wait_until
from trioserve.config import Settings
from trioserve.engine_programs.mock import expected_text


def test_default_keepalive_is_15_seconds():
    assert Settings().sse_keepalive == 15.0


async def test_a_silent_stream_gets_comment_lines_until_the_first_output(nursery, http_server):
    engine = await start_engine(nursery)
    frontend = await start_frontend(nursery, engine, server=http_server, sse_keepalive=0.05)
    # The engine never produces anything (a prefill that does not end).
    body = json.dumps({"prompt": "x", "stream": True, "mock_hang_after": 0}).encode()
    stream = await raw_request(frontend, "POST", "/v1/completions", body, x_request_id="ka")
    data = await read_until(stream, b": keepalive\n\n")
    head = data.split(b"\r\n\r\n")[0].lower()
    assert head.startswith(b"http/1.1 200")
    assert b"cache-control: no-cache" in head and b"x-accel-buffering: no" in head
    assert b"data:" not in data
    await stream.aclose()
    await wait_until(lambda: frontend.ends("ka") == ["aborted"], "one abort")


async def test_clients_ignore_the_comment_lines(nursery, http_server):
    engine = await start_engine(nursery)
    frontend = await start_frontend(nursery, engine, server=http_server, sse_keepalive=0.01)
    client = openai.AsyncOpenAI(base_url=f"{frontend.url}/v1", api_key="x", max_retries=0)
    async with client:
        stream = await client.completions.create(
            model="mock",
            prompt="slow start",
            max_tokens=3,
            stream=True,
            extra_body={"mock_ttft_ms": 200},
        )
        text = "".join([chunk.choices[0].text async for chunk in stream if chunk.choices])
    assert text == expected_text("slow start", 3)
