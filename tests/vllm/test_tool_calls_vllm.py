"""Tools through trioserve to a real vLLM engine (the shared engine, the SDK's path): a
request with ``tools`` is served (it was a 400), the tools reach vLLM's chat template,
and a forced call is held by vLLM's structured outputs to the structural tag vLLM's own
server sets for the hermes format, which trioserve hands it: the engine writes what
``vllm serve`` writes under it. Every request ends in vLLM."""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers.vllm import CHAT, forced_call_as_vllm_writes_it, frontend_on, post_json, settled
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


async def test_tools_are_served_and_forced_calls_constrained_by_vllm(vllm: Vllm, nursery) -> None:
    frontend = await frontend_on(nursery, vllm, tool_call_parser="hermes")
    auto = await post_json(frontend.url, CHAT, body())
    assert auto.status_code == 200, auto.text  # vLLM's renderer refused tools before
    assert auto.json()["choices"][0]["message"]["tool_calls"] == []  # the tiny model calls none

    # The tiny model's weights are random: held by vLLM's structured outputs to the
    # structural tag vLLM's own server would set (a <tool_call> envelope of the tool),
    # it writes exactly what vLLM's server writes under it; cut off by max_tokens, the
    # call is answered as text (docs/api.md).
    await forced_call_as_vllm_writes_it(frontend.url, vllm.reference_url, "required")
    named = {"type": "function", "function": {"name": "get_weather"}}
    await forced_call_as_vllm_writes_it(frontend.url, vllm.reference_url, named)
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
