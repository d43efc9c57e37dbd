"""API keys end to end (``--api-key``): real clients, real sockets, both HTTP servers."""

from __future__ import annotations

import json

import openai
import pytest
import trio
from trio_websocket import ConnectionRejected, open_websocket_url

from tests.helpers.api_keys import ALICE, BOB, KEY, keyed_frontend
from tests.helpers.frontends import LONG, running
from tests.helpers.waiting import HANG_GUARD, wait_until
from tests.helpers.websocket import collect, receive, request, ws_url
from trioserve.engine_programs.mock import expected_text

CHALLENGE = 'Bearer realm="trioserve"'
CHALLENGE_INVALID = 'Bearer realm="trioserve", error="invalid_token"'

#: Every route a key protects (and a path that is no route: not even that is revealed).
PROTECTED = [
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/completions"),
    ("POST", "/generate"),
    ("POST", "/v1/audio/speech"),
    ("POST", "/v1/images/generations"),
    ("POST", "/v1/images/edits"),
    ("POST", "/v1/videos/generations"),
    ("POST", "/v1/embeddings"),
    ("GET", "/v1/models"),
    ("GET", "/v1/models/mock"),
    ("DELETE", "/v1/requests/some-id"),
    ("GET", "/no/such/route"),
]
#: What each refusal sends: the Authorization header, and the challenge it gets back.
REFUSALS = [
    ({}, CHALLENGE),
    ({"authorization": "Bearer sk-test-mallory"}, CHALLENGE_INVALID),
    ({"authorization": "Bearer"}, CHALLENGE_INVALID),
    ({"authorization": "Basic c2stdGVzdC1hbGljZTo="}, CHALLENGE_INVALID),
    ({"authorization": KEY}, CHALLENGE_INVALID),
]


def assert_refused(response, challenge: str) -> None:
    assert response.status_code == 401, response.text
    assert response.headers["www-authenticate"] == challenge
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["code"] == "invalid_api_key"
    assert error["param"] is None and error["message"]
    assert KEY not in response.text and "mallory" not in response.text


async def test_every_generation_route_models_and_cancel_refuse_a_request_without_a_valid_key(
    nursery,
    http_server,
):
    frontend = await keyed_frontend(nursery, server=http_server)
    async with frontend.client() as client:
        for method, path in PROTECTED:
            for headers, challenge in REFUSALS:
                body = b'{"prompt": "x", "max_tokens": 1}' if method == "POST" else None
                response = await client.request(method, path, content=body, headers=headers)
                assert_refused(response, challenge)
        assert frontend.engine.core.stats.submitted == 0  # nothing reached the engine
        models = await client.get("/v1/models", headers=ALICE)
        assert models.status_code == 200 and models.json()["data"][0]["id"]
        answer = await client.post(
            "/v1/completions", json={"prompt": "x", "max_tokens": 2}, headers=BOB
        )
        assert answer.status_code == 200
        assert answer.json()["choices"][0]["text"] == expected_text("x", 2)


async def test_health_live_metrics_and_the_pages_stay_open(nursery, http_server):
    # A browser opening a page cannot send a key; the playground asks for one itself.
    frontend = await keyed_frontend(nursery, server=http_server)
    async with frontend.client() as client:
        for path in ("/health", "/live", "/metrics", "/", "/docs", "/openapi.json"):
            assert (await client.get(path)).status_code == 200, path


async def test_metrics_can_require_a_key(nursery, http_server):
    frontend = await keyed_frontend(nursery, server=http_server, metrics_require_key=True)
    async with frontend.client() as client:
        assert_refused(await client.get("/metrics"), CHALLENGE)
        assert (await client.get("/metrics", headers=ALICE)).status_code == 200
        assert (await client.get("/health")).status_code == 200


async def test_without_keys_everything_stays_open(frontend):
    async with frontend.client() as client:
        response = await client.get("/v1/models", headers={"authorization": "Basic eDp5"})
        assert response.status_code == 200
        assert (await client.get("/metrics")).status_code == 200


