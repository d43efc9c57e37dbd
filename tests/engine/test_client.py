"""The engine client against the real mock engine over real ZeroMQ on loopback."""

from __future__ import annotations

import contextlib
import fcntl
import struct
import termios
import time
from collections.abc import AsyncIterator
from typing import Any

import msgpack
import pytest
import trio

from tests.helpers.fake_engine import FakeEngine, receive_a, welcome
from tests.helpers.frontends import start_engine
from tests.helpers.waiting import HANG_GUARD, wait_until
from trioserve import metrics
from trioserve.ends import EndReason
from trioserve.engine.subscription import DEFAULT_BUFFER, Subscription
from trioserve.engine_programs.mock import expected_text
from trioserve.errors import EngineFailedError, EngineLostError, SlowClientError
from trioserve.links import protocol as connection
from trioserve.links.protocol import HeartbeatConfig
from trioserve.links.protocol_client import open_protocol_client
from trioserve.protocol import (
    PROTOCOL_VERSION,
    Abort,
    Hello,
    OutputItem,
    Outputs,
    Ping,
    Pong,
    Reject,
    Submit,
    encode,
)


@contextlib.asynccontextmanager
async def subscribed(sub: Subscription) -> AsyncIterator[Subscription]:
    """Abort ``sub`` when the block exits, as a request's owner does (unless it ended)."""
    try:
        yield sub
    finally:
        sub.abort(EndReason.DISCONNECT)


def completion(request_id: str, prompt: str = "hello", **params: object) -> Submit:
    return Submit(request_id, "mock", "completion", {"prompt": prompt}, dict(params))


async def collect(sub) -> list[OutputItem]:
    items = []
    while batch := await sub.receive_batch():
        items += batch
    return items


async def test_streams_exactly_max_tokens_in_order_then_finishes(nursery):
    engine = await start_engine(nursery)
    async with open_protocol_client([engine.address]) as client:
        await client.wait_ready()
        sub = client.submit(completion("r1", max_tokens=7), "completion")
        async with subscribed(sub):
            items = await collect(sub)
        assert [i.seq for i in items] == list(range(7))
        assert "".join(i.data for i in items) == expected_text("hello", 7)
        assert items[-1].finish_reason == "length" and items[-1].usage.completion_tokens == 7
        assert sub.state == "finished"
    assert engine.stats.aborts_received == 0


async def test_leaving_the_context_early_sends_exactly_one_abort(nursery):
    engine = await start_engine(nursery)
    async with open_protocol_client([engine.address]) as client:
        await client.wait_ready()
        frontend = client.links[0].frontend_id.encode()
        async with subscribed(
            client.submit(completion("r1", max_tokens=10_000), "completion")
        ) as sub:
            await sub.receive_batch()
        assert sub.state == "aborted"
        assert sub.abort(EndReason.CANCEL) is False  # idempotent
        await wait_until(lambda: engine.core.ends.get((frontend, "r1")), "the abort")
        assert engine.core.ends[(frontend, "r1")] == ["aborted"]
        assert engine.stats.aborts_received == 1 and not engine.core.running


async def test_aborts_of_one_scheduling_round_leave_in_one_frame(nursery):
    engine = await start_engine(nursery)
    async with open_protocol_client([engine.address]) as client:
        await client.wait_ready()
        subs = [
            client.submit(completion(f"r{i}", max_tokens=10_000), "completion") for i in range(20)
        ]
        await wait_until(lambda: len(engine.core.running) == 20, "20 running requests")
        frames_before = engine.core.stats.aborts_received
        for sub in subs:
            sub.abort(EndReason.DISCONNECT)
        await wait_until(lambda: not engine.core.running, "all aborted")
        assert engine.core.stats.aborts_received - frames_before == 20
        assert engine.core.stats.unknown_aborts == 0


async def test_a_slow_subscriber_never_blocks_the_others(nursery):
    engine = await start_engine(nursery, tokens_per_second=2000)
    async with open_protocol_client([engine.address]) as client:
        await client.wait_ready()
        frontend = client.links[0].frontend_id.encode()
        failures = []
        slow = client.submit(
            completion("slow", max_tokens=500), "completion", buffer=4, on_failure=failures.append
        )
        async with subscribed(
            client.submit(completion("fast", max_tokens=200), "completion")
        ) as fast:
            items = await collect(fast)  # never reads `slow`
        assert len(items) == 200
        await wait_until(lambda: slow.done, "the slow subscriber to be ended")
        assert isinstance(slow.error, SlowClientError) and len(failures) == 1
        with pytest.raises(SlowClientError):
            await slow.receive_batch()
        await wait_until(lambda: engine.core.ends.get((frontend, "slow")), "the abort")
        assert engine.core.ends[(frontend, "slow")] == ["aborted"]


