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

import pytest
import trio

from tests.helpers.processes import start_frontend_process

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
    "POST /generate",
    "POST /v1/embeddings",
    "POST /v1/audio/speech",
    "POST /v1/images/generations",
    "POST /v1/images/edits",
    "POST /v1/videos/generations",
)
CONFIG = "\n".join(
    f"""
[[operations]]
include-name = "{name}"
checks.not_a_server_error.expected-statuses = ["2xx", "3xx", "4xx", "504"]
"""
    for name in GENERATION
)


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
    _, url = await start_frontend_process(
        nursery,
        "--request-timeout",
        "3",
        "--mock-tokens-per-second",
        "2000",
        "--mock-ttft-ms",
        "0",
    )
    output = await run_schemathesis(url, tmp_path)
    assert "Tested: 16" in output  # every route of the description was run


@pytest.mark.integration
async def test_with_api_keys_the_description_and_the_answers_agree(nursery, tmp_path):
    _, url = await start_frontend_process(
        nursery,
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
    assert "Tested: 16" in output
