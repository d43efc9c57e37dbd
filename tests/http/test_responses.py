"""POST /v1/responses in the foreground (JSON and SSE), with the official openai client,
and the Responses endpoint of /v1/ws. Background responses: test_responses_background.py."""

from __future__ import annotations

import json

import openai
import pytest
import trio

from tests.helpers.frontends import capture_submits, start_engine, start_frontend
from tests.helpers.http import raw_request, read_until
from tests.helpers.responses import (
    aborts_sent,
    check_sequence,
    named_events,
    start_natural_engine,
)
from tests.helpers.waiting import wait_until
from trioserve import metrics
from trioserve.engine_programs.mock import PREFIX_BLOCK_WORDS, expected_text


@pytest.fixture
async def engine(nursery):
    """The mock engine, with answers that end by themselves ("stop") unless cut short."""
    return await start_natural_engine(nursery)


def sdk(frontend, **options) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=f"{frontend.url}/v1", api_key="unused", max_retries=0, **options
    )


async def test_sdk_create_answers_a_completed_response_with_usage(frontend):
    response = await sdk(frontend).responses.create(model="mock", input="hello there")
    assert response.object == "response" and response.id.startswith("resp_")
    assert response.status == "completed" and response.error is None
    assert response.output_text == expected_text("hello there", 16)
    [message] = response.output
    assert message.type == "message" and message.role == "assistant"
    assert message.status == "completed" and message.id.startswith("msg_")
    assert response.usage.input_tokens == 2 and response.usage.output_tokens == 16
    assert response.usage.total_tokens == 18
    assert response.model == "mock" and response.background is False


async def test_max_output_tokens_reached_is_incomplete(frontend):
    response = await sdk(frontend).responses.create(input="hello there", max_output_tokens=5)
    assert response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.output_text == expected_text("hello there", 5)
    assert response.output[0].status == "incomplete"
    assert response.max_output_tokens == 5


async def test_sdk_stream_gives_every_typed_event_in_order_with_sequence_numbers(frontend):
    stream = await sdk(frontend).responses.create(input="hello there", stream=True)
    events = [event async for event in stream]
    check_sequence([e.type for e in events], "response.completed")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    text = expected_text("hello there", 16)
    assert "".join(e.delta for e in deltas) == text
    item_id = events[2].item.id
    assert {e.item_id for e in deltas} == {item_id}
    assert events[-4].text == text
    assert events[0].response.status == "in_progress"
    final = events[-1].response
    assert final.status == "completed" and final.output_text == text
    assert final.usage.output_tokens == 16 and final.id == events[0].response.id


async def test_stream_is_sse_with_event_names_matching_their_types(frontend):
    async with frontend.client() as client:
        response = await client.post(
            "/v1/responses", json={"input": "hi", "stream": True, "max_output_tokens": 3}
        )
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert "[DONE]" not in response.text
    events = named_events(response.text)
    assert all(name == data["type"] for name, data in events)
    check_sequence([name for name, _ in events], "response.incomplete")
    assert events[-1][1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


async def test_instructions_input_items_and_sampling_reach_the_engine_as_chat(frontend):
    submits = capture_submits(frontend)
    response = await sdk(frontend).responses.create(
        instructions="be brief",
        input=[
            {"role": "user", "content": "first"},
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "an answer"}],
            },
            {"role": "user", "content": [{"type": "input_text", "text": "second"}]},
        ],
        max_output_tokens=4,
        temperature=0.5,
        top_p=0.9,
        extra_body={"seed": 7, "stop": ["x"]},
    )
    assert response.status == "incomplete" and response.instructions == "be brief"
    assert response.temperature == 0.5 and response.top_p == 0.9
    [submit] = submits
    assert submit.task == "chat"
    assert submit.inputs["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": [{"type": "text", "text": "an answer"}]},
        {"role": "user", "content": [{"type": "text", "text": "second"}]},
    ]
    assert submit.inputs["modalities"] == ["text"]
    assert submit.params == {
        "max_tokens": 4,
        "temperature": 0.5,
        "top_p": 0.9,
        "seed": 7,
        "stop": ["x"],
    }
    assert response.output_text == expected_text("be brief\nfirst\nan answer\nsecond", 4)


