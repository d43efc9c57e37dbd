"""A draining engine, seen from the frontend: routed nothing new at once, its requests
finish there, and its departure fails nothing (readiness stays green while another
engine serves)."""

from __future__ import annotations

import logging

import trio

from tests.helpers.waiting import HANG_GUARD, wait_until
from trioserve import metrics
from trioserve.ends import EndReason
from trioserve.engine_programs.mock import MockBackend, expected_text
from trioserve.links.protocol import HeartbeatConfig
from trioserve.links.protocol_client import open_protocol_client
from trioserve.protocol import Submit
from trioserve.sdk import serve_engine

QUICK = HeartbeatConfig(interval=0.05, timeout=0.5)


def completion(request_id: str, prompt: str = "hello", **params: object) -> Submit:
    return Submit(request_id, "mock", "completion", {"prompt": prompt}, dict(params))


class Stoppable:
    """An engine a test can end the life of, as its process would end."""

    def __init__(self) -> None:
        self.scope = trio.CancelScope()
        self.stopped = trio.Event()

    async def stop(self) -> None:
        self.scope.cancel()
        with trio.fail_after(HANG_GUARD):
            await self.stopped.wait()

    async def run(self, address: str, task_status: trio.TaskStatus) -> None:
        try:
            with self.scope:
                backend = MockBackend(tokens_per_second=200.0, ttft_ms=2.0)
                await serve_engine(backend, address, track_ends=True, task_status=task_status)
        finally:
            self.stopped.set()


async def start_stoppable_engine(nursery: trio.Nursery, address: str = "tcp://127.0.0.1:*"):
    stoppable = Stoppable()
    engine = await nursery.start(stoppable.run, address)
    return engine, stoppable


async def test_a_drained_engine_leaves_without_failing_anything(nursery, caplog):
    leaving, stop = await start_stoppable_engine(nursery)
    staying, _ = await start_stoppable_engine(nursery)
    caplog.set_level(logging.INFO, logger="trioserve.links.protocol")
    async with open_protocol_client([leaving.address, staying.address], heartbeat=QUICK) as client:
        await client.wait_ready()
        a, b = client.links
        failures = []
        streams = [
            a.submit(completion(f"r{i}", f"p{i}", max_tokens=30), on_failure=failures.append)
            for i in range(3)
        ]
        await streams[0].receive_batch()
        draining = metrics.ENGINE_DRAINING.labels(engine=leaving.address)
        async with trio.open_nursery() as inner:
            inner.start_soon(leaving.drain, HANG_GUARD)
            await wait_until(lambda: a.draining, "the draining pong")
            assert draining._value.get() == 1
            # At once: nothing new goes there, and readiness holds on the other engine.
            assert client.ready and not a.accepting
            new = [client.submit(completion(f"n{i}"), "completion") for i in range(5)]
            assert all(sub.engine is b for sub in new)
            for i, sub in enumerate(streams):
                items = []
                while batch := await sub.receive_batch():
                    items += batch
                text = "".join(item.data for item in items)
                assert expected_text(f"p{i}", 30).endswith(text) and items[-1].finish_reason
        await stop.stop()  # the drained engine's process exits
        await wait_until(lambda: not a.ready, "the departure noticed")
        assert client.ready and not failures and draining._value.get() == 0
        for sub in new:
            sub.abort(EndReason.CANCEL)
    departures = [r for r in caplog.records if r.name == "trioserve.links.protocol"]
    assert any("left after draining" in r.getMessage() for r in departures)
    assert not [r for r in departures if r.levelno >= logging.WARNING], [
        r.getMessage() for r in departures if r.levelno >= logging.WARNING
    ]
    assert leaving.core.ends and all(e == ["finished"] for e in leaving.core.ends.values())


async def test_readiness_turns_red_when_every_engine_drains(nursery):
    engine, _ = await start_stoppable_engine(nursery)
    async with open_protocol_client([engine.address], heartbeat=QUICK) as client:
        await client.wait_ready()
        assert client.ready
        async with trio.open_nursery() as inner:
            sub = client.submit(completion("hold", max_tokens=10**7), "completion")
            await sub.receive_batch()
            inner.start_soon(engine.drain, HANG_GUARD)
            await wait_until(lambda: not client.ready, "readiness red")
            assert client.serves_model("mock")  # still known: a 503, not a 404
            engine.end_grace()


async def test_a_draining_engine_replaced_at_its_address_is_welcomed_fresh(nursery):
    # The replacement answers before the frontend noticed the old one left: a new session
    # in a pong. No request was there: nothing fails, and the new one is routed to.
    old, stop = await start_stoppable_engine(nursery)
    address = old.address
    async with open_protocol_client([address], heartbeat=QUICK) as client:
        await client.wait_ready()
        [conn] = client.links
        await old.drain(0)
        await wait_until(lambda: conn.draining, "the draining pong")
        await stop.stop()
        new, _ = await start_stoppable_engine(nursery, address)
        await wait_until(lambda: conn.accepting, "the new engine welcomed")
        sub = client.submit(completion("r1", max_tokens=2), "completion")
        while await sub.receive_batch():
            pass
        assert new.stats.finished == 1 and sub.state == "finished"
