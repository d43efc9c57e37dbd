"""Function calls and reasoning on /v1/responses, and conversation state
(``previous_response_id``): the mock engine scripted (``mock_answer``) to think and call
as Qwen 3 would, read by the frontend's parsers (hermes, qwen3); the openai client's
Responses tool loop, JSON, SSE, background and WebSocket."""

from __future__ import annotations

import json
import typing

import openai
import pytest
import trio
from openai.types.responses import ResponseStreamEvent
from trio_websocket import open_websocket_url

from tests.helpers.frontends import capture_submits, start_engine, start_frontend
from tests.helpers.responses import named_events
from tests.helpers.waiting import HANG_GUARD, wait_until

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
THOUGHT = "The user wants the weather; I should call the tool."
THINKING = THOUGHT + "</think>\n\n"
ASK = "What is the weather in Paris?"

#: The openai package's class of each event type.
EVENT_TYPES = {
    typing.get_args(cls.model_fields["type"].annotation)[0]: cls
    for cls in typing.get_args(typing.get_args(ResponseStreamEvent)[0])
}


@pytest.fixture
async def frontend(nursery, http_server):
    engine = await start_engine(nursery)
    return await start_frontend(
        nursery,
        engine,
        server=http_server,
        tool_call_parser="hermes",
        reasoning_parser="qwen3",
        api_keys=["key-a", "key-b"],
    )


def sdk(frontend, key: str = "key-a") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{frontend.url}/v1", api_key=key, max_retries=0)


def scripted(answer: str, **more) -> dict:
    return {"mock_answer": answer, **more}


async def test_the_sdk_tool_loop_continues_with_previous_response_id(frontend):
    client = sdk(frontend)
    submits = capture_submits(frontend)
    first = await client.responses.create(
        input=ASK, tools=[WEATHER], extra_body=scripted(THINKING + CALL)
    )
    assert first.status == "completed"
    reasoning, call = first.output
    assert reasoning.type == "reasoning" and reasoning.content[0].text == THOUGHT
    assert call.type == "function_call" and call.name == "get_weather"
    assert call.id.startswith("fc_") and call.status == "completed"
    assert json.loads(call.arguments) == {"city": "Paris"}
    assert first.tools[0].name == "get_weather"

    final = await client.responses.create(
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
        tools=[WEATHER],
        extra_body=scripted(THINKING + "It is sunny in Paris."),
    )
    assert final.status == "completed" and final.previous_response_id == first.id
    assert final.output_text == "\n\nIt is sunny in Paris."  # (as vLLM's qwen3 parser leaves it)
    # The engine read the whole conversation: the question, the call, its result.
    messages = submits[1].inputs["messages"]
    assert messages[0] == {"role": "user", "content": ASK}
    assert messages[1]["role"] == "assistant" and messages[1]["reasoning"] == THOUGHT
    [sent] = messages[1]["tool_calls"]
    assert sent["id"] == call.call_id and sent["function"]["name"] == "get_weather"
    assert messages[2] == {"role": "tool", "tool_call_id": call.call_id, "content": "sunny"}
    assert len(messages) == 3

    # A third turn continues from the second: the whole chain, the instructions its own.
    await client.responses.create(
        previous_response_id=final.id,
        instructions="be brief",
        input="thanks",
        extra_body=scripted("</think>You are welcome."),
    )
    third = submits[2].inputs["messages"]
    assert third[0] == {"role": "system", "content": "be brief"}
    assert third[1:4] == messages
    assert third[4]["role"] == "assistant" and third[4]["content"] == "\n\nIt is sunny in Paris."
    assert third[5] == {"role": "user", "content": "thanks"}


async def test_stateless_input_items_carry_the_calls_and_results(frontend):
    submits = capture_submits(frontend)
    await sdk(frontend).responses.create(
        input=[
            {"role": "user", "content": ASK},
            {"type": "reasoning", "id": "rs_1", "summary": [], "content": [
                {"type": "reasoning_text", "text": "look it up"}]},
            {"type": "function_call", "call_id": "c1", "name": "get_weather",
             "arguments": '{"city": "Paris"}'},
            {"type": "function_call", "call_id": "c2", "name": "get_weather",
             "arguments": '{"city": "Oslo"}'},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
            {"type": "function_call_output", "call_id": "c2", "output": [
                {"type": "input_text", "text": "rain"}]},
        ],
        tools=[WEATHER],
        tool_choice="none",
        extra_body=scripted("It is sunny in Paris and rainy in Oslo."),
    )  # fmt: skip
    messages = submits[0].inputs["messages"]
    assert messages[1] == {
        "role": "assistant",
        "content": None,
        "reasoning": "look it up",
        "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
            {"id": "c2", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}},
        ],
    }  # fmt: skip
    assert messages[2:] == [
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "c2", "content": "rain"},
    ]


