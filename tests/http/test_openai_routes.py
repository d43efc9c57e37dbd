"""The OpenAI-compatible surface end to end: hypercorn on port 0, real mock engine."""

from __future__ import annotations

import json
import uuid

import attrs
import openai
import pytest
import trio

from tests.helpers.frontends import capture_submits
from tests.helpers.waiting import HANG_GUARD
from trioserve.engine_programs.mock import expected_text

CHAT = {"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 5}


def sse_events(text: str) -> list[str]:
    return [line.removeprefix("data: ") for line in text.split("\n\n") if line.startswith("data: ")]


async def test_chat_completion_json(frontend):
    async with frontend.client() as client:
        response = await client.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"] == {
        "role": "assistant",
        "content": expected_text("hello there", 5),
    }
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": 2, "completion_tokens": 5, "total_tokens": 7}
    assert response.headers["x-request-id"]


async def test_completion_json_defaults_to_16_tokens(frontend):
    async with frontend.client() as client:
        response = await client.post("/v1/completions", json={"prompt": "abc"})
    body = response.json()
    assert body["object"] == "text_completion"
    assert body["choices"][0]["text"] == expected_text("abc", 16)
    assert body["usage"]["completion_tokens"] == 16


async def test_chat_stream_is_sse_ending_in_done_with_usage(frontend):
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    async with frontend.client() as client:
        response = await client.post("/v1/chat/completions", json=body)
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["cache-control"] == "no-cache"
    events = sse_events(response.text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == expected_text("hello there", 5)
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 5
    assert len({c["id"] for c in chunks}) == 1


async def test_stream_without_include_usage_has_no_usage_chunk(frontend):
    async with frontend.client() as client:
        response = await client.post("/v1/completions", json={"prompt": "p", "stream": True})
    chunks = [json.loads(e) for e in sse_events(response.text)[:-1]]
    assert all("usage" not in c for c in chunks)
    assert "".join(c["choices"][0]["text"] for c in chunks) == expected_text("p", 16)


async def test_models_health_live_and_metrics(frontend):
    async with frontend.client() as client:
        models = (await client.get("/v1/models")).json()
        assert [m["id"] for m in models["data"]] == ["mock"]
        assert (await client.get("/health")).status_code == 200
        assert (await client.get("/live")).status_code == 200
        metrics = (await client.get("/metrics")).text
    for name in (
        "trioserve_requests_in_flight",
        'trioserve_engine_aborts_total{reason="disconnect"}',
        "trioserve_engine_requests_running{",
    ):
        assert name in metrics


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({"messages": [{"content": "no role"}]}, "$.messages[0].role"),
        ({}, "$.messages"),
        ({"messages": "not a list"}, "$.messages"),
        ({**CHAT, "max_tokens": "many"}, "$.max_tokens"),
        ({**CHAT, "max_tokens": 2**31}, "$.max_tokens"),
        ({**CHAT, "temperature": 9}, "$.temperature"),
        ({**CHAT, "stream": "maybe"}, "$.stream"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "$.messages[0].role"),
        ({"messages": [{"role": "user", "content": 5}]}, "$.messages[0].content"),
    ],
)
async def test_schema_violations_get_422_with_the_field_path(frontend, body, loc):
    async with frontend.client() as client:
        response = await client.post("/v1/chat/completions", json=body)
        assert response.status_code == 422
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error"
        assert loc in [d["loc"] for d in error["details"]]
        # ...and the server keeps serving.
        assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
async def test_max_tokens_below_one_is_the_engines_400_not_the_bodys_422(frontend, field):
    """As vLLM's server answers it (a 400 of its sampling checks; the direct vLLM path's
    text layer says it as vLLM does): here the mock engine's."""
    async with frontend.client() as client:
        response = await client.post("/v1/chat/completions", json={**CHAT, field: 0})
        assert response.status_code == 400, response.text
        assert "max_tokens" in response.json()["error"]["message"]
        assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200


