"""The engine-link seam, seen from HTTP: a link's prepare phase (before any engine hears of
the request) and a frontend-decided successful end (a stop string), on both servers, JSON
and SSE, over the real mock engine (tests/helpers/links.py)."""

from __future__ import annotations

import json

import pytest
import trio

from tests.helpers.frontends import capture_submits, start_frontend
from tests.helpers.http import raw_request
from tests.helpers.links import REFUSE, SLOW, Preparer, preparing_links
from tests.helpers.waiting import wait_until
from trioserve import metrics


def aborts(reason: str) -> float:
    return (
        metrics.REGISTRY.get_sample_value("trioserve_engine_aborts_total", {"reason": reason})
        or 0.0
    )


@pytest.fixture
async def seam(nursery, engine, http_server):
    preparer = Preparer()
    frontend = await start_frontend(
        nursery,
        engine,
        server=http_server,
        engines=[],
        links=[(engine.address, preparing_links(preparer))],
    )
    return frontend, preparer


def chat(content: str, **params: object) -> dict:
    return {"messages": [{"role": "user", "content": content}], "max_tokens": 50, **params}


async def test_a_request_is_prepared_then_submitted(seam):
    frontend, preparer = seam
    async with frontend.client() as client:
        response = await client.post(
            "/v1/chat/completions", json=chat("hello"), headers={"x-request-id": "p1"}
        )
    assert response.status_code == 200, response.text
    assert preparer.prepared == ["p1"] and frontend.ends("p1") == ["finished"]


async def test_what_the_prepare_phase_refuses_is_a_400_and_reaches_no_engine(seam):
    frontend, _ = seam
    submits = capture_submits(frontend)
    async with frontend.client() as client:
        for stream in (False, True):
            response = await client.post(
                "/v1/chat/completions", json=chat(f"{REFUSE} me", stream=stream)
            )
            assert response.status_code == 400
            assert response.json()["error"]["code"] == "invalid_prompt"
        assert (await client.post("/v1/chat/completions", json=chat("next"))).status_code == 200
    assert [s.inputs["messages"][0]["content"] for s in submits] == ["next"]


async def test_a_client_gone_while_preparing_owes_the_engine_nothing(seam):
    frontend, preparer = seam
    submits = capture_submits(frontend)
    before = aborts("disconnect")
    body = json.dumps(chat(f"{SLOW} a while", stream=True)).encode()
    stream = await raw_request(frontend, "POST", "/v1/chat/completions", body, x_request_id="w1")
    await wait_until(lambda: preparer.waiting == 1, "the preparer to hold the request")
    await stream.aclose()
    await wait_until(lambda: len(frontend.app.services.registry) == 0, "no request in flight")
    assert preparer.waiting == 0 and submits == [] and frontend.ends("w1") == []
    assert aborts("disconnect") == before  # nothing was submitted: no abort owed
    preparer.release.set()


async def test_a_deadline_while_preparing_is_a_504_without_an_abort(seam):
    frontend, _ = seam
    submits = capture_submits(frontend)
    before = aborts("deadline")
    async with frontend.client() as client:
        response = await client.post(
            "/v1/chat/completions",
            json=chat(SLOW),
            headers={"x-request-timeout": "0.2", "x-request-id": "w2"},
        )
    assert response.status_code == 504 and response.json()["error"]["code"] == "deadline_exceeded"
    assert submits == [] and aborts("deadline") == before


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_a_frontend_decided_stop_answers_200_stop_and_aborts_once(seam, stream):
    frontend, _ = seam
    before = aborts("stop_string")
    async with frontend.client() as client:
        response = await client.post(
            "/v1/chat/completions",
            json=chat("stop early", max_tokens=100_000, stream=stream),
            headers={"x-request-id": "s1"},
        )
        assert response.status_code == 200, response.text
        if stream:
            events = [
                json.loads(line[6:])
                for line in response.text.splitlines()
                if line.startswith("data: {")
            ]
            text = "".join(
                e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"]
            )
            finish = [e["choices"][0]["finish_reason"] for e in events if e["choices"]][-1]
            assert response.text.endswith("data: [DONE]\n\n")
        else:
            choice = response.json()["choices"][0]
            text, finish = choice["message"]["content"], choice["finish_reason"]
        assert finish == "stop" and text
        await wait_until(lambda: frontend.ends("s1"), "the engine to see s1 end")
        assert frontend.ends("s1") == ["aborted"]  # one abort, for the stop
        assert frontend.engine.core.stats.unknown_aborts == 0
        assert aborts("stop_string") == before + 1
        assert (await client.post("/v1/chat/completions", json=chat("next"))).status_code == 200
    await wait_until(lambda: len(frontend.app.services.registry) == 0, "no request in flight")


async def test_the_live_view_shows_a_request_being_prepared(seam):
    frontend, preparer = seam
    async with frontend.client() as client, trio.open_nursery() as nursery:
        nursery.start_soon(
            lambda: client.post(
                "/v1/chat/completions", json=chat(SLOW), headers={"x-request-id": "v1"}
            )
        )
        await wait_until(lambda: preparer.waiting == 1, "the preparer to hold the request")
        handle = frontend.app.services.registry.get("v1")
        assert handle is not None and handle.phase == "submitting" and handle.sub is None
        preparer.release.set()
    assert frontend.ends("v1") == ["finished"]
