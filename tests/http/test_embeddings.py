"""``POST /v1/embeddings`` end to end: the mock engine's deterministic vectors, both
encodings, ``dimensions``, batches, validation, the official client, and every early end
with exactly one abort."""

from __future__ import annotations

import base64
import json
import math
import struct
from functools import partial

import openai
import pytest

from tests.helpers.frontends import capture_submits, running, start_engine, start_frontend
from tests.helpers.http import raw_request
from tests.helpers.waiting import wait_until
from tests.http.test_cancellation import assert_ended_once_and_still_serving
from trioserve.engine_programs.mock import EMBEDDING_DIMENSIONS, MockBackend, mock_embedding
from trioserve.sdk import serve_engine
from trioserve.sdk.core import Output


def vector(text: str, dimensions: int = EMBEDDING_DIMENSIONS) -> list[float]:
    packed = mock_embedding(text, dimensions)
    return list(struct.unpack(f"<{len(packed) // 4}f", packed))


async def test_one_input_is_one_float_vector_of_unit_length(frontend):
    async with frontend.client() as client:
        response = await client.post("/v1/embeddings", json={"input": "hello world"})
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "list" and body["model"] == "mock"
    (item,) = body["data"]
    assert (item["object"], item["index"]) == ("embedding", 0)
    assert item["embedding"] == vector("hello world")
    assert math.isclose(math.fsum(v * v for v in item["embedding"]), 1.0, rel_tol=1e-5)
    assert body["usage"] == {"prompt_tokens": 2, "total_tokens": 2}


async def test_a_batch_is_one_engine_request_answered_in_input_order(frontend):
    texts = ["first one", "second", "third input here", "first one"]
    submits = capture_submits(frontend)
    async with frontend.client() as client:
        response = await client.post(
            "/v1/embeddings", json={"input": texts, "user": "u1", "extra_param": 7}
        )
    body = response.json()
    assert [d["index"] for d in body["data"]] == [0, 1, 2, 3]
    assert [d["embedding"] for d in body["data"]] == [vector(t) for t in texts]
    assert body["usage"]["prompt_tokens"] == 8
    (submit,) = submits
    assert (submit.task, submit.inputs) == ("embedding", {"input": texts})
    # Unknown fields reach the engine; the frontend's own (user, encoding_format) do not.
    assert submit.params == {"extra_param": 7}


async def test_the_largest_batch_is_answered_whole(frontend):
    # 2,048 embeddings in one engine step: more items than --stream-buffer holds.
    texts = [f"text {i}" for i in range(2048)]
    body = {"input": texts, "encoding_format": "base64", "dimensions": 2}
    async with frontend.client() as client:
        response = await client.post("/v1/embeddings", json=body)
    assert response.status_code == 200, response.text
    data = response.json()["data"]
    assert [base64.b64decode(d["embedding"]) for d in data] == [mock_embedding(t, 2) for t in texts]


async def test_base64_is_the_float32_little_endian_bytes(frontend):
    body = {"input": ["a", "b"], "encoding_format": "base64", "dimensions": 8}
    async with frontend.client() as client:
        response = await client.post("/v1/embeddings", json=body)
    data = response.json()["data"]
    assert [base64.b64decode(d["embedding"]) for d in data] == [
        mock_embedding("a", 8),
        mock_embedding("b", 8),
    ]


async def test_dimensions_shorten_the_vector_and_reach_the_engine(frontend):
    submits = capture_submits(frontend)
    async with frontend.client() as client:
        response = await client.post("/v1/embeddings", json={"input": "x", "dimensions": 3})
    assert response.json()["data"][0]["embedding"] == vector("x", 3)
    assert submits[0].params == {"dimensions": 3}


async def test_dimensions_the_engine_cannot_give_are_its_400(frontend):
    body = {"input": "x", "dimensions": EMBEDDING_DIMENSIONS + 1}
    async with frontend.client() as client:
        response = await client.post("/v1/embeddings", json=body)
    assert response.status_code == 400
    assert "dimensions must be between 1 and" in response.json()["error"]["message"]


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({}, "$.input"),
        ({"input": ""}, "$.input"),
        ({"input": []}, "$.input"),
        ({"input": ["ok", ""]}, "$.input[1]"),
        ({"input": ["ok", 5]}, "$.input[1]"),
        ({"input": [1, 2, 3]}, "$.input[0]"),
        ({"input": 5}, "$.input"),
        ({"input": ["x"] * 2049}, "$.input"),
        ({"input": "x", "encoding_format": "int8"}, "$.encoding_format"),
        ({"input": "x", "dimensions": 0}, "$.dimensions"),
        ({"input": "x", "dimensions": "many"}, "$.dimensions"),
        ({"input": "x", "model": 5}, "$.model"),
    ],
)
async def test_invalid_bodies_are_422_naming_the_field(frontend, body, loc):
    submits = capture_submits(frontend)
    async with frontend.client() as client:
        response = await client.post("/v1/embeddings", json=body)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["details"][0]["loc"] == loc
    assert submits == []