@pytest.mark.parametrize(
    "body",
    [
        b'{"messages": [',
        # Strict JSON (RFC 8259): no NaN literal, UTF-8 only.
        b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}',
        '{"messages": [{"role": "user", "content": "hi"}]}'.encode("utf-16"),
    ],
)
async def test_malformed_json_gets_422_and_never_reaches_the_engine(frontend, body):
    async with frontend.client() as client:
        response = await client.post("/v1/chat/completions", content=body)
        assert response.status_code == 422
        error = response.json()["error"]
        assert error["code"] == "invalid_request" and "malformed JSON" in error["message"]
        assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200
    assert frontend.engine.core.stats.submitted == 1


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("value", ["99999999999999999999", "1e300", '"99999999999999999999"'])
async def test_a_number_the_engine_protocol_cannot_carry_is_a_422(frontend, value, stream):
    # Past 64 bits msgpack has no integer: a valid request otherwise, refused before
    # anything reaches the engine (it was a 500 from the encoder).
    body = b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": %s, "stream": %s}' % (
        value.encode(),
        b"true" if stream else b"false",
    )
    async with frontend.client() as client:
        response = await client.post("/v1/chat/completions", content=body)
        assert response.status_code == 422
        error = response.json()["error"]
        assert error["code"] == "invalid_request" and "cannot carry" in error["message"]
        assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200
    assert frontend.engine.core.stats.submitted == 1


async def test_strings_for_numbers_and_booleans_are_accepted(frontend):
    body = {**CHAT, "max_tokens": "3", "temperature": "0.5", "stream": "false"}
    async with frontend.client() as client:
        response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200
    assert response.json()["usage"]["completion_tokens"] == 3


async def test_unknown_model_route_and_method(frontend):
    async with frontend.client() as client:
        response = await client.post("/v1/chat/completions", json={**CHAT, "model": "gpt-9"})
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "model_not_found"
        assert (await client.get("/nowhere")).status_code == 404
        assert (await client.get("/v1/chat/completions")).status_code == 405


async def test_client_supplied_request_id_is_echoed(frontend):
    async with frontend.client() as client:
        response = await client.post(
            "/v1/chat/completions", json=CHAT, headers={"x-request-id": "my-id.1"}
        )
        assert response.headers["x-request-id"] == "my-id.1"
        assert response.json()["id"] == "chatcmpl-my-id.1"
        hostile = await client.post(
            "/v1/chat/completions", json=CHAT, headers={"x-request-id": "x" * 500}
        )
        made = hostile.headers["x-request-id"]
        assert uuid.UUID(hex=made).version == 4 and made == uuid.UUID(hex=made).hex
        again = await client.post("/v1/chat/completions", json=CHAT)
        assert again.headers["x-request-id"] != made


async def test_engine_error_before_output_keeps_its_status_and_sends_no_abort(frontend):
    body = {**CHAT, "mock_error_after": 0, "mock_error_status": 400, "mock_error_message": "bad"}
    async with frontend.client() as client:
        response = await client.post("/v1/chat/completions", json=body)
        streamed = await client.post("/v1/chat/completions", json={**body, "stream": True})
    assert response.status_code == 400 and response.json()["error"]["message"] == "bad"
    assert streamed.status_code == 400
    assert frontend.engine.stats.aborts_received == 0


# "one_step": the tokens and the error leave the engine in one frame and reach the writer
# in one batch; the tokens still came first, so the stream starts (it used to be a 500,
# or not, by timing), their text in one delta or two.
@pytest.mark.parametrize("pacing", [{}, {"mock_tokens_per_second": 0}], ids=["paced", "one_step"])
async def test_engine_error_mid_stream_ends_sse_with_an_error_event_and_no_done(frontend, pacing):
    body = {**CHAT, **pacing, "stream": True, "mock_error_after": 2, "mock_error_status": 500}
    async with frontend.client() as client:
        response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200
    *deltas, failure = sse_events(response.text)
    assert "[DONE]" not in deltas
    assert json.loads(failure)["error"]["message"] == "mock engine failure"
    text = "".join(json.loads(e)["choices"][0]["delta"]["content"] for e in deltas)
    assert text == expected_text("hello there", 2)
    assert frontend.engine.stats.aborts_received == 0


