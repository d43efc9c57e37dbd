"""Failover before the first output: a request its engine refuses (503 before any
output: draining, at its limit) or loses (engine lost, failed) goes to another engine
that serves its model, once; after an output was delivered it ends as before. Every
engine request still ends exactly once, as each engine saw it."""

from __future__ import annotations

import httpx
import pytest
import trio

from tests.helpers.frontends import start_engine, start_frontend
from tests.helpers.waiting import HANG_GUARD, wait_until
from trioserve import metrics
from trioserve.ends import EndReason
from trioserve.engine_programs.mock import expected_text
from trioserve.errors import EngineLostError
from trioserve.links.protocol import HeartbeatConfig
from trioserve.links.protocol_client import open_protocol_client
from trioserve.protocol import Limits, Submit

#: Loss is noticed within a fraction of a second (a frozen engine answers nothing).
QUICK = HeartbeatConfig(interval=0.05, timeout=0.5)


def completion(request_id: str, prompt: str = "hello", **params: object) -> Submit:
    return Submit(request_id, "mock", "completion", {"prompt": prompt}, dict(params))


async def collect(sub) -> list:
    items = []
    while batch := await sub.receive_batch():
        items += batch
    return items


def failovers(reason: str) -> float:
    return metrics.engine_failovers(reason)._value.get()


def drain_unannounced(engine) -> None:
    """Make ``engine`` refuse every submit as a draining engine does, while its pongs do
    not say it drains: submits that cross the drain's announcement, every time."""
    core = engine.core
    on_submit = core._on_submit

    def refusing(identity, submit):
        core.draining = True
        try:
            return on_submit(identity, submit)
        finally:
            core.draining = False

    core._on_submit = refusing


def ends(engine, client, request_id: str) -> list[str]:
    return engine.core.ends.get((client.frontend_id.encode(), request_id), [])


async def test_a_request_refused_by_a_draining_engine_is_served_by_another(nursery):
    first, second = await start_engine(nursery), await start_engine(nursery)
    async with open_protocol_client([first.address, second.address]) as client:
        await client.wait_ready()
        # The submit crosses the engine's drain: it arrives after the engine began
        # draining, before the frontend heard so.
        drain_unannounced(first)
        before = failovers("draining")
        sub = client.submit(completion("r1", max_tokens=5), "completion")
        items = await collect(sub)
        assert "".join(item.data for item in items) == expected_text("hello", 5)
        assert sub.engine is client.links[1] and sub.state == "finished"
        assert failovers("draining") == before + 1
        assert ends(first, client, "r1") == ["finished"]  # refused: its one end there
        assert ends(second, client, "r1") == ["finished"]
    assert first.stats.refused == 1 and first.stats.aborts_received == 0
    assert second.stats.aborts_received == 0


async def test_a_request_refused_at_an_engines_limit_is_served_by_another(nursery):
    first = await start_engine(nursery)
    second = await start_engine(nursery)
    first.core.limits = Limits(max_requests=1)
    async with open_protocol_client([first.address, second.address]) as client:
        await client.wait_ready()
        a, b = client.links
        # One long request on the first, two on the second: the least loaded is the
        # first, which is at its limit.
        held = [a.submit(completion("hold-a", max_tokens=10**7))]
        held += [b.submit(completion(f"hold-b{i}", max_tokens=10**7)) for i in (1, 2)]
        before = failovers("refused")
        sub = client.submit(completion("r1", max_tokens=3), "completion")
        items = await collect(sub)
        assert items[-1].finish_reason == "length" and sub.engine is b
        assert failovers("refused") == before + 1
        for sub in held:
            sub.abort(EndReason.CANCEL)
        await wait_until(lambda: not first.core.running and not second.core.running, "aborts")
    assert ends(first, client, "r1") == ["finished"] and ends(second, client, "r1") == ["finished"]


async def test_a_request_is_resubmitted_at_most_once(nursery):
    # Every engine answers 503 before any output: tried twice, then the error is the answer.
    engines = [await start_engine(nursery) for _ in range(3)]
    async with open_protocol_client([e.address for e in engines]) as client:
        await client.wait_ready()
        before = failovers("refused")
        refuse = {"mock_error_after": 0, "mock_error_status": 503}
        sub = client.submit(completion("r1", **refuse), "completion")
        [item] = await collect(sub)
        assert item.error.status == 503 and sub.state == "finished"
        assert failovers("refused") == before + 1
        seen = [ends(engine, client, "r1") for engine in engines]
        assert sorted(seen) == [[], ["finished"], ["finished"]]


