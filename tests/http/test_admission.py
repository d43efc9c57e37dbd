"""Admission control: past --max-concurrent-requests, an immediate 503 with Retry-After;
operations routes bypass it; a stream holds its slot until its last byte."""

from __future__ import annotations

import json

import pytest
import trio
import trio_websocket

from tests.helpers.frontends import start_engine, start_frontend
from tests.helpers.http import read_until
from tests.helpers.waiting import wait_until
from trioserve import metrics
from trioserve.config import Settings

HANG = {"prompt": "hold", "max_tokens": 100, "stream": True, "mock_hang_after": 1}


@pytest.fixture
async def one_slot(nursery, http_server):
    engine = await start_engine(nursery)
    return await start_frontend(nursery, engine, server=http_server, max_concurrent_requests=1)


def test_default_limit_is_256():
    assert Settings().max_concurrent_requests == 256


async def test_past_the_limit_is_an_immediate_503_and_operations_bypass_it(one_slot):
    frontend = one_slot
    refused_before = metrics.REGISTRY.get_sample_value("trioserve_admission_refused_total") or 0
    async with (
        frontend.client() as client,
        client.stream(
            "POST", "/v1/completions", json=HANG, headers={"x-request-id": "holder"}
        ) as held,
    ):
        # Kept referenced: dropping a half-read iterator closes the response.
        chunks = held.aiter_bytes()
        await chunks.__anext__()  # the first event: the stream is under way, holding the slot
        for path, body in [
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}),
            ("/v1/completions", {"prompt": "x"}),
            ("/generate", {"prompt": "x"}),
            ("/v1/audio/speech", {"input": "x"}),
            ("/v1/images/generations", {"prompt": "x"}),
            ("/v1/videos/generations", {"prompt": "x"}),
        ]:
            response = await client.post(path, json=body)
            assert response.status_code == 503, path
            assert response.headers["retry-after"] == "1"
            payload = response.json()
            error = payload.get("error") or payload
            assert error["code"] == "server_overloaded"
            if path != "/generate":
                assert error["type"] == "overloaded_error"
        for path in ("/health", "/live", "/metrics", "/v1/models"):
            assert (await client.get(path)).status_code == 200, path
        # The stream is still the one in flight, and still holds the slot.
        assert frontend.app.services.admission.in_use == 1
        assert (await client.delete("/v1/requests/holder")).status_code == 200
        text = b"".join([chunk async for chunk in chunks]).decode()
    assert "request_cancelled" in text
    refused = metrics.REGISTRY.get_sample_value("trioserve_admission_refused_total")
    assert refused == refused_before + 6
    await wait_until(lambda: frontend.app.services.admission.in_use == 0, "the slot to be released")
    async with frontend.client() as client:
        assert (await client.post("/v1/completions", json={"prompt": "x"})).status_code == 200
    await wait_until(lambda: frontend.ends("holder"), "the engine to see the holder end")
    assert frontend.ends("holder") == ["aborted"]


async def test_generate_overload_is_in_the_native_detail_shape(one_slot):
    frontend = one_slot
    async with frontend.client() as client, client.stream("POST", "/generate", json=HANG) as held:
        chunks = held.aiter_bytes()
        await chunks.__anext__()
        response = await client.post("/generate", json={"prompt": "x"})
        assert response.status_code == 503
        assert response.json()["code"] == "server_overloaded"
        assert "detail" in response.json()


async def test_websocket_requests_take_slots_too(one_slot):
    frontend = one_slot
    async with trio_websocket.open_websocket_url(
        f"ws://{frontend.host}:{frontend.port}/v1/ws"
    ) as ws:
        await ws.send_message(
            json.dumps({"type": "request", "id": "a", "endpoint": "completions", "body": HANG})
        )
        first = json.loads(await ws.get_message())
        assert first["type"] == "chunk"
        await ws.send_message(
            json.dumps(
                {"type": "request", "id": "b", "endpoint": "completions", "body": {"prompt": "x"}}
            )
        )
        refused = json.loads(await ws.get_message())
        assert refused["type"] == "error" and refused["id"] == "b"
        assert refused["error"]["code"] == "server_overloaded"
        await ws.send_message(json.dumps({"type": "cancel", "id": "a"}))
    await wait_until(lambda: frontend.app.services.admission.in_use == 0, "the slot to be released")