# docs/api.md, "Engine parameters": the knobs are unknown fields, passed uncoerced; the
# mock refuses a value of the wrong type with a 400 that names it.
@pytest.mark.parametrize(
    ("knob", "says"),
    [
        ({"mock_ttft_ms": "5"}, "mock_ttft_ms must be a number"),
        ({"mock_error_after": "1"}, "mock_error_after must be a number of tokens"),
        ({"mock_hang_after": "1"}, "mock_hang_after must be a number of tokens"),
    ],
)
async def test_a_mock_knob_of_the_wrong_type_is_a_400_engine_error(frontend, knob, says):
    async with frontend.client() as client:
        response = await client.post("/v1/chat/completions", json={**CHAT, **knob})
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["code"], error["message"]) == ("engine_error", says)


async def test_engine_error_mid_json_keeps_its_status(frontend):
    body = {**CHAT, "mock_error_after": 2, "mock_error_status": 503}
    async with frontend.client() as client:
        response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 503


async def test_official_openai_client_streaming_and_not(frontend):
    client = openai.AsyncOpenAI(base_url=f"{frontend.url}/v1", api_key="unused", max_retries=0)
    async with client:
        answer = await client.chat.completions.create(
            model="mock", messages=[{"role": "user", "content": "hello there"}], max_tokens=5
        )
        assert answer.choices[0].message.content == expected_text("hello there", 5)
        stream = await client.chat.completions.create(
            model="mock",
            messages=[{"role": "user", "content": "hello there"}],
            max_tokens=5,
            stream=True,
        )
        text = ""
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
        assert text == expected_text("hello there", 5)
        with pytest.raises(openai.APIError, match="mock engine failure"):
            broken = await client.chat.completions.create(
                model="mock",
                messages=[{"role": "user", "content": "x"}],
                stream=True,
                extra_body={"mock_error_after": 1},
            )
            async for _ in broken:
                pass


@pytest.mark.parametrize(
    ("body", "loc", "says"),
    [
        ({"messages": ["x"]}, "$.messages[0]", "expected an object, got a string"),
        ({**CHAT, "stream_options": True}, "$.stream_options", "expected an object"),
    ],
)
async def test_wrong_json_types_are_named_not_python_errors(frontend, body, loc, says):
    async with frontend.client() as client:
        response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 422
    [detail] = response.json()["error"]["details"]
    assert detail == {"loc": loc, "msg": says} or (detail["loc"] == loc and says in detail["msg"])


async def test_message_fields_reach_the_engine_untouched(frontend):
    seen = capture_submits(frontend)
    messages = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function"}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    async with frontend.client() as client:
        response = await client.post(
            "/v1/chat/completions",
            json={"messages": messages, "max_tokens": 2, "max_completion_tokens": 3},
        )
    assert response.status_code == 200
    assert seen[0].inputs["messages"] == messages
    assert seen[0].params["max_tokens"] == 3  # the current name wins


async def test_405_says_which_methods_are_allowed(frontend):
    async with frontend.client() as client:
        response = await client.get("/v1/chat/completions")
    assert response.status_code == 405 and response.headers["allow"] == "POST"


async def test_a_malformed_chunked_body_is_a_400_and_nothing_reaches_the_engine(
    frontend, http_server
):
    submits = capture_submits(frontend)
    stream = await trio.open_tcp_stream(frontend.host, frontend.port)
    await stream.send_all(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b'transfer-encoding: chunked\r\n\r\n5\r\n{"mes\r\nnot-hex\r\n'
    )
    data = b""
    with trio.fail_after(HANG_GUARD):
        while chunk := await stream.receive_some(65536):
            data += chunk
    await stream.aclose()
    assert data.startswith(b"HTTP/1.1 400")
    if http_server == "builtin":  # hypercorn answers its own 400, without a body
        assert json.loads(data.partition(b"\r\n\r\n")[2])["error"]["code"] == "bad_request"
    async with frontend.client() as client:  # the server keeps serving
        assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200
    assert len(submits) == 1  # the good request only


