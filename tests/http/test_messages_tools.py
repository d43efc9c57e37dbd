"""Tool use and thinking on /v1/messages: the mock engine scripted (``mock_answer``) to
write a call and its thinking as Qwen 3 would, read by the frontend's parsers (hermes,
qwen3) into tool_use and thinking blocks; the anthropic client's tool loop."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import pytest

from tests.helpers.frontends import capture_submits, start_engine, start_frontend
from tests.helpers.responses import named_events

WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
CALL = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris, naïve café"}}\n</tool_call>'
)
THOUGHT = "The user wants the weather; I should call the tool."
THINKING = THOUGHT + "</think>\n\n"
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture
async def frontend(nursery, http_server):
    engine = await start_engine(nursery)
    return await start_frontend(
        nursery, engine, server=http_server, tool_call_parser="hermes", reasoning_parser="qwen3"
    )


def sdk(frontend) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=frontend.url, api_key="unused", max_retries=0)


def scripted(answer: str, **more: Any) -> dict[str, Any]:
    return {"mock_answer": answer, **more}


async def test_a_call_is_a_tool_use_block_after_the_thinking(frontend):
    message = await sdk(frontend).messages.create(
        model="mock",
        max_tokens=200,
        messages=ASK,
        tools=[WEATHER],
        extra_body=scripted(THINKING + CALL),
    )
    assert message.stop_reason == "tool_use"
    thinking, call = message.content
    assert thinking.type == "thinking" and thinking.thinking == THOUGHT
    assert call.type == "tool_use" and call.id.startswith("toolu_")
    assert call.name == "get_weather" and call.input == {"city": "Paris, naïve café"}


async def test_a_plain_answer_ends_the_turn(frontend):
    message = await sdk(frontend).messages.create(
        model="mock",
        max_tokens=200,
        messages=ASK,
        tools=[WEATHER],
        extra_body=scripted(THINKING + "It is sunny."),
    )
    assert message.stop_reason == "end_turn"
    assert [block.type for block in message.content] == ["thinking", "text"]
    assert message.content[1].text == "\n\nIt is sunny."  # (as vLLM's qwen3 parser leaves it)


async def test_streamed_call_names_first_and_streams_its_arguments(frontend):
    async with frontend.client() as client:
        response = await client.post(
            "/v1/messages",
            json={
                "max_tokens": 200,
                "messages": ASK,
                "tools": [WEATHER],
                "stream": True,
                **scripted(THINKING + CALL, mock_chars_per_token=3),
            },
        )
    events = named_events(response.text)
    starts = [data["content_block"] for name, data in events if name == "content_block_start"]
    assert [block["type"] for block in starts] == ["thinking", "tool_use"]
    assert starts[1]["name"] == "get_weather" and starts[1]["input"] == {}
    deltas = [data["delta"] for name, data in events if name == "content_block_delta"]
    thought = "".join(d["thinking"] for d in deltas if d["type"] == "thinking_delta")
    assert thought == THOUGHT
    arguments = [d["partial_json"] for d in deltas if d["type"] == "input_json_delta"]
    assert json.loads("".join(arguments)) == {"city": "Paris, naïve café"}
    assert len(arguments) > 3  # as generated, not in one piece at the end
    # Each block is started, given its deltas, and stopped before the next one starts.
    names = [name for name, _ in events]
    assert names.count("content_block_stop") == 2
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"
    assert names[-1] == "message_stop"


async def test_the_sdk_stream_adds_up_the_tool_use(frontend):
    async with sdk(frontend).messages.stream(
        model="mock",
        max_tokens=200,
        messages=ASK,
        tools=[WEATHER],
        extra_body=scripted(CALL, mock_chars_per_token=2),
    ) as stream:
        final = await stream.get_final_message()
    [call] = final.content
    assert call.type == "tool_use" and call.input == {"city": "Paris, naïve café"}
    assert final.stop_reason == "tool_use"


async def test_the_sdk_tool_loop_sends_the_result_back(frontend):
    client = sdk(frontend)
    submits = capture_submits(frontend)
    first = await client.messages.create(
        model="mock",
        max_tokens=200,
        messages=ASK,
        tools=[WEATHER],
        extra_body=scripted(CALL),
    )
    [call] = first.content
    assert call.type == "tool_use"
    turn = [
        *ASK,
        {"role": "assistant", "content": [block.model_dump() for block in first.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "sunny, 21 C"}],
        },
    ]
    final = await client.messages.create(
        model="mock",
        max_tokens=200,
        messages=turn,
        tools=[WEATHER],
        extra_body=scripted(THINKING + "It is sunny in Paris."),
    )
    assert final.stop_reason == "end_turn"
    assert final.content[-1].text == "\n\nIt is sunny in Paris."
    messages = submits[1].inputs["messages"]
    assert messages[1]["role"] == "assistant"
    [sent] = messages[1]["tool_calls"]
    assert sent["id"] == call.id and sent["function"]["name"] == "get_weather"
    assert json.loads(sent["function"]["arguments"]) == {"city": "Paris, naïve café"}
    assert messages[2] == {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"}
    # The engine renders the tools; the frontend parses (as on chat completions).
    assert submits[1].params["tool_choice"] == "none"


async def test_a_forced_call_is_constrained_like_chats(frontend):
    submits = capture_submits(frontend)
    message = await sdk(frontend).messages.create(
        model="mock",
        max_tokens=200,
        messages=ASK,
        tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather"},
        extra_body=scripted(THINKING + CALL),
    )
    thinking, call = message.content
    assert thinking.thinking == THOUGHT
    assert call.type == "tool_use" and call.input == {"city": "Paris, naïve café"}
    assert message.stop_reason == "tool_use"
    # hermes: held to the call's <tool_call> envelope, as vLLM holds it.
    assert "structural_tag" in submits[0].params["structured_outputs"]


async def test_auto_without_a_tool_call_parser_is_anthropics_400(nursery, http_server):
    engine = await start_engine(nursery)
    frontend = await start_frontend(nursery, engine, server=http_server)
    with pytest.raises(anthropic.BadRequestError) as caught:
        await sdk(frontend).messages.create(
            model="mock", max_tokens=20, messages=ASK, tools=[WEATHER]
        )
    assert "--tool-call-parser" in caught.value.body["error"]["message"]
