"""The response store (http/responses_store.py) in-process, on trio's mock clock: the TTL,
the byte bound, the event bound, owners, and the tasks it owns."""

from __future__ import annotations

import json

import pytest
import trio

from tests.helpers.responses import ECHO
from trioserve.http.errors import HTTPError, WriterRefused
from trioserve.http.lifecycle import RequestHandle
from trioserve.http.responses_store import (
    RECORD_OVERHEAD,
    SWEEP_INTERVAL,
    RecordWriter,
    ResponseStore,
    StoredResponse,
    echo_bytes,
    events_bytes,
    held_bytes,
    parts_bytes,
)
from trioserve.http.writers.response_events import ResponseEvents
from trioserve.protocol import OutputItem, Usage

TTL = 60.0


def make_store(**bounds) -> ResponseStore:
    options = {"ttl": TTL, "max_events": 100, "max_background": 2, "max_bytes": 2**20}
    return ResponseStore(**{**options, **bounds})


def finished(response_id: str, text: str = " a") -> ResponseEvents:
    events = ResponseEvents(response_id, "mock", ECHO)
    events.add_text(text)
    events.complete("stop", Usage(1, 1))
    return events


#: What the store counts for a response of ECHO with no conversation, before its text.
BASE = RECORD_OVERHEAD + echo_bytes(ECHO) + echo_bytes([])


def kept_size(text: str) -> int:
    """What the store counts for a finished foreground response of ``text``."""
    return BASE + parts_bytes([text])


def background(response_id: str, owner: int | None = None) -> StoredResponse:
    events = ResponseEvents(response_id, "mock", ECHO, background=True)
    return StoredResponse(events, owner, RequestHandle(response_id, owner=owner))


async def test_a_finished_response_expires_ttl_seconds_after_it_finished(autojump_clock):
    store = make_store()
    store.keep(finished("resp_1"), None)
    await trio.sleep(TTL - 1)
    assert store.get("resp_1", None) is not None
    await trio.sleep(1)
    assert store.get("resp_1", None) is None
    assert len(store) == 0 and store.bytes == 0


async def test_the_sweep_frees_expired_responses_that_nobody_asks_for(nursery, autojump_clock):
    store = make_store()
    await nursery.start(store.serve)
    store.keep(finished("resp_1"), None)
    assert store.bytes == kept_size(" a")
    await trio.sleep(TTL + SWEEP_INTERVAL)
    assert len(store) == 0 and store.bytes == 0


async def test_finished_responses_are_dropped_oldest_first_to_stay_under_the_bytes(
    autojump_clock,
):
    store = make_store(max_bytes=3 * kept_size("x" * 100))
    for n in range(5):
        store.keep(finished(f"resp_{n}", "x" * 100), None)
        await trio.sleep(1)
    assert [r for r in ("resp_0", "resp_1") if store.get(r, None)] == []
    assert all(store.get(f"resp_{n}", None) for n in (2, 3, 4))
    assert store.bytes == 3 * kept_size("x" * 100)


async def test_a_response_is_none_to_another_owner():
    store = make_store()
    store.keep(finished("resp_1"), 0)
    assert store.get("resp_1", 1) is None and store.get("resp_1", None) is None
    assert store.get("resp_1", 0) is not None


async def test_background_runs_are_bounded_and_owned_by_the_store(nursery):
    store = make_store(max_background=1)
    with pytest.raises(HTTPError) as caught:
        store.start_background(background("resp_0"), trio.sleep_forever)
    assert caught.value.code == "background_unavailable"
    await nursery.start(store.serve)
    release = trio.Event()
    first = background("resp_1")
    store.start_background(first, release.wait)
    assert [name for name, _ in first.retained] == ["response.created"]
    with pytest.raises(HTTPError) as caught:
        store.start_background(background("resp_2"), trio.sleep_forever)
    assert (caught.value.status, caught.value.code) == (503, "too_many_background_responses")
    assert "resp_2" not in store._records
    release.set()
    with trio.fail_after(5):
        await store.wait_idle()
    assert store.running == 0


async def test_stopping_the_store_fails_what_still_runs():
    store = make_store()
    record = background("resp_1")
    async with trio.open_nursery() as nursery:
        await nursery.start(store.serve)
        store.start_background(record, trio.sleep_forever)
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    assert record.finished and record.events.status == "failed"
    assert record.events.error["code"] == "server_shutting_down"
    assert record.retained[-1][0] == "response.failed"


