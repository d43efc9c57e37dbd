"""schemathesis against a live ``trioserve run`` (mock engine, 127.0.0.1): every route
of ``/openapi.json`` fed generated requests, valid and invalid, a bounded number per
route, derandomized. Every answer must match the description (status documented,
content type, body and SSE events against their schemas, the X-Request-Id header), and
none may be a 5xx but the one a schema-valid request can earn by design: 504 when it
asks for more tokens (up to 2^31 - 1) than its deadline lets the mock make.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
import trio
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.helpers.processes import start_frontend_process
from tests.helpers.text_models import build_text_model
from tests.helpers.waiting import HANG_GUARD

SCHEMATHESIS = Path(sys.executable).parent / "schemathesis"
#: Generated requests per route (and per phase): bounded, so the run takes a minute.
MAX_EXAMPLES = 25
#: What every answer is held to (docs: `schemathesis run --help`). Not held:
#: positive_data_acceptance and negative_data_rejection, since the server is lenient on
#: purpose (a number as a string is accepted, docs/api.md "Validation"), and the checks
#: that need resources made by other calls (DELETE /v1/requests/{id} of a request in
#: flight), which a stateless run cannot make.
CHECKS = ",".join(
    (
        "not_a_server_error",
        "status_code_conformance",
        "content_type_conformance",
        "response_schema_conformance",
        "response_headers_conformance",
    )
)
GENERATION = (
    "POST /v1/chat/completions",
    "POST /v1/completions",
    "POST /v1/responses",
    "POST /v1/messages",
    "POST /generate",
    "POST /v1/embeddings",
    "POST /v1/audio/speech",
    "POST /v1/images/generations",
    "POST /v1/images/edits",
    "POST /v1/videos/generations",
)
# What a run of `schemathesis run` also holds every answer to (the Python API's checks).
CHECK_FUNCTIONS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
]
CONFIG = "\n".join(
    f"""
