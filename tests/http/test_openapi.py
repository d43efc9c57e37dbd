"""``GET /openapi.json``: every route described, request schemas generated from the attrs
classes that validate them (answers are held to it by tests/process/
test_openapi_conformance.py)."""

from __future__ import annotations

import attrs

from tests.helpers.frontends import start_engine, start_frontend
from trioserve.http.app import ROUTES, TEMPLATED
from trioserve.http.bodies.embeddings import EmbeddingRequest
from trioserve.http.bodies.openai import MAX_N, MAX_TOKENS, ChatCompletionRequest
from trioserve.http.bodies.responses import ResponsesRequest, parse_response
from trioserve.http.openapi.answers import ANSWERS


async def fetch_spec(frontend) -> dict:
    async with frontend.client() as client:
        response = await client.get("/openapi.json")
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    return response.json()


async def test_every_route_of_the_table_is_described(frontend):
    spec = await fetch_spec(frontend)
    assert spec["openapi"] == "3.1.0"
    described = {(m.upper(), p) for p, ops in spec["paths"].items() for m in ops}
    assert described == set(ROUTES) | set(TEMPLATED)
    ids = [op["operationId"] for ops in spec["paths"].values() for op in ops.values()]
    assert len(ids) == len(set(ids))
    for ops in spec["paths"].values():
        for op in ops.values():
            assert "default" in op["responses"]  # any error: the error body
            assert "401" not in op["responses"]  # no API keys here
    assert "security" not in spec


async def test_request_schemas_are_the_attrs_classes(frontend):
    spec = await fetch_spec(frontend)
    schemas = spec["components"]["schemas"]
    chat = schemas["ChatCompletionRequest"]
    assert set(chat["properties"]) == {a.name for a in attrs.fields(ChatCompletionRequest)}
    assert chat["required"] == ["messages"]
    assert chat["properties"]["messages"] == {
        "type": "array",
        "items": {"$ref": "#/components/schemas/ChatMessage"},
    }
    # Ranges declared on the fields, which the checks read too.
    assert chat["properties"]["n"]["maximum"] == MAX_N
    assert chat["properties"]["top_p"]["exclusiveMinimum"] == 0
    assert chat["properties"]["stream"]["type"] == ["boolean", "null"]
    body = spec["paths"]["/v1/embeddings"]["post"]["requestBody"]["content"]
    assert body["application/json"]["schema"] == {"$ref": "#/components/schemas/EmbeddingRequest"}
    embedding = schemas["EmbeddingRequest"]
    assert set(embedding["properties"]) == {a.name for a in attrs.fields(EmbeddingRequest)}
    assert embedding["properties"]["encoding_format"]["enum"] == ["float", "base64", None]
    edits = spec["paths"]["/v1/images/edits"]["post"]["requestBody"]["content"]
    form = edits["multipart/form-data"]["schema"]
    assert form["required"] == ["prompt", "image"]
    assert form["properties"]["image"]["contentMediaType"] == "application/octet-stream"


async def test_the_native_route_documents_its_own_error_shape(frontend):
    spec = await fetch_spec(frontend)
    responses = spec["paths"]["/generate"]["post"]["responses"]
    assert responses["422"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/DetailError"
    }
    chat = spec["paths"]["/v1/chat/completions"]["post"]["responses"]
    assert chat["422"]["content"]["application/json"]["schema"]["$ref"].endswith("/Error")


async def test_with_api_keys_every_route_but_the_open_ones_needs_a_key(nursery, http_server):
    engine = await start_engine(nursery)
    frontend = await start_frontend(
        nursery, engine, server=http_server, api_keys=["k1"], playground=False
    )
    spec = await fetch_spec(frontend)
    # A bearer token, or X-Api-Key (as Anthropic's clients send it).
    assert spec["security"] == [{"bearer": []}, {"apiKey": []}]
    assert spec["components"]["securitySchemes"]["apiKey"] == {
        "type": "apiKey",
        "in": "header",
        "name": "X-Api-Key",
    }
    assert "/" not in spec["paths"]  # --no-playground
    open_paths = {"/health", "/live", "/metrics", "/docs", "/openapi.json", "/favicon.ico"}
    for path, ops in spec["paths"].items():
        for op in ops.values():
            if path in open_paths:
                assert op["security"] == [] and "401" not in op["responses"], path
            else:
                assert "security" not in op and "401" in op["responses"], path


async def test_the_responses_api_is_described_from_its_request_class(frontend):
    spec = await fetch_spec(frontend)
    request = spec["components"]["schemas"]["ResponsesRequest"]
    assert set(request["properties"]) == {a.name for a in attrs.fields(ResponsesRequest)}
    assert request["required"] == ["input"]
    assert request["properties"]["max_output_tokens"]["maximum"] == MAX_TOKENS
    assert request["properties"]["top_p"]["exclusiveMinimum"] == 0
    tools = request["properties"]["tools"]
    assert tools["items"]["properties"]["type"] == {"const": "function"}  # functions only
    events = spec["components"]["schemas"]["ResponseEvent"]["anyOf"]
    kinds = {kind for event in events for kind in event["properties"]["type"]["enum"]}
    assert {"response.function_call_arguments.delta", "response.reasoning_text.delta"} <= kinds
    paths = spec["paths"]
    assert set(paths["/v1/responses/{id}"]) == {"get", "delete"}
    assert set(paths["/v1/responses/{id}/cancel"]) == {"post"}
    created = paths["/v1/responses"]["post"]["responses"]["200"]
    assert set(created["content"]) == {"application/json", "text/event-stream"}
    assert {link["operationId"] for link in created["links"].values()} == {
        "retrieveResponse",
        "cancelResponse",
        "deleteResponse",
    }
    retrieve = paths["/v1/responses/{id}"]["get"]
    assert [(p["name"], p["in"]) for p in retrieve["parameters"]] == [
        ("id", "path"),
        ("stream", "query"),
        ("starting_after", "query"),
    ]
    assert set(retrieve["responses"]["200"]["content"]) == {"application/json", "text/event-stream"}


def test_the_response_schema_names_every_field_of_the_response_object():
    generation = parse_response({"input": "x"}, "req-1", lambda model: "mock")
    snapshot = generation.events("resp_1").snapshot()
    schema = ANSWERS["Response"]
    assert set(schema["properties"]) == set(snapshot) == set(schema["required"])
