"""Tool calls and reasoning in chat completions, parsed by the frontend out of the text
the engine writes (the mock, scripted with ``mock_answer``): JSON, SSE and WebSocket;
``tool_choice`` auto, none, required and named; the openai SDK's tool loop."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
import trio
from trio_websocket import open_websocket_url

from tests.helpers.frontends import capture_submits, start_engine, start_frontend
from tests.helpers.waiting import HANG_GUARD

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    },
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}},
]
CALL = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris, naïve café"}}\n</tool_call>'
)
THINKING = "The user wants the weather; I should call the tool.</think>\n\n"
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]


def chat(answer: str, **body: Any) -> dict[str, Any]:
    return {"messages": MESSAGES, "tools": TOOLS, "mock_answer": answer, **body}


@pytest.fixture
async def frontend(nursery, http_server):
    engine = await start_engine(nursery)
    return await start_frontend(
        nursery, engine, server=http_server, tool_call_parser="hermes", reasoning_parser="qwen3"
    )


async def post(frontend, body: dict[str, Any]) -> dict[str, Any]:
    async with frontend.client() as client:
        response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()


async def stream(frontend, body: dict[str, Any]) -> list[dict[str, Any]]:
    chunks = []
    async with (
        frontend.client() as client,
        client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as response,
    ):
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                chunks.append(json.loads(line[6:]))
    return chunks


def added_up(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """A streamed answer, added up as a client does: content, reasoning, calls by index."""
    out: dict[str, Any] = {"content": "", "reasoning": "", "calls": {}, "finish": None}
    for chunk in chunks:
        choice = chunk["choices"][0]
        delta = choice["delta"]
        out["content"] += delta.get("content") or ""
        out["reasoning"] += delta.get("reasoning") or ""
        for call in delta.get("tool_calls") or []:
            entry = out["calls"].setdefault(call["index"], {"name": None, "arguments": ""})
            if "id" in call:
                assert entry["name"] is None, "a call starts once"
                entry["id"], entry["name"] = call["id"], call["function"]["name"]
            entry["arguments"] += call["function"].get("arguments", "")
        out["finish"] = choice["finish_reason"] or out["finish"]
    return out


async def test_json_answer_has_the_reasoning_then_the_call(frontend):
    answer = await post(frontend, chat(THINKING + CALL))
    choice = answer["choices"][0]
    message = choice["message"]
    assert choice["finish_reason"] == "tool_calls"
    assert message["reasoning"] == THINKING.removesuffix("</think>\n\n")
    assert message["content"] is None
    [call] = message["tool_calls"]
    assert call["type"] == "function"
    assert call["id"].startswith("chatcmpl-tool-")
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris, naïve café"}


async def test_streamed_call_names_first_and_sends_arguments_as_generated(frontend):
    chunks = await stream(frontend, chat(THINKING + CALL, mock_chars_per_token=3))
    total = added_up(chunks)
    assert total["finish"] == "tool_calls"
    assert total["reasoning"] == THINKING.removesuffix("</think>\n\n")
    [call] = total["calls"].values()
    assert call["name"] == "get_weather"
    assert json.loads(call["arguments"]) == {"city": "Paris, naïve café"}
    # The arguments came in many chunks, not in one at the end.
    pieces = [
        c
        for chunk in chunks
        for c in chunk["choices"][0]["delta"].get("tool_calls") or []
        if c["function"].get("arguments")
    ]
    assert len(pieces) > 5
    # The name came before any argument, in a chunk of its own call start.
    first = next(
        c for chunk in chunks for c in chunk["choices"][0]["delta"].get("tool_calls") or []
    )
    assert first["function"]["name"] == "get_weather" and "id" in first


async def test_parallel_calls_get_their_own_index_and_id(frontend):
    second = '\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    answer = await post(frontend, chat(CALL + second))
    calls = answer["choices"][0]["message"]["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["get_weather", "get_time"]
    assert len({c["id"] for c in calls}) == 2
    streamed = added_up(await stream(frontend, chat(CALL + second)))
    assert [c["name"] for c in streamed["calls"].values()] == ["get_weather", "get_time"]
    one = await post(frontend, chat(CALL + second, parallel_tool_calls=False))
    assert [c["function"]["name"] for c in one["choices"][0]["message"]["tool_calls"]] == [
        "get_weather"
    ]


@pytest.mark.parametrize(
    "text",
    [
        "It is sunny in Paris.",
        "<tool_call>\nnot a call at all\n</tool_call>",
        'An example: <tool_ is not a tag, and {"name": 1} is not a call.',
    ],
)
async def test_a_text_that_is_not_a_call_is_answered_as_text(frontend, text):
    answer = await post(frontend, chat("</think>" + text))
    choice = answer["choices"][0]
    assert choice["message"]["content"] == text
    assert choice["message"]["tool_calls"] == []
    assert choice["finish_reason"] == "stop"
    streamed = added_up(await stream(frontend, chat("</think>" + text, mock_chars_per_token=1)))
    assert streamed["content"] == text
    assert streamed["calls"] == {}
    assert streamed["finish"] == "stop"


async def test_a_call_cut_by_max_tokens_is_text_in_json_and_ends_length(frontend):
    body = chat(CALL, max_tokens=8)
    answer = await post(frontend, body)
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "length"
    assert choice["message"]["tool_calls"] == []
    assert choice["message"]["content"] == CALL[:32]
    streamed = added_up(await stream(frontend, body))
    assert streamed["finish"] == "length"


async def test_tool_choice_none_answers_the_text_and_tells_the_engine_none(frontend):
    submits = capture_submits(frontend)
    answer = await post(frontend, chat("</think>" + CALL, tool_choice="none"))
    assert answer["choices"][0]["message"]["content"] == CALL
    assert "tool_calls" not in answer["choices"][0]["message"]
    assert submits[-1].params["tool_choice"] == "none"
    assert submits[-1].params["tools"] == TOOLS


async def test_required_hands_the_engine_vllms_structural_tag_and_parses_the_call(frontend):
    # As vLLM 0.32 forces a hermes call: a structural tag holds the model to <tool_call>
    # envelopes of the declared tools (arguments free: no tool says strict), and the
    # answer is read by the hermes parser.
    submits = capture_submits(frontend)
    options = {"disable_any_whitespace": True, "regex": "x+"}  # the constraint is replaced
    answer = await post(
        frontend, chat("</think>" + CALL, tool_choice="required", structured_outputs=options)
    )
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    [call] = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris, naïve café"}
    assert choice["message"]["content"] == ""
    sent = submits[-1].params["structured_outputs"]
    assert sent["disable_any_whitespace"] is True and "regex" not in sent
    tag = json.loads(sent["structural_tag"])["format"]
    assert tag["type"] == "tags_with_separator" and tag["at_least_one"] is True
    begins = [t["begin"] for t in tag["tags"]]
    assert '<tool_call>\n{"name": "get_weather", "arguments": ' in begins
    assert '<tool_call>{"name": "get_time", "arguments": ' in begins
    assert {t["content"]["json_schema"] for t in tag["tags"]} == {True}
    assert submits[-1].params["tool_choice"] == "none"
    assert submits[-1].params["skip_special_tokens"] is False


async def test_a_named_function_is_called_in_the_formats_syntax_and_ends_stop(frontend):
    submits = capture_submits(frontend)
    choice_of = {"type": "function", "function": {"name": "get_weather"}}
    answer = await post(frontend, chat("</think>" + CALL, tool_choice=choice_of))
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "stop"
    [call] = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    tag = json.loads(submits[-1].params["structured_outputs"]["structural_tag"])["format"]
    assert tag["stop_after_first"] is True
    assert {t["begin"].split('"')[3] for t in tag["tags"]} == {"get_weather"}


async def test_auto_is_constrained_only_for_a_strict_tool_or_one_call(frontend):
    submits = capture_submits(frontend)
    await post(frontend, chat("Sunny."))
    assert "structured_outputs" not in submits[-1].params
    strict = [{**TOOLS[0], "function": {**TOOLS[0]["function"], "strict": True}}, TOOLS[1]]
    await post(frontend, chat("Sunny.", tools=strict))
    tag = json.loads(submits[-1].params["structured_outputs"]["structural_tag"])["format"]
    assert tag["type"] == "triggered_tags" and tag["triggers"] == ["<tool_call>"]
    schemas = [t["content"]["json_schema"] for t in tag["tags"]]
    assert schemas == [TOOLS[0]["function"]["parameters"]] * 2 + [True, True]
    await post(frontend, chat("Sunny.", parallel_tool_calls=False))
    tag = json.loads(submits[-1].params["structured_outputs"]["structural_tag"])["format"]
    assert tag["stop_after_first"] is True and tag["at_least_one"] is False


@pytest.mark.parametrize("level", ["function", "parameter"])
async def test_a_tool_strict_level_constrains_auto_for_every_tool(nursery, http_server, level):
    # --tool-strict-level function: a call the model opens is held to the envelope, with
    # any tool, strict or not; parameter: its arguments to the tool's schema too.
    engine = await start_engine(nursery)
    frontend = await start_frontend(
        nursery, engine, server=http_server, tool_call_parser="hermes", tool_strict_level=level
    )
    submits = capture_submits(frontend)
    await post(frontend, chat("Sunny."))
    tag = json.loads(submits[-1].params["structured_outputs"]["structural_tag"])["format"]
    assert tag["type"] == "triggered_tags" and tag["triggers"] == ["<tool_call>"]
    schemas = [t["content"]["json_schema"] for t in tag["tags"]]
    if level == "parameter":
        assert schemas[0] == TOOLS[0]["function"]["parameters"]
    else:
        assert schemas == [True] * len(schemas)


async def test_auto_with_a_strict_tool_and_a_response_format_is_the_calls_or_the_format(
    frontend,
):
    # As vLLM 0.32's server (Parser._apply_structural_tag): one grammar, either the calls
    # (as for "required") or the request's format; the format is not sent apart.
    submits = capture_submits(frontend)
    strict = [{**TOOLS[0], "function": {**TOOLS[0]["function"], "strict": True}}, TOOLS[1]]
    schema = {"type": "object", "properties": {"sky": {"type": "string"}}}
    json_schema = {"type": "json_schema", "json_schema": {"name": "sky", "schema": schema}}
    answer = await post(
        frontend, chat('</think>{"sky": "clear"}', tools=strict, response_format=json_schema)
    )
    assert answer["choices"][0]["message"]["content"] == '{"sky": "clear"}'
    assert answer["choices"][0]["message"]["tool_calls"] == []
    sent = submits[-1].params
    assert "response_format" not in sent
    tag = json.loads(sent["structured_outputs"]["structural_tag"])["format"]
    calls, own = tag["elements"]
    assert tag["type"] == "or" and calls["type"] == "tags_with_separator"
    assert calls["at_least_one"] is True  # the calls' branch has a call
    assert own["type"] == "json_schema" and own["json_schema"] == schema

    called = '</think><tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
    answer = await post(
        frontend, chat(called, tools=strict, structured_outputs={"regex": "[a-z]+"})
    )
    assert answer["choices"][0]["finish_reason"] == "tool_calls"
    tag = json.loads(submits[-1].params["structured_outputs"]["structural_tag"])["format"]
    assert tag["elements"][1] == {"type": "regex", "pattern": "[a-z]+"}

    # Without a strict tool, or with a Lark grammar (xgrammar's to convert), the
    # request's own constraint stays alone.
    await post(frontend, chat("{}", response_format={"type": "json_object"}))
    assert submits[-1].params["response_format"] == {"type": "json_object"}
    assert "structured_outputs" not in submits[-1].params
    lark = {"grammar": 'start: "sunny"'}
    await post(frontend, chat("sunny", tools=strict, structured_outputs=lark))
    assert submits[-1].params["structured_outputs"] == lark


@pytest.fixture
async def plain(nursery, http_server):
    """A frontend without a tool-call format: forced calls take vLLM's generic path."""
    return await start_frontend(nursery, await start_engine(nursery), server=http_server)