[[operations]]
include-name = "{name}"
checks.not_a_server_error.expected-statuses = ["2xx", "3xx", "4xx", "504"]
"""
    for name in GENERATION
)


async def operations(url: str) -> int:
    """How many operations of the live description schemathesis runs: all but
    ``GET /openapi.json``, the description it was loaded from."""
    async with httpx.AsyncClient(timeout=HANG_GUARD) as client:
        spec = (await client.get(f"{url}/openapi.json")).json()
    return sum(len(methods) for path, methods in spec["paths"].items() if path != "/openapi.json")


async def run_schemathesis(
    url: str, tmp_path: Path, *extra: str, max_examples: int = MAX_EXAMPLES
) -> str:
    config = tmp_path / "schemathesis.toml"
    config.write_text(CONFIG)
    result = await trio.run_process(
        [
            str(SCHEMATHESIS),
            "--config-file",
            str(config),
            "run",
            f"{url}/openapi.json",
            "--checks",
            CHECKS,
            "--max-examples",
            str(max_examples),
            "--generation-deterministic",
            "--workers",
            "1",
            "--request-timeout",
            "60",
            "--suppress-health-check",
            "all",
            "--no-color",
            *extra,
        ],
        capture_stdout=True,
        stderr=subprocess.STDOUT,
        check=False,
        cwd=tmp_path,
    )
    output = result.stdout.decode(errors="replace")
    print(output)  # the run's report, shown by pytest when the test fails
    assert result.returncode == 0, output[-6000:]
    return output


@pytest.mark.integration
async def test_every_answer_matches_the_openapi_description(nursery, tmp_path):
    # A tokenizer (the harder tiny Llama's text assets), so that /tokenize, /detokenize and
    # the render routes are fuzzed for real (without one they answer 501).
    model = build_text_model(tmp_path / "model", harder=True)
    _, url = await start_frontend_process(
        nursery,
        "--tokenizer",
        str(model),
        "--request-timeout",
        "3",
        "--mock-tokens-per-second",
        "2000",
        "--mock-ttft-ms",
        "0",
        # Generated bodies start background responses (each up to its 3 s deadline):
        # the default bound (64) is for real clients, not for a generator's pace.
        "--max-background-responses",
        "1024",
    )
    output = await run_schemathesis(url, tmp_path)
    assert f"Tested: {await operations(url)}" in output  # every route of the description was run


@pytest.mark.integration
async def test_with_api_keys_the_description_and_the_answers_agree(nursery, tmp_path):
    model = build_text_model(tmp_path / "model", harder=True)  # as above: the text routes
    _, url = await start_frontend_process(
        nursery,
        "--tokenizer",
        str(model),
        "--api-key",
        "sekret-1",
        "--request-timeout",
        "3",
        "--mock-tokens-per-second",
        "2000",
        "--mock-ttft-ms",
        "0",
    )
    # Fewer examples: what differs here is the security of each route, not the bodies.
    output = await run_schemathesis(
        url, tmp_path, "--header", "Authorization: Bearer sekret-1", max_examples=8
    )
    assert f"Tested: {await operations(url)}" in output


def responses_scenario(url: str) -> list[tuple[str, int]]:
    """Every route of the Responses API asked about responses that exist, in each state
    (running, finished, cancelled, deleted; background, stored, streamed), each answer held
    by schemathesis to /openapi.json as its CLI holds them: a stateless run cannot make
    these (generated ids are unknown ids). Returns what was asked and the status, in order."""
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
    asked: list[tuple[str, int]] = []

    def call(what: str, method: str, path: str, **parts: object) -> Any:
        case = schema[path][method].Case(**parts)
        response = case.call(base_url=url, timeout=HANG_GUARD)
        case.validate_response(response, checks=CHECK_FUNCTIONS)
        asked.append((what, response.status_code))
        return response

    def create(what: str, **body: object) -> Any:
        body = {"input": "Hello", "max_output_tokens": 4, **body}
        return call(what, "POST", "/v1/responses", body=body, media_type="application/json")

    def retrieve(what: str, response_id: str, **query: str) -> Any:
        return call(what, "GET", "/v1/responses/{id}", path_parameters={"id": response_id},
                    query=query or None)  # fmt: skip

    def cancel(what: str, response_id: str) -> Any:
        return call(what, "POST", "/v1/responses/{id}/cancel", path_parameters={"id": response_id})

    def delete(what: str, response_id: str) -> Any:
        return call(what, "DELETE", "/v1/responses/{id}", path_parameters={"id": response_id})

    short = create("background", background=True).json()["id"]
    running = create("background, running", background=True, max_output_tokens=10**6)
    running = running.json()["id"]
    followed = retrieve("follow until it ends", short, stream="true")
    assert followed.text.rstrip().rsplit("event: ", 1)[1].startswith("response.incomplete")
    assert retrieve("finished", short).json()["status"] == "incomplete"
    assert retrieve("running", running).json()["status"] in ("queued", "in_progress")
    assert cancel("cancel", running).json()["status"] == "cancelled"
    cancel("cancel again", running)
    replay = retrieve("replay after 0", running, stream="true", starting_after="0")
    assert "event: response.failed" in replay.text and 'sequence_number":0' not in replay.text
    cancel("cancel a finished one", short)
    delete("delete", short)
    retrieve("deleted", short)
    delete("delete a cancelled one", running)
    stored = create("stored").json()["id"]
    retrieve("retrieve a stored one", stored)
    retrieve("stream a stored one", stored, stream="true")
    cancel("cancel a stored one", stored)
    create("streamed", stream=True)
    create("background, streamed", background=True, stream=True)
    return asked


@pytest.mark.integration
async def test_the_responses_api_of_made_responses_matches_the_description(nursery):
    _, url = await start_frontend_process(
        nursery, "--request-timeout", "0", "--mock-tokens-per-second", "200", "--mock-ttft-ms", "0"
    )
    asked = await trio.to_thread.run_sync(responses_scenario, url)
    assert asked == [
        ("background", 200),
        ("background, running", 200),
        ("follow until it ends", 200),
        ("finished", 200),
        ("running", 200),
        ("cancel", 200),
        ("cancel again", 200),
        ("replay after 0", 200),
        ("cancel a finished one", 409),
        ("delete", 200),
        ("deleted", 404),
        ("delete a cancelled one", 200),
        ("stored", 200),
        ("retrieve a stored one", 200),
        ("stream a stored one", 400),
        ("cancel a stored one", 400),
        ("streamed", 200),
        ("background, streamed", 200),
    ]
