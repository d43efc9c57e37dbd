"""Ctrl-C and SIGTERM on a real `trioserve run`: SIGINT skips --drain-delay (it is for load
balancers, and a person at a terminal wants the server gone), SIGTERM waits it. Asserted on
the log and on what the server still answers, never on durations."""

from __future__ import annotations

import signal

import httpx
import pytest

from tests.helpers.frontends import SERVERS
from tests.helpers.processes import start_frontend_process
from tests.helpers.waiting import HANG_GUARD

pytestmark = pytest.mark.integration

#: Longer than any test may run: a drain that waited it could not pass.
FOREVER = "3600"


@pytest.mark.parametrize("server", SERVERS)
async def test_ctrl_c_on_an_idle_server_skips_the_drain_delay_and_exits_0(nursery, server):
    frontend, url = await start_frontend_process(
        nursery, "--server", server, "--drain-delay", FOREVER, "--graceful-timeout", FOREVER
    )
    async with httpx.AsyncClient(base_url=url, timeout=HANG_GUARD) as client:
        assert (await client.get("/health")).status_code == 200
    frontend.signal(signal.SIGINT)
    assert await frontend.wait() == 0
    log = frontend.output.decode()
    # Three lines, none about a grace period with nothing to wait for: what the frontend
    # does, the engine's account, and the engine's exit. (The /health request's access
    # line may come after the signal's: hypercorn logs a request once its connection's
    # task has finished it, which can be after the client has read the answer.)
    said = [
        line
        for line in log[log.index("Ctrl-C: nothing in flight; stopping") :].splitlines()
        if "trioserve.access" not in line
    ]
    assert len(said) == 3, said
    assert "drained: Stats(submitted=0" in said[1]
    assert said[2].endswith("the mock engine stopped (exit code 0)")
    assert "second signal" not in log  # one Ctrl-C was enough


async def test_sigterm_keeps_serving_through_the_drain_delay(nursery):
    frontend, url = await start_frontend_process(
        nursery, "--drain-delay", FOREVER, "--graceful-timeout", FOREVER
    )
    frontend.signal(signal.SIGTERM)
    await frontend.wait_for_output(f"draining: readiness is now 503; serving for {FOREVER} s more")
    # Within the delay: readiness says draining, and the listener still takes new
    # connections and serves them (what load balancers still send here).
    async with httpx.AsyncClient(base_url=url, timeout=HANG_GUARD) as client:
        assert (await client.get("/health")).json() == {"status": "draining"}
        fresh = await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
        assert fresh.status_code == 200
    async with httpx.AsyncClient(base_url=url, timeout=HANG_GUARD) as another:
        assert (await another.get("/live")).status_code == 200
    assert b"listener closed" not in frontend.output
    frontend.signal(signal.SIGTERM)  # the operator's way out of the wait
    assert await frontend.wait() == 0
    log = frontend.output.decode()
    assert "second signal: ending what is left now" in log
    # Nothing was in flight: the listener's closing is no news worth a line.
    assert "listener closed" not in log


async def test_ctrl_c_with_a_stream_in_flight_gives_it_the_rest_of_the_grace_period(nursery):
    # SIGINT skips the delay, not the grace: what remains after the delay (here 1 s of
    # 3601) is the stream's to finish, and it is then ended as at any drain deadline.
    frontend, url = await start_frontend_process(
        nursery, "--drain-delay", FOREVER, "--graceful-timeout", str(int(FOREVER) + 1)
    )
    body = {"prompt": "x", "max_tokens": 1_000_000, "stream": True}
    async with (
        httpx.AsyncClient(base_url=url, timeout=HANG_GUARD) as client,
        client.stream("POST", "/v1/completions", json=body) as response,
    ):
        chunks = response.aiter_text()
        assert "data: " in await anext(chunks)  # streaming
        frontend.signal(signal.SIGINT)
        rest = "".join([chunk async for chunk in chunks])
    assert '"code":"server_shutting_down"' in rest and "[DONE]" not in rest
    assert await frontend.wait() == 0
    log = frontend.output.decode()
    assert "finishing 1 request(s) in flight for up to 1 s" in log
    assert log.index("listener closed; 1 request(s) in flight") < log.index(
        "drain deadline: ended 1 request(s) still in flight"
    )


async def test_two_signals_read_together_are_one_drain_and_a_skip(nursery):
    # SIGTERM and SIGINT sent back to back reach the server in one read of its signals: the
    # first read begins the drain, the second is the operator's "stop now", never a second
    # drain (whose lines came twice: issue 29.8).
    frontend, url = await start_frontend_process(
        nursery, "--drain-delay", FOREVER, "--graceful-timeout", FOREVER
    )
    body = {"prompt": "x", "max_tokens": 1_000_000, "stream": True}
    async with (
        httpx.AsyncClient(base_url=url, timeout=HANG_GUARD) as client,
        client.stream("POST", "/v1/completions", json=body) as response,
    ):
        chunks = response.aiter_text()
        assert "data: " in await anext(chunks)  # streaming
        frontend.signal(signal.SIGTERM)
        frontend.signal(signal.SIGINT)
        rest = "".join([chunk async for chunk in chunks])
    assert '"code":"server_shutting_down"' in rest  # the skip ended it, not a drain's wait
    assert await frontend.wait() == 0
    log = frontend.output.decode()
    # Which of the two it read first is the kernel's business; one began the drain.
    began = log.count("draining: readiness is now 503") + log.count("Ctrl-C: readiness")
    assert began == 1, log
    assert log.count("second signal: ending what is left now") == 1
    assert log.count("listener closed; 1 request(s) in flight") == 1