_MSG = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("cls", "body", "plain"),
    [
        ("chat", {"messages": _MSG}, True),
        ("chat", {"model": "mock", "messages": _MSG, "stream": True, "max_tokens": 5}, True),
        ("chat", {"messages": _MSG, "temperature": 1, "top_p": 0.5, "seed": 3, "n": 1}, True),
        ("chat", {"messages": _MSG, "stop": ["a", 1], "user": "u", "extra": {"x": 1}}, True),
        (
            "chat",
            {"messages": [{"role": "user", "content": [{"type": "text"}], "name": "n"}]},
            True,
        ),
        ("chat", {"messages": _MSG, "model": None, "stream": None, "max_tokens": None}, True),
        ("chat", {"messages": [{"role": "user"}], "prompt": "not a field of chat"}, True),
        ("chat", {"messages": _MSG, "max_completion_tokens": 7, "stream_options": None}, True),
        ("completion", {"prompt": "hi", "max_tokens": 3, "messages": "not a field"}, True),
        ("completion", {"prompt": None}, True),
        # The converter's: strings and 0/1 for numbers and booleans, and every fault.
        ("chat", {"messages": _MSG, "max_tokens": "5"}, False),
        ("chat", {"messages": _MSG, "max_tokens": 5.0}, False),
        ("chat", {"messages": _MSG, "max_tokens": True}, False),
        ("chat", {"messages": _MSG, "stream": 1}, False),
        ("chat", {"messages": _MSG, "stream": "true"}, False),
        ("chat", {"messages": _MSG, "temperature": "0.5"}, False),
        ("chat", {"messages": _MSG, "temperature": False}, False),
        ("chat", {"messages": _MSG, "stream_options": {"include_usage": True}}, False),
        ("chat", {"messages": _MSG, "model": 3}, False),
        ("chat", {"messages": None}, False),
        ("chat", {"messages": {"role": "user"}}, False),
        ("chat", {"messages": ["hi"]}, False),
        ("chat", {"messages": [{"content": "no role"}]}, False),
        ("chat", {"messages": [{"role": "user", "name": 5}]}, False),
        ("chat", {"model": "mock"}, False),
        ("completion", {"max_tokens": 3}, False),
    ],
)
def test_plain_bodies_skip_the_converter_and_get_exactly_what_it_builds(cls, body, plain):
    from trioserve.http.bodies import openai as openai_api
    from trioserve.http.bodies.validation import structure

    request_cls = {
        "chat": openai_api.ChatCompletionRequest,
        "completion": openai_api.CompletionRequest,
    }[cls]
    fast = openai_api._plain(body, request_cls)
    assert (fast is not None) == plain
    if fast is None:
        return
    slow = structure(body, request_cls)  # a plain body the converter refuses: an error
    assert fast == slow
    assert attrs.asdict(fast, recurse=True) == attrs.asdict(slow, recurse=True)
    for name in attrs.fields_dict(request_cls):  # 1.0 == 1, so the types too
        assert type(getattr(fast, name)) is type(getattr(slow, name)), name


def test_the_fast_path_knows_every_field_of_the_request_classes():
    # A field added to a request class but not to the fast path's table would be dropped
    # from plain bodies (built with its default) while the converter would read it.
    from trioserve.http.bodies import openai as openai_api

    for cls, table in openai_api._PLAIN.items():
        assert set(table) | {"stream_options"} == set(attrs.fields_dict(cls)), cls.__name__


async def test_a_percent_encoded_path_is_decoded_before_routing(frontend):
    # ASGI's scope path is percent-decoded; a path without '%' is taken as it is.
    async with frontend.client() as client:
        response = await client.post("/v1/chat/%63ompletions", json=CHAT)
        assert response.status_code == 200
        assert response.json()["object"] == "chat.completion"
        assert (await client.post("/v1/chat/%63ompletion", json=CHAT)).status_code == 404
