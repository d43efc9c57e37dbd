"""Every early end of a request reaches vLLM: checked from vLLM's side, on both paths.

Each test starts an answer that would run for thousands of tokens (seconds on this model),
ends it early in one way, and then asserts that vLLM is idle again and never finished it.
The cases run on both paths (``path``):

- shared: a frontend in-process on the session's ``trioserve engine vllm``. The engine
  process's metrics are read until vLLM is idle: its own scheduler figures
  (``vllm:num_requests_running`` and ``..._waiting`` at 0, ``vllm:kv_cache_usage_perc`` at
  0); then, on deltas over the test, the SDK received exactly one abort, for a request it
  knew, and the request ended as aborted (or orphaned, for a frontend that died), not
  finished; vLLM never finished it (``vllm:request_success_total{finished_reason="length"}``
  did not move) and generated fewer tokens than it was asked for.
- direct: a frontend in-process that is a client of the session's EngineCore
  (tests/helpers/enginecore_session.py: no engine of its own), with the direct path's link
  and text layer. From what crossed the client's sockets and from vLLM: exactly one ADD and
  exactly one ABORT for it left the frontend; vLLM's scheduler runs and queues nothing and
  its KV cache is empty again (its own figures, sent with a probe's step:
  :func:`~tests.helpers.enginecore_session.scheduler_idle`); vLLM never finished it (no
  output of it carried a finish reason) and generated fewer tokens than it was asked for.

Then the cases of one path only: a killed frontend (shared: the engine reclaims a silent
frontend's requests; the direct path's counterpart, a killed worker, is in
test_direct_workers.py), and the WebSocket over the direct path.
"""

from __future__ import annotations

import json
import signal
from typing import Any

import pytest
import trio
import trio_websocket

from tests.helpers.enginecore_session import (
    DirectFrontend,
    HeadlessEngine,
    scheduler_idle,
    start_direct_frontend,
)
from tests.helpers.frontends import Frontend
from tests.helpers.http import raw_request, read_until
from tests.helpers.processes import Proc
from tests.helpers.vllm import (
    LONG,
    MAX_TOKENS,
    client,
    frontend_on,
    reached_vllm,
    running_in_vllm,
    settled,
)
from tests.helpers.vllm_session import MODEL, Vllm
from tests.helpers.waiting import HANG_GUARD, wait_until
from trioserve.text.assets import ModelText

pytestmark = pytest.mark.integration


def assert_ended_early(
    before: dict[str, float], after: dict[str, float], how: str, requests: int = 1
) -> None:
    def delta(name: str) -> float:
        return after[name] - before[name]

    ends = {k: delta(f"trioserve_engine_{k}_total") for k in ("finished", "aborted", "orphaned")}
    seen = {k: delta(f"trioserve_engine_{k}_total") for k in ("aborts_received", "unknown_aborts")}
    assert delta("trioserve_engine_submitted_total") == requests
    assert ends == {"finished": 0, "aborted": 0, "orphaned": 0, how: requests}, (ends, seen)
    assert delta("trioserve_engine_finished_total") == 0
    if how == "aborted":
        assert delta("trioserve_engine_aborts_received_total") == requests  # one abort each
        assert delta("trioserve_engine_unknown_aborts_total") == 0
    assert delta('vllm:request_success_total{finished_reason="length"}') == 0
    assert delta("vllm:generation_tokens_total") < MAX_TOKENS * requests


async def ended_early(direct: DirectFrontend) -> None:
    """The one request of the test was aborted once in vLLM, and never finished there."""
    tap = direct.tap
    [request_id] = tap.requests
    await tap.aborted_once(request_id)
    stats = await scheduler_idle(direct.client)
    assert (stats.num_running_reqs, stats.num_waiting_reqs, stats.kv_cache_usage) == (0, 0, 0.0)
    assert tap.aborted == [request_id]  # one ABORT, and none for anything else
    assert not tap.finished_in_engine(request_id)
    assert tap.generated(request_id) < MAX_TOKENS
    assert direct.client.in_flight == 0


class SharedPath:
    """A frontend on the session's ``trioserve engine vllm``, judged by the engine's
    metrics (vLLM's and the SDK's), as deltas from when the frontend was up."""

    def __init__(self, vllm: Vllm) -> None:
        self.vllm = vllm
        self.before: dict[str, float] = {}

    async def start(self, nursery: trio.Nursery, **settings: Any) -> Frontend:
        frontend = await frontend_on(nursery, self.vllm, **settings)
        self.before = await settled(self.vllm)
        return frontend

    async def running(self) -> None:
        """Until the request runs in vLLM."""
        await running_in_vllm(self.vllm)

    async def submitted(self) -> None:
        """Until the request has reached the engine (not settled before: vLLM is idle
        until it has)."""
        await reached_vllm(self.vllm, self.before)

    async def ended_early(self) -> None:
        assert_ended_early(self.before, await settled(self.vllm), "aborted")


