"""The pages. The playground (``GET /``) in a real headless Chromium: the page loads its models,
streams an answer over WebSocket and over SSE, shows time to first token, tokens per
second and the request id, Stop ends a stream with exactly one abort at the engine,
errors appear as the server sent them, and API keys work (the WebSocket's key in its
subprotocol token). Each test leaves a screenshot under tests/artifacts/."""

from __future__ import annotations

import json
import re

import pytest

from tests.helpers.chromium import open_chromium
from tests.helpers.frontends import start_engine, start_frontend
from tests.helpers.waiting import wait_until
from trioserve.engine_programs.mock import expected_text

ANSWERS = "[...document.querySelectorAll('.answer')]"


def answer(index: int, expression: str) -> str:
    return f"(() => {{ const a = {ANSWERS}[{index}]; return a ? {expression} : null; }})()"


async def models_loaded(page) -> None:
    await page.wait_for("!!document.querySelector('#model option[value=mock]')", "the model list")


async def ask(page, prompt: str, transport: str, max_tokens: int) -> None:
    await page.evaluate(
        f"document.getElementById('transport').value = {json.dumps(transport)};"
        f"document.getElementById('max-tokens').value = '{max_tokens}';"
    )
    await page.type_text("#prompt", prompt)
    await page.click("#send")


async def state(page, index: int) -> str:
    return await page.evaluate(answer(index, "a.dataset.state"))


@pytest.mark.parametrize("transport", ["ws", "sse"])
async def test_a_prompt_streams_and_stop_ends_it_with_one_abort(
    nursery, tmp_path, transport, http_server, chromium
):
    engine = await start_engine(nursery)
    frontend = await start_frontend(nursery, engine, server=http_server)
    async with open_chromium(chromium, tmp_path / "profile") as page:
        await page.open(frontend.url + "/")
        await models_loaded(page)

        # A whole answer.
        await ask(page, "hello there", transport, 5)
        await page.wait_for(answer(0, "a.dataset.state === 'done'"), "the first answer")
        text = await page.evaluate(answer(0, "a.querySelector('.text').textContent"))
        assert text == expected_text("hello there", 5)
        first_id = await page.evaluate(answer(0, "a.dataset.requestId"))
        assert first_id
        if transport == "ws":
            assert first_id.startswith("ws-") and first_id.endswith(".p1")
        await wait_until(lambda: frontend.ends(first_id), "the engine to see the answer end")
        assert frontend.ends(first_id) == ["finished"]
        meta = await page.evaluate(answer(0, "a.querySelector('.meta').textContent"))
        assert "time to first token" in meta and "tokens/s" in meta
        assert f"request id {first_id}" in meta

        # A long answer, stopped while it streams.
        await ask(page, "go on", transport, 1_000_000)
        await page.wait_for(answer(1, "Number(a.dataset.tokens) >= 3"), "tokens to stream")
        live = await page.evaluate("document.getElementById('live').textContent")
        assert live.startswith("streaming:")
        assert "time to first token" in live and "tokens/s" in live
        stopped_id = await page.evaluate(answer(1, "a.dataset.requestId"))
        assert stopped_id and stopped_id != first_id
        await page.click("#stop")
        await page.wait_for(answer(1, "a.dataset.state === 'stopped'"), "the answer to stop")
        await wait_until(lambda: frontend.ends(stopped_id), "the engine to see the stop")
        await wait_until(lambda: len(frontend.app.services.registry) == 0, "nothing in flight")
        assert frontend.ends(stopped_id) == ["aborted"]  # one abort, nothing more
        assert engine.core.stats.unknown_aborts == 0
        assert await page.evaluate("document.getElementById('send').disabled") is False

        # The conversation goes on after a stop.
        await ask(page, "and then?", transport, 3)
        await page.wait_for(answer(2, "a.dataset.state === 'done'"), "the third answer")
        await page.screenshot(f"playground-{transport}-{http_server}.png")


async def test_with_api_keys_the_page_asks_for_one_and_shows_refusals_as_sent(
    nursery, tmp_path, http_server, chromium
):
    engine = await start_engine(nursery)
    frontend = await start_frontend(nursery, engine, server=http_server, api_keys=["sk-play-1"])
    async with open_chromium(chromium, tmp_path / "profile") as page:
        await page.open(frontend.url + "/")
        notice = await page.wait_for(
            "document.getElementById('notice').textContent", "the refused model list"
        )
        assert "HTTP 401" in notice and '"invalid_api_key"' in notice

        await page.type_text("#key", "sk-wrong")
        await page.evaluate("document.getElementById('key').dispatchEvent(new Event('change'))")
        await ask(page, "hi", "sse", 2)
        await page.wait_for(answer(0, "a.dataset.state === 'error'"), "the refusal")
        error = await page.evaluate(answer(0, "a.querySelector('.error').textContent"))
        assert error.startswith("HTTP 401 invalid_api_key: the API key is not valid")
        assert '"code": "invalid_api_key"' in error  # the body as the server sent it

        await page.evaluate("document.getElementById('key').value = ''")
        await page.type_text("#key", "sk-play-1")
        await page.evaluate("document.getElementById('key').dispatchEvent(new Event('change'))")
        await models_loaded(page)
        for transport in ("ws", "sse"):
            await page.click("#clear")  # a new conversation: the prompt alone
            await ask(page, "hi", transport, 2)
            await page.wait_for(answer(0, "a.dataset.state === 'done'"), transport)
            text = await page.evaluate(answer(0, "a.querySelector('.text').textContent"))
            assert text == expected_text("hi", 2)
        await page.screenshot(f"playground-api-key-{http_server}.png")


