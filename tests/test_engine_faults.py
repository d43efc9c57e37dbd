"""Engines and frontends that die or hang, as real processes."""

from __future__ import annotations

import json
import signal

import httpx
import pytest
import trio

from tests.conftest import HANG_GUARD, start_engine, start_frontend, wait_until
from tests.processes import free_port, start_engine_process, start_frontend_process
from trioserve import metrics

pytestmark = pytest.mark.integration

LONG = {"messages": [{"role": "user", "content": "go on"}], "max_tokens": 100_000}


async def wait_health(client: httpx.AsyncClient, status: int) -> None:
    with trio.fail_after(HANG_GUARD):
        while (await client.get("/health")).status_code != status:
            await trio.sleep(0.02)


async def test_engine_killed_mid_request_fails_it_with_503_then_serving_resumes(nursery):
    port = free_port()
    engine = await start_engine_process(nursery, port)
    frontend = await start_frontend(
        nursery,
        None,
        engines=[f"tcp://127.0.0.1:{port}"],
        heartbeat_interval=0.05,
        heartbeat_timeout=0.4,
    )
    before = metrics.REGISTRY.get_sample_value(
        "trioserve_engine_aborts_total", {"reason": "engine_lost"}
    )
    results = {}
    async with frontend.client() as client:

        async def stream_it() -> None:
            results["stream"] = await client.post(
                "/v1/chat/completions", json={**LONG, "stream": True}
            )

        async def wait_it() -> None:
            results["json"] = await client.post("/v1/chat/completions", json=LONG)

        async with trio.open_nursery() as requests:
            requests.start_soon(stream_it)
            requests.start_soon(wait_it)
            await wait_until(
                lambda: len(frontend.app.services.registry) == 2, "two requests in flight"
            )
            await trio.sleep(0.1)  # let the stream emit some tokens
            await engine.stop()  # SIGKILL
        assert results["json"].status_code == 503
        assert results["json"].json()["error"]["code"] == "engine_lost"
        events = [e for e in results["stream"].text.split("\n\n") if e]
        assert "data: [DONE]" not in events
        assert json.loads(events[-1].removeprefix("data: "))["error"]["code"] == "engine_lost"
        assert (await client.get("/health")).status_code == 503
        after = metrics.REGISTRY.get_sample_value(
            "trioserve_engine_aborts_total", {"reason": "engine_lost"}
        )
        assert after == before + 2
        # The engine comes back on the same address: the frontend reconnects by itself.
        await start_engine_process(nursery, port)
        await wait_health(client, 200)
        response = await client.post("/v1/chat/completions", json={**LONG, "max_tokens": 3})
        assert response.status_code == 200


async def test_hung_engine_is_noticed_by_heartbeat_and_recovers(nursery):
    port = free_port()
    await start_engine_process(nursery, port)
    frontend = await start_frontend(
        nursery,
        None,
        engines=[f"tcp://127.0.0.1:{port}"],
        heartbeat_interval=0.05,
        heartbeat_timeout=0.4,
    )
    async with frontend.client() as client:
        # This request blocks the whole engine for 2 s: pings go unanswered. Only the
        # frontend's abort can end it afterwards (it would run for minutes).
        response = await client.post("/v1/chat/completions", json={**LONG, "mock_stall_s": 2})
        assert response.status_code == 503
        assert (await client.get("/health")).status_code == 503
        await wait_health(client, 200)
        # The engine received the abort once it woke, and holds nothing any more.
        await wait_until(
            lambda: (
                metrics.REGISTRY.get_sample_value(
                    "trioserve_engine_requests_running", {"engine": f"tcp://127.0.0.1:{port}"}
                )
                == 0
            ),
            "the engine to report no running request",
        )
        ok = await client.post("/v1/chat/completions", json={**LONG, "max_tokens": 2})
        assert ok.status_code == 200


async def test_frontend_killed_leaves_nothing_running_at_the_engine(nursery):
    from trioserve.sdk import MockBackend, serve_engine

    engine = await nursery.start(
        lambda task_status: serve_engine(
            MockBackend(tokens_per_second=100),
            "tcp://127.0.0.1:*",
            frontend_timeout=0.5,
            track_ends=True,
            task_status=task_status,
        )
    )
    frontend, url = await start_frontend_process(
        nursery, "--engine", engine.address, "--heartbeat-interval", "0.1"
    )
    async with httpx.AsyncClient(base_url=url, timeout=HANG_GUARD) as client:
        await wait_health(client, 200)

        async def stream_it() -> None:
            try:
                await client.post("/v1/chat/completions", json={**LONG, "stream": True})
            except httpx.HTTPError:
                pass  # the frontend dies under us

        async with trio.open_nursery() as requests:
            for _ in range(3):
                requests.start_soon(stream_it)
            await wait_until(lambda: len(engine.core.running) == 3, "three running requests")
            frontend.signal(signal.SIGKILL)
    await wait_until(lambda: not engine.core.running, "the engine to drop the orphans")
    assert engine.core.stats.orphaned == 3
    assert sorted(end for ends in engine.core.ends.values() for end in ends) == ["orphaned"] * 3
    await frontend.wait()


