"""An engine's drain (the trio shell; the asyncio shell and the signals in
tests/process/test_engine_drain.py): frontends are told at once, new requests are refused,
running ones finish within the grace period, the rest are ended once each."""

from __future__ import annotations

import pytest
import trio

from tests.helpers.frontends import start_engine
from tests.helpers.waiting import HANG_GUARD, wait_until
from trioserve.engine_programs.mock import expected_text
from trioserve.errors import NoEngineError
from trioserve.links.protocol_client import open_protocol_client
from trioserve.protocol import Submit


def completion(request_id: str, prompt: str = "hello", **params: object) -> Submit:
    return Submit(request_id, "mock", "completion", {"prompt": prompt}, dict(params))


async def collect(sub) -> list:
    items = []
    while batch := await sub.receive_batch():
        items += batch
    return items


async def test_running_requests_finish_and_new_ones_are_refused_while_draining(nursery):
    engine = await start_engine(nursery, tokens_per_second=100.0)
    async with open_protocol_client([engine.address]) as client:
        await client.wait_ready()
        [conn] = client.links
        subs = [
            client.submit(completion(f"r{i}", f"p{i}", max_tokens=20), "completion") for i in (1, 2)
        ]
        first = [await sub.receive_batch() for sub in subs]  # both are running
        drained = trio.Event()

        async def drain() -> None:
            await engine.drain(HANG_GUARD)
            drained.set()

        nursery.start_soon(drain)
        await wait_until(lambda: conn.draining, "the draining pong")
        assert not client.ready  # its only engine takes nothing new
        with pytest.raises(NoEngineError, match="draining"):
            client.submit(completion("late"), "completion")
        for i, (sub, batch) in enumerate(zip(subs, first, strict=True), 1):
            items = batch + await collect(sub)
            assert "".join(item.data for item in items) == expected_text(f"p{i}", 20)
            assert items[-1].finish_reason == "length"
        with trio.fail_after(HANG_GUARD):
            await drained.wait()
    stats = engine.stats
    assert (stats.submitted, stats.finished, stats.cut_off, stats.aborted) == (2, 2, 0, 0)


async def test_what_outlives_the_grace_period_is_ended_once_with_engine_stopped(nursery):
    engine = await start_engine(nursery)
    async with open_protocol_client([engine.address]) as client:
        await client.wait_ready()
        sub = client.submit(completion("long", max_tokens=10_000_000), "completion")
        assert (await sub.receive_batch())[0].data  # it has begun
        await engine.drain(0)
        items = await collect(sub)
        assert items[-1].error.status == 503 and items[-1].error.type == "engine_stopped"
        assert sub.state == "finished"  # the engine ended it: no abort follows
    assert list(engine.core.ends.values()) == [["finished"]]
    assert (engine.stats.cut_off, engine.stats.aborts_received) == (1, 0)


async def test_end_grace_cuts_a_drain_short(nursery):
    engine = await start_engine(nursery)
    async with open_protocol_client([engine.address]) as client:
        await client.wait_ready()
        sub = client.submit(completion("long", max_tokens=10_000_000), "completion")
        await sub.receive_batch()
        async with trio.open_nursery() as inner:
            inner.start_soon(engine.drain, HANG_GUARD)
            await wait_until(lambda: engine.core.draining, "the drain")
            engine.end_grace()
        items = await collect(sub)
        assert items[-1].error.type == "engine_stopped"
    assert engine.stats.cut_off == 1


async def test_a_frontend_that_connects_while_an_engine_drains_routes_nothing_to_it(nursery):
    engine = await start_engine(nursery)
    async with trio.open_nursery() as inner, open_protocol_client([engine.address]) as first:
        await first.wait_ready()
        sub = first.submit(completion("long", max_tokens=10_000_000), "completion")
        await sub.receive_batch()
        inner.start_soon(engine.drain, HANG_GUARD)
        await wait_until(lambda: engine.core.draining, "the drain")
        async with open_protocol_client([engine.address]) as second:
            await second.wait_ready()  # welcomed, and told in the welcome
            [conn] = second.links
            assert conn.ready and conn.draining and not second.ready
        engine.end_grace()