async def test_no_playground_makes_the_root_a_404(nursery, http_server):
    engine = await start_engine(nursery)
    frontend = await start_frontend(nursery, engine, server=http_server, playground=False)
    async with frontend.client() as client:
        response = await client.get("/")
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "not_found"
        assert (await client.get("/docs")).status_code == 200


async def test_the_icon_browsers_ask_for_is_served_without_a_key(nursery, http_server):
    engine = await start_engine(nursery)
    frontend = await start_frontend(nursery, engine, server=http_server, api_keys=["sk-a"])
    async with frontend.client() as client:
        response = await client.get("/favicon.ico")
    assert response.status_code == 200
    assert response.headers["content-type"] == "image/svg+xml"
    assert response.content.startswith(b"<svg ")


async def test_the_pages_allow_only_their_own_script_and_style(frontend):
    async with frontend.client() as client:
        for path in ("/", "/docs"):
            response = await client.get(path)
            assert response.status_code == 200
            assert response.headers["content-type"] == "text/html; charset=utf-8"
            policy = response.headers["content-security-policy"]
            assert "default-src 'none'" in policy and "connect-src 'self'" in policy
            assert "script-src 'sha256-" in policy and "unsafe-inline" not in policy
            # Nothing fetched from elsewhere: no URL with a host, no external file.
            assert re.search(r"https?://", response.text) is None
            assert re.search(r"<(script|link|img)[^>]*(src|href)=", response.text) is None


async def test_the_docs_page_lists_every_route_and_tries_one(
    nursery, tmp_path, http_server, chromium
):
    engine = await start_engine(nursery)
    frontend = await start_frontend(nursery, engine, server=http_server)
    async with frontend.client() as client:
        spec = (await client.get("/openapi.json")).json()
    count = sum(len(ops) for ops in spec["paths"].values())
    async with open_chromium(chromium, tmp_path / "profile") as page:
        await page.open(frontend.url + "/docs")
        await page.wait_for("!!document.getElementById('createEmbedding')", "the operations")
        listed = await page.evaluate("document.querySelectorAll('#operations details.op').length")
        assert listed == count
        # The description's Markdown is rendered: its list and its code, no raw marks.
        intro = await page.evaluate(
            "(() => { const i = document.getElementById('intro');"
            " return [i.querySelectorAll('li').length, i.querySelectorAll('code').length,"
            " i.textContent]; })()"
        )
        assert intro[0] >= 3 and intro[1] >= 3
        assert "`" not in intro[2] and "\n- " not in intro[2]
        # Try the chat route with its example body: the answer appears, as sent.
        await page.evaluate("document.getElementById('createChatCompletion').open = true")
        await page.click("#createChatCompletion button")
        status = await page.wait_for(
            "(() => { const s = document.querySelector('#createChatCompletion .status');"
            " return s && s.textContent.startsWith('HTTP') && s.textContent; })()",
            "the try-it answer",
        )
        assert status.startswith("HTTP 200 · application/json · x-request-id ")
        shown = await page.evaluate(
            "document.querySelector('#createChatCompletion pre').textContent"
        )
        assert json.loads(shown)["choices"][0]["message"]["content"] == expected_text("Hello!", 16)
        await page.screenshot(f"docs-{http_server}.png")


async def test_the_docs_page_sends_query_parameters(nursery, tmp_path, http_server, chromium):
    engine = await start_engine(nursery)
    frontend = await start_frontend(nursery, engine, server=http_server)
    async with frontend.client() as client:
        created = await client.post(
            "/v1/responses", json={"input": "Hi", "max_output_tokens": 3, "background": True}
        )
    response_id = created.json()["id"]
    async with open_chromium(chromium, tmp_path / "profile") as page:
        await page.open(frontend.url + "/docs")
        await page.wait_for("!!document.getElementById('retrieveResponse')", "the operations")
        # The retrieve operation: its id, and stream=true (starting_after left empty).
        await page.evaluate(
            "(() => { const op = document.getElementById('retrieveResponse'); op.open = true;"
            " const [id, stream] = op.querySelectorAll('input');"
            f" id.value = {json.dumps(response_id)}; stream.value = 'true'; }})()"
        )
        await page.click("#retrieveResponse button")
        shown = await page.wait_for(
            "(() => { const p = document.querySelector('#retrieveResponse pre');"
            " const text = p && p.textContent;"
            " return text && text.includes('event: response.incomplete') && text; })()",
            "the replayed events",
        )
        status = await page.evaluate(
            "document.querySelector('#retrieveResponse .status').textContent"
        )
    assert status.startswith("HTTP 200 · text/event-stream")
    # All of it: starting_after, left empty, was not sent.
    assert shown.startswith("event: response.created\n")
