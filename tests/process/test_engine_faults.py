"""Engines and frontends that die or hang, as real processes."""

from __future__ import annotations

import json
import signal

import httpx
import pytest
import trio

from tests.helpers.frontends import LONG, start_frontend
from tests.helpers.http import wait_health
from tests.helpers.processes import free_port, start_engine_process, start_frontend_process
from tests.helpers.waiting import HANG_GUARD, wait_until
from trioserve import metrics
from trioserve.ends import EndReason

pytestmark = pytest.mark.integration


async def test_engine_killed_mid_request_fails_it_with_503_then_serving_resumes(nursery):
    port = free_port()
    engine = await start_engine_process(nursery, port)
    frontend = await start_frontend(
        nursery,
        None,
        server="builtin",
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
        server="builtin",
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
    from trioserve.engine_programs.mock import MockBackend
    from trioserve.sdk import serve_engine

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
    frontend = await start_frontend(
        nursery, None, server="builtin", engines=[f"tcp://127.0.0.1:{port}"]
    )
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

    from trioserve.links.protocol import HeartbeatConfig
    from trioserve.links.protocol_client import open_protocol_client
    from trioserve.protocol import Submit

    port = free_port()
    await start_engine_process(nursery, port)
    heartbeat = HeartbeatConfig(interval=0.05, timeout=0.3)
    async with open_protocol_client([f"tcp://127.0.0.1:{port}"], heartbeat=heartbeat) as client:
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
        sub.abort(EndReason.CANCEL)


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
