"""Tools through trioserve to a real vLLM engine (the shared engine, the SDK's path): a
request with ``tools`` is served (it was a 400), the tools reach vLLM's chat template,
and a forced call is held by vLLM's structured outputs to the call's JSON schema, which
trioserve hands it. Every request ends in vLLM."""

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
    return {"messages": MESSAGES, "tools": TOOLS, "max_tokens": 40, "temperature": 0, **fields}


async def test_tools_are_served_and_forced_calls_constrained_by_vllm(vllm: Vllm, nursery) -> None:
    frontend = await frontend_on(nursery, vllm, tool_call_parser="hermes")
    auto = await post_json(frontend.url, CHAT, body())
    assert auto.status_code == 200, auto.text  # vLLM's renderer refused tools before
    assert auto.json()["choices"][0]["message"]["tool_calls"] == []  # the tiny model calls none

    # The tiny model's weights are random: held to the call's JSON schema by vLLM's
    # structured outputs, it writes the array's start and then whitespace (which JSON
    # allows) until max_tokens; cut off, the call is answered as text (docs/api.md). That
    # text is the schema's, which the random model would never write by itself.
    required = await post_json(frontend.url, CHAT, body(tool_choice="required"))
    assert required.status_code == 200, required.text
    choice = required.json()["choices"][0]
    if choice["finish_reason"] == "tool_calls":
        [call, *_] = choice["message"]["tool_calls"]
        assert call["function"]["name"] == "get_weather"
    else:
        assert choice["finish_reason"] == "length"
        assert choice["message"]["tool_calls"] == []
        assert choice["message"]["content"].lstrip().startswith("[")

    named = {"type": "function", "function": {"name": "get_weather"}}
    forced = await post_json(frontend.url, CHAT, body(tool_choice=named))
    assert forced.status_code == 200, forced.text
    choice = forced.json()["choices"][0]
    if choice["message"]["tool_calls"]:
        assert json.loads(choice["message"]["tool_calls"][0]["function"]["arguments"])
    else:
        assert choice["message"]["content"].lstrip().startswith("{")
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