async def test_the_official_client_gets_the_same_vectors(frontend):
    client = openai.AsyncOpenAI(base_url=f"{frontend.url}/v1", api_key="x", max_retries=0)
    # The client asks for base64 unless told otherwise, and decodes it.
    result = await client.embeddings.create(model="mock", input=["hi there", "bye"])
    assert [d.embedding for d in result.data] == [vector("hi there"), vector("bye")]
    assert result.usage.prompt_tokens == 3
    floats = await client.embeddings.create(
        model="mock", input="hi there", encoding_format="float", dimensions=5
    )
    assert floats.data[0].embedding == vector("hi there", 5)
    with pytest.raises(openai.NotFoundError):
        await client.embeddings.create(model="nope", input="x")


async def test_an_engine_without_the_capability_makes_the_route_404(nursery, http_server):
    engine = await start_engine(nursery, capabilities=["chat", "completion"])
    frontend = await start_frontend(nursery, engine, server=http_server)
    async with frontend.client() as client:
        response = await client.post("/v1/embeddings", json={"input": "x"})
    assert response.status_code == 404
    error = response.json()["error"]
    assert error["code"] == "route_not_supported"
    assert "capability 'embedding'" in error["message"]


# -- early ends: exactly one abort each ---------------------------------------------------

SLOW = {"input": ["a", "b"], "mock_ttft_ms": 600_000}


async def test_disconnect_while_waiting_aborts_the_engine_request(frontend):
    body = json.dumps(SLOW).encode()
    stream = await raw_request(frontend, "POST", "/v1/embeddings", body, x_request_id="e1")
    await running(frontend, "e1")
    await stream.aclose()
    await assert_ended_once_and_still_serving(frontend, "e1", "aborted")


async def test_deadline_is_504_and_aborts(frontend):
    async with frontend.client() as client:
        response = await client.post(
            "/v1/embeddings",
            json=SLOW,
            headers={"x-request-timeout": "0.2", "x-request-id": "e2"},
        )
    assert response.status_code == 504
    assert response.json()["error"]["code"] == "deadline_exceeded"
    await assert_ended_once_and_still_serving(frontend, "e2", "aborted")


async def test_cancel_by_id_is_499_and_aborts(frontend, nursery):
    answers = []

    async def post() -> None:
        async with frontend.client() as client:
            answers.append(
                await client.post("/v1/embeddings", json=SLOW, headers={"x-request-id": "e3"})
            )

    nursery.start_soon(post)
    await running(frontend, "e3")
    async with frontend.client() as client:
        assert (await client.delete("/v1/requests/e3")).status_code == 200
    await wait_until(lambda: answers, "the cancelled request's answer")
    assert answers[0].status_code == 499
    await assert_ended_once_and_still_serving(frontend, "e3", "aborted")


async def test_an_engine_error_is_its_status_with_no_abort(frontend):
    body = {"input": ["a", "b"], "mock_error_after": 1, "mock_error_status": 503}
    async with frontend.client() as client:
        response = await client.post("/v1/embeddings", json=body, headers={"x-request-id": "e4"})
    assert response.status_code == 503
    await assert_ended_once_and_still_serving(frontend, "e4", "finished")


# -- an engine that answers wrongly -------------------------------------------------------


class WrongEmbeddings(MockBackend):
    """Sends what the request's ``wrong`` param says instead of the right embeddings, then
    (but for ``too_few``, which ends the request) waits to be aborted."""

    async def generate(self, request):
        wrong = request.params["wrong"]
        one = mock_embedding("x", 4)
        if wrong == "too_many":
            for _ in range(len(request.inputs["input"]) + 1):
                yield Output(one, modality="embedding")
        elif wrong == "too_few":
            yield Output(one, modality="embedding", finish_reason="stop")
        elif wrong == "ragged":
            yield Output(one, modality="embedding")
            yield Output(one[:-1], modality="embedding")
        elif wrong == "text":
            yield Output("0.5, 0.5")
        await trio_sleep_forever()


async def trio_sleep_forever() -> None:
    import trio

    await trio.sleep_forever()


@pytest.mark.parametrize(
    ("wrong", "how"),
    [("too_many", "aborted"), ("ragged", "aborted"), ("text", "aborted"), ("too_few", "finished")],
)
async def test_a_wrong_answer_is_502_bad_engine_output(nursery, wrong, how, http_server):
    backend = WrongEmbeddings(tokens_per_second=400.0, ttft_ms=2.0)
    engine = await nursery.start(
        partial(serve_engine, backend, "tcp://127.0.0.1:*", track_ends=True)
    )
    frontend = await start_frontend(nursery, engine, server=http_server)
    async with frontend.client() as client:
        response = await client.post(
            "/v1/embeddings",
            json={"input": ["a", "b"], "wrong": wrong},
            headers={"x-request-id": "w1"},
        )
    assert response.status_code == 502, response.text
    assert response.json()["error"]["code"] == "bad_engine_output"
    await wait_until(lambda: frontend.ends("w1"), "the engine to see w1 end")
    assert frontend.ends("w1") == [how]
    assert engine.core.stats.unknown_aborts == 0
