"""A failure stays where it starts: a bug in one request's writer ends that request alone
(a 500 if nothing was sent, one abort at the engine), and every other request and the
server go on."""

from __future__ import annotations

import json

from tests.helpers.http import raw_request, read_until
from tests.helpers.waiting import wait_until
from trioserve.http.writers.stream import JSONWriter, SSEWriter

LONG = {"messages": [{"role": "user", "content": "go on"}], "max_tokens": 100_000}
SHORT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 40, "stream": True}


async def test_a_writer_failing_in_the_engine_links_task_ends_only_its_request(
    frontend, monkeypatch
):
    # The synchronous path of a stream's writer runs in the task that reads the engine's
    # socket for every request. Broken for one request, it used to end the whole frontend.
    original = SSEWriter.sink

    def sink(self):
        if "broken" not in self.fmt.id:
            return original(self)

        def broken(items):
            raise RuntimeError("a bug in this request's writer")

        return broken

    monkeypatch.setattr(SSEWriter, "sink", sink)
    body = json.dumps({**LONG, "stream": True}).encode()
    healthy = await raw_request(frontend, "POST", "/v1/chat/completions", body, x_request_id="ok")
    await read_until(healthy, b"data: ")  # streaming before the broken one starts
    async with frontend.client() as client:
        answer = await client.post(
            "/v1/chat/completions", json=SHORT, headers={"x-request-id": "broken"}
        )
        assert answer.status_code == 500, answer.text
        assert answer.json()["error"]["code"] == "internal_error"
        await wait_until(lambda: frontend.ends("broken"), "the engine to see the request end")
        assert frontend.ends("broken") == ["aborted"]  # one abort, nothing more
        # The other stream is still flowing, and the server serves the next request.
        await read_until(healthy, b"data: ")
        again = await client.post("/v1/chat/completions", json=SHORT)
        assert again.text.endswith("data: [DONE]\n\n")
    await healthy.aclose()
    await wait_until(lambda: frontend.ends("ok"), "the healthy stream to be aborted")
    assert frontend.ends("ok") == ["aborted"]
    assert frontend.engine.core.stats.unknown_aborts == 0


async def test_a_writer_failing_in_the_requests_task_costs_one_500_and_one_abort(
    frontend, monkeypatch
):
    original = JSONWriter.write

    async def write(self, batch):
        if "boom" in self.fmt.id:
            raise RuntimeError("a bug in this request's writer")
        return await original(self, batch)

    monkeypatch.setattr(JSONWriter, "write", write)
    # Every delta through the request's task (the writer's synchronous path would collect
    # them in the engine link's task, and the task would write only at the end).
    monkeypatch.setattr(JSONWriter, "sink", lambda self: None)
    async with frontend.client() as client:
        answer = await client.post(
            "/v1/chat/completions", json=LONG, headers={"x-request-id": "boom"}
        )
        assert answer.status_code == 500
        await wait_until(lambda: frontend.ends("boom"), "the engine to see the request end")
        assert frontend.ends("boom") == ["aborted"]
        again = await client.post("/v1/chat/completions", json=SHORT)
        assert again.text.endswith("data: [DONE]\n\n")
    await wait_until(lambda: len(frontend.app.services.registry) == 0, "no request in flight")


async def test_a_failure_right_after_the_submit_still_aborts_the_engine_request(
    frontend, monkeypatch
):
    # What runs between the submit and the relay (the writer's preparation) used to sit
    # outside the block whose exit aborts: a failure there left the engine request
    # running with nobody to end it.
    def prepare(self):
        raise RuntimeError("a bug while preparing the response")

    monkeypatch.setattr(SSEWriter, "prepare", prepare)
    async with frontend.client() as client:
        answer = await client.post(
            "/v1/chat/completions",
            # No output for ten minutes: only an abort ends it.
            json={**LONG, "stream": True, "mock_ttft_ms": 600_000},
            headers={"x-request-id": "prep"},
        )
        assert answer.status_code == 500
    await wait_until(lambda: frontend.ends("prep"), "the engine to see the request end")
    assert frontend.ends("prep") == ["aborted"]