async def test_required_without_a_format_hands_the_generic_schema_and_parses_the_array(plain):
    submits = capture_submits(plain)
    forced = '[{"name": "get_weather", "parameters": {"city": "Oslo"}}]'
    answer = await post(plain, chat(forced, tool_choice="required"))
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    [call] = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Oslo"}
    schema = submits[-1].params["structured_outputs"]["json"]
    assert schema["type"] == "array" and schema["minItems"] == 1
    names = [v["properties"]["name"]["enum"] for v in schema["items"]["anyOf"]]
    assert names == [["get_weather"], ["get_time"]]


async def test_a_named_function_without_a_format_is_its_arguments_and_ends_stop(plain):
    submits = capture_submits(plain)
    choice_of = {"type": "function", "function": {"name": "get_weather"}}
    answer = await post(plain, chat('{"city": "Lima"}', tool_choice=choice_of))
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "stop"
    [call] = choice["message"]["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Lima"}'}
    assert submits[-1].params["structured_outputs"]["json"] == TOOLS[0]["function"]["parameters"]


async def test_a_forced_mistral_call_is_its_array_of_name_and_arguments(nursery, http_server):
    engine = await start_engine(nursery)
    frontend = await start_frontend(nursery, engine, server=http_server, tool_call_parser="mistral")
    submits = capture_submits(frontend)
    forced = '[{"name": "get_weather", "arguments": {"city": "Oslo"}}]'
    answer = await post(frontend, chat(forced, tool_choice="required"))
    [call] = answer["choices"][0]["message"]["tool_calls"]
    assert json.loads(call["function"]["arguments"]) == {"city": "Oslo"}
    schema = submits[-1].params["structured_outputs"]["json"]
    assert schema["items"]["anyOf"][0]["required"] == ["name", "arguments"]


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ({"tools": []}, "$.tools"),
        ({"tools": [{"type": "function"}]}, "$.tools[0].function"),
        ({"tool_choice": "required"}, "$.tool_choice"),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "$.tool_choice"),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "$.tool_choice",
        ),
        ({"tools": TOOLS, "parallel_tool_calls": "yes"}, "$.parallel_tool_calls"),
        ({"reasoning_effort": "extreme"}, "$.reasoning_effort"),
    ],
)
async def test_bad_tool_fields_are_a_422_naming_the_field(frontend, body, where):
    async with frontend.client() as client:
        response = await client.post("/v1/chat/completions", json={"messages": MESSAGES, **body})
    assert response.status_code == 422
    assert where in json.dumps(response.json())


