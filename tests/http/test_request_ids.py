"""Request ids a client chose (``X-Request-Id``) tell other clients nothing."""

from __future__ import annotations

import json

import trio

from tests.helpers.api_keys import ALICE, BOB, keyed_frontend
from tests.helpers.frontends import LONG, running
from tests.helpers.waiting import wait_until


async def test_an_id_in_flight_under_another_key_is_neither_refused_nor_revealed(
    nursery, http_server
):
    # A 409 to Bob would confirm that Alice has a request "shared" in flight; to Bob the
    # id is free. Alice reusing her own id in flight still gets the 409.
    frontend = await keyed_frontend(nursery, server=http_server)
    results = {}

    async def alices_stream() -> None:
        async with frontend.client() as client:
            results["alice"] = await client.post(
                "/v1/chat/completions",
                json={**LONG, "stream": True},
                headers={**ALICE, "x-request-id": "shared"},
            )

    async with trio.open_nursery() as requests:
        requests.start_soon(alices_stream)
        await running(frontend, "shared")
        short = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
        async with frontend.client() as client:
            bob = await client.post(
                "/v1/chat/completions", json=short, headers={**BOB, "x-request-id": "shared"}
            )
            again = await client.post(
                "/v1/chat/completions", json=short, headers={**ALICE, "x-request-id": "shared"}
            )
            assert frontend.ends("shared") == []  # Alice's still runs, untouched
            cancel = await client.delete("/v1/requests/shared", headers=ALICE)
    assert bob.status_code == 200 and bob.headers["x-request-id"] == "shared"
    assert again.status_code == 409
    assert cancel.status_code == 200
    events = [e for e in results["alice"].text.split("\n\n") if e]
    assert json.loads(events[-1].removeprefix("data: "))["error"]["code"] == "request_cancelled"
    await wait_until(lambda: frontend.ends("shared"), "the engine to see the abort")
    assert frontend.ends("shared") == ["aborted"]  # Bob's reached the engine as another id
    finished = [ends for (_, rid), ends in frontend.engine.core.ends.items() if rid != "shared"]
    assert finished == [["finished"]]
