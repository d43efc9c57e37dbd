"""vLLM's ``stop_reason`` (the stop string matched, or the stop token's id; null at the end
of sequence) and Anthropic's ``stop_sequence``, from the engine's final item to every
writer: chat and completions as JSON, SSE (one choice and ``n`` of them) and WebSocket, and
``/v1/messages`` as JSON and its event stream. The mock engine scripted (``mock_answer``)
cuts its answer at the request's stop strings, as vLLM does, and reports the string."""

from __future__ import annotations

import json
from typing import Any

import anthropic
from trio_websocket import open_websocket_url

from tests.helpers.responses import named_events
from tests.helpers.websocket import collect, ws_url

ANSWER = "Paris. Then Oslo!"
CHAT = {"messages": [{"role": "user", "content": "hi"}], "mock_answer": ANSWER}
COMPLETION = {"prompt": "hi", "mock_answer": ANSWER}


def chunks(text: str) -> list[dict[str, Any]]:
    events = [line.removeprefix("data: ") for line in text.split("\n\n")]
    return [json.loads(e) for e in events if e.startswith("{")]


async def test_a_stop_string_is_the_stop_reason_of_json_answers(frontend):
    async with frontend.client() as client:
        chat = await client.post("/v1/chat/completions", json={**CHAT, "stop": ["!", "."]})
        completion = await client.post("/v1/completions", json={**COMPLETION, "stop": "Oslo"})
        natural = await client.post("/v1/chat/completions", json=CHAT)
    [choice] = chat.json()["choices"]
    assert choice["message"]["content"] == "Paris"  # the earliest match wins
    assert (choice["finish_reason"], choice["stop_reason"]) == ("stop", ".")
    [choice] = completion.json()["choices"]
    assert (choice["text"], choice["stop_reason"]) == ("Paris. Then ", "Oslo")
    # The end of sequence: no stop reason, and the field is there (null), as vLLM has it.
    [choice] = natural.json()["choices"]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] is None


async def test_a_stop_string_is_the_stop_reason_of_the_last_chunk(frontend):
    async with frontend.client() as client:
        chat = await client.post(
            "/v1/chat/completions", json={**CHAT, "stop": ["."], "stream": True}
        )
        completion = await client.post(
            "/v1/completions", json={**COMPLETION, "stop": ["!"], "stream": True}
        )
    *deltas, last = chunks(chat.text)
    assert last["choices"][0]["finish_reason"] == "stop"
    assert last["choices"][0]["stop_reason"] == "."
    # A chat delta has no stop_reason; a completion chunk has it on every chunk (null
    # until the last), as vLLM streams them.
    assert all("stop_reason" not in c["choices"][0] for c in deltas)
    *deltas, last = chunks(completion.text)
    assert "".join(c["choices"][0]["text"] for c in deltas) == "Paris. Then Oslo"
    assert last["choices"][0]["stop_reason"] == "!"
    assert all(c["choices"][0]["stop_reason"] is None for c in deltas)


async def test_each_of_n_choices_has_its_own_stop_reason(frontend):
    # Seeded per choice: the mock's answer is the same, each choice says what stopped it.
    body = {**COMPLETION, "n": 2, "stop": ["."], "temperature": 1}
    async with frontend.client() as client:
        whole = await client.post("/v1/completions", json=body)
        streamed = await client.post("/v1/completions", json={**body, "stream": True})
    assert [c["stop_reason"] for c in whole.json()["choices"]] == [".", "."]
    finals = [c["choices"][0] for c in chunks(streamed.text) if c["choices"][0]["finish_reason"]]
    assert sorted((c["index"], c["stop_reason"]) for c in finals) == [(0, "."), (1, ".")]


async def test_a_stop_string_is_the_stop_reason_over_websocket(frontend):
    request = {"type": "request", "id": "s", "endpoint": "completions"}
    request["body"] = {**COMPLETION, "stop": ["."]}
    async with open_websocket_url(ws_url(frontend)) as ws:
        await ws.send_message(json.dumps(request))
        messages = (await collect(ws, {"s"}))["s"]
    [last] = [m for m in messages if m["type"] != "done"][-1:]
    assert last["data"]["choices"][0]["stop_reason"] == "."


def sdk(frontend) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=frontend.url, api_key="unused", max_retries=0)


async def test_a_stop_sequence_matched_is_the_messages_stop_reason(frontend):
    ask = [{"role": "user", "content": "hi"}]
    message = await sdk(frontend).messages.create(
        model="mock",
        max_tokens=50,
        messages=ask,
        stop_sequences=["Oslo"],
        extra_body={"mock_answer": ANSWER},
    )
    assert message.content[0].text == "Paris. Then "
    assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", "Oslo")
    ended = await sdk(frontend).messages.create(
        model="mock", max_tokens=50, messages=ask, extra_body={"mock_answer": ANSWER}
    )
    assert (ended.stop_reason, ended.stop_sequence) == ("end_turn", None)


async def test_a_stop_sequence_matched_is_in_the_message_delta_event(frontend):
    body = {
        "max_tokens": 50,
        "messages": [{"role": "user", "content": "hi"}],
        "stop_sequences": ["!"],
        "stream": True,
        "mock_answer": ANSWER,
    }
    async with frontend.client() as client:
        response = await client.post(
            "/v1/messages", json=body, headers={"anthropic-version": "2023-06-01"}
        )
    events = dict(named_events(response.text))
    assert events["message_delta"]["delta"] == {
        "stop_reason": "stop_sequence",
        "stop_sequence": "!",
    }
