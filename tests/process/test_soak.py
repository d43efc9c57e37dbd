"""A randomized soak: normal requests mixed with disconnects, deadlines, engine errors and
cancels, then zero leaked engine requests.

Seeded and reproducible: the sequence of requests and faults is a function of the seed
(``TRIOSERVE_SOAK_SEED``, printed on failure); how they interleave in time is not, and the
invariants must hold whatever the interleaving. Bounded in count (``TRIOSERVE_SOAK_COUNT``,
default 2000) and in time (a hang guard on the whole run).
"""

from __future__ import annotations

import json
import os
import random
from collections import Counter

import httpx
import pytest
import trio

from tests.helpers.frontends import start_engine, start_frontend
from tests.helpers.http import raw_request
from tests.helpers.waiting import wait_until
from trioserve import metrics

pytestmark = pytest.mark.integration

SEED = int(os.environ.get("TRIOSERVE_SOAK_SEED", "20261129"))
COUNT = int(os.environ.get("TRIOSERVE_SOAK_COUNT", "2000"))
CONCURRENCY = 32
ACTIONS = ["json", "sse", "disconnect", "deadline", "engine_error", "cancel"]


async def test_soak_leaks_no_engine_request(nursery):
    rng = random.Random(SEED)
    engine = await start_engine(nursery, tokens_per_second=2000, ttft_ms=1)
    frontend = await start_frontend(nursery, engine, server="builtin")
    plan = [(i, rng.choice(ACTIONS), rng.random(), rng.randint(1, 60)) for i in range(COUNT)]
    outcomes: Counter[str] = Counter()
    problems: list[str] = []
    limiter = trio.CapacityLimiter(CONCURRENCY)

    async with httpx.AsyncClient(
        base_url=frontend.url,
        timeout=30,
        # The client lets idle connections go well before the server would close them, so
        # no request is sent on a connection the server is closing at that moment.
        limits=httpx.Limits(max_connections=CONCURRENCY * 2, keepalive_expiry=1.0),
    ) as client:

        async def one(i: int, action: str, x: float, tokens: int) -> None:
            rid = f"soak-{i}"
            stream = action in ("sse", "disconnect") or (action != "json" and x < 0.5)
            body = {"prompt": f"p{i}", "max_tokens": tokens, "stream": stream}
            headers = {"x-request-id": rid}
            if action == "deadline":
                headers["x-request-timeout"] = str(0.002 + x * 0.03)
            if action == "engine_error":
                body["mock_error_after"] = int(x * tokens)
                body["mock_error_status"] = rng_status(i)
            async with limiter:
                if action == "disconnect":
                    sock = await raw_request(
                        frontend, "POST", "/v1/completions", json.dumps(body).encode(), **headers
                    )
                    await trio.sleep(x * 0.03)
                    await sock.aclose()
                    outcomes["disconnect"] += 1
                    return
                if action == "cancel":
                    async with trio.open_nursery() as n:

                        async def cancel_later() -> None:
                            await trio.sleep(x * 0.03)
                            await client.delete(f"/v1/requests/{rid}")

                        n.start_soon(cancel_later)
                        response = await client.post("/v1/completions", json=body, headers=headers)
                else:
                    response = await client.post("/v1/completions", json=body, headers=headers)
            check(action, stream, response, rid)

        def check(action: str, stream: bool, response: httpx.Response, rid: str) -> None:
            text = response.text
            if response.status_code == 200 and stream:
                if text.endswith("data: [DONE]\n\n"):
                    outcomes["complete"] += 1
                    return
                last = text.rstrip("\n").rsplit("\n\n", 1)[-1].removeprefix("data: ")
                if "error" in json.loads(last):
                    outcomes[f"error-event:{json.loads(last)['error']['code']}"] += 1
                    return
                problems.append(f"{rid} {action}: stream neither complete nor errored")
            elif response.status_code == 200:
                if json.loads(text)["choices"][0]["finish_reason"] == "length":
                    outcomes["complete"] += 1
                    return
                problems.append(f"{rid} {action}: 200 without a finish reason")
            else:
                error = response.json().get("error", {})
                if not error.get("code"):
                    problems.append(f"{rid} {action}: {response.status_code} without an error")
                outcomes[f"status:{response.status_code}"] += 1

        with trio.fail_after(240):
            async with trio.open_nursery() as requests:
                for args in plan:
                    requests.start_soon(one, *args)

    await wait_until(lambda: not engine.core.running, "the engine to hold no request")
    await wait_until(lambda: len(frontend.app.services.registry) == 0, "the frontend to hold none")
    assert metrics.REGISTRY.get_sample_value("trioserve_requests_in_flight") == 0
    ends = engine.core.ends
    multiple = {key: how for key, how in ends.items() if len(how) != 1}
    assert not problems, f"seed {SEED}: {problems[:10]}"
    assert not multiple, f"seed {SEED}: requests that ended more than once: {multiple}"
    assert len(ends) == COUNT, (
        f"seed {SEED}: {COUNT - len(ends)} request(s) never reached the engine"
    )
    # The mix really exercised every path.
    print(f"seed {SEED}: {sorted(outcomes.items())}")
    assert outcomes["complete"] and outcomes["disconnect"]
    assert outcomes["status:504"] + outcomes["error-event:deadline_exceeded"]
    assert outcomes["status:499"] + outcomes["error-event:request_cancelled"]


def rng_status(i: int) -> int:
    return (400, 429, 500, 503)[i % 4]