async def test_engine_error_item_ends_the_request_without_an_abort(nursery):
    engine = await start_engine(nursery)
    async with open_protocol_client([engine.address]) as client:
        await client.wait_ready()
        sub = client.submit(
            completion("e1", mock_error_after=2, mock_error_status=429), "completion"
        )
        async with subscribed(sub):
            items = await collect(sub)
        assert [i.data is not None for i in items] == [True, True, False]
        assert items[-1].error.status == 429
        assert engine.stats.aborts_received == 0


async def test_a_sink_takes_what_it_returns_nothing_of_and_errors_never_reach_it(nursery):
    # The sink runs in the socket owner while the consumer is parked: given what came for
    # the request, it returns what is left for the consumer. A final item comes back
    # (maybe without its data) and still ends the subscription; an error item always
    # goes the consumer's way.
    engine = await start_engine(nursery, tokens_per_second=200)
    async with open_protocol_client([engine.address]) as client:
        await client.wait_ready()
        seen: list[OutputItem] = []

        def sink(items: list[OutputItem]) -> list[OutputItem]:
            seen.extend(items)
            return [
                OutputItem(i.request_id, i.seq, finish_reason=i.finish_reason)
                for i in items
                if i.finish_reason is not None
            ]

        sub = client.submit(completion("s1", max_tokens=3), "completion")
        async with subscribed(sub):
            sub.sink = sink
            items = await collect(sub)
        assert [i.seq for i in seen] == [0, 1, 2] and seen[-1].data  # the last had text
        assert [(i.seq, i.data, i.finish_reason) for i in items] == [(2, None, "length")]
        assert sub.state == "finished"

        failing = client.submit(completion("s2", mock_error_after=0), "completion")
        async with subscribed(failing):
            failing.sink = lambda items: seen.extend(items) or items
            items = await collect(failing)
        assert len(seen) == 3  # not called
        assert [i.error.status for i in items] == [500]
        assert engine.stats.aborts_received == 0


def unread_bytes(client) -> int:
    """What the kernel holds, unread, on the client's socket to its (only) engine."""
    sock = client.links[0]._pump._sock
    return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0" * 4))[0]


@contextlib.asynccontextmanager
async def parked_sinks(*request_ids: str) -> AsyncIterator[tuple[FakeEngine, bytes, Any, list]]:
    """A client welcomed by a hand-driven engine, with ``request_ids`` submitted, each
    with its consumer parked and a sink that takes everything and records each call (a
    list of ``(request_id, seq)``). Yields the engine, the client's identity there, the
    client and the calls."""
    fake = FakeEngine()
    try:
        async with open_protocol_client([fake.address]) as client, trio.open_nursery() as inner:
            ident, _ = await fake.receive()
            fake.send(ident, welcome())
            await client.wait_ready()
            calls: list[list[tuple[str, int]]] = []

            def sink(items: list[OutputItem]) -> list[OutputItem]:
                calls.append([(i.request_id, i.seq) for i in items])
                return []

            subs = [client.submit(completion(rid), "completion") for rid in request_ids]
            for sub in subs:
                sub.sink = sink
                inner.start_soon(sub.receive_batch)  # parked: the sink's condition
            await wait_until(lambda: all(s._waiter for s in subs), "parked consumers")
            yield fake, ident, client, calls
            for sub in subs:
                sub.abort(EndReason.CANCEL)
            inner.cancel_scope.cancel()
    finally:
        fake.close()


async def test_steps_that_piled_up_unread_reach_each_sink_in_one_call():
    # A frontend that fell behind finds several engine steps waiting: it reads them in
    # one pass, and what came for each request among them goes to its sink in one call
    # (one write to that client), in order. A step read alone goes alone, at once.
    async with parked_sinks("a", "b") as (fake, ident, client, calls):

        def step(seq: int) -> bytes:
            return encode(Outputs([OutputItem(r, seq, data=f"{r}{seq}") for r in "ab"]))

        fake.send(ident, step(0))
        await wait_until(lambda: len(calls) == 2, "the first step")
        assert calls == [[("a", 0)], [("b", 0)]]
        # Three more steps while the frontend's loop does not run (no checkpoint here):
        # they pile up in its socket.
        frames = [step(seq) for seq in (1, 2, 3)]
        for frame in frames:
            fake.send(ident, frame)
        expected = sum(len(frame) + 2 for frame in frames)  # ZMTP: 2-byte short frames
        deadline = time.monotonic() + 10
        while unread_bytes(client) < expected and time.monotonic() < deadline:
            time.sleep(0.001)  # noqa: ASYNC251 (the loop must not run meanwhile)
        assert unread_bytes(client) == expected
        await wait_until(lambda: len(calls) == 4, "the piled-up steps")
        assert calls[2:] == [[("a", 1), ("a", 2), ("a", 3)], [("b", 1), ("b", 2), ("b", 3)]]


