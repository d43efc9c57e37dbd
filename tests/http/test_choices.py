"""``n`` > 1 choices on chat and completions: as many engine requests, one answer."""

from __future__ import annotations

import json

import pytest
import trio
from trio_websocket import open_websocket_url

from tests.helpers.http import raw_request
from tests.helpers.waiting import wait_until
from tests.helpers.websocket import ws_url
from trioserve.engine_programs.mock import expected_text

CHAT = ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]})
COMPLETION = ("/v1/completions", {"prompt": "Hi"})


def text(choice: dict) -> str:
    return choice["message"]["content"] if "message" in choice else choice["text"]


@pytest.mark.parametrize(("path", "body"), [CHAT, COMPLETION])
async def test_n_choices_are_n_engine_requests_in_one_answer(frontend, path, body):
    async with frontend.client() as client:
        answer = await client.post(
            path, json={**body, "n": 3, "max_tokens": 4, "seed": 10}, headers={"x-request-id": "c"}
        )
    assert answer.status_code == 200, answer.text
    choices = answer.json()["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2]
    assert all(text(c) == expected_text("Hi", 4) for c in choices)
    assert all(c["finish_reason"] == "length" for c in choices)
    assert answer.json()["usage"] == {
        "prompt_tokens": 1,
        "completion_tokens": 12,
        "total_tokens": 13,
    }
    # Each choice one engine request, ended once; choice i seeded with seed + i.
    assert [frontend.ends(f"c.{i}") for i in range(3)] == [["finished"]] * 3


async def test_a_client_gone_while_waiting_for_n_choices_aborts_each_once(frontend):
    body = json.dumps({**COMPLETION[1], "n": 2, "max_tokens": 100_000}).encode()
    stream = await raw_request(frontend, "POST", COMPLETION[0], body, x_request_id="g")
    await wait_until(lambda: len(frontend.engine.core.running) == 2, "both choices running")
    await stream.aclose()
    await wait_until(lambda: frontend.ends("g.0") and frontend.ends("g.1"), "both ended")
    assert [frontend.ends(f"g.{i}") for i in range(2)] == [["aborted"]] * 2
    await wait_until(lambda: len(frontend.app.services.registry) == 0, "nothing in flight")


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"n": 17}, "must be between 1 and 16"),
        ({"n": 0}, "must be between 1 and 16"),
    ],
)
async def test_what_n_does_not_serve_is_a_422_at_n(frontend, extra, message):
    async with frontend.client() as client:
        answer = await client.post(COMPLETION[0], json={**COMPLETION[1], **extra})
    assert answer.status_code == 422, answer.text
    assert answer.text.count("$.n") >= 1 and message in answer.text
    assert frontend.engine.core.stats.submitted == 0
    await trio.lowlevel.checkpoint()


@pytest.mark.parametrize(("path", "body"), [CHAT, COMPLETION])
async def test_n_streamed_choices_interleave_by_index_then_usage_and_done(frontend, path, body):
    events = []
    request = {**body, "n": 2, "max_tokens": 3, "stream": True}
    request["stream_options"] = {"include_usage": True}
    async with frontend.client() as client, client.stream("POST", path, json=request) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {"prompt_tokens": 1, "completion_tokens": 6, "total_tokens": 7}
    texts, finishes = {0: "", 1: ""}, {}
    for chunk in chunks[:-1]:
        (choice,) = chunk["choices"]
        delta = choice.get("delta", {}).get("content") or choice.get("text") or ""
        texts[choice["index"]] += delta
        if choice["finish_reason"]:
            finishes[choice["index"]] = choice["finish_reason"]
    assert texts == {0: expected_text("Hi", 3), 1: expected_text("Hi", 3)}
    assert finishes == {0: "length", 1: "length"}


async def test_a_streamed_choice_that_fails_ends_the_others_with_one_error_event(frontend):
    # Choice 1 (seed 11) fails after its first token: the stream ends with the error
    # event and no [DONE], and choice 0 is aborted, once.
    request = {**COMPLETION[1], "n": 2, "max_tokens": 100_000, "seed": 10, "stream": True}
    request["mock_by_seed"] = {"11": {"mock_error_after": 1}}
    async with (
        frontend.client() as client,
        client.stream("POST", COMPLETION[0], json=request, headers={"x-request-id": "f"}) as r,
    ):
        text = "".join([chunk async for chunk in r.aiter_text()])
    assert '"error"' in text.rsplit("data: ", 1)[-1] and "[DONE]" not in text
    await wait_until(lambda: frontend.ends("f.0") and frontend.ends("f.1"), "both ended")
    assert frontend.ends("f.0") == ["aborted"] and frontend.ends("f.1") == ["finished"]


def ws_request(client_id: str, endpoint: str, body: dict) -> str:
    return json.dumps({"type": "request", "id": client_id, "endpoint": endpoint, "body": body})


def engine_id(chunk: dict) -> str:
    """The server's request id of a WebSocket chunk (``chatcmpl-<id>``, ``cmpl-<id>``)."""
    return chunk["data"]["id"].split("-", 1)[1]