async def test_auto_without_a_tool_call_parser_is_refused_as_vllm_refuses_it(nursery, http_server):
    engine = await start_engine(nursery)
    plain = await start_frontend(nursery, engine, server=http_server)
    async with plain.client() as client:
        response = await client.post(
            "/v1/chat/completions", json={"messages": MESSAGES, "tools": TOOLS}
        )
        assert response.status_code == 422
        assert "--tool-call-parser" in response.text
        # tool_choice none still renders the tools, and answers plain text.
        ok = await client.post(
            "/v1/chat/completions",
            json={"messages": MESSAGES, "tools": TOOLS, "tool_choice": "none"},
        )
        assert ok.status_code == 200


async def test_enable_thinking_false_has_no_reasoning(frontend):
    body = chat("No thinking here.", chat_template_kwargs={"enable_thinking": False})
    message = (await post(frontend, body))["choices"][0]["message"]
    assert message["content"] == "No thinking here." and message["reasoning"] is None
    effort = chat("No thinking here.", reasoning_effort="none")
    assert (await post(frontend, effort))["choices"][0]["message"]["reasoning"] is None


async def test_n_choices_are_parsed_each(frontend):
    body = chat(THINKING + CALL, n=2)
    answer = await post(frontend, body)
    assert [c["finish_reason"] for c in answer["choices"]] == ["tool_calls", "tool_calls"]
    ids = [c["message"]["tool_calls"][0]["id"] for c in answer["choices"]]
    assert len(set(ids)) == 2
    chunks = await stream(frontend, body)
    for index in (0, 1):
        mine = [c for c in chunks if c["choices"] and c["choices"][0]["index"] == index]
        total = added_up(mine)
        assert total["finish"] == "tool_calls"
        assert json.loads(total["calls"][0]["arguments"]) == {"city": "Paris, naïve café"}