async def test_a_body_still_arriving_holds_no_slot(one_slot):
    # A client that declares a 2 MiB body and sends it slowly: its slot used to be taken
    # before the body was read, so such clients could hold every slot; now the slot is
    # taken once the body is complete.
    frontend = one_slot
    body = json.dumps({"prompt": "x" * (2 * 2**20), "max_tokens": 1}).encode()
    slow = await trio.open_tcp_stream(frontend.host, frontend.port)
    head = (
        f"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    )
    await slow.send_all(head.encode() + body[: len(body) // 2])
    async with frontend.client() as client:
        answer = await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
        assert answer.status_code == 200, answer.text  # the one slot was free
    await slow.send_all(body[len(body) // 2 :])
    assert b"HTTP/1.1 200" in await read_until(slow, b'"finish_reason"')
    await slow.aclose()


async def test_bodies_held_in_memory_across_requests_are_bounded(nursery, http_server):
    # A 100 kB body holds about 200 kB: its bytes, and its parse (a 100 kB string).
    engine = await start_engine(nursery)
    frontend = await start_frontend(
        nursery, engine, server=http_server, max_body_memory_bytes=300_000
    )
    big = {"prompt": "x" * 100_000}
    async with (
        frontend.client() as client,
        client.stream(
            "POST", "/v1/completions", json={**HANG, **big}, headers={"x-request-id": "holder"}
        ) as held,
    ):
        chunks = held.aiter_bytes()
        await chunks.__anext__()  # under way: its 100 kB body is held until it ends
        refused = await client.post("/v1/completions", json={**big, "max_tokens": 1})
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "body_memory_exhausted"
        assert refused.headers["retry-after"] == "1"
        small = await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 1})
        assert small.status_code == 200  # what fits is served
        assert (await client.delete("/v1/requests/holder")).status_code == 200
        _ = [chunk async for chunk in chunks]
    await wait_until(
        lambda: frontend.app.services.body_budget.held == 0, "the held body to be given back"
    )
    async with frontend.client() as client:
        again = await client.post("/v1/completions", json={**big, "max_tokens": 1})
        assert again.status_code == 200


async def test_multipart_form_fields_are_held_in_the_body_budget(nursery, http_server):
    """Form fields (not files) are kept in memory: they count against
    --max-body-memory-mb from their first byte until their request ends, so stalled
    uploads full of fields cannot hold memory outside it (issue 27: four held 387 MiB
    under a 64 MiB budget)."""
    engine = await start_engine(nursery)
    frontend = await start_frontend(
        nursery, engine, server=http_server, max_body_memory_bytes=300_000
    )
    boundary = b"fieldsboundary"
    fields = b"".join(
        b'--%s\r\ncontent-disposition: form-data; name="f%d"\r\n\r\n%s\r\n'
        % (boundary, i, b"v" * 50_000)
        for i in range(4)
    )
    stalled = await trio.open_tcp_stream(frontend.host, frontend.port)
    head = (
        b"POST /generate HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n"
        b"content-type: multipart/form-data; boundary=%s\r\n\r\n" % boundary
    )
    await stalled.send_all(head + b"%x\r\n%s\r\n" % (len(fields), fields))  # no closing boundary
    budget = frontend.app.services.body_budget
    await wait_until(lambda: budget.held >= 200_000, "the fields to be counted")
    async with frontend.client() as client:
        refused = await client.post("/generate", json={"prompt": "x" * 60_000, "max_tokens": 1})
        assert refused.status_code == 503
        assert refused.json()["code"] == "body_memory_exhausted"
        # A second upload whose fields go past the budget is refused as they arrive.
        more = b"".join(
            b'--%s\r\ncontent-disposition: form-data; name="g%d"\r\n\r\n%s\r\n'
            % (boundary, i, b"w" * 50_000)
            for i in range(3)
        )
        over = await client.post(
            "/generate",
            content=more + b"--%s--\r\n" % boundary,
            headers={"content-type": f"multipart/form-data; boundary={boundary.decode()}"},
        )
        assert over.status_code == 503, over.text
        assert over.json()["code"] == "body_memory_exhausted"
    await stalled.aclose()
    await wait_until(lambda: budget.held == 0, "the stalled upload's fields to be given back")
    async with frontend.client() as client:
        # (The refused body fits once the fields are gone: 60 kB, and 60 kB parsed.)
        served = await client.post("/generate", json={"prompt": "x" * 60_000, "max_tokens": 1})
        assert served.status_code == 200


async def test_a_key_at_its_share_is_429_and_another_key_is_still_served(nursery, http_server):
    engine = await start_engine(nursery)
    frontend = await start_frontend(
        nursery, engine, server=http_server, max_concurrent_requests=2, api_keys=["ka", "kb"]
    )
    assert frontend.app.services.admission.per_key == 1  # 2 slots, 2 keys
    a = {"authorization": "Bearer ka"}
    b = {"authorization": "Bearer kb"}
    async with (
        frontend.client() as client,
        client.stream(
            "POST", "/v1/completions", json=HANG, headers={**a, "x-request-id": "holder"}
        ) as held,
    ):
        chunks = held.aiter_bytes()
        await chunks.__anext__()  # key a holds its one slot
        refused = await client.post("/v1/completions", json={"prompt": "x"}, headers=a)
        assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["code"] == "too_many_requests_for_key"
        # The server has a slot left, and it is key b's.
        served = await client.post("/v1/completions", json={"prompt": "x"}, headers=b)
        assert served.status_code == 200
        assert (await client.delete("/v1/requests/holder", headers=a)).status_code == 200
        b"".join([chunk async for chunk in chunks])
    await wait_until(lambda: frontend.app.services.admission.in_use == 0, "the slots released")
    assert frontend.app.services.admission.by_key == {}
    await wait_until(lambda: frontend.ends("holder"), "the engine to see the holder end")
    assert frontend.ends("holder") == ["aborted"]
