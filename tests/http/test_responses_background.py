"""Background responses: they outlive their client, their events can be replayed and
followed (``starting_after``), a cancel reaches the engine once, and every bound holds."""

from __future__ import annotations

import random

import httpx
import openai
import pytest
import trio

from tests.helpers.frontends import start_frontend
from tests.helpers.responses import aborts_sent, named_events, start_natural_engine
from tests.helpers.waiting import HANG_GUARD, wait_until
from trioserve.engine_programs.mock import expected_text

#: A background response that generates until it is ended (the engine never finishes it).
ENDLESS = {"input": "go on", "background": True, "max_output_tokens": 10_000_000}


@pytest.fixture
async def engine(nursery):
    return await start_natural_engine(nursery)


def sdk(frontend, key: str = "unused") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{frontend.url}/v1", api_key=key, max_retries=0)


def record_of(frontend, response_id: str):
    record = frontend.app.services.responses._records.get(response_id)
    assert record is not None
    return record


def engine_ends(frontend, response_id: str) -> list[str]:
    # A background response's engine request id is its response id.
    return frontend.ends(response_id)


async def ended_once(frontend, response_id: str, how: str) -> None:
    await wait_until(lambda: engine_ends(frontend, response_id), "the engine to see it end")
    assert engine_ends(frontend, response_id) == [how]
    assert frontend.engine.core.stats.unknown_aborts == 0
    await wait_until(lambda: len(frontend.app.services.registry) == 0, "nothing in flight")
    assert frontend.app.services.responses.running == 0


async def read_events(
    client: httpx.AsyncClient, method: str, url: str, *, cut: int | None = None, **options
) -> tuple[list[tuple[str, dict]], bool]:
    """The complete events of one SSE stream, and whether it ended by itself; with
    ``cut``, the connection is dropped once ``cut`` bytes have come (a partial event at
    the cut is lost, as a client that loses its network loses it)."""
    received = b""
    async with client.stream(method, url, **options) as response:
        assert response.status_code == 200, await response.aread()
        async for chunk in response.aiter_bytes():
            received += chunk
            if cut is not None and len(received) >= cut:
                return named_events(received[:cut].decode(errors="ignore")), False
    return named_events(received.decode()), True


async def test_background_create_is_queued_then_completes_with_the_sdk(frontend):
    client = sdk(frontend)
    created = await client.responses.create(input="hello there", background=True)
    assert created.status == "queued" and created.background is True
    stream = await client.responses.retrieve(created.id, stream=True)
    events = [event async for event in stream]
    assert events[0].type == "response.created" and events[0].sequence_number == 0
    assert events[1].type == "response.in_progress"
    assert events[-1].type == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = await client.responses.retrieve(created.id)
    assert final.status == "completed"
    assert final.output_text == expected_text("hello there", 16)
    assert final.usage.output_tokens == 16
    await ended_once(frontend, created.id, "finished")


async def test_background_response_goes_on_when_its_client_leaves(frontend):
    body = {**ENDLESS, "stream": True, "max_output_tokens": 40, "mock_tokens_per_second": 100}
    async with frontend.client() as client:
        events, ended = await read_events(client, "POST", "/v1/responses", json=body, cut=2000)
    assert not ended
    response_id = events[0][1]["response"]["id"]
    await ended_once(frontend, response_id, "finished")  # no abort: it went on
    final = await sdk(frontend).responses.retrieve(response_id)
    assert final.status == "incomplete"
    assert final.output_text == expected_text("go on", 40)


async def test_replay_after_a_sequence_number_then_follow_live_until_the_end(frontend):
    client = sdk(frontend)
    created = await client.responses.create(
        **{**ENDLESS, "max_output_tokens": None}, extra_body={"mock_hang_after": 6}
    )
    record = record_of(frontend, created.id)
    await wait_until(lambda: record.events.text == expected_text("go on", 6), "six tokens")
    held = len(record.retained)
    follower = await client.responses.retrieve(created.id, stream=True, starting_after=2)
    seen = []
    async for event in follower:
        seen.append(event)
        if event.sequence_number == held - 1:  # every retained one replayed: end it
            cancelled = await client.responses.cancel(created.id)
            assert cancelled.status == "cancelled"
    assert [e.sequence_number for e in seen] == list(range(3, held + 1))
    assert seen[-1].type == "response.failed"  # live, after the replay
    assert seen[-1].response.status == "cancelled"
    await ended_once(frontend, created.id, "aborted")


