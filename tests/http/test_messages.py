"""POST /v1/messages and /v1/messages/count_tokens (Anthropic's Messages API), with the
official anthropic client against the mock engine: JSON and its event stream, what
reaches the engine, errors in Anthropic's shape, keys in X-Api-Key. Every early end of a
message aborts once: tests/http/test_fault_matrix.py covers the route."""

from __future__ import annotations

import base64

import anthropic
import pytest

from tests.helpers.frontends import capture_submits, start_engine, start_frontend
from tests.helpers.responses import named_events
from tests.helpers.text_models import build_text_model
from tests.helpers.waiting import wait_until
from trioserve import metrics
from trioserve.engine_programs.mock import expected_text
from trioserve.http.bodies.anthropic import parse_messages


def sdk(frontend, **options) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(
        base_url=frontend.url, api_key=options.pop("api_key", "unused"), max_retries=0, **options
    )


HELLO = [{"role": "user", "content": "hello there"}]
#: A 1x1 PNG.
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAAAAAA6fptVAAAACklEQVR4nGNgAAAAAgABSK+kcQAAAABJRU5ErkJggg=="
)


async def test_sdk_create_answers_a_message_with_usage(frontend):
    message = await sdk(frontend).messages.create(model="mock", max_tokens=5, messages=HELLO)
    assert message.type == "message" and message.role == "assistant"
    assert message.id.startswith("msg_") and message.model == "mock"
    [block] = message.content
    assert block.type == "text" and block.text == expected_text("hello there", 5)
    assert message.stop_reason == "max_tokens" and message.stop_sequence is None
    assert message.usage.input_tokens == 2 and message.usage.output_tokens == 5


async def test_sdk_stream_gives_the_text_and_the_final_message(frontend):
    client = sdk(frontend)
    async with client.messages.stream(model="mock", max_tokens=6, messages=HELLO) as stream:
        texts = [text async for text in stream.text_stream]
        final = await stream.get_final_message()
    assert "".join(texts) == expected_text("hello there", 6)
    assert final.content[0].text == expected_text("hello there", 6)
    assert final.stop_reason == "max_tokens"
    assert final.usage.input_tokens == 2 and final.usage.output_tokens == 6


async def test_the_stream_is_anthropics_event_sequence(frontend):
    async with frontend.client() as client:
        response = await client.post(
            "/v1/messages",
            json={"max_tokens": 4, "messages": HELLO, "stream": True},
            headers={"anthropic-version": "2023-06-01", "x-request-id": "seq1"},
        )
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = named_events(response.text)
    assert all(name == data["type"] for name, data in events)
    names = [name for name, _ in events]
    deltas = names.count("content_block_delta")
    assert deltas >= 1
    assert names == [
        "message_start",
        "content_block_start",
        *["content_block_delta"] * deltas,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start = events[0][1]["message"]
    assert start["id"] == "msg_seq1" and start["content"] == [] and start["stop_reason"] is None
    assert events[1][1] == {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "text", "text": ""},
    }
    text = "".join(data["delta"]["text"] for name, data in events if name == "content_block_delta")
    assert text == expected_text("hello there", 4)
    assert events[-2][1]["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert events[-2][1]["usage"] == {"input_tokens": 2, "output_tokens": 4}


async def test_system_blocks_images_tools_and_results_reach_the_engine_as_chat(frontend):
    submits = capture_submits(frontend)
    image = base64.b64encode(PNG).decode()
    tool = {
        "name": "get_weather",
        "description": "the weather of a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
    await sdk(frontend).messages.create(
        model="mock",
        max_tokens=3,
        system=[{"type": "text", "text": "be brief"}],
        tools=[tool],
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
        stop_sequences=["END"],
        metadata={"user_id": "u1"},
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "weather?"},
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": image},
                    },
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "look it up", "signature": ""},
                    {"type": "text", "text": "let me look"},
                    {
                        "type": "tool_use",
                        "id": "t1",
                        "name": "get_weather",
                        "input": {"city": "Oslo"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": "sunny"},
                    {"type": "text", "text": "thanks"},
                ],
            },
        ],
        extra_body={"seed": 3, "temperature": 0.5, "top_k": 5},
    )
    [submit] = submits
    assert submit.task == "chat"
    messages = submit.inputs["messages"]
    assert messages[0] == {"role": "system", "content": "be brief"}
    first = messages[1]["content"]
    assert first[0] == {"type": "text", "text": "weather?"}
    assert first[1]["type"] == "image" and first[1]["media"]["mime_type"] == "image/png"
    assert bytes(first[1]["media"]["data"]) == PNG
    assert messages[2] == {
        "role": "assistant",
        "content": "let me look",
        "reasoning": "look it up",
        "tool_calls": [
            {
                "id": "t1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
            }
        ],
    }
    assert messages[3] == {"role": "tool", "tool_call_id": "t1", "content": "sunny"}
    assert messages[4] == {"role": "user", "content": "thanks"}
    assert submit.inputs["modalities"] == ["text", "image"]
    # tool_choice any is chat's required: the engine renders the tools and is held to
    # the calls by structured outputs; the frontend parses (http/bodies/agents.py).
    params = dict(submit.params)
    assert params.pop("structured_outputs")["json"]["type"] == "array"
    assert params == {
        "max_tokens": 3,
        "temperature": 0.5,
        "top_k": 5,
        "stop": ["END"],
        "seed": 3,
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "description": "the weather of a city",
                    "parameters": tool["input_schema"],
                },
            }
        ],
        "tool_choice": "none",
        "parallel_tool_calls": False,
        "skip_special_tokens": False,
    }
    # metadata.user_id is the session key of affinity routing (never on the wire).
    body = {"max_tokens": 1, "messages": HELLO, "metadata": {"user_id": "u1"}}
    assert parse_messages(body, "id", lambda model: "mock").submit.session_key == "u1"