async def test_cors_preflight_needs_no_key_and_a_refusal_is_readable_by_the_browser(
    nursery, http_server
):
    origin = "https://app.example"
    frontend = await keyed_frontend(nursery, server=http_server, cors_origins=[origin])
    async with frontend.client() as client:
        preflight = await client.options(
            "/v1/chat/completions",
            headers={
                "origin": origin,
                "access-control-request-method": "POST",
                "access-control-request-headers": "authorization, content-type",
            },
        )
        assert preflight.status_code == 204
        assert "authorization" in preflight.headers["access-control-allow-headers"]
        refused = await client.post("/v1/chat/completions", json=LONG, headers={"origin": origin})
        assert_refused(refused, CHALLENGE)
        assert refused.headers["access-control-allow-origin"] == origin


async def test_the_official_openai_client_api_key_works_unchanged(nursery, http_server):
    frontend = await keyed_frontend(nursery, server=http_server)
    client = openai.AsyncOpenAI(base_url=f"{frontend.url}/v1", api_key=KEY, max_retries=0)
    messages = [{"role": "user", "content": "hello there"}]
    whole = await client.chat.completions.create(model="mock", messages=messages, max_tokens=3)
    assert whole.choices[0].message.content == expected_text("hello there", 3)
    stream = await client.chat.completions.create(
        model="mock", messages=messages, max_tokens=3, stream=True
    )
    text = "".join([chunk.choices[0].delta.content or "" async for chunk in stream])
    assert text == expected_text("hello there", 3)
    assert [m.id async for m in client.models.list()] == ["mock"]

    wrong = openai.AsyncOpenAI(base_url=f"{frontend.url}/v1", api_key="sk-nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as caught:
        await wrong.chat.completions.create(model="mock", messages=messages, max_tokens=3)
    assert caught.value.code == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        await wrong.chat.completions.create(
            model="mock", messages=messages, max_tokens=3, stream=True
        )


async def test_a_request_can_be_cancelled_only_with_the_key_that_started_it(nursery, http_server):
    frontend = await keyed_frontend(nursery, server=http_server)
    results = {}

    async def stream_it() -> None:
        async with frontend.client() as client:
            results["r"] = await client.post(
                "/v1/chat/completions",
                json={**LONG, "stream": True},
                headers={**ALICE, "x-request-id": "mine"},
            )

    async with trio.open_nursery() as requests:
        requests.start_soon(stream_it)
        await running(frontend, "mine")
        async with frontend.client() as client:
            unknown = await client.delete("/v1/requests/nobody", headers=BOB)
            strangers = await client.delete("/v1/requests/mine", headers=BOB)
            anonymous = await client.delete("/v1/requests/mine")
            assert frontend.ends("mine") == []  # still running
            owners = await client.delete("/v1/requests/mine", headers=ALICE)
    # Another key's request is, to that key, exactly an unknown one.
    assert strangers.status_code == unknown.status_code == 404
    assert strangers.json()["error"]["code"] == unknown.json()["error"]["code"]
    assert "mine" in strangers.json()["error"]["message"]
    assert_refused(anonymous, CHALLENGE)
    assert owners.status_code == 200 and owners.json()["cancelled"] is True
    events = [e for e in results["r"].text.split("\n\n") if e]
    assert json.loads(events[-1].removeprefix("data: "))["error"]["code"] == "request_cancelled"
    await assert_ended_once_and_still_serving_with_key(frontend, "mine")


async def assert_ended_once_and_still_serving_with_key(frontend, request_id: str) -> None:
    await wait_until(lambda: frontend.ends(request_id), f"the engine to see {request_id} end")
    assert frontend.ends(request_id) == ["aborted"]
    await wait_until(lambda: len(frontend.app.services.registry) == 0, "no request in flight")
    async with frontend.client() as client:
        response = await client.post(
            "/v1/completions", json={"prompt": "x", "max_tokens": 1}, headers=ALICE
        )
        assert response.status_code == 200


async def test_images_fanout_is_owned_by_its_key(nursery, http_server):
    frontend = await keyed_frontend(nursery, server=http_server)
    results = {}

    async def generate() -> None:
        async with frontend.client() as client:
            results["r"] = await client.post(
                "/v1/images/generations",
                json={"prompt": "a cat", "n": 2, "mock_ttft_ms": 600_000},
                headers={**ALICE, "x-request-id": "pics"},
            )

    async with trio.open_nursery() as requests:
        requests.start_soon(generate)
        await wait_until(
            lambda: frontend.app.services.registry.get("pics") is not None, "pics to run"
        )
        async with frontend.client() as client:
            assert (await client.delete("/v1/requests/pics", headers=BOB)).status_code == 404
            assert (await client.delete("/v1/requests/pics", headers=ALICE)).status_code == 200
    assert results["r"].status_code == 499


# -- WebSocket -------------------------------------------------------------------------------


async def converse(ws, client_id: str = "a") -> None:
    await ws.send_message(request(client_id, "over the socket", max_tokens=3))
    seen = await collect(ws, {client_id})
    assert seen[client_id][-1]["type"] == "done"


async def test_websocket_with_the_key_in_the_authorization_header(nursery, http_server):
    frontend = await keyed_frontend(nursery, server=http_server)
    headers = [(b"authorization", f"Bearer {KEY}".encode())]
    with trio.fail_after(HANG_GUARD):
        async with open_websocket_url(ws_url(frontend), extra_headers=headers) as ws:
            await converse(ws)
            assert ws.subprotocol is None


async def test_websocket_with_the_key_in_a_subprotocol_token(nursery, http_server):
    frontend = await keyed_frontend(nursery, server=http_server)
    offered = ["trioserve.v1", f"trioserve.bearer.{KEY}"]
    with trio.fail_after(HANG_GUARD):
        async with open_websocket_url(ws_url(frontend), subprotocols=offered) as ws:
            await converse(ws)
            selected = ws.subprotocol
    assert selected != f"trioserve.bearer.{KEY}"  # the key is never echoed
    assert selected == "trioserve.v1"  # browsers fail a handshake that selects none


@pytest.mark.parametrize(
    ("headers", "subprotocols"),
    [
        ([], None),
        ([], ["trioserve.v1"]),
        ([(b"authorization", b"Bearer sk-test-mallory")], None),
        ([(b"authorization", b"Bearer")], None),
        ([(b"authorization", b"Basic c2stdGVzdC1hbGljZTo=")], None),
        ([], ["trioserve.v1", "trioserve.bearer.sk-test-mallory"]),
    ],
)
async def test_websocket_without_a_valid_key_is_refused_before_the_upgrade(
    nursery, http_server, headers, subprotocols
):
    frontend = await keyed_frontend(nursery, server=http_server)
    with trio.fail_after(HANG_GUARD), pytest.raises(ConnectionRejected) as caught:
        async with open_websocket_url(
            ws_url(frontend), extra_headers=headers, subprotocols=subprotocols
        ):
            pass
    rejected = caught.value
    assert 400 <= rejected.status_code < 500
    assert frontend.engine.core.stats.submitted == 0
    assert rejected.status_code == 401
    response_headers = {k.lower(): v for k, v in rejected.headers}
    assert response_headers[b"www-authenticate"].startswith(b'Bearer realm="trioserve"')
    assert json.loads(rejected.body)["error"]["code"] == "invalid_api_key"


async def test_websocket_requests_are_cancelled_only_by_their_key(nursery, http_server):
    frontend = await keyed_frontend(nursery, server=http_server)
    headers = [(b"authorization", f"Bearer {KEY}".encode())]
    async with open_websocket_url(ws_url(frontend), extra_headers=headers) as ws:
        await ws.send_message(request("long", "go on", max_tokens=100_000))
        first = await receive(ws)
        request_id = first["data"]["id"].removeprefix("cmpl-")  # the id to DELETE
        path = f"/v1/requests/{request_id}"
        async with frontend.client() as client:
            assert (await client.delete(path, headers=BOB)).status_code == 404
            assert (await client.delete(path, headers=ALICE)).status_code == 200
        seen = await collect(ws, {"long"})
    assert seen["long"][-1]["error"]["code"] == "request_cancelled"
