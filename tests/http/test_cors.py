"""CORS: configured origins only, preflight answered, never '*' with credentials."""

from __future__ import annotations

import pytest

from tests.helpers.frontends import start_engine, start_frontend
from trioserve import cli
from trioserve.http.cors import CorsPolicy

APP = "https://app.example"
PREFLIGHT = {
    "origin": APP,
    "access-control-request-method": "POST",
    "access-control-request-headers": "content-type, x-request-id",
}


async def test_without_configured_origins_there_is_no_cors(frontend):
    async with frontend.client() as client:
        response = await client.get("/v1/models", headers={"origin": APP})
        assert "access-control-allow-origin" not in response.headers
        assert (await client.options("/v1/chat/completions", headers=PREFLIGHT)).status_code == 405


async def test_listed_origin_with_credentials(nursery, http_server):
    engine = await start_engine(nursery)
    frontend = await start_frontend(
        nursery,
        engine,
        server=http_server,
        cors_origins=[APP, "https://other.example"],
        cors_allow_credentials=True,
    )
    async with frontend.client() as client:
        ok = await client.post(
            "/v1/completions", json={"prompt": "x", "max_tokens": 1}, headers={"origin": APP}
        )
        assert ok.headers["access-control-allow-origin"] == APP
        assert ok.headers["access-control-allow-credentials"] == "true"
        assert "x-request-id" in ok.headers["access-control-expose-headers"]
        assert "origin" in ok.headers["vary"].lower()
        stranger = await client.get("/v1/models", headers={"origin": "https://evil.example"})
        assert "access-control-allow-origin" not in stranger.headers
        assert "access-control-allow-credentials" not in stranger.headers

        preflight = await client.options("/v1/chat/completions", headers=PREFLIGHT)
        assert preflight.status_code == 204
        assert preflight.headers["access-control-allow-origin"] == APP
        assert "POST" in preflight.headers["access-control-allow-methods"]
        assert "x-request-id" in preflight.headers["access-control-allow-headers"]
        assert preflight.headers["access-control-max-age"]
        refused = await client.options(
            "/v1/chat/completions", headers={**PREFLIGHT, "origin": "https://evil.example"}
        )
        assert refused.status_code == 403
        assert "access-control-allow-origin" not in refused.headers


async def test_any_origin_never_comes_with_credentials(nursery, http_server):
    engine = await start_engine(nursery)
    frontend = await start_frontend(nursery, engine, server=http_server, cors_origins=["*"])
    async with frontend.client() as client:
        simple = await client.get("/v1/models", headers={"origin": "https://any.example"})
        preflight = await client.options(
            "/generate", headers={**PREFLIGHT, "origin": "https://any.example"}
        )
    for response in (simple, preflight):
        assert response.headers["access-control-allow-origin"] == "*"
        assert "access-control-allow-credentials" not in response.headers
    assert preflight.status_code == 204


def test_any_origin_with_credentials_is_refused():
    with pytest.raises(ValueError, match="any origin"):
        CorsPolicy(["*"], allow_credentials=True)
    assert cli.main(["run", "--cors-origin", "*", "--cors-allow-credentials"]) == 2