class DirectPath:
    """A frontend that is a client of the session's EngineCore, judged by what crossed
    its sockets and by vLLM's scheduler figures."""

    def __init__(self, engine: HeadlessEngine, text: ModelText) -> None:
        self.engine = engine
        self.text = text
        self.direct: DirectFrontend | None = None

    async def start(self, nursery: trio.Nursery, **settings: Any) -> Frontend:
        self.direct = await start_direct_frontend(nursery, self.engine, self.text, **settings)
        return self.direct.frontend

    async def running(self) -> None:
        assert self.direct is not None
        tap = self.direct.tap
        with trio.fail_after(HANG_GUARD):
            while not tap.requests:
                await trio.sleep(0.02)
        await tap.running(tap.requests[0])

    async def submitted(self) -> None:
        # The frontend ends a client that stops reading itself (slow_client): until its
        # ABORT has left.
        assert self.direct is not None
        with trio.fail_after(HANG_GUARD * 3):
            while not self.direct.tap.aborted:
                await trio.sleep(0.05)

    async def ended_early(self) -> None:
        assert self.direct is not None
        await ended_early(self.direct)


@pytest.fixture(params=["shared", "direct"])
def path(request: pytest.FixtureRequest) -> SharedPath | DirectPath:
    """The path under test; only its session engine is started."""
    if request.param == "shared":
        return SharedPath(request.getfixturevalue("vllm"))
    return DirectPath(request.getfixturevalue("enginecore"), request.getfixturevalue("text"))


async def test_disconnect_while_streaming_aborts_in_vllm(path, nursery) -> None:
    frontend = await path.start(nursery)
    stream = await raw_request(
        frontend, "POST", "/v1/completions", json.dumps({**LONG, "stream": True}).encode()
    )
    await read_until(stream, b'"text"')
    await stream.aclose()
    await path.ended_early()


async def test_disconnect_while_waiting_for_json_aborts_in_vllm(path, nursery) -> None:
    frontend = await path.start(nursery)
    stream = await raw_request(frontend, "POST", "/v1/completions", json.dumps(LONG).encode())
    await path.running()
    await stream.aclose()
    await path.ended_early()


async def test_deadline_aborts_in_vllm(path, nursery) -> None:
    frontend = await path.start(nursery)
    async with client(frontend.url) as http:
        answer = await http.post("/v1/completions", json=LONG, headers={"x-request-timeout": "1"})
    assert answer.status_code == 504, answer.text
    await path.ended_early()


async def test_delete_request_aborts_in_vllm(path, nursery) -> None:
    frontend = await path.start(nursery)
    async with (
        client(frontend.url) as http,
        http.stream(
            "POST", "/v1/completions", json={**LONG, "stream": True}, headers={"x-request-id": "d1"}
        ) as response,
    ):
        lines = response.aiter_lines()
        assert (await anext(lines)).startswith("data: ")
        deleted = await http.delete("/v1/requests/d1")
        assert deleted.status_code in (200, 202, 204), deleted.text
        rest = [line async for line in lines]
    assert not any("[DONE]" in line for line in rest)  # ended with an error, not completed
    await path.ended_early()


async def test_websocket_cancel_aborts_in_vllm(path, nursery) -> None:
    frontend = await path.start(nursery)
    url = frontend.url.replace("http", "ws") + "/v1/ws"
    with trio.fail_after(HANG_GUARD * 3):
        async with trio_websocket.open_websocket_url(url) as ws:
            request = {"type": "request", "id": "w", "endpoint": "completions", "body": LONG}
            await ws.send_message(json.dumps(request))
            first = json.loads(await ws.get_message())
            assert first["type"] == "chunk", first
            await ws.send_message(json.dumps({"type": "cancel", "id": "w"}))
            while (message := json.loads(await ws.get_message()))["type"] == "chunk":
                pass
            assert message["error"]["code"] == "request_cancelled"
    await path.ended_early()


async def test_drain_deadline_aborts_in_vllm(path, nursery) -> None:
    frontend = await path.start(nursery, drain_delay=0.0, graceful_timeout=1.0)
    stream = await raw_request(
        frontend, "POST", "/v1/completions", json.dumps({**LONG, "stream": True}).encode()
    )
    await read_until(stream, b'"text"')
    nursery.start_soon(frontend.drain.drain)
    tail = await read_until(stream, b"server_shutting_down")
    assert b"[DONE]" not in tail
    with trio.fail_after(HANG_GUARD):
        await frontend.stopped.wait()
    await path.ended_early()


async def test_a_client_that_stops_reading_is_ended_and_aborted_in_vllm(path, nursery) -> None:
    frontend = await path.start(nursery, stream_buffer=8)
    sock = trio.socket.socket()
    sock.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_RCVBUF, 4096)
    await sock.connect((frontend.host, frontend.port))
    stream = trio.SocketStream(sock)
    body = json.dumps({**LONG, "stream": True}).encode()
    head = "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
    await stream.send_all(f"{head}content-length: {len(body)}\r\n\r\n".encode() + body)
    # Never read: the frontend ends the request itself (slow_client) and aborts it.
    await path.submitted()
    await path.ended_early()
    await stream.aclose()