@pytest.mark.parametrize(
    ("thinking", "kwargs", "budget"),
    [
        ({"type": "enabled", "budget_tokens": 1024}, {"enable_thinking": True}, 1024),
        ({"type": "disabled"}, {"enable_thinking": False}, None),
    ],
)
async def test_thinking_asks_the_chat_template(frontend, thinking, kwargs, budget):
    submits = capture_submits(frontend)
    await sdk(frontend).messages.create(
        model="mock",
        max_tokens=2048,
        messages=HELLO,
        thinking=thinking,
        extra_body={"mock_tokens_per_second": 1e5},
    )
    [submit] = submits
    assert submit.params["chat_template_kwargs"] == kwargs
    assert submit.params.get("thinking_token_budget") == budget


async def test_sdk_count_tokens_estimates_what_the_model_reads(frontend):
    count = await sdk(frontend).messages.count_tokens(
        model="mock", system="be brief", messages=[{"role": "user", "content": "x" * 400}]
    )
    assert count.input_tokens == 102  # (408 characters, at 4 a token: an estimate)
    async with frontend.client() as client:
        response = await client.post("/v1/messages/count_tokens", json={"messages": HELLO})
    assert response.json() == {"input_tokens": 3, "estimated": True}


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({"messages": HELLO}, "$.max_tokens"),
        ({"max_tokens": 0, "messages": HELLO}, "$.max_tokens"),
        ({"max_tokens": 4, "messages": []}, "$.messages"),
        ({"max_tokens": 4, "messages": [{"role": "robot", "content": "x"}]}, "$.messages[0].role"),
        (
            {"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "document"}]}]},
            "$.messages[0].content[0].type",
        ),
        ({"max_tokens": 4, "messages": HELLO, "temperature": 1.5}, "$.temperature"),
        (
            {
                "max_tokens": 4,
                "messages": HELLO,
                "tools": [{"type": "web_search_20250305", "name": "w"}],
            },
            "$.tools[0].type",
        ),
        ({"max_tokens": 4, "messages": HELLO, "tool_choice": {"type": "any"}}, "$.tool_choice"),
        (
            {
                "max_tokens": 2000,
                "messages": HELLO,
                "thinking": {"type": "enabled", "budget_tokens": 2000},
            },
            "$.thinking.budget_tokens",
        ),
        ({"max_tokens": 4, "messages": HELLO, "mcp_servers": [{"url": "x"}]}, "$.mcp_servers"),
    ],
)
async def test_invalid_bodies_are_anthropics_400_naming_the_field(frontend, body, loc):
    submits = capture_submits(frontend)
    async with frontend.client() as client:
        response = await client.post("/v1/messages", json=body, headers={"x-request-id": "bad1"})
    assert response.status_code == 400, response.text
    answer = response.json()
    assert answer["type"] == "error" and answer["request_id"] == "bad1"
    error = answer["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "invalid_request"
    assert loc in [d["loc"] for d in error["details"]]
    assert submits == []


async def test_sdk_raises_anthropics_errors(frontend):
    client = sdk(frontend)
    with pytest.raises(anthropic.BadRequestError) as caught:
        await client.messages.create(model="mock", max_tokens=4, messages=[])
    assert caught.value.body["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.NotFoundError) as caught:
        await client.messages.create(model="claude-nope", max_tokens=4, messages=HELLO)
    assert caught.value.body["error"]["code"] == "model_not_found"
    async with frontend.client() as raw:
        response = await raw.get("/v1/messages")
    assert response.status_code == 405 and response.json()["type"] == "error"


@pytest.mark.parametrize("stream", [False, True])
async def test_engine_error_before_any_output_is_its_own_status(frontend, stream):
    body = {"max_tokens": 4, "messages": HELLO, "stream": stream}
    body |= {"mock_error_after": 0, "mock_error_status": 429}
    async with frontend.client() as client:
        response = await client.post("/v1/messages", json=body)
    assert response.status_code == 429
    assert response.json()["error"] == {
        "type": "rate_limit_error",
        "message": "mock engine failure",
        "code": "engine_error",
    }


async def test_engine_error_mid_stream_is_an_error_event_the_sdk_raises(frontend):
    client = sdk(frontend)
    with pytest.raises(anthropic.APIStatusError) as caught:
        async with client.messages.stream(
            model="mock",
            max_tokens=50,
            messages=HELLO,
            extra_body={"mock_error_after": 2, "mock_error_message": "broke"},
        ) as stream:
            async for _ in stream:
                pass
    assert caught.value.body["error"]["message"] == "broke"
    async with frontend.client() as raw:
        response = await raw.post(
            "/v1/messages",
            json={"max_tokens": 50, "messages": HELLO, "stream": True, "mock_error_after": 2},
        )
    events = named_events(response.text)
    assert events[-1] == (
        "error",
        {
            "type": "error",
            "error": {
                "type": "api_error",
                "message": "mock engine failure",
                "code": "engine_error",
            },
        },
    )
    assert "message_stop" not in [name for name, _ in events]


async def test_a_silent_stream_starts_with_message_start_then_pings(nursery, http_server):
    engine = await start_engine(nursery)
    frontend = await start_frontend(nursery, engine, server=http_server, sse_keepalive=0.05)
    body = {"max_tokens": 2, "messages": HELLO, "stream": True, "mock_ttft_ms": 400}
    async with frontend.client() as client:
        response = await client.post("/v1/messages", json=body)
    events = named_events(response.text)
    names = [name for name, _ in events]
    assert names[0] == "message_start" and names[1] == "ping"
    assert names.count("message_start") == 1
    assert names[-1] == "message_stop"
    assert names[names.index("content_block_start") - 1] == "ping"


async def test_api_keys_come_as_x_api_key_and_refusals_are_anthropics(nursery, http_server):
    engine = await start_engine(nursery)
    frontend = await start_frontend(nursery, engine, server=http_server, api_keys=["k1", "k2"])
    message = await sdk(frontend, api_key="k2").messages.create(
        model="mock", max_tokens=2, messages=HELLO
    )
    assert message.usage.output_tokens == 2
    with pytest.raises(anthropic.AuthenticationError) as caught:
        await sdk(frontend, api_key="wrong").messages.create(
            model="mock", max_tokens=2, messages=HELLO
        )
    assert caught.value.body["error"]["type"] == "authentication_error"
    async with frontend.client() as client:
        missing = await client.post("/v1/messages", json={"max_tokens": 2, "messages": HELLO})
        both = await client.post(
            "/v1/messages",
            json={"max_tokens": 2, "messages": HELLO},
            headers={"x-api-key": "k1", "authorization": "Bearer k1"},
        )
        chat = await client.post(
            "/v1/chat/completions",
            json={"max_tokens": 2, "messages": HELLO},
            headers={"x-api-key": "k1"},
        )
    assert missing.status_code == 401 and missing.json()["type"] == "error"
    assert both.status_code == 401 and "more than one" in both.json()["error"]["message"]
    assert chat.status_code == 200  # X-Api-Key serves every route


async def test_the_route_is_described_and_counted(frontend):
    def served() -> float:
        sample = metrics.REGISTRY.get_sample_value(
            "trioserve_http_requests_total",
            {"route": "/v1/messages", "method": "POST", "status": "200"},
        )
        return sample or 0.0

    before = served()
    await sdk(frontend).messages.create(model="mock", max_tokens=1, messages=HELLO)
    await wait_until(lambda: served() == before + 1, "the message counted")
    async with frontend.client() as client:
        spec = (await client.get("/openapi.json")).json()
    operation = spec["paths"]["/v1/messages"]["post"]
    assert operation["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/MessagesRequest"
    }
    assert "max_tokens" in spec["components"]["schemas"]["MessagesRequest"]["required"]
    assert operation["responses"]["400"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/AnthropicError"
    }
    assert "/v1/messages/count_tokens" in spec["paths"]


async def test_count_tokens_uses_the_models_tokenizer_when_it_is_here(
    nursery, http_server, tmp_path
):
    engine = await start_engine(nursery)
    model_dir = build_text_model(tmp_path, harder=True)
    frontend = await start_frontend(nursery, engine, server=http_server, tokenizer=str(model_dir))
    messages = [{"role": "user", "content": "Wetter in Zürich? 日本 🙂"}]
    count = await sdk(frontend).messages.count_tokens(
        model="mock", system="Réponds brièvement.", messages=messages
    )
    chat = [{"role": "system", "content": "Réponds brièvement."}, *messages]
    async with frontend.client() as client:
        tokenized = (await client.post("/tokenize", json={"messages": chat})).json()
        raw = (await client.post("/v1/messages/count_tokens", json={"messages": messages})).json()
    # The chat template rendered and tokenized, as /tokenize does it: no estimate.
    assert count.input_tokens == tokenized["count"] > 0
    assert "estimated" not in raw
