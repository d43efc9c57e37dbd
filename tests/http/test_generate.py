"""``POST /generate``: every content type, form booleans, JSON and NDJSON answers, errors in
the ``{"detail": ...}`` shape; with plain ``requests`` and ``curl`` as its clients use it."""

from __future__ import annotations

import json
import shutil

import pytest
import requests
import trio

from tests.helpers.frontends import capture_submits, start_engine, start_frontend
from trioserve.engine_programs.mock import expected_text

TRUE = ["true", "TRUE", "t", "Yes", "y", "on", "1", " true "]
FALSE = ["false", "F", "no", "N", "off", "0", "False"]


def ndjson(text: str) -> list[dict]:
    assert text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


async def test_urlencoded_form_with_requests_answers_json(frontend):
    def call():
        return requests.post(
            f"{frontend.url}/generate", data={"prompt": "hello there", "max_tokens": "4"}
        )

    response = await trio.to_thread.run_sync(call)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert body["object"] == "generation"
    assert body["text"] == expected_text("hello there", 4)
    assert body["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": 2, "completion_tokens": 4, "total_tokens": 6}
    assert body["id"] == response.headers["x-request-id"]


async def test_json_and_multipart_give_the_same_answer(frontend):
    async with frontend.client() as client:
        as_json = await client.post("/generate", json={"prompt": "p", "max_tokens": 3})
        as_form = await client.post(
            "/generate",
            data={"prompt": "p", "max_tokens": "3"},
            files={"image": ("a.png", b"\x89PNG", "image/png")},
        )
    assert as_json.status_code == as_form.status_code == 200
    assert as_json.json()["text"] == as_form.json()["text"] == expected_text("p", 3)


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
async def test_curl_form_fields_and_file_upload(frontend, tmp_path):
    upload = tmp_path / "clip.wav"
    upload.write_bytes(b"RIFF....WAVE")
    command = [
        "curl", "-s", "-F", "prompt=hi", "-F", "max_tokens=2", "-F", "streaming=on",
        "-F", f"audio=@{upload};type=audio/wav", f"{frontend.url}/generate",
    ]  # fmt: skip
    result = await trio.run_process(command, capture_stdout=True)
    lines = ndjson(result.stdout.decode())
    assert "".join(line["text"] for line in lines) == expected_text("hi", 2)


async def test_streaming_answers_ndjson_one_output_per_line(frontend):
    async with frontend.client() as client:
        response = await client.post(
            "/generate", json={"prompt": "stream me", "max_tokens": 5, "stream": True}
        )
    assert response.headers["content-type"] == "application/x-ndjson"
    assert response.headers["x-accel-buffering"] == "no"
    lines = ndjson(response.text)
    assert [line["seq"] for line in lines] == [0, 1, 2, 3, 4]
    assert "".join(line["text"] for line in lines) == expected_text("stream me", 5)
    assert all("finish_reason" not in line for line in lines[:-1])
    assert lines[-1]["finish_reason"] == "length"
    assert lines[-1]["usage"]["completion_tokens"] == 5


async def test_the_stop_string_that_ended_an_answer_is_its_stop_reason(frontend):
    # vLLM's field, as on chat and completions: the stop string that cut the answer (null
    # for one that ran to its end or its length), JSON and on the last NDJSON line.
    body = {"prompt": "p", "mock_answer": "Sunny today. Rain tomorrow.", "stop": [". "]}
    async with frontend.client() as client:
        stopped = (await client.post("/generate", json=body)).json()
        streamed = ndjson((await client.post("/generate", json={**body, "stream": True})).text)
        plain = (await client.post("/generate", json={"prompt": "p", "max_tokens": 2})).json()
    assert (stopped["text"], stopped["finish_reason"]) == ("Sunny today", "stop")
    assert stopped["stop_reason"] == ". "
    assert "".join(line["text"] for line in streamed) == "Sunny today"
    assert (streamed[-1]["finish_reason"], streamed[-1]["stop_reason"]) == ("stop", ". ")
    assert all("stop_reason" not in line for line in streamed[:-1])
    assert (plain["finish_reason"], plain["stop_reason"]) == ("length", None)


@pytest.mark.parametrize("spelling", TRUE)
async def test_form_truthy_spellings_stream(frontend, spelling):
    async with frontend.client() as client:
        response = await client.post(
            "/generate", data={"prompt": "x", "max_tokens": "2", "streaming": spelling}
        )
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/x-ndjson"


@pytest.mark.parametrize("spelling", FALSE)
async def test_form_falsy_spellings_do_not_stream(frontend, spelling):
    async with frontend.client() as client:
        response = await client.post(
            "/generate", data={"prompt": "x", "max_tokens": "2", "stream": spelling}
        )
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"