# -- the shared path only: a frontend killed ------------------------------------------------


async def test_a_killed_frontends_requests_are_reclaimed_in_vllm(vllm: Vllm, nursery) -> None:
    """A frontend that dies sends no abort: the engine notices its silence (the session's
    engine runs with --frontend-timeout FRONTEND_TIMEOUT) and aborts its requests itself.

    The dead frontend's request asks for ``n`` choices (``orphans`` engine requests): one
    answer of MAX_TOKENS takes the tiny model about 9 s on a quiet machine, less than the
    engine's 10 s of patience, so one request alone could finish first (it did); 16
    (the most ``n`` takes) in one batch take about twice as long."""
    orphans = 16
    before = await settled(vllm)
    frontend = await Proc.start(nursery, "run", "--port", "0", "--engine", vllm.address)
    match = await frontend.wait_for_output(r"Running on (http://127\.0\.0\.1:\d+)")
    await frontend.wait_for_output(r"engine \S+ connected")
    host, port = match[1].decode().removeprefix("http://").split(":")
    stream = await trio.open_tcp_stream(host, int(port))
    sampled = {"n": orphans, "temperature": 1.0, "seed": 1}  # (greedy n > 1 is refused)
    body = json.dumps({**LONG, **sampled, "stream": True}).encode()
    head = "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
    await stream.send_all(f"{head}content-length: {len(body)}\r\n\r\n".encode() + body)
    await read_until(stream, b'"text"')
    frontend.signal(signal.SIGKILL)
    await frontend.wait()
    assert_ended_early(before, await settled(vllm), "orphaned", orphans)


# -- the direct path only: the WebSocket ----------------------------------------------------


async def test_a_websocket_request_streams_the_json_answer_over_the_direct_path(
    enginecore, text, nursery
) -> None:
    direct = await start_direct_frontend(nursery, enginecore, text)
    body = {"model": MODEL, "prompt": "The quick brown fox", "max_tokens": 24, "temperature": 0}
    async with client(direct.frontend.url) as http:
        answer = (await http.post("/v1/completions", json=body)).json()
    chunks, done = [], None
    url = direct.frontend.url.replace("http", "ws") + "/v1/ws"
    with trio.fail_after(HANG_GUARD * 3):
        async with trio_websocket.open_websocket_url(url) as ws:
            request = {"type": "request", "id": "s", "endpoint": "completions", "body": body}
            await ws.send_message(json.dumps(request))
            while (message := json.loads(await ws.get_message()))["type"] == "chunk":
                chunks.append(message["data"])
            done = message
    assert done["type"] == "done", done
    assert len(chunks) > 1  # streamed, not one piece
    assert "".join(c["choices"][0]["text"] for c in chunks) == answer["choices"][0]["text"]
    assert chunks[-1]["choices"][0]["finish_reason"] == answer["choices"][0]["finish_reason"]
    usage = answer["usage"]
    assert done["usage"] == {k: usage[k] for k in done["usage"]}
    # Two requests, both finished by the engine: no ABORT.
    assert len(direct.tap.requests) == 2 and direct.tap.aborted == []
    assert all(direct.tap.finished_in_engine(r) for r in direct.tap.requests)


async def test_closing_the_websocket_aborts_each_of_its_requests_once_in_vllm(
    enginecore, text, nursery
) -> None:
    direct = await start_direct_frontend(nursery, enginecore, text)
    url = direct.frontend.url.replace("http", "ws") + "/v1/ws"
    # "b" asks for two choices: two engine requests, each aborted once too.
    bodies = {"a": LONG, "b": {**LONG, "n": 2, "temperature": 1.0, "seed": 1}}
    with trio.fail_after(HANG_GUARD * 3):
        async with trio_websocket.open_websocket_url(url) as ws:
            for name, body in bodies.items():
                request = {"type": "request", "id": name, "endpoint": "completions", "body": body}
                await ws.send_message(json.dumps(request))
            seen: set[str] = set()
            while seen != {"a", "b"}:
                message = json.loads(await ws.get_message())
                assert message["type"] == "chunk", message
                seen.add(message["id"])
            await wait_until(lambda: len(direct.tap.requests) == 3, "three engine requests")
    tap = direct.tap
    assert len(tap.requests) == 3
    for request_id in tap.requests:
        await tap.aborted_once(request_id)
    stats = await scheduler_idle(direct.client)
    assert (stats.num_running_reqs, stats.kv_cache_usage) == (0, 0.0)
    assert sorted(tap.aborted) == sorted(tap.requests)
    assert not any(tap.finished_in_engine(r) for r in tap.requests)