async def test_input_image_parts_are_decoded_for_the_engine(frontend):
    submits = capture_submits(frontend)
    png = (
        "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAAAAAA6fptVAAAACklEQVR4nGNg"
        "AAAAAgABSK+kcQAAAABJRU5ErkJggg=="
    )
    response = await sdk(frontend).responses.create(
        input=[
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "what is it"},
                    {"type": "input_image", "image_url": png},
                ],
            }
        ],
        max_output_tokens=2,
    )
    assert response.status == "incomplete"
    content = submits[0].inputs["messages"][0]["content"]
    assert content[0] == {"type": "text", "text": "what is it"}
    assert content[1]["type"] == "image" and content[1]["media"]["mime_type"] == "image/png"
    assert submits[0].inputs["modalities"] == ["text", "image"]


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({}, "$.input"),
        ({"input": 5}, "$.input"),
        ({"input": []}, "$.input"),
        ({"input": "x", "max_output_tokens": 0}, "$.max_output_tokens"),
        ({"input": "x", "temperature": 3}, "$.temperature"),
        ({"input": "x", "tools": [{"type": "web_search"}]}, "$.tools[0].type"),
        # (auto, the default with tools, needs --tool-call-parser: as chat's)
        ({"input": "x", "tools": [{"type": "function", "name": "f"}]}, "$.tool_choice"),
        ({"input": "x", "tool_choice": "required"}, "$.tool_choice"),
        ({"input": "x", "text": {"format": {"type": "json_object"}}}, "$.text.format"),
        ({"input": "x", "truncation": "auto"}, "$.truncation"),
        ({"input": "x", "include": ["message.output_text.logprobs"]}, "$.include"),
        ({"input": "x", "background": True, "store": False}, "$.store"),
        ({"input": [{"type": "function_call_output", "output": "1"}]}, "$.input[0].call_id"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "$.input[0].type"),
        ({"input": [{"type": {}, "role": "user", "content": "x"}]}, "$.input[0].type"),
        ({"input": [{"role": "robot", "content": "x"}]}, "$.input[0].role"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file"}]}]},
            "$.input[0].content[0].type",
        ),
        ({"input": "x", "metadata": {"k": "v" * 513}}, "$.metadata"),
        ({"input": "x", "stream": "maybe"}, "$.stream"),
        # What a stored response echoes is bounded (OpenAI's 64 characters).
        ({"input": "x", "user": "u" * 65}, "$.user"),
        ({"input": "x", "safety_identifier": "s" * 65}, "$.safety_identifier"),
        ({"input": "x", "reasoning": {"effort": "e" * 65}}, "$.reasoning.effort"),
    ],
)
async def test_invalid_bodies_are_422_naming_the_field(frontend, body, loc):
    submits = capture_submits(frontend)
    async with frontend.client() as client:
        response = await client.post("/v1/responses", json=body)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_request"
    assert loc in [d["loc"] for d in error["details"]]
    assert submits == []


async def test_reasoning_is_echoed_as_read_not_as_sent(frontend):
    body = {
        "input": "x",
        "max_output_tokens": 2,
        "reasoning": {"effort": "low", "junk": "x" * 1000},
    }
    async with frontend.client() as client:
        response = await client.post("/v1/responses", json=body)
        assert response.status_code == 200, response.text
        assert response.json()["reasoning"] == {"effort": "low", "summary": None}
        response = await client.post("/v1/responses", json={**body, "user": "u" * 64})
        assert response.json()["user"] == "u" * 64


async def test_sdk_raises_the_openai_error_of_a_bad_request(frontend):
    with pytest.raises(openai.UnprocessableEntityError) as caught:
        await sdk(frontend).responses.create(input="x", max_output_tokens=0)
    assert caught.value.body["code"] == "invalid_request"
    with pytest.raises(openai.NotFoundError) as caught:
        await sdk(frontend).responses.create(input="x", previous_response_id="resp_1")
    assert caught.value.body["code"] == "previous_response_not_found"
    assert caught.value.body["param"] == "previous_response_id"
    with pytest.raises(openai.NotFoundError) as caught:
        await sdk(frontend).responses.create(model="gpt-nope", input="x")
    assert caught.value.body["code"] == "model_not_found"