@pytest.mark.parametrize("seed", range(5))
async def test_a_resumed_stream_delivers_every_event_exactly_once_across_drops(frontend, seed):
    rng = random.Random(seed)
    prompt = f"resume {seed}"
    body = {
        "input": prompt,
        "background": True,
        "stream": True,
        "max_output_tokens": 80,
        "mock_tokens_per_second": 200,
    }
    seen: list[tuple[str, dict]] = []
    drops = 0
    async with frontend.client() as client:
        # Dropped after response.created at least (the client must learn the id).
        events, ended = await read_events(
            client, "POST", "/v1/responses", json=body, cut=rng.randrange(1500, 6000)
        )
        seen += events
        response_id = seen[0][1]["response"]["id"]
        while not ended:
            drops += 1
            cut = rng.randrange(1, 4000) if drops < 12 else None
            events, ended = await read_events(
                client,
                "GET",
                f"/v1/responses/{response_id}",
                params={"stream": "true", "starting_after": seen[-1][1]["sequence_number"]},
                cut=cut,
            )
            seen += events
    assert drops >= 1
    numbers = [data["sequence_number"] for _, data in seen]
    assert numbers == list(range(len(numbers)))  # each once, in order, none missing
    assert [name for name, _ in seen] == [data["type"] for _, data in seen]
    deltas = [data["delta"] for name, data in seen if name == "response.output_text.delta"]
    assert "".join(deltas) == expected_text(prompt, 80)
    assert seen[-1][0] == "response.incomplete"
    assert numbers[-1] == len(record_of(frontend, response_id).retained) - 1
    await ended_once(frontend, response_id, "finished")


async def test_cancel_ends_a_background_response_with_exactly_one_abort(frontend):
    before = aborts_sent("cancel")
    client = sdk(frontend)
    created = await client.responses.create(**ENDLESS)
    record = record_of(frontend, created.id)
    await wait_until(lambda: len(record.events.parts) >= 3, "a few tokens")
    cancelled = await client.responses.cancel(created.id)
    assert cancelled.status == "cancelled"
    assert cancelled.error.code == "request_cancelled"
    await ended_once(frontend, created.id, "aborted")
    assert aborts_sent("cancel") == before + 1
    # Idempotent, and what GET and a replay say agree.
    assert (await client.responses.cancel(created.id)).status == "cancelled"
    assert (await client.responses.retrieve(created.id)).status == "cancelled"
    replay = [e async for e in await client.responses.retrieve(created.id, stream=True)]
    assert replay[-1].type == "response.failed"
    assert replay[-1].response.status == "cancelled"
    assert aborts_sent("cancel") == before + 1
    assert engine_ends(frontend, created.id) == ["aborted"]


async def test_a_finished_response_cannot_be_cancelled(frontend):
    client = sdk(frontend)
    created = await client.responses.create(input="x", background=True)
    [_ async for _ in await client.responses.retrieve(created.id, stream=True)]
    with pytest.raises(openai.ConflictError) as caught:
        await client.responses.cancel(created.id)
    assert caught.value.body["code"] == "response_already_finished"
    assert (await client.responses.retrieve(created.id)).status == "completed"


async def test_delete_cancels_a_running_response_and_forgets_it(frontend):
    client = sdk(frontend)
    created = await client.responses.create(**ENDLESS)
    async with frontend.client() as raw:
        deleted = await raw.delete(f"/v1/responses/{created.id}")
        assert deleted.json() == {"id": created.id, "object": "response", "deleted": True}
        gone = await raw.get(f"/v1/responses/{created.id}")
    assert gone.status_code == 404
    await ended_once(frontend, created.id, "aborted")
    assert frontend.app.services.responses.bytes == 0