@pytest.mark.parametrize(
    ("endpoint", "body"), [("chat.completions", CHAT[1]), ("completions", COMPLETION[1])]
)
async def test_n_choices_over_the_websocket_are_chunks_by_index_then_one_done(
    frontend, endpoint, body
):
    messages = []
    with trio.fail_after(20):
        async with open_websocket_url(ws_url(frontend)) as ws:
            await ws.send_message(ws_request("a", endpoint, {**body, "n": 3, "max_tokens": 3}))
            while not messages or messages[-1]["type"] == "chunk":
                messages.append(json.loads(await ws.get_message()))
    # Every chunk is the SSE route's, tagged with its choice; one done ends the request,
    # with the prompt counted once and the completions summed.
    assert messages[-1] == {
        "type": "done",
        "id": "a",
        "usage": {"prompt_tokens": 1, "completion_tokens": 9, "total_tokens": 10},
    }
    texts, finishes = {0: "", 1: "", 2: ""}, {}
    for message in messages[:-1]:
        assert message["type"] == "chunk" and message["id"] == "a"
        (choice,) = message["data"]["choices"]
        texts[choice["index"]] += choice.get("delta", {}).get("content") or choice.get("text") or ""
        if choice["finish_reason"]:
            finishes[choice["index"]] = choice["finish_reason"]
    assert texts == {i: expected_text("Hi", 3) for i in range(3)}
    assert finishes == {0: "length", 1: "length", 2: "length"}
    request_id = engine_id(messages[0])
    assert {engine_id(m) for m in messages[:-1]} == {request_id}
    assert [frontend.ends(f"{request_id}.{i}") for i in range(3)] == [["finished"]] * 3


async def test_a_cancelled_websocket_request_of_n_choices_aborts_each_once(frontend):
    body = {**COMPLETION[1], "n": 2, "max_tokens": 100_000}
    with trio.fail_after(20):
        async with open_websocket_url(ws_url(frontend)) as ws:
            await ws.send_message(ws_request("a", "completions", body))
            first = json.loads(await ws.get_message())
            await wait_until(lambda: len(frontend.engine.core.running) == 2, "both running")
            await ws.send_message(json.dumps({"type": "cancel", "id": "a"}))
            ends = []
            while not ends:
                message = json.loads(await ws.get_message())
                if message["type"] != "chunk":
                    ends.append(message)
            # The socket goes on: the same id runs again at once.
            await ws.send_message(
                ws_request("a", "completions", {**COMPLETION[1], "max_tokens": 2})
            )
            while (message := json.loads(await ws.get_message()))["type"] == "chunk":
                pass
    assert message["type"] == "done"
    (end,) = ends
    assert end["type"] == "error" and end["id"] == "a"
    assert end["error"]["code"] == "request_cancelled"
    request_id = engine_id(first)
    await wait_until(lambda: all(frontend.ends(f"{request_id}.{i}") for i in range(2)), "ended")
    assert [frontend.ends(f"{request_id}.{i}") for i in range(2)] == [["aborted"]] * 2
    await wait_until(lambda: len(frontend.app.services.registry) == 0, "nothing in flight")


async def test_a_failing_websocket_choice_ends_the_others_with_one_error(frontend):
    # Choice 1 (seed 11) fails after its first token: the request's one message of its end
    # is that error, and choice 0 is aborted, once.
    body = {**COMPLETION[1], "n": 2, "max_tokens": 100_000, "seed": 10}
    body["mock_by_seed"] = {"11": {"mock_error_after": 1}}
    with trio.fail_after(20):
        async with open_websocket_url(ws_url(frontend)) as ws:
            await ws.send_message(ws_request("a", "completions", body))
            messages = [json.loads(await ws.get_message())]
            while messages[-1]["type"] == "chunk":
                messages.append(json.loads(await ws.get_message()))
            await ws.send_message(json.dumps({"type": "ping", "id": 1}))
            pong = json.loads(await ws.get_message())
    assert messages[-1]["type"] == "error" and messages[-1]["id"] == "a"
    assert pong == {"type": "pong", "id": 1}
    request_id = engine_id(messages[0])
    await wait_until(lambda: all(frontend.ends(f"{request_id}.{i}") for i in range(2)), "ended")
    assert frontend.ends(f"{request_id}.0") == ["aborted"]
    assert frontend.ends(f"{request_id}.1") == ["finished"]


@pytest.mark.parametrize("end", ["close", "delete"])
async def test_websocket_choices_end_together_with_the_socket_or_a_delete(frontend, end):
    body = {**CHAT[1], "n": 2, "max_tokens": 100_000}
    with trio.fail_after(20):
        async with open_websocket_url(ws_url(frontend)) as ws:
            await ws.send_message(ws_request("a", "chat.completions", body))
            request_id = engine_id(json.loads(await ws.get_message()))
            await wait_until(lambda: len(frontend.engine.core.running) == 2, "both running")
            if end == "delete":
                # The group's id (the chunks' own) ends every choice, as over HTTP.
                async with frontend.client() as client:
                    answer = await client.delete(f"/v1/requests/{request_id}")
                assert answer.status_code == 200, answer.text
                while (message := json.loads(await ws.get_message()))["type"] == "chunk":
                    pass
                assert message["type"] == "error" and message["id"] == "a"
    await wait_until(lambda: all(frontend.ends(f"{request_id}.{i}") for i in range(2)), "ended")
    assert [frontend.ends(f"{request_id}.{i}") for i in range(2)] == [["aborted"]] * 2
    await wait_until(lambda: len(frontend.app.services.registry) == 0, "nothing in flight")