@pytest.mark.parametrize("stream", [False, True])
async def test_engine_error_before_any_output_is_its_own_status(frontend, stream):
    body = {"input": "x", "stream": stream, "mock_error_after": 0, "mock_error_status": 429}
    async with frontend.client() as client:
        response = await client.post("/v1/responses", json=body)
    assert response.status_code == 429
    assert response.json()["error"]["code"] == "engine_error"


async def test_engine_error_mid_stream_is_response_failed(frontend):
    stream = await sdk(frontend).responses.create(
        input="x",
        stream=True,
        extra_body={"mock_error_after": 2, "mock_error_message": "broke"},
    )
    events = [event async for event in stream]
    assert events[-1].type == "response.failed"
    failed = events[-1].response
    assert failed.status == "failed"
    assert failed.error.code == "engine_error" and failed.error.message == "broke"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "response.completed" not in [e.type for e in events]


async def test_disconnect_mid_stream_aborts_the_engine_request_once(frontend):
    before = aborts_sent("disconnect")
    body = json.dumps({"input": "go", "stream": True, "max_output_tokens": 100_000}).encode()
    stream = await raw_request(frontend, "POST", "/v1/responses", body, x_request_id="rd1")
    await read_until(stream, b"response.output_text.delta")
    await stream.aclose()
    await wait_until(lambda: frontend.ends("rd1"), "the engine to see rd1 end")
    assert frontend.ends("rd1") == ["aborted"]
    assert frontend.engine.core.stats.unknown_aborts == 0
    assert aborts_sent("disconnect") == before + 1
    await wait_until(lambda: len(frontend.app.services.registry) == 0, "nothing in flight")


async def test_disconnect_while_waiting_for_json_aborts_the_engine_request_once(frontend):
    body = json.dumps({"input": "go", "max_output_tokens": 100_000}).encode()
    stream = await raw_request(frontend, "POST", "/v1/responses", body, x_request_id="rd2")
    key = (frontend.frontend_id, "rd2")
    await wait_until(lambda: key in frontend.engine.core.running, "rd2 to run")
    await stream.aclose()
    await wait_until(lambda: frontend.ends("rd2"), "the engine to see rd2 end")
    assert frontend.ends("rd2") == ["aborted"]
    assert frontend.engine.core.stats.unknown_aborts == 0


async def test_deadline_mid_stream_is_response_failed_and_one_abort(frontend):
    before = aborts_sent("deadline")
    async with frontend.client() as client:
        response = await client.post(
            "/v1/responses",
            json={"input": "go", "stream": True, "max_output_tokens": 100_000},
            headers={"x-request-timeout": "0.3", "x-request-id": "rdl"},
        )
    events = named_events(response.text)
    assert events[-1][0] == "response.failed"
    assert events[-1][1]["response"]["error"]["code"] == "deadline_exceeded"
    await wait_until(lambda: frontend.ends("rdl"), "the engine to see rdl end")
    assert frontend.ends("rdl") == ["aborted"]
    assert aborts_sent("deadline") == before + 1


async def test_cancel_by_request_id_is_499_before_any_output(frontend):
    results = {}

    async def wait_it() -> None:
        async with frontend.client() as client:
            results["r"] = await client.post(
                "/v1/responses",
                json={"input": "x", "mock_ttft_ms": 600_000},
                headers={"x-request-id": "rc1"},
            )

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait_it)
        key = (frontend.frontend_id, "rc1")
        await wait_until(lambda: key in frontend.engine.core.running, "rc1 to run")
        async with frontend.client() as client:
            assert (await client.delete("/v1/requests/rc1")).status_code == 200
    assert results["r"].status_code == 499
    assert results["r"].json()["error"]["code"] == "request_cancelled"
    await wait_until(lambda: frontend.ends("rc1"), "the engine to see rc1 end")
    assert frontend.ends("rc1") == ["aborted"]


