"""Tools through trioserve to a real vLLM engine (the shared engine, the SDK's path): a
request with ``tools`` is served (it was a 400), the tools reach vLLM's chat template,
and a forced call comes back as OpenAI ``tool_calls``: vLLM's structured outputs held the
tiny model to the call's JSON schema, trioserve parsed it. Every request ends in vLLM."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.helpers.vllm import frontend_on, post_json, settled
from tests.helpers.vllm_session import MODEL, Vllm

pytestmark = pytest.mark.integration

CHAT = "/v1/chat/completions"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    }
]
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]


def body(**fields: Any) -> dict[str, Any]:
    return {"messages": MESSAGES, "tools": TOOLS, "max_tokens": 120, "temperature": 0, **fields}


#: The tiny model's weights are random: left free, it fills JSON with whitespace until
#: max_tokens; the grammar without it leaves only the call (the client's option is kept).
TIGHT = {"structured_outputs": {"disable_any_whitespace": True}}


async def test_tools_are_served_and_forced_calls_come_back_as_tool_calls(
    vllm: Vllm, nursery
) -> None:
    frontend = await frontend_on(nursery, vllm, tool_call_parser="hermes")
    auto = await post_json(frontend.url, CHAT, body())
    assert auto.status_code == 200, auto.text  # vLLM's renderer refused tools before
    assert auto.json()["choices"][0]["message"]["tool_calls"] == []  # the tiny model calls none

    required = await post_json(frontend.url, CHAT, body(tool_choice="required", **TIGHT))
    assert required.status_code == 200, required.text
    choice = required.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls", choice
    [call] = choice["message"]["tool_calls"][:1]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"])["city"] in ("Paris", "Oslo")

    named = {"type": "function", "function": {"name": "get_weather"}}
    forced = await post_json(frontend.url, CHAT, body(tool_choice=named, **TIGHT))
    assert forced.status_code == 200, forced.text
    choice = forced.json()["choices"][0]
    assert choice["finish_reason"] == "stop"
    [call] = choice["message"]["tool_calls"]
    assert json.loads(call["function"]["arguments"])["city"] in ("Paris", "Oslo")
    await settled(vllm)


async def test_a_model_without_a_tool_call_parser_answers_tool_choice_none(
    vllm: Vllm, nursery
) -> None:
    frontend = await frontend_on(nursery, vllm)
    none = await post_json(frontend.url, CHAT, body(tool_choice="none", max_tokens=8))
    assert none.status_code == 200, none.text
    assert isinstance(none.json()["choices"][0]["message"]["content"], str)
    auto = await post_json(frontend.url, CHAT, body())
    assert auto.status_code == 422 and "--tool-call-parser" in auto.text
    assert MODEL
    await settled(vllm)
