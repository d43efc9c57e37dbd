"""What an operator sees of each request (http/observe.py): the latency histograms and
token counters, requests by status and by end, and one access log line per request, on
every route, on both servers."""

from __future__ import annotations

import json
import logging

import pytest
import trio
import trio_websocket

from tests.helpers.frontends import LONG, start_engine, start_frontend
from tests.helpers.step_engine import start_step_engine
from tests.helpers.waiting import HANG_GUARD, wait_until
from tests.helpers.websocket import collect, receive, request, ws_url
from trioserve import metrics
from trioserve.protocol import Usage
from trioserve.sdk import Output

CHAT = "/v1/chat/completions"


def sample(name: str, **labels: str) -> float:
    return metrics.REGISTRY.get_sample_value(name, labels) or 0.0


def stream_figures(model: str, route: str) -> dict[str, float]:
    labels = {"model": model, "route": route}
    return {
        "ttft": sample("trioserve_time_to_first_token_seconds_count", **labels),
        "itl": sample("trioserve_inter_token_latency_seconds_count", **labels),
        "tpot": sample("trioserve_time_per_output_token_seconds_count", **labels),
        "duration": sample(
            "trioserve_request_duration_seconds_count", **labels, outcome="completed"
        ),
        "queue": sample("trioserve_request_queue_time_seconds_count", model=model),
        "queue_sum": sample("trioserve_request_queue_time_seconds_sum", model=model),
        "prompt": sample("trioserve_prompt_tokens_total", **labels),
        "generated": sample("trioserve_generation_tokens_total", **labels),
        "completed": sample("trioserve_requests_total", **labels, outcome="completed"),
        "http_200": sample(
            "trioserve_http_requests_total", route=route, method="POST", status="200"
        ),
    }


async def next_data_line(lines) -> str:
    async for line in lines:
        if line.startswith("data: "):
            return line
    raise AssertionError("the stream ended")