async def test_a_fault_in_one_background_run_ends_only_that_response(nursery):
    store = make_store()
    await nursery.start(store.serve)

    async def broken() -> None:
        raise RuntimeError("a bug")

    record = background("resp_1")
    store.start_background(record, broken)
    with trio.fail_after(5):
        await record.done.wait()
    assert record.events.error["code"] == "internal_error"
    after = background("resp_2")
    store.start_background(after, trio.sleep_forever)  # the store still serves
    assert store.running == 1


def item(seq: int, data: str | None = None, **fields) -> OutputItem:
    return OutputItem("resp_1", seq, data=data, **fields)


async def test_a_batch_past_the_event_bound_is_refused_whole_and_the_failure_kept(nursery):
    store = make_store(max_events=6)
    await nursery.start(store.serve)
    record = background("resp_1")
    store.start_background(record, trio.sleep_forever)
    writer = RecordWriter(store, record)
    assert not await writer.write([item(0, " a")])  # created + 4 opening events: 5
    with pytest.raises(WriterRefused) as caught:
        await writer.write([item(1, " b"), item(2, finish_reason="stop", usage=Usage(1, 2))])
    assert caught.value.error.code == "response_events_overflow"
    assert caught.value.reason == "response_overflow"
    assert len(record.retained) == 5 and record.events.text == " a"
    await writer.fail(caught.value.error)
    numbers = [json.loads(data)["sequence_number"] for _, data in record.retained]
    assert numbers == list(range(6))
    assert record.retained[-1][0] == "response.failed" and record.finished
    assert (
        store.bytes == record.size == (BASE + parts_bytes([" a"]) + events_bytes(record.retained))
    )


async def test_a_follower_wakes_for_each_append_and_at_the_end(nursery):
    store = make_store()
    await nursery.start(store.serve)
    record = background("resp_1")
    store.start_background(record, trio.sleep_forever)
    writer = RecordWriter(store, record)
    woken = []

    async def follow() -> None:
        seen = len(record.retained)
        while not record.finished:
            await record.wait_beyond(seen)
            seen = len(record.retained)
            woken.append(seen)

    nursery.start_soon(follow)
    await trio.testing.wait_all_tasks_blocked()
    await writer.write([item(0, " a")])
    await trio.testing.wait_all_tasks_blocked()
    await writer.write([item(1, finish_reason="stop", usage=Usage(1, 1))])
    await trio.testing.wait_all_tasks_blocked()
    assert woken == [5, 9] and len(record.retained) == 9
    assert record.events.status == "completed"


async def test_delete_cancels_a_running_response_and_frees_its_bytes():
    store = make_store()
    record = background("resp_1")
    store._add(record)
    store.delete(record)
    assert record.handle.end_reason == "cancel"
    assert store.get("resp_1", None) is None and store.bytes == 0


async def test_the_sink_retains_plain_deltas_and_leaves_the_end_to_write(nursery):
    store = make_store()
    await nursery.start(store.serve)
    record = background("resp_1")
    store.start_background(record, trio.sleep_forever)
    writer = RecordWriter(store, record)
    sink = writer.sink()
    assert sink is not None
    finish = item(2, finish_reason="stop", usage=Usage(1, 2))
    # The deltas of one read pass: one delta event (after the opening events); the
    # finish is left for write().
    assert sink([item(0, " a"), item(1, " b"), finish]) == [finish]
    kinds = [kind for kind, _ in record.retained]
    assert kinds[-1] == "response.output_text.delta" and len(kinds) == 5
    assert json.loads(record.retained[-1][1])["delta"] == " a b"
    assert record.events.parts == [" a b"]  # one part per pass of the sink
    assert (
        store.bytes == record.size == (BASE + parts_bytes([" a b"]) + events_bytes(record.retained))
    )
    assert not record.finished
    assert await writer.write([finish])
    assert record.finished and record.events.text == " a b"
    assert [kind for kind, _ in record.retained][-1] == "response.completed"


async def test_deltas_past_a_bound_are_left_by_the_sink_for_write_to_refuse(nursery):
    store = make_store(max_events=5)
    await nursery.start(store.serve)
    record = background("resp_1")
    store.start_background(record, trio.sleep_forever)
    writer = RecordWriter(store, record)
    sink = writer.sink()
    assert sink is not None
    assert sink([item(0, " a")]) == []  # created + 4 opening events: 5
    held = [item(1, " b"), item(2, " c")]
    assert sink(held) == held  # one delta event more passes 5: nothing retained or taken
    assert len(record.retained) == 5 and record.events.text == " a"
    with pytest.raises(WriterRefused) as caught:
        await writer.write(held)
    assert caught.value.error.code == "response_events_overflow"


