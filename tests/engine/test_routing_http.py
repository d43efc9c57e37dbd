"""Affinity routing end to end: the session key reaches the engine client from HTTP
(``X-Session-Id``, else the body's ``user``; never the engine), and an engine's prefix
cache hits come back in the usage."""

from __future__ import annotations

import pytest

from tests.helpers.frontends import start_engine, start_frontend
from trioserve.engine_programs.mock import PREFIX_BLOCK_WORDS


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize("how", ["header", "user"])
async def test_a_session_sticks_to_one_engine(nursery, how, path):
    engines = [await start_engine(nursery) for _ in range(3)]
    frontend = await start_frontend(
        nursery, None, server="builtin", engines=[e.address for e in engines], routing="affinity"
    )
    seen_params = []
    for engine in engines:
        generate = engine.core.backend.generate

        async def spy(request, generate=generate):
            seen_params.append(request.params)
            async for out in generate(request):
                yield out

        engine.core.backend.generate = spy
    async with frontend.client() as client:
        for i in range(12):
            body = {"model": "mock", "max_tokens": 2}
            if path == "/v1/completions":
                body["prompt"] = f"unrelated prompt {i}"
            else:
                body["messages"] = [{"role": "user", "content": f"unrelated prompt {i}"}]
            headers = {}
            if how == "header":
                headers["x-session-id"] = "session-42"
            else:
                body["user"] = "user-42"
            response = await client.post(path, json=body, headers=headers)
            assert response.status_code == 200
    assert sorted(e.stats.submitted for e in engines) == [0, 0, 12]
    assert all("user" not in params and "session_key" not in params for params in seen_params)


async def test_without_a_session_the_prompt_prefix_decides_and_hits_come_back(nursery):
    engines = [await start_engine(nursery, prefix_cache=1000) for _ in range(3)]
    frontend = await start_frontend(
        nursery, None, server="builtin", engines=[e.address for e in engines], routing="affinity"
    )
    system = " ".join(f"rule{i}" for i in range(4 * PREFIX_BLOCK_WORDS))
    cached = []
    async with frontend.client() as client:
        for i in range(6):
            messages = [
                {"role": "system", "content": system},
                {"role": "user", "content": f"question {i}"},
            ]
            response = await client.post(
                "/v1/chat/completions",
                json={"model": "mock", "messages": messages, "max_tokens": 2},
            )
            usage = response.json()["usage"]
            cached.append(usage["prompt_tokens_details"]["cached_tokens"])
    assert sorted(e.stats.submitted for e in engines) == [0, 0, 6]
    # The first request fills the engine's cache; every later one finds the system prompt.
    assert cached == [0] + [4 * PREFIX_BLOCK_WORDS] * 5