async def test_what_a_pass_holds_for_a_sink_stays_within_the_bound():
    # One engine frame with more outputs for one request than its subscription's bound:
    # the held items go to the sink each time they reach the bound, in order.
    async with parked_sinks("a") as (fake, ident, _, calls):
        total = DEFAULT_BUFFER + 44
        fake.send(ident, encode(Outputs([OutputItem("a", n, data="x") for n in range(total)])))
        await wait_until(lambda: sum(map(len, calls)) == total, "every output")
        assert [len(c) for c in calls] == [DEFAULT_BUFFER, 44]
        assert [seq for c in calls for _, seq in c] == list(range(total))


async def test_a_backlog_read_in_one_pass_does_not_end_a_waiting_consumer():
    # A frontend whose process was not scheduled for a while (a busy machine: vLLM's
    # processes on the same cores kept it off the CPU for seconds) finds many engine
    # steps waiting and handles them in one pass, before any consumer has had a turn.
    # A consumer that was waiting for outputs is not behind: it gets everything, and its
    # request is not ended as a slow client (nor aborted at the engine). One that was not
    # waiting for outputs still is, at its bound.
    fake = FakeEngine()
    try:
        async with open_protocol_client([fake.address]) as client, trio.open_nursery() as inner:
            ident, _ = await receive_a(fake, Hello)
            fake.send(ident, welcome())
            await client.wait_ready()
            waiting = client.submit(completion("waiting"), "completion")
            busy = client.submit(completion("busy"), "completion")
            received: list[OutputItem] = []

            async def consume() -> None:
                received.extend(await collect(waiting))

            inner.start_soon(consume)
            await wait_until(lambda: waiting._waiter is not None, "a waiting consumer")
            total = DEFAULT_BUFFER + 44
            fake.send(
                ident,
                encode(
                    Outputs(
                        [
                            OutputItem(
                                rid, n, data="x", finish_reason="length" if n + 1 == total else None
                            )
                            for n in range(total)
                            for rid in ("waiting", "busy")
                        ]
                    )
                ),
            )
            await wait_until(lambda: waiting.done and busy.done, "both requests to end")
            assert busy.state == "aborted" and isinstance(busy.error, SlowClientError)
            assert waiting.state == "finished" and waiting.error is None
            await wait_until(lambda: len(received) == total, "every output")
            assert [i.seq for i in received] == list(range(total))
            _, abort = await receive_a(fake, Abort)
            assert abort.request_ids == ["busy"]
    finally:
        fake.close()


async def test_two_engines_share_the_load_and_models_are_merged(nursery):
    first = await start_engine(nursery, model="m1")
    second = await start_engine(nursery, model="m2")
    async with open_protocol_client([first.address, second.address]) as client:
        await client.wait_ready()
        assert {m.id for m in client.models()} == {"m1", "m2"}
        sub = client.submit(Submit("x", "m2", "completion", {"prompt": "p"}), "completion")
        async with subscribed(sub):
            await collect(sub)
        assert second.stats.finished == 1 and first.stats.submitted == 0


@pytest.fixture
def quick_retry(monkeypatch):
    """A failed engine is tried again after 50 ms (the backoff's start), not a second."""
    monkeypatch.setattr(connection, "FAIL_BACKOFF", 0.05)