async def test_asyncio_engine_shell_serves_the_same_protocol(nursery):
    port = free_port()
    await start_engine_process(nursery, port, "--loop", "asyncio")
    frontend = await start_frontend(nursery, None, engines=[f"tcp://127.0.0.1:{port}"])
    async with frontend.client() as client:
        response = await client.post(
            "/v1/completions", json={"prompt": "x", "max_tokens": 4, "stream": True}
        )
        assert response.text.endswith("data: [DONE]\n\n")
        response = await client.post(
            "/v1/completions", json={"prompt": "x", "mock_error_after": 1, "mock_error_status": 422}
        )
        assert response.status_code == 422


async def test_a_busy_frontend_loop_does_not_declare_a_healthy_engine_lost(nursery):
    import time

    from trioserve.engine import HeartbeatConfig, open_engine_client
    from trioserve.protocol import Submit

    port = free_port()
    await start_engine_process(nursery, port)
    heartbeat = HeartbeatConfig(interval=0.05, timeout=0.3)
    async with open_engine_client([f"tcp://127.0.0.1:{port}"], heartbeat=heartbeat) as client:
        with trio.fail_after(HANG_GUARD):
            await client.wait_ready()
        sub = client.submit(
            Submit("busy", "mock", "completion", {"prompt": "p"}, {"mock_hang_after": 0}),
            "completion",
        )
        for _ in range(5):
            await trio.sleep(0.06)  # pings go out, pongs come back
            time.sleep(0.5)  # noqa: ASYNC251 - the loop is busy: pongs wait unread
        await trio.sleep(0.2)
        assert client.ready and sub.state == "open"
        sub.abort("cancel")


async def test_an_engine_that_breaks_the_protocol_fails_alone_and_the_server_serves_on(
    nursery, monkeypatch
):
    # Served by two engines, one hand-driven. Its second welcome, of another protocol
    # version, used to stop the whole frontend: now its streams end with 503
    # engine_failed (one abort each), and the other engine goes on serving.
    from tests.engine.test_client import FakeEngine, receive_a, welcome
    from trioserve.engine import connection
    from trioserve.protocol import PROTOCOL_VERSION, Abort, Hello, Submit

    monkeypatch.setattr(connection, "FAIL_BACKOFF", 0.05)
    engine = await start_engine(nursery)
    fake = FakeEngine()
    try:

        async def welcome_it() -> None:
            ident, _ = await receive_a(fake, Hello)
            fake.send(ident, welcome(model="fake"))

        nursery.start_soon(welcome_it)
        frontend = await start_frontend(
            nursery, engine, engines=[engine.address, fake.address], heartbeat_timeout=60.0
        )
        async with frontend.client() as client:
            results = {}

            async def ask_fake(name: str, stream: bool) -> None:
                results[name] = await client.post(
                    "/v1/completions", json={"model": "fake", "prompt": "p", "stream": stream}
                )

            async with trio.open_nursery() as requests:
                requests.start_soon(ask_fake, "stream", True)
                requests.start_soon(ask_fake, "json", False)
                ident, _ = await receive_a(fake, Submit)
                await receive_a(fake, Submit)
                fake.send(ident, welcome(version=PROTOCOL_VERSION + 1))
            assert results["json"].status_code == 503
            assert results["json"].json()["error"]["code"] == "engine_failed"
            assert results["stream"].status_code == 503  # nothing was sent before
            _, abort = await receive_a(fake, Abort)
            assert len(abort.request_ids) == 2
            assert (await client.get("/health")).status_code == 200
            ok = await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
            assert ok.status_code == 200
            failed = await client.post("/v1/completions", json={"model": "fake", "prompt": "x"})
            assert failed.status_code == 404  # no engine serves "fake" now
            # Tried again after the backoff, and back.
            ident, _ = await receive_a(fake, Hello)
            fake.send(ident, welcome(model="fake"))
            await wait_until(
                lambda: frontend.app.services.engines.connections[1].ready, "the fake back"
            )
            assert frontend.app.services.engines.failures() == {}
    finally:
        fake.close()


@pytest.mark.parametrize("allowed", [False, True], ids=["default", "mock-fault-injection"])
async def test_the_mock_that_run_starts_obeys_fault_knobs_only_when_asked(nursery, allowed):
    # Any client could stall the default engine for everyone with mock_stall_s: the
    # knobs are off unless the operator turns them on.
    _, url = await start_frontend_process(nursery, *(["--mock-fault-injection"] if allowed else []))
    async with httpx.AsyncClient(base_url=url, timeout=HANG_GUARD) as client:
        body = {"prompt": "x", "max_tokens": 2, "mock_error_after": 0, "mock_error_status": 429}
        response = await client.post("/v1/completions", json=body)
        plain = await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
    assert plain.status_code == 200
    if allowed:
        assert response.status_code == 429
    else:
        assert response.status_code == 400
        assert response.json()["error"]["code"] == "fault_injection_disabled"


async def test_the_engine_frame_bound_setting_reaches_the_link(nursery):
    """--engine-max-frame-mb: an engine frame over it fails that engine (its request a
    503 engine_failed), not the frontend. Here a speech chunk (2,400 bytes a word) is
    over a 1 KiB bound."""
    engine = await start_engine(nursery)
    frontend = await start_frontend(nursery, engine, engine_max_message_bytes=1024)
    async with frontend.client() as client:
        answer = await client.post("/v1/audio/speech", json={"input": "hello there"})
        assert answer.status_code == 503, answer.text
        assert answer.json()["error"]["code"] == "engine_failed"
        assert (await client.get("/live")).status_code == 200