async def test_retained_events_past_the_bound_fail_the_response_with_one_abort(
    nursery, engine, http_server
):
    before = aborts_sent("response_overflow")
    frontend = await start_frontend(nursery, engine, server=http_server, responses_max_events=12)
    client = sdk(frontend)
    created = await client.responses.create(**ENDLESS)
    events = [e async for e in await client.responses.retrieve(created.id, stream=True)]
    assert len(events) == 13  # the bound, and the response.failed that says why
    assert [e.sequence_number for e in events] == list(range(13))
    assert events[-1].type == "response.failed"
    error = events[-1].response.error
    assert error.code == "response_events_overflow" and "12 events" in error.message
    await ended_once(frontend, created.id, "aborted")
    assert aborts_sent("response_overflow") == before + 1
    assert (await client.responses.retrieve(created.id)).status == "failed"


async def test_a_full_store_fails_the_response_that_grows_with_one_abort(
    nursery, engine, http_server
):
    frontend = await start_frontend(
        nursery, engine, server=http_server, responses_store_bytes=16_000
    )
    client = sdk(frontend)
    created = await client.responses.create(**ENDLESS)
    events = [e async for e in await client.responses.retrieve(created.id, stream=True)]
    assert events[-1].type == "response.failed"
    assert events[-1].response.error.code == "response_store_full"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    await ended_once(frontend, created.id, "aborted")
    store = frontend.app.services.responses
    assert store.bytes <= 16_000 + 2_000  # the bound, plus the response.failed kept past it


async def test_a_finished_response_expires_after_the_ttl(nursery, engine, http_server):
    frontend = await start_frontend(nursery, engine, server=http_server, responses_ttl=60.0)
    now = [1000.0]
    store = frontend.app.services.responses
    store.clock = lambda: now[0]
    client = sdk(frontend)
    created = await client.responses.create(input="x", background=True)
    [_ async for _ in await client.responses.retrieve(created.id, stream=True)]
    foreground = await client.responses.create(input="y")
    assert record_of(frontend, created.id).finished_at == 1000.0
    now[0] += 59.0
    assert (await client.responses.retrieve(created.id)).status == "completed"
    assert (await client.responses.retrieve(foreground.id)).status == "completed"
    now[0] += 1.0
    for response_id in (created.id, foreground.id):
        with pytest.raises(openai.NotFoundError) as caught:
            await client.responses.retrieve(response_id)
        assert caught.value.body["code"] == "response_not_found"
    assert len(store) == 0 and store.bytes == 0


async def test_a_response_is_only_visible_to_the_key_that_created_it(nursery, engine, http_server):
    frontend = await start_frontend(
        nursery, engine, server=http_server, api_keys=["key-a", "key-b"]
    )
    owner, other = sdk(frontend, "key-a"), sdk(frontend, "key-b")
    created = await owner.responses.create(**ENDLESS)
    for call in (
        lambda: other.responses.retrieve(created.id),
        lambda: other.responses.cancel(created.id),
        lambda: other.responses.delete(created.id),
    ):
        with pytest.raises(openai.NotFoundError) as caught:
            await call()
        assert caught.value.body["code"] == "response_not_found"
    async with frontend.client() as raw:
        anonymous = await raw.get(f"/v1/responses/{created.id}")
        replay = await raw.get(
            f"/v1/responses/{created.id}",
            params={"stream": "true"},
            headers={"authorization": "Bearer key-b"},
        )
    assert anonymous.status_code == 401
    assert anonymous.json()["error"]["code"] == "invalid_api_key"
    assert replay.status_code == 404
    assert engine_ends(frontend, created.id) == []  # none of that touched it
    assert (await owner.responses.retrieve(created.id)).status == "in_progress"
    assert (await owner.responses.cancel(created.id)).status == "cancelled"
    await ended_once(frontend, created.id, "aborted")