@pytest.mark.parametrize("answer", ["reject", "welcome"])
async def test_an_engine_that_refuses_our_version_fails_alone_and_is_tried_again(
    nursery, quick_retry, caplog, answer
):
    # A reject, or a welcome of another version: that engine is out of service (one log
    # line), the frontend does not stop, the other engine serves, and after the backoff
    # the failed one is said hello to again; a proper welcome brings it back.
    engine = await start_engine(nursery)
    fake = FakeEngine()
    try:
        async with open_protocol_client([engine.address, fake.address]) as client:
            ident, _ = await receive_a(fake, Hello)
            if answer == "reject":
                fake.send(ident, encode(Reject(PROTOCOL_VERSION + 1, "speaks 2 only")))
            else:
                fake.send(ident, welcome(version=PROTOCOL_VERSION + 1))
            with trio.fail_after(HANG_GUARD):
                await client.wait_ready()  # returns: a failed engine has settled
            (why,) = client.failures().values()
            assert f"version {PROTOCOL_VERSION + 1}" in why
            assert client.ready and not client.links[1].ready
            async with subscribed(
                client.submit(completion("r1", max_tokens=3), "completion")
            ) as sub:
                assert len(await collect(sub)) == 3
            ident, _ = await receive_a(fake, Hello)  # tried again
            fake.send(ident, welcome(model="fake"))
            await wait_until(lambda: client.links[1].ready, "the engine back")
            assert client.failures() == {} and client.serves_model("fake")
        failed = [r for r in caplog.records if "failed:" in r.getMessage()]
        assert len(failed) == 1 and failed[0].levelname == "ERROR"
    finally:
        fake.close()


async def test_a_version_change_while_serving_fails_its_requests_once_each(quick_retry):
    fake = FakeEngine()
    try:
        async with open_protocol_client([fake.address]) as client:
            ident, _ = await receive_a(fake, Hello)
            fake.send(ident, welcome())
            await client.wait_ready()
            failures: list[Exception] = []
            subs = [
                client.submit(completion(f"r{i}"), "completion", on_failure=failures.append)
                for i in range(3)
            ]
            for _ in subs:
                await receive_a(fake, Submit)
            fake.send(ident, welcome(version=PROTOCOL_VERSION + 1))
            for sub in subs:
                with pytest.raises(EngineFailedError, match="speaks protocol version"):
                    await sub.receive_batch()
            assert [s.state for s in subs] == ["lost"] * 3 and len(failures) == 3
            assert not client.ready
            _, abort = await receive_a(fake, Abort)
            assert sorted(abort.request_ids) == ["r0", "r1", "r2"]
            for sub in subs:
                assert sub.abort(EndReason.CANCEL) is False  # ended once
            # Retried: a hello (never a second abort) comes next.
            _, message = await fake.receive()
            while not isinstance(message, Hello):
                assert not isinstance(message, Abort)
                _, message = await fake.receive()
    finally:
        fake.close()


async def test_a_frame_over_the_bound_fails_that_engine_not_the_frontend(nursery, quick_retry):
    engine = await start_engine(nursery)
    fake = FakeEngine()
    try:
        async with open_protocol_client([engine.address, fake.address], max_message=1000) as client:
            ident, _ = await receive_a(fake, Hello)
            fake.send(ident, welcome(model="fake"))
            await client.wait_ready()
            sub = client.submit(Submit("big", "fake", "completion", {"prompt": "p"}), "completion")
            await receive_a(fake, Submit)
            fake.send(ident, b"z" * 1001)
            with pytest.raises(EngineFailedError, match="larger than 1000 bytes"):
                await sub.receive_batch()
            assert "larger than 1000 bytes" in client.failures()[fake.address]
            assert client.ready and not client.serves_model("fake")
            async with subscribed(
                client.submit(completion("ok", max_tokens=2), "completion")
            ) as other:
                assert len(await collect(other)) == 2
            # The link comes back after the backoff; the abort of "big" leaves on it.
            _, abort = await receive_a(fake, Abort)
            assert abort.request_ids == ["big"]
    finally:
        fake.close()


@pytest.mark.parametrize(
    "bad",
    [
        (-(2**63), 0, None),
        (2**64 - 1, 0, None),
        (2**31, 0, None),
        (0, 2**31, None),
        (3, 0, -0.1),
        (3, 0, 1.5),
        (3, 0, float("nan")),
    ],
)
async def test_impossible_pong_figures_are_ignored_with_one_warning(caplog, bad):
    fake = FakeEngine()
    try:
        heartbeat = HeartbeatConfig(interval=0.02, timeout=5.0)
        async with open_protocol_client([fake.address], heartbeat=heartbeat) as client:
            ident, _ = await receive_a(fake, Hello)
            fake.send(ident, welcome())
            await client.wait_ready()
            conn = client.links[0]
            gauge = metrics.ENGINE_RUNNING.labels(engine=fake.address)
            for figures in [(3, 1, 0.25), bad, bad]:
                _, ping = await receive_a(fake, Ping)
                fake.send(ident, encode(Pong(ping.seq, "s1", *figures)))
            await receive_a(fake, Ping)  # the last pong has been read by now
            await wait_until(lambda: conn._bad_figures, "the last pong")
            assert (conn.running, conn.queued, conn.kv_cache_usage) == (3, 1, 0.25)
            assert gauge._value.get() == 3
            assert client.ready
        assert caplog.text.count("ignoring pong figures") == 1
    finally:
        fake.close()


