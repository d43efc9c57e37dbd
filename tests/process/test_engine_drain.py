"""`trioserve engine mock` drains on SIGTERM (on either event loop): it tells the frontend,
takes nothing new, lets running streams finish, exits 0; a second signal ends the grace
period and what is left ends with a clear error, once."""

from __future__ import annotations

import json
import re
import signal

import pytest
import trio

from tests.helpers.frontends import start_frontend
from tests.helpers.processes import Proc, free_port, start_mock_engine
from tests.helpers.waiting import HANG_GUARD, wait_until
from trioserve.engine_programs.mock import expected_text

pytestmark = pytest.mark.integration


async def start_mock(nursery: trio.Nursery, address: str, *extra: str) -> Proc:
    return await start_mock_engine(nursery, address, *extra, tokens_per_second=50)


def final_stats(engine: Proc) -> dict[str, int]:
    """The engine's account of its requests, from its last log line about them."""
    match = re.findall(rb"drained: Stats\((.*?)\)", engine.output)
    assert match, engine.output.decode()[-2000:]
    return {k: int(v) for k, v in (pair.split("=") for pair in match[-1].decode().split(", "))}


def sse_text(body: str) -> str:
    text = ""
    for event in body.split("\n\n"):
        if event.startswith("data: {"):
            choice = json.loads(event.removeprefix("data: "))["choices"][0]
            text += choice.get("text") or ""
    return text


@pytest.mark.parametrize("loop", ["trio", "asyncio"])
async def test_sigterm_drains_an_engine_without_failing_its_streams(nursery, loop):
    address = f"tcp://127.0.0.1:{free_port()}"
    engine = await start_mock(nursery, address, "--loop", loop)
    frontend = await start_frontend(nursery, None, server="builtin", engines=[address])
    [conn] = frontend.app.services.engines.links
    bodies: dict[int, str] = {}
    async with frontend.client() as client:

        async def stream(i: int, task_status: trio.TaskStatus) -> None:
            body = {"prompt": f"p{i}", "max_tokens": 40, "stream": True}
            async with client.stream("POST", "/v1/completions", json=body) as response:
                assert response.status_code == 200
                chunks = response.aiter_text()
                bodies[i] = await anext(chunks)
                task_status.started()  # running at the engine: its first token came
                bodies[i] += "".join([chunk async for chunk in chunks])

        async with trio.open_nursery() as streams:
            for i in range(3):
                await streams.start(stream, i)
            engine.signal(signal.SIGTERM)
            await wait_until(lambda: conn.draining, "the frontend told")
            # Its only engine takes nothing new: a clear, retryable 503.
            refused = await client.post("/v1/completions", json={"prompt": "late"})
            assert refused.status_code == 503
            assert "draining" in refused.json()["error"]["message"]
        assert await engine.wait() == 0
    for i in range(3):
        assert bodies[i].endswith("data: [DONE]\n\n")
        assert sse_text(bodies[i]) == expected_text(f"p{i}", 40)
    stats = final_stats(engine)
    assert stats["submitted"] == stats["finished"] == 3 and stats["cut_off"] == 0


async def test_a_second_signal_ends_the_grace_period(nursery):
    address = f"tcp://127.0.0.1:{free_port()}"
    engine = await start_mock(nursery, address, "--grace-period", "600")
    frontend = await start_frontend(nursery, None, server="builtin", engines=[address])
    async with frontend.client() as client:
        results = {}

        async def stream() -> None:
            body = {"prompt": "long", "max_tokens": 10**7, "stream": True}
            results["long"] = await client.post("/v1/completions", json=body)

        async with trio.open_nursery() as streams:
            streams.start_soon(stream)
            await wait_until(lambda: len(frontend.app.services.registry) == 1, "the stream")
            engine.signal(signal.SIGTERM)
            await engine.wait_for_output("draining")
            engine.signal(signal.SIGTERM)
            with trio.fail_after(HANG_GUARD):
                assert await engine.wait() == 0
    events = [e for e in results["long"].text.split("\n\n") if e]
    assert json.loads(events[-1].removeprefix("data: "))["error"]["code"] == "engine_stopped"
    assert final_stats(engine)["cut_off"] == 1