async def test_a_stored_response_can_be_retrieved_and_an_unstored_one_cannot(frontend):
    client = sdk(frontend)
    stored = await client.responses.create(input="hello there")
    again = await client.responses.retrieve(stored.id)
    assert again.status == "completed" and again.output_text == stored.output_text
    assert again.id == stored.id
    streamed = await client.responses.create(input="hello there", stream=True)
    final = [event async for event in streamed][-1].response
    assert (await client.responses.retrieve(final.id)).output_text == final.output_text
    unstored = await client.responses.create(input="hello there", store=False)
    assert unstored.store is False
    with pytest.raises(openai.NotFoundError) as caught:
        await client.responses.retrieve(unstored.id)
    assert caught.value.body["code"] == "response_not_found"
    # Only background responses have events to replay, and can be cancelled.
    async with frontend.client() as raw:
        replay = await raw.get(f"/v1/responses/{stored.id}", params={"stream": "true"})
        cancel = await raw.post(f"/v1/responses/{stored.id}/cancel")
    assert replay.status_code == 400
    assert replay.json()["error"]["code"] == "response_not_streamable"
    assert cancel.status_code == 400
    assert cancel.json()["error"]["code"] == "response_not_background"


async def test_a_failed_foreground_response_is_not_kept(frontend):
    async with frontend.client() as client:
        response = await client.post("/v1/responses", json={"input": "x", "mock_error_after": 0})
    assert response.status_code == 500
    assert len(frontend.app.services.responses) == 0


@pytest.mark.parametrize(
    ("method", "path", "status", "code"),
    [
        ("GET", "/v1/responses/resp_nope", 404, "response_not_found"),
        ("GET", "/v1/responses/", 404, "not_found"),
        ("GET", "/v1/responses/a/b", 404, "response_not_found"),
        ("POST", "/v1/responses/resp_nope/cancel", 404, "response_not_found"),
        ("POST", "/v1/responses/resp_nope", 405, "method_not_allowed"),
        ("POST", "/v1/responses/resp_nope/stop", 405, "method_not_allowed"),
        ("PUT", "/v1/responses/resp_nope", 405, "method_not_allowed"),
        ("GET", "/v1/responses", 405, "method_not_allowed"),
        ("GET", "/v1/responses/resp_nope/cancel", 404, "response_not_found"),
        ("GET", "/v1/responses/x?stream=perhaps", 400, "invalid_query_parameter"),
        ("GET", "/v1/responses/x?stream=true&starting_after=-1", 400, "invalid_query_parameter"),
        # A digit to str.isdigit, not to int(): "²", percent-encoded.
        (
            "GET",
            "/v1/responses/x?stream=true&starting_after=%C2%B2",
            400,
            "invalid_query_parameter",
        ),
        (
            "GET",
            f"/v1/responses/x?stream=true&starting_after={2**63}",
            400,
            "invalid_query_parameter",
        ),
        (
            "GET",
            f"/v1/responses/x?stream=true&starting_after={2**63 - 1}",
            404,
            "response_not_found",
        ),
    ],
)
async def test_unknown_responses_and_routes_answer_clearly(frontend, method, path, status, code):
    async with frontend.client() as client:
        response = await client.request(method, path)
    assert response.status_code == status
    assert response.json()["error"]["code"] == code
    if status == 405:
        assert response.headers["allow"] == ALLOW[path]


#: The methods a 405 names: every route whose path (or template) matches.
ALLOW = {
    "/v1/responses/resp_nope": "DELETE, GET",  # POST and PUT
    "/v1/responses/resp_nope/stop": "DELETE, GET",
    "/v1/responses": "POST",
}


async def test_without_a_chat_engine_the_route_is_404_route_not_supported(nursery, http_server):
    engine = await start_natural_engine(nursery, capabilities=["completion"])
    frontend = await start_frontend(nursery, engine, server=http_server)
    async with frontend.client() as client:
        response = await client.post("/v1/responses", json={"input": "x"})
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "route_not_supported"