async def test_the_stream_has_reasoning_and_function_call_events_the_sdk_accepts(frontend):
    async with frontend.client(headers={"authorization": "Bearer key-a"}) as client:
        response = await client.post(
            "/v1/responses",
            json={
                "input": ASK,
                "tools": [WEATHER],
                "stream": True,
                **scripted(THINKING + CALL, mock_chars_per_token=3),
            },
        )
    events = named_events(response.text)
    typed = [EVENT_TYPES[name].model_validate(data, strict=True) for name, data in events]
    assert [e.sequence_number for e in typed] == list(range(len(typed)))
    names = [name for name, _ in events]
    reasoning_deltas = names.count("response.reasoning_text.delta")
    argument_deltas = names.count("response.function_call_arguments.delta")
    assert reasoning_deltas >= 1 and argument_deltas > 3  # as generated, not at the end
    assert names == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.reasoning_text.delta"] * reasoning_deltas,
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        *["response.function_call_arguments.delta"] * argument_deltas,
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    added = [e for e in typed if e.type == "response.output_item.added"]
    assert [e.output_index for e in added] == [0, 1]
    assert added[1].item.name == "get_weather" and added[1].item.arguments == ""
    arguments = "".join(e.delta for e in typed if e.type.endswith("arguments.delta"))
    assert json.loads(arguments) == {"city": "Paris"}
    done = typed[-1].response
    assert [item.type for item in done.output] == ["reasoning", "function_call"]
    assert done.output[1].arguments == arguments


async def test_a_background_response_with_calls_replays_its_events(frontend):
    client = sdk(frontend)
    created = await client.responses.create(
        input=ASK,
        tools=[WEATHER],
        background=True,
        extra_body=scripted(THINKING + CALL, mock_chars_per_token=3),
    )
    await wait_until(
        lambda: frontend.app.services.responses.get(created.id, 0).finished, "it to end"
    )
    replayed = [event async for event in await client.responses.retrieve(created.id, stream=True)]
    kinds = [event.type for event in replayed]
    assert "response.function_call_arguments.delta" in kinds
    assert kinds[-1] == "response.completed"
    assert [e.sequence_number for e in replayed] == list(range(len(replayed)))
    later = await client.responses.retrieve(
        created.id, stream=True, starting_after=replayed[-3].sequence_number
    )
    assert [event.type async for event in later] == kinds[-2:]
    final = await client.responses.retrieve(created.id)
    assert [item.type for item in final.output] == ["reasoning", "function_call"]


async def test_another_key_and_unstored_responses_cannot_be_continued(frontend):
    client = sdk(frontend)
    stored = await client.responses.create(input=ASK, extra_body=scripted("</think>hi"))
    unstored = await client.responses.create(
        input=ASK, store=False, extra_body=scripted("</think>hi")
    )
    for key, previous in (("key-b", stored.id), ("key-a", unstored.id)):
        with pytest.raises(openai.NotFoundError) as caught:
            await sdk(frontend, key).responses.create(previous_response_id=previous, input="x")
        assert caught.value.body["code"] == "previous_response_not_found"
    # What store: false kept: nothing.
    assert frontend.app.services.responses.get(unstored.id, 0) is None


async def test_a_running_response_cannot_be_continued_yet(frontend):
    client = sdk(frontend)
    running = await client.responses.create(input=ASK, background=True, max_output_tokens=100_000)
    with pytest.raises(openai.ConflictError) as caught:
        await client.responses.create(previous_response_id=running.id, input="x")
    assert caught.value.body["code"] == "previous_response_in_progress"
    await client.responses.cancel(running.id)


async def test_the_websocket_streams_the_function_call_events(frontend):
    url = frontend.url.replace("http://", "ws://") + "/v1/ws"
    body = {"input": ASK, "tools": [WEATHER], **scripted(THINKING + CALL)}
    request = {"type": "request", "id": "r1", "endpoint": "responses", "body": body}
    kinds = []
    with trio.fail_after(HANG_GUARD):
        async with open_websocket_url(url, extra_headers=[("authorization", "Bearer key-a")]) as ws:
            await ws.send_message(json.dumps(request))
            while (message := json.loads(await ws.get_message()))["type"] != "done":
                assert message["type"] == "event", message
                kinds.append(message["data"]["type"])
    assert "response.function_call_arguments.done" in kinds
    assert kinds.index("response.reasoning_text.done") < kinds.index("response.output_item.done")
    assert kinds[-1] == "response.completed"