async def test_a_refusal_with_no_other_engine_is_the_answer(nursery):
    engine = await start_engine(nursery)
    async with open_protocol_client([engine.address]) as client:
        await client.wait_ready()
        drain_unannounced(engine)
        sub = client.submit(completion("r1"), "completion")
        [item] = await collect(sub)
        assert item.error.status == 503 and item.error.type == "engine_draining"


async def test_a_request_whose_engine_is_lost_before_any_output_goes_to_another(nursery):
    first, second = await start_engine(nursery), await start_engine(nursery)
    async with open_protocol_client([first.address, second.address], heartbeat=QUICK) as client:
        await client.wait_ready()
        first.freeze()  # hung: holds what it gets, answers nothing
        before = failovers("engine_lost")
        failures = []
        sub = client.submit(
            completion("r1", max_tokens=5), "completion", on_failure=failures.append
        )
        assert sub.engine is client.links[0]
        items = await collect(sub)
        assert "".join(item.data for item in items) == expected_text("hello", 5)
        assert not failures and sub.state == "finished"
        assert failovers("engine_lost") == before + 1
        # The hung engine comes back: it gets the submit, then its abort, in that order.
        first.thaw()
        await wait_until(lambda: ends(first, client, "r1"), "the abort at the first engine")
        assert ends(first, client, "r1") == ["aborted"]
        assert ends(second, client, "r1") == ["finished"]


async def test_a_request_whose_engine_is_lost_after_an_output_fails_as_before(nursery):
    first, second = await start_engine(nursery), await start_engine(nursery)
    async with open_protocol_client([first.address, second.address], heartbeat=QUICK) as client:
        await client.wait_ready()
        before = failovers("engine_lost")
        sub = client.submit(completion("r1", max_tokens=10**7), "completion")
        assert (await sub.receive_batch())[0].data
        first.freeze()
        with pytest.raises(EngineLostError), trio.fail_after(HANG_GUARD):
            while await sub.receive_batch():
                pass
        assert sub.state == "lost" and failovers("engine_lost") == before
        assert second.stats.submitted == 0
        first.thaw()
        await wait_until(lambda: ends(first, client, "r1"), "the abort")
        assert ends(first, client, "r1") == ["aborted"]


async def test_a_request_still_prefilling_when_a_drain_runs_out_goes_to_another(nursery):
    # Cut off at the end of its engine's grace period before its first token: a 503
    # before any output, like any refusal.
    first = await start_engine(nursery, ttft_ms=10**7)  # no first token before the drain
    second = await start_engine(nursery)
    async with open_protocol_client([first.address, second.address]) as client:
        await client.wait_ready()
        sub = client.submit(completion("r1", max_tokens=3), "completion")
        assert sub.engine is client.links[0]
        await wait_until(lambda: first.core.running, "the request at the first engine")
        await first.drain(0)
        items = await collect(sub)
        assert items[-1].finish_reason == "length" and sub.engine is client.links[1]
    assert first.stats.cut_off == 1


async def test_an_engine_whose_link_takes_nothing_more_is_passed_over(nursery, monkeypatch):
    first, second = await start_engine(nursery), await start_engine(nursery)
    async with open_protocol_client([first.address, second.address]) as client:
        await client.wait_ready()
        a, b = client.links
        monkeypatch.setattr(a._pump, "send", lambda frames: False)
        before = failovers("overloaded")
        sub = client.submit(completion("r1", max_tokens=2), "completion")
        await collect(sub)
        assert sub.engine is b and failovers("overloaded") == before + 1


@pytest.mark.parametrize("stream", [False, True])
async def test_http_requests_fail_over_without_the_client_noticing(nursery, stream):
    first, second = await start_engine(nursery), await start_engine(nursery)
    frontend = await start_frontend(
        nursery, None, server="builtin", engines=[first.address, second.address]
    )
    drain_unannounced(first)
    body = {"model": "mock", "prompt": "hi", "max_tokens": 4, "stream": stream}
    async with httpx.AsyncClient(base_url=frontend.url, timeout=HANG_GUARD) as http:
        response = await http.post("/v1/completions", json=body)
    assert response.status_code == 200
    if stream:
        assert response.text.endswith("data: [DONE]\n\n")
        assert "engine_draining" not in response.text
    else:
        assert response.json()["choices"][0]["text"] == expected_text("hi", 4)
    assert first.stats.refused == 1 and second.stats.finished == 1