async def test_a_stream_s_latencies_and_tokens_reach_the_metrics(nursery, http_server):
    engine, backend = await start_step_engine(nursery)
    frontend = await start_frontend(nursery, engine, server=http_server)
    before = stream_figures("steps", CHAT)
    body = {"model": "steps", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    async with frontend.client() as client, client.stream("POST", CHAT, json=body) as response:
        lines = response.aiter_lines()
        # Each output is sent once the client has the one before: three writes.
        await backend.step(Output("a"))
        await next_data_line(lines)
        await backend.step(Output("b"))
        await next_data_line(lines)
        await backend.step(Output("c", usage=Usage(4, 3), finish_reason="stop", queue_time=0.5))
        assert (await next_data_line(lines)).endswith(
            '"content":"c"},"logprobs":null,"finish_reason":null}]}'
        )
        async for _ in lines:
            pass

    def grown() -> dict[str, float]:
        after = stream_figures("steps", CHAT)
        return {key: after[key] - before[key] for key in after}

    await wait_until(lambda: grown()["http_200"] == 1, "the response to be counted")
    assert grown() == {
        "ttft": 1,
        "itl": 2,  # three writes, two gaps
        "tpot": 1,
        "duration": 1,
        "queue": 1,
        "queue_sum": 0.5,
        "prompt": 4,
        "generated": 3,
        "completed": 1,
        "http_200": 1,
    }


async def test_the_ttft_bucket_holds_the_engine_s_delay(frontend):
    # The mock waits 300 ms before its first token: the observation lands at or above
    # the 0.25 s bucket, never below (a lower bound only: the machine may be slow).
    labels = {"model": "mock", "route": "/v1/completions"}
    below = "trioserve_time_to_first_token_seconds_bucket"
    before = sample(below, **labels, le="0.25"), sample(below, **labels, le="+Inf")
    async with frontend.client() as client:
        body = {"prompt": "hi", "max_tokens": 2, "mock_ttft_ms": 300}
        assert (await client.post("/v1/completions", json=body)).status_code == 200
    await wait_until(lambda: sample(below, **labels, le="+Inf") == before[1] + 1)
    assert sample(below, **labels, le="0.25") == before[0]


@pytest.fixture
def access_lines(caplog):
    caplog.set_level(logging.INFO, logger="trioserve.access")

    def lines() -> list[dict]:
        return [r.access for r in caplog.records if r.name == "trioserve.access"]

    return lines


async def test_every_http_request_gets_one_access_log_line(frontend, access_lines):
    unmatched = sample(
        "trioserve_http_requests_total", route="unmatched", method="GET", status="404"
    )
    async with frontend.client() as client:
        assert (await client.get("/health")).status_code == 200
        assert (await client.get("/no/such/route")).status_code == 404
        body = {"prompt": "one two three", "max_tokens": 3}
        answer = await client.post("/v1/completions", json=body, headers={"x-request-id": "obs-1"})
        assert answer.status_code == 200
    await wait_until(lambda: len(access_lines()) == 3, "three access lines")
    health, missing, completion = access_lines()
    assert health["path"] == "/health" and health["status"] == 200 and health["end"] is None
    assert health["method"] == "GET" and health["protocol"] == "HTTP/1.1"
    assert missing["path"] == "/no/such/route" and missing["status"] == 404
    assert completion == {
        **completion,
        "method": "POST",
        "path": "/v1/completions",
        "status": 200,
        "bytes": len(answer.content),
        "prompt_tokens": 3,
        "completion_tokens": 3,
        "end": "completed",
        "request_id": "obs-1",
    }
    assert completion["ttft"] > 0 and completion["duration"] >= completion["ttft"]
    assert completion["client"].startswith("127.0.0.1:")
    assert (
        sample("trioserve_http_requests_total", route="unmatched", method="GET", status="404")
        == unmatched + 1
    )


async def test_a_client_that_leaves_is_logged_and_counted(frontend, access_lines):
    gone = sample("trioserve_client_disconnects_total", route=CHAT)
    async with frontend.client() as client:
        body = {**LONG, "stream": True}
        async with client.stream("POST", CHAT, json=body) as response:
            await next_data_line(response.aiter_lines())
    # A non-streaming request whose client leaves before any answer.
    stream = await trio.open_tcp_stream(frontend.host, frontend.port)
    payload = json.dumps(LONG).encode()
    await stream.send_all(
        b"POST %s HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%s" % (CHAT.encode(), len(payload), payload)
    )
    await wait_until(lambda: len(frontend.app.services.registry) == 1, "the request to run")
    await stream.aclose()
    await wait_until(lambda: len(access_lines()) == 2, "two access lines")
    streamed, waiting = access_lines()
    assert streamed["status"] == 200 and streamed["end"] == "disconnect"
    assert streamed["completion_tokens"] >= 1 and streamed["ttft"] > 0
    assert waiting["status"] == 499 and waiting["end"] == "disconnect"
    assert sample("trioserve_client_disconnects_total", route=CHAT) == gone + 2


async def test_each_websocket_request_and_the_socket_get_a_line(frontend, access_lines):
    async with trio_websocket.open_websocket_url(ws_url(frontend)) as ws:
        await ws.send_message(request("a", "hello there", max_tokens=2))
        await ws.send_message(request("b", "hi", max_tokens=3))
        await collect(ws, {"a", "b"})
        await ws.send_message(json.dumps({"type": "request", "id": "c", "endpoint": "nope"}))
        assert (await receive(ws))["type"] == "error"
        await wait_until(lambda: len(access_lines()) == 3, "three request lines")
    await wait_until(lambda: len(access_lines()) == 4, "the socket's line")
    *requests, socket = access_lines()
    by_status = sorted(requests, key=lambda line: (line["status"], line["completion_tokens"] or 0))
    first, second, refused = by_status
    assert first["method"] == second["method"] == "WS" and first["path"] == "/v1/ws"
    assert (first["protocol"], first["completion_tokens"], first["end"]) == (
        "completions",
        2,
        "completed",
    )
    assert (second["completion_tokens"], second["prompt_tokens"]) == (3, 1)
    assert first["socket"] == second["socket"] == refused["socket"] == socket["socket"]
    assert first["request_id"].endswith(".a") and first["bytes"] > 0
    assert (refused["status"], refused["end"], refused["protocol"]) == (400, None, "-")
    assert (socket["method"], socket["status"], socket["requests"]) == ("GET", 101, 3)
    assert socket["end"] == "client_closed" and socket["bytes"] >= first["bytes"] + second["bytes"]


async def test_no_access_log_writes_no_line_and_still_counts(nursery, engine, http_server, caplog):
    caplog.set_level(logging.INFO, logger="trioserve.access")
    frontend = await start_frontend(nursery, engine, server=http_server, access_log=False)
    before = sample("trioserve_http_requests_total", route="/health", method="GET", status="200")
    async with frontend.client() as client:
        assert (await client.get("/health")).status_code == 200
    await wait_until(
        lambda: (
            sample("trioserve_http_requests_total", route="/health", method="GET", status="200")
            == before + 1
        )
    )
    assert [r for r in caplog.records if r.name == "trioserve.access"] == []


async def test_an_access_line_cannot_be_split_by_the_path(frontend, access_lines):
    async with frontend.client() as client:
        # %0A decodes to a newline in the path the application sees.
        assert (await client.get("/x%0Ay%22z")).status_code == 404
    await wait_until(lambda: len(access_lines()) == 1)
    assert access_lines()[0]["path"] == '/x\\ny\\"z'


async def test_the_text_line_says_it_all(frontend, caplog):
    caplog.set_level(logging.INFO, logger="trioserve.access")
    async with frontend.client() as client:
        body = {"prompt": "one two", "max_tokens": 2}
        await client.post("/v1/completions", json=body, headers={"x-request-id": "line-1"})
    await wait_until(lambda: any(r.name == "trioserve.access" for r in caplog.records))
    (record,) = [r for r in caplog.records if r.name == "trioserve.access"]
    text = record.getMessage()
    assert text.startswith("127.0.0.1:")
    assert '"POST /v1/completions HTTP/1.1" 200 ' in text
    assert " tokens=2/2 end=completed id=line-1" in text and " ttft=" in text


async def test_an_engine_error_before_any_output_is_logged_with_its_status(frontend, access_lines):
    # An engine error before any output: the response's own status, in the line and the
    # metrics.
    async with frontend.client() as client:
        body = {"prompt": "x", "max_tokens": 3, "mock_error_after": 0, "mock_error_status": 429}
        assert (await client.post("/v1/completions", json=body)).status_code == 429
    await wait_until(lambda: len(access_lines()) == 1)
    line = access_lines()[0]
    assert (line["status"], line["end"]) == (429, "engine_error")


async def test_a_request_refused_before_any_output_has_no_ttft_and_no_tokens(
    frontend, access_lines
):
    # A request the engine refuses at once (a too-long prompt, a refused parameter) never
    # produced a token: it must not pull the TTFT histogram down nor count as generated.
    route = "/v1/completions"
    before = stream_figures("mock", route)
    async with frontend.client() as client:
        body = {"prompt": "x", "max_tokens": 3, "mock_error_after": 0, "mock_error_status": 400}
        assert (await client.post(route, json=body)).status_code == 400
    await wait_until(lambda: len(access_lines()) == 1)
    after = stream_figures("mock", route)
    assert (after["ttft"], after["generated"]) == (before["ttft"], before["generated"])
    line = access_lines()[0]
    assert (line["ttft"], line["completion_tokens"]) == (None, None)


async def test_a_websocket_handshake_on_another_path_is_logged_and_counted_there(
    frontend, access_lines
):
    def counted(route: str) -> float:
        return sample("trioserve_http_requests_total", route=route, method="GET", status="404")

    before = counted("unmatched"), counted("/v1/ws")
    url = f"ws://{frontend.host}:{frontend.port}/ws"
    with pytest.raises(trio_websocket.ConnectionRejected), trio.fail_after(HANG_GUARD):
        async with trio_websocket.open_websocket_url(url):
            pass
    await wait_until(lambda: len(access_lines()) == 1)
    assert (access_lines()[0]["path"], access_lines()[0]["status"]) == ("/ws", 404)
    assert (counted("unmatched"), counted("/v1/ws")) == (before[0] + 1, before[1])


async def test_the_access_log_and_the_live_view_name_the_key_by_its_label(
    nursery, http_server, access_lines
):
    engine = await start_engine(nursery)
    frontend = await start_frontend(
        nursery,
        engine,
        server=http_server,
        api_keys=["secret-a", "secret-b"],
        api_key_labels=["team-a"],
        debug_endpoints=True,
    )
    async with frontend.client() as client:
        for key in ("secret-a", "secret-b"):
            headers = {"authorization": f"Bearer {key}"}
            body = {"prompt": "hi", "max_tokens": 2}
            assert (
                await client.post("/v1/completions", json=body, headers=headers)
            ).status_code == 200
        assert (await client.get("/live")).status_code == 200
    await wait_until(lambda: len(access_lines()) == 3, "three access lines")
    assert [line["key"] for line in access_lines()] == ["team-a", "key-2", None]
    assert not any("secret" in str(line) for line in access_lines())
