"""``trioserve run``'s observability options as an operator uses them: ``--log-format
json`` (every line JSON, the access log's fields as keys), ``--no-access-log`` and
``--debug-endpoints``."""

from __future__ import annotations

import json
import signal

import httpx

from tests.helpers.processes import Proc
from tests.helpers.waiting import HANG_GUARD


async def start(nursery, *args: str) -> tuple[Proc, str]:
    frontend = await Proc.start(nursery, "--log-format", "json", "run", "--port", "0", *args)
    match = await frontend.wait_for_output(r"Running on (http://127\.0\.0\.1:\d+)")
    return frontend, match.group(1).decode()


async def stop(frontend: Proc) -> list[dict]:
    frontend.signal(signal.SIGTERM)
    assert await frontend.wait() == 0
    return [json.loads(line) for line in frontend.output.decode().splitlines()]


async def test_json_logs_carry_the_access_log_s_fields(nursery):
    frontend, url = await start(nursery, "--drain-delay", "0", "--debug-endpoints")
    async with httpx.AsyncClient(base_url=url, timeout=HANG_GUARD) as client:
        body = {"prompt": "a b c", "max_tokens": 2}
        answer = await client.post("/v1/completions", json=body, headers={"x-request-id": "j-1"})
        assert answer.status_code == 200
        assert (await client.get("/debug/requests")).json()["in_flight"] == 0
    lines = await stop(frontend)  # every line parses: json.loads above
    assert {line["logger"] for line in lines} >= {"trioserve", "trioserve.access"}
    (completion,) = [line for line in lines if line.get("request_id") == "j-1"]
    assert completion == {
        **completion,
        "level": "INFO",
        "logger": "trioserve.access",
        "method": "POST",
        "path": "/v1/completions",
        "status": 200,
        "prompt_tokens": 3,
        "completion_tokens": 2,
        "end": "completed",
    }
    assert completion["message"].startswith("127.0.0.1:")
    assert any(line.get("path") == "/debug/requests" for line in lines)
    # Said once at start: the endpoint shows who asks what, from where.
    [warning] = [line for line in lines if "--debug-endpoints" in line["message"]]
    assert warning["level"] == "WARNING" and "client's address" in warning["message"]
    assert "anyone who can reach this server" in warning["message"]  # no API key here


async def test_no_access_log_and_no_debug_endpoint_by_default(nursery):
    frontend, url = await start(nursery, "--drain-delay", "0", "--no-access-log")
    async with httpx.AsyncClient(base_url=url, timeout=HANG_GUARD) as client:
        assert (await client.get("/health")).status_code == 200
        assert (await client.get("/debug/requests")).status_code == 404
    lines = await stop(frontend)
    assert lines and not [line for line in lines if line["logger"] == "trioserve.access"]