async def test_websocket_streams_the_reasoning_and_the_call(frontend):
    url = f"ws://{frontend.host}:{frontend.port}/v1/ws"
    request = {"type": "request", "id": "a", "endpoint": "chat.completions"}
    request["body"] = chat(THINKING + CALL)
    chunks = []
    with trio.fail_after(HANG_GUARD):
        async with open_websocket_url(url) as ws:
            await ws.send_message(json.dumps(request))
            while (message := json.loads(await ws.get_message()))["type"] == "chunk":
                chunks.append(message["data"])
    assert message["type"] == "done"
    total = added_up(chunks)
    assert total["finish"] == "tool_calls"
    assert total["reasoning"] == THINKING.removesuffix("</think>\n\n")
    assert json.loads(total["calls"][0]["arguments"]) == {"city": "Paris, naïve café"}


async def test_the_openai_sdk_tool_loop_runs_against_the_scripted_mock(frontend):
    client = openai.AsyncOpenAI(base_url=f"{frontend.url}/v1", api_key="unused", max_retries=0)
    messages: list[Any] = list(MESSAGES)
    first = await client.chat.completions.create(
        model="mock", messages=messages, tools=TOOLS, extra_body={"mock_answer": THINKING + CALL}
    )
    message = first.choices[0].message
    assert first.choices[0].finish_reason == "tool_calls"
    assert message.tool_calls and message.tool_calls[0].function.name == "get_weather"
    city = json.loads(message.tool_calls[0].function.arguments)["city"]
    messages.append(message.model_dump(exclude_none=True))
    messages.append(
        {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": f"{city}: 21 C"}
    )
    # The streaming helper adds the deltas up into the same call.
    async with client.chat.completions.stream(
        model="mock", messages=messages, tools=TOOLS, extra_body={"mock_answer": THINKING + CALL}
    ) as streamed:
        final = await streamed.get_final_completion()
    streamed_call = final.choices[0].message.tool_calls[0]
    assert streamed_call.function.name == "get_weather"
    assert json.loads(streamed_call.function.arguments) == {"city": city}
    done = await client.chat.completions.create(
        model="mock", messages=messages, tools=TOOLS, extra_body={"mock_answer": "</think>21 C."}
    )
    assert done.choices[0].finish_reason == "stop"
    assert done.choices[0].message.content == "21 C."
    await client.close()