async def test_past_the_background_bound_a_new_one_is_503(nursery, engine, http_server):
    frontend = await start_frontend(nursery, engine, server=http_server, max_background_responses=1)
    client = sdk(frontend)
    first = await client.responses.create(**ENDLESS)
    async with frontend.client() as raw:
        refused = await raw.post("/v1/responses", json=ENDLESS)
        foreground = await raw.post("/v1/responses", json={"input": "x"})
    assert refused.status_code == 503
    assert refused.json()["error"]["code"] == "too_many_background_responses"
    assert refused.headers["retry-after"] == "1"
    assert foreground.status_code == 200  # foreground requests are not bounded by it
    await client.responses.cancel(first.id)
    await ended_once(frontend, first.id, "aborted")
    second = await client.responses.create(input="x", background=True)
    assert second.status == "queued"


async def test_the_drain_waits_for_background_responses_then_its_deadline_ends_them(
    nursery, engine, http_server
):
    before = aborts_sent("drain")
    frontend = await start_frontend(
        nursery, engine, server=http_server, drain_delay=0.0, graceful_timeout=HANG_GUARD
    )
    created = await sdk(frontend).responses.create(
        **ENDLESS, extra_body={"mock_tokens_per_second": 50}
    )
    record = record_of(frontend, created.id)
    nursery.start_soon(frontend.drain.drain)
    await frontend.drain.stop_accepting.wait()
    # The listener is closed and no connection is left, but the response goes on...
    held = len(record.retained)
    await wait_until(lambda: len(record.retained) > held + 2, "the response to go on")
    assert not frontend.stopped.is_set() and not record.finished
    frontend.drain.begin()  # ...until the drain deadline (here: a second signal)
    with trio.fail_after(HANG_GUARD):
        await frontend.stopped.wait()
    assert record.events.status == "failed"
    assert record.events.error == {
        "code": "server_shutting_down",
        "message": "the server is shutting down",
        "type": "overloaded_error",
        "param": None,
    }
    assert record.retained[-1][0] == "response.failed"
    # The abort left before the engine link closed; the engine reads it when it can.
    await wait_until(lambda: frontend.ends(created.id), "the engine to see it end")
    assert frontend.ends(created.id) == ["aborted"]
    assert aborts_sent("drain") == before + 1


async def test_a_background_response_that_ends_within_the_grace_period_completes(
    nursery, engine, http_server
):
    frontend = await start_frontend(
        nursery, engine, server=http_server, drain_delay=0.0, graceful_timeout=HANG_GUARD
    )
    created = await sdk(frontend).responses.create(
        input="x", background=True, max_output_tokens=30, extra_body={"mock_tokens_per_second": 60}
    )
    record = record_of(frontend, created.id)
    nursery.start_soon(frontend.drain.drain)
    with trio.fail_after(HANG_GUARD):
        await frontend.stopped.wait()
    assert record.events.status == "incomplete"
    assert record.events.text == expected_text("x", 30)
    assert frontend.ends(created.id) == ["finished"]


async def test_an_engine_that_outruns_the_buffer_does_not_fail_a_background_response(
    nursery, engine, http_server
):
    # No client reads a background response: its outputs go to the store, so nobody can
    # be too slow. An engine step that brings many times --stream-buffer outputs at once
    # (the mock at full speed) must not end it as slow_client.
    before = aborts_sent("slow_client")
    frontend = await start_frontend(nursery, engine, server=http_server, stream_buffer=4)
    client = sdk(frontend)
    body = {"input": "fast", "background": True, "max_output_tokens": 3000}
    created = await client.responses.create(**body, extra_body={"mock_tokens_per_second": 0})
    events = [e async for e in await client.responses.retrieve(created.id, stream=True)]
    assert events[-1].type == "response.incomplete"  # the whole max_output_tokens
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == expected_text("fast", 3000)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    await ended_once(frontend, created.id, "finished")
    assert aborts_sent("slow_client") == before