async def test_a_silent_stream_starts_with_created_then_keepalive_comments(nursery, http_server):
    engine = await start_natural_engine(nursery)
    frontend = await start_frontend(nursery, engine, server=http_server, sse_keepalive=0.02)
    stream = await sdk(frontend).responses.create(
        input="slow start",
        max_output_tokens=3,
        stream=True,
        extra_body={"mock_ttft_ms": 300},
    )
    events = [event async for event in stream]
    check_sequence([e.type for e in events], "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    # Raw: the first keepalive sent created and in_progress; the later ones are comments.
    body = json.dumps({"input": "x", "stream": True, "mock_hang_after": 0}).encode()
    raw = await raw_request(frontend, "POST", "/v1/responses", body, x_request_id="ka")
    data = await read_until(raw, b": keepalive\n\n")
    assert data.index(b"event: response.created") < data.index(b"event: response.in_progress")
    assert data.index(b"event: response.in_progress") < data.index(b": keepalive")
    assert b"response.output_item.added" not in data
    await raw.aclose()
    await wait_until(lambda: frontend.ends("ka") == ["aborted"], "one abort")


@pytest.mark.parametrize(
    ("method", "path", "route", "status"),
    [
        ("GET", "/v1/responses/resp_nope", "/v1/responses/{id}", "404"),
        ("POST", "/v1/responses/resp_nope/cancel", "/v1/responses/{id}/cancel", "404"),
        ("DELETE", "/v1/responses/resp_nope", "/v1/responses/{id}", "404"),
        ("PUT", "/v1/responses/resp_nope", "/v1/responses/{id}", "405"),
    ],
)
async def test_the_metrics_name_a_responses_route_by_its_template(
    frontend, method, path, route, status
):
    def count() -> float:
        labels = {"route": route, "method": method, "status": status}
        return metrics.REGISTRY.get_sample_value("trioserve_http_requests_total", labels) or 0.0

    before = count()
    async with frontend.client() as client:
        await client.request(method, path)
    await wait_until(lambda: count() == before + 1, "the request counted")


@pytest.mark.parametrize("how", [None, "header", "user", "prompt_cache_key", "background"])
async def test_a_session_of_responses_sticks_to_one_engine(nursery, http_server, how):
    engines = [await start_engine(nursery) for _ in range(3)]
    addresses = [e.address for e in engines]
    frontend = await start_frontend(
        nursery, None, server=http_server, engines=addresses, routing="affinity"
    )
    async with frontend.client() as client:
        for i in range(12):
            body: dict = {"input": f"unrelated question {i}", "max_output_tokens": 2}
            headers = {}
            if how in ("header", "background"):
                headers["x-session-id"] = "session-42"
            if how == "background":
                body["background"] = True
            elif how is not None:
                body[how] = "someone-42"
            response = await client.post("/v1/responses", json=body, headers=headers)
            assert response.status_code == 200
            if how == "background":  # one at a time (affinity yields to load)
                response_id = response.json()["id"]
                await client.get(f"/v1/responses/{response_id}", params={"stream": "true"})
    submitted = lambda: sorted(e.stats.submitted for e in engines)  # noqa: E731
    await wait_until(lambda: sum(submitted()) == 12, "every response submitted")
    if how is None:  # the prompts alone spread (so the key is what keeps them together)
        assert max(submitted()) < 12
    else:
        assert submitted() == [0, 0, 12]


async def test_prefix_cache_hits_show_in_the_responses_usage(nursery, http_server):
    engine = await start_engine(nursery, prefix_cache=1000)
    frontend = await start_frontend(nursery, engine, server=http_server)
    instructions = " ".join(f"rule{i}" for i in range(4 * PREFIX_BLOCK_WORDS))
    cached = []
    async with frontend.client() as client:
        for i in range(3):
            body = {"instructions": instructions, "input": f"question {i}", "max_output_tokens": 2}
            response = await client.post("/v1/responses", json=body)
            cached.append(response.json()["usage"]["input_tokens_details"]["cached_tokens"])
    # The first fills the engine's cache; the later ones find the instructions there.
    assert cached == [0, 4 * PREFIX_BLOCK_WORDS, 4 * PREFIX_BLOCK_WORDS]