@pytest.mark.parametrize("value", ["maybe", "2", "", "truthy"])
async def test_other_form_boolean_values_are_400_with_detail(frontend, value):
    submits = capture_submits(frontend)
    async with frontend.client() as client:
        response = await client.post("/generate", data={"prompt": "x", "streaming": value})
    assert response.status_code == 400
    body = response.json()
    assert body["code"] == "invalid_request"
    assert body["detail"][0]["loc"] == "$.streaming"
    assert submits == []


@pytest.mark.parametrize(
    "content_type", ["text/plain", "application/xml", "application/octet-stream", None]
)
async def test_other_content_types_are_400_naming_the_accepted_ones(frontend, content_type):
    headers = {"content-type": content_type} if content_type else {}
    async with frontend.client() as client:
        response = await client.post("/generate", content=b"prompt=x", headers=headers)
    assert response.status_code == 400
    detail = response.json()["detail"]
    for accepted in (
        "multipart/form-data",
        "application/x-www-form-urlencoded",
        "application/json",
    ):
        assert accepted in detail


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({}, "$.prompt"),
        ({"prompt": 5}, "$.prompt"),
        ({"prompt": "x", "max_tokens": "many"}, "$.max_tokens"),
        ({"prompt": "x", "max_tokens": 0}, "$.max_tokens"),
        ({"prompt": "x", "temperature": "hot"}, "$.temperature"),
    ],
)
async def test_json_schema_errors_are_422_with_detail_list(frontend, body, loc):
    async with frontend.client() as client:
        response = await client.post("/generate", json=body)
    assert response.status_code == 422
    assert loc in [d["loc"] for d in response.json()["detail"]]


async def test_malformed_json_is_422_detail(frontend):
    async with frontend.client() as client:
        response = await client.post(
            "/generate", content=b'{"prompt": ', headers={"content-type": "application/json"}
        )
    assert response.status_code == 422
    assert "malformed JSON" in response.json()["detail"][0]["msg"]


async def test_form_without_prompt_is_400(frontend):
    async with frontend.client() as client:
        response = await client.post("/generate", data={"max_tokens": "2"})
    assert response.status_code == 400
    assert response.json()["detail"][0] == {"loc": "$.prompt", "msg": "field required"}


async def test_string_numbers_are_coerced_and_unknown_fields_reach_the_engine(frontend):
    submits = capture_submits(frontend)
    async with frontend.client() as client:
        response = await client.post(
            "/generate",
            data={"prompt": "x", "max_tokens": "2.0", "temperature": "0.5", "top_k": "40"},
        )
    assert response.status_code == 200
    params = submits[0].params
    assert params["max_tokens"] == 2 and params["temperature"] == 0.5
    assert params["top_k"] == "40"  # unknown: verbatim
    assert submits[0].task == "generate"
    assert submits[0].inputs["modalities"] == ["text"]


async def test_engine_error_keeps_its_status_in_detail_shape(frontend):
    body = {"prompt": "x", "mock_error_after": 0, "mock_error_status": 429}
    async with frontend.client() as client:
        response = await client.post("/generate", json={**body, "mock_error_message": "busy"})
    assert response.status_code == 429
    assert response.json() == {"detail": "busy", "code": "engine_error"}


# "one_step": the tokens and the error reach the writer in one batch (see the SSE twin).
@pytest.mark.parametrize("pacing", [{}, {"mock_tokens_per_second": 0}], ids=["paced", "one_step"])
async def test_engine_error_mid_stream_ends_with_a_detail_line(frontend, pacing):
    body = {"prompt": "x", "max_tokens": 10, "stream": True, "mock_error_after": 2, **pacing}
    async with frontend.client() as client:
        response = await client.post("/generate", json=body)
    assert response.status_code == 200
    lines = ndjson(response.text)
    assert len(lines) == 3
    assert lines[-1] == {"detail": "mock engine failure", "code": "engine_error"}
    assert frontend.engine.stats.aborts_received == 0


async def test_unknown_model_is_404_in_detail_shape(frontend):
    async with frontend.client() as client:
        response = await client.post("/generate", json={"prompt": "x", "model": "nope"})
    assert response.status_code == 404
    assert response.json()["code"] == "model_not_found"


async def test_generate_without_the_capability_is_404(nursery, http_server):
    engine = await start_engine(nursery, capabilities=["chat", "completion"])
    frontend = await start_frontend(nursery, engine, server=http_server)
    async with frontend.client() as client:
        response = await client.post("/generate", json={"prompt": "x"})
    assert response.status_code == 404
    assert response.json()["code"] == "route_not_supported"
    assert "native generation" in response.json()["detail"]
