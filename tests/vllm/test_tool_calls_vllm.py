"""Tools through trioserve to a real vLLM engine (the shared engine, the SDK's path): a
request with ``tools`` is served (it was a 400), the tools reach vLLM's chat template,
and each answer, JSON and streamed, is what ``vllm serve`` answers with the same parser
flags (``--enable-auto-tool-choice --tool-call-parser hermes``): ``auto`` (the tiny
model calls nothing), and calls forced by ``required`` or a named function, held to the
structural tag each server builds, with tools strict or not. Every request ends in vLLM."""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers.vllm import (
    CHAT,
    STRICT_WEATHER_TOOLS,
    WEATHER_TOOLS,
    frontend_on,
    post_json,
    settled,
    tool_answers_as_vllm_serves_them,
)
from tests.helpers.vllm_session import MODEL, Vllm

pytestmark = pytest.mark.integration

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


async def test_tool_answers_are_vllm_serves_answers_json_and_streamed(vllm: Vllm, nursery) -> None:
    frontend = await frontend_on(nursery, vllm, tool_call_parser="hermes")
    auto = await tool_answers_as_vllm_serves_them(frontend.url, vllm.reference_url, "auto")
    assert auto["tool_calls"] == [] and auto["content"]  # the tiny model calls none

    # The tiny model's weights are random: held to the structural tag (a <tool_call>
    # envelope of the tool), it opens a call; its arguments are free JSON unless the tool
    # is strict (then held to the schema, with the whitespace JSON allows: the tiny model
    # may write it until max_tokens). Cut off, JSON answers the call as text and the
    # stream has sent its deltas: both servers alike.
    named = {"type": "function", "function": {"name": "get_weather"}}
    for choice in ("required", named):
        for tools in (WEATHER_TOOLS, STRICT_WEATHER_TOOLS):
            read = await tool_answers_as_vllm_serves_them(
                frontend.url, vllm.reference_url, choice, tools
            )
            assert read["tool_calls"] or read["finish_reason"] == "length"
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