async def test_malformed_frames_from_an_engine_are_dropped_and_serving_goes_on():
    fake = FakeEngine()
    try:
        async with open_protocol_client([fake.address]) as client:
            ident, _ = await fake.receive()
            fake.send(ident, welcome())
            await client.wait_ready()
            sub = client.submit(completion("r1"), "completion")
            for junk in [b"\xc1", msgpack.packb(["nope", {}]), msgpack.packb(["pong", {}])]:
                fake.send(ident, junk)
            fake.send(
                ident, encode(Outputs([OutputItem("r1", 0, data="ok", finish_reason="stop")]))
            )
            async with subscribed(sub):
                items = await collect(sub)
            assert [i.data for i in items] == ["ok"]
    finally:
        fake.close()


async def test_a_silent_engine_is_declared_lost_and_its_requests_fail():
    fake = FakeEngine()
    try:
        heartbeat = HeartbeatConfig(interval=0.05, timeout=0.3)
        async with open_protocol_client([fake.address], heartbeat=heartbeat) as client:
            ident, _ = await fake.receive()
            fake.send(ident, welcome())
            await client.wait_ready()
            failures = []
            sub = client.submit(completion("r1"), "completion", on_failure=failures.append)
            # The fake never answers pings: the heartbeat must give up on it.
            with pytest.raises(EngineLostError):
                await sub.receive_batch()
            assert not client.ready and len(failures) == 1 and sub.state == "lost"
            # ...and the client says hello again; a welcome brings it back.
            while True:
                ident, message = await fake.receive()
                if isinstance(message, Hello):
                    break
            fake.send(ident, welcome(session="s2"))
            await client.wait_ready()
            assert client.ready
    finally:
        fake.close()


async def answer_a_ping(fake: FakeEngine, ident: bytes, conn, *figures: object) -> None:
    """Answer the next ping with a pong carrying ``figures`` (running, queued, kv) and wait
    until the frontend has read them."""
    _, ping = await receive_a(fake, Ping)
    fake.send(ident, encode(Pong(ping.seq, "s1", *figures)))  # type: ignore[arg-type]
    await wait_until(lambda: (conn.running, conn.queued) == figures[:2], "the pong read")


async def test_routing_follows_the_engines_own_load_and_kv_cache(nursery):
    """Several frontends share engines: each engine's own figures (every frontend's
    requests), not this frontend's in-flight count alone, decide where a request goes;
    the KV cache breaks ties. Figures reach /metrics."""
    fakes = [FakeEngine(), FakeEngine()]
    try:
        heartbeat = HeartbeatConfig(interval=0.02, timeout=5.0)
        addresses = [fake.address for fake in fakes]
        async with open_protocol_client(addresses, heartbeat=heartbeat) as client:
            idents = []
            for fake in fakes:
                ident, _ = await receive_a(fake, Hello)
                fake.send(ident, welcome())
                idents.append(ident)
            await client.wait_ready()
            a, b = client.links

            def routed_to(request_id: str) -> int:
                client.submit(completion(request_id), "completion")
                return [request_id in conn._subs for conn in (a, b)].index(True)

            await answer_a_ping(fakes[0], idents[0], a, 5, 2, 0.5)
            await answer_a_ping(fakes[1], idents[1], b, 1, 0, 0.1)
            assert routed_to("r1") == 1  # B: 1 + the one this frontend just sent
            assert b.load == 2 and a.load == 7
            await answer_a_ping(fakes[1], idents[1], b, 9, 0, 0.1)
            assert routed_to("r2") == 0
            # Equal load: the emptier KV cache wins.
            await answer_a_ping(fakes[0], idents[0], a, 4, 0, 0.8)
            await answer_a_ping(fakes[1], idents[1], b, 4, 0, 0.2)
            assert routed_to("r3") == 1
            kv = metrics.ENGINE_KV_CACHE_USAGE.labels(engine=fakes[0].address)
            assert kv._value.get() == 0.8
    finally:
        for fake in fakes:
            fake.close()
