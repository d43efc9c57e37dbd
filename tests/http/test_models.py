"""``GET /v1/models`` and ``GET /v1/models/{id}``."""

from __future__ import annotations

import openai
import pytest

from tests.helpers.api_keys import ALICE, KEY
from tests.helpers.frontends import start_engine, start_frontend


async def test_a_served_model_is_described(frontend):
    async with frontend.client() as client:
        response = await client.get("/v1/models/mock")
    assert response.status_code == 200
    assert response.json() == {
        "id": "mock",
        "object": "model",
        "created": 0,
        "owned_by": "trioserve",
    }
    assert response.headers["x-request-id"]


async def test_an_unknown_model_is_404_model_not_found(frontend):
    async with frontend.client() as client:
        response = await client.get("/v1/models/gpt-4")
    assert response.status_code == 404
    error = response.json()["error"]
    assert error["code"] == "model_not_found"
    assert error["type"] == "not_found_error"
    assert "'gpt-4'" in error["message"] and "available: mock" in error["message"]


async def test_a_model_id_with_slashes_is_found_encoded_or_not(nursery, http_server):
    engine = await start_engine(nursery, model="org/name-7b")
    frontend = await start_frontend(nursery, engine, server=http_server)
    async with frontend.client() as client:
        for path in ("/v1/models/org/name-7b", "/v1/models/org%2Fname-7b"):
            response = await client.get(path)
            assert response.status_code == 200, path
            assert response.json()["id"] == "org/name-7b"
        assert (await client.get("/v1/models/org")).status_code == 404


async def test_other_methods_are_405_and_an_empty_id_is_no_route(frontend):
    async with frontend.client() as client:
        response = await client.post("/v1/models/mock", json={})
        assert response.status_code == 405
        assert response.headers["allow"] == "GET"
        response = await client.get("/v1/models/")
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "not_found"
        # The other templated route keeps its own methods.
        response = await client.get("/v1/requests/x")
        assert response.status_code == 405 and response.headers["allow"] == "DELETE"


async def test_the_official_client_retrieves_and_lists(frontend):
    client = openai.AsyncOpenAI(base_url=f"{frontend.url}/v1", api_key="x", max_retries=0)
    model = await client.models.retrieve("mock")
    assert (model.id, model.object, model.owned_by) == ("mock", "model", "trioserve")
    assert [m.id async for m in client.models.list()] == ["mock"]
    with pytest.raises(openai.NotFoundError) as caught:
        await client.models.retrieve("nope")
    assert caught.value.code == "model_not_found"


async def test_with_api_keys_a_model_needs_a_key_as_the_list_does(nursery, http_server):
    engine = await start_engine(nursery)
    frontend = await start_frontend(nursery, engine, server=http_server, api_keys=[KEY])
    async with frontend.client() as client:
        assert (await client.get("/v1/models/mock")).status_code == 401
        # An unknown id is refused the same way: which models exist is not revealed.
        assert (await client.get("/v1/models/nope")).status_code == 401
        assert (await client.get("/v1/models/mock", headers=ALICE)).status_code == 200
    keyed = openai.AsyncOpenAI(base_url=f"{frontend.url}/v1", api_key=KEY, max_retries=0)
    assert (await keyed.models.retrieve("mock")).id == "mock"