# -- what a record counts ---------------------------------------------------------------


def test_a_record_counts_its_echoed_fields_as_python_holds_them():
    long = {**ECHO, "instructions": "x" * 100_000}
    astral = {**ECHO, "instructions": "x" * 100_000 + "\U0001f600"}  # 4 bytes a character
    sizes = [StoredResponse(ResponseEvents("r", "mock", echo), None).size for echo in (long,)]
    assert sizes[0] >= RECORD_OVERHEAD + 100_000
    assert StoredResponse(ResponseEvents("r", "mock", astral), None).size >= (
        RECORD_OVERHEAD + 400_000
    )


def test_held_bytes_measures_any_depth_without_recursion():
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    assert held_bytes(deep) >= 100_000 * 56


async def test_a_kept_response_holds_its_text_as_one_part():
    events = ResponseEvents("resp_1", "mock", ECHO)
    for _ in range(1000):
        events.add_text(" a")
    events.complete("stop", Usage(1, 1000))
    store = make_store()
    store.keep(events, None)
    assert events.parts == [" a" * 1000]
    assert store.bytes == kept_size(" a" * 1000)


# -- tenants: each key its own share ------------------------------------------------------


async def test_a_key_over_its_share_drops_its_own_oldest_never_another_keys(autojump_clock):
    size = kept_size("x" * 100)
    store = make_store(max_bytes=8 * size, tenants=2)  # a share: 4 responses
    for n in range(3):
        store.keep(finished(f"resp_b{n}", "x" * 100), 1)
        await trio.sleep(1)
    for n in range(20):  # key 0 keeps making responses
        store.keep(finished(f"resp_a{n}", "x" * 100), 0)
        await trio.sleep(1)
    assert all(store.get(f"resp_b{n}", 1) for n in range(3))
    assert [n for n in range(20) if store.get(f"resp_a{n}", 0)] == [16, 17, 18, 19]
    assert store.held_by(0) == 4 * size and store.held_by(1) == 3 * size


async def test_a_full_share_refuses_that_keys_background_responses_only(nursery):
    store = make_store(max_bytes=2 * (RECORD_OVERHEAD + 20_000), tenants=2, max_background=10)
    await nursery.start(store.serve)
    store.start_background(background("resp_a0", owner=0), trio.sleep_forever)
    # Running responses cannot be dropped: key 0's share fills and it is refused.
    with pytest.raises(HTTPError) as caught:
        for n in range(1, 10):
            store.start_background(background(f"resp_a{n}", owner=0), trio.sleep_forever)
    assert (caught.value.status, caught.value.code) == (503, "response_store_full")
    assert "this API key's share" in caught.value.message
    store.start_background(background("resp_b0", owner=1), trio.sleep_forever)
    assert store.get("resp_b0", 1) is not None


async def test_a_running_response_that_outgrows_its_keys_share_fails(nursery):
    store = make_store(max_bytes=2 * (RECORD_OVERHEAD + 8_000), tenants=2)
    await nursery.start(store.serve)
    record = background("resp_a", owner=0)
    store.start_background(record, trio.sleep_forever)
    other = background("resp_b", owner=1)
    store.start_background(other, trio.sleep_forever)
    writer = RecordWriter(store, record)
    with pytest.raises(WriterRefused) as caught:
        for n in range(1000):
            await writer.write([item(n, "y" * 100)])
    assert caught.value.error.code == "response_store_full"
    assert store.held_by(0) <= store.quota and store.get("resp_b", 1) is other


async def test_an_overcommitted_quota_yields_to_a_key_under_its_fair_share(autojump_clock):
    size = kept_size("x" * 100)
    # Each key may hold 6 of the 8, but key 1 is owed its fair share of 4.
    store = make_store(max_bytes=8 * size, tenants=2, quota=6 * size)
    for n in range(6):
        store.keep(finished(f"resp_a{n}", "x" * 100), 0)
        await trio.sleep(1)
    for n in range(4):
        store.keep(finished(f"resp_b{n}", "x" * 100), 1)
        await trio.sleep(1)
    assert all(store.get(f"resp_b{n}", 1) for n in range(4))
    assert [n for n in range(6) if store.get(f"resp_a{n}", 0)] == [2, 3, 4, 5]
    assert store.bytes <= store.max_bytes
