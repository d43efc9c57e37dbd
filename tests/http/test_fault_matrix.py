"""The fault matrix: route by response kind by end path by phase, each ending exactly once.

For every combination the test asserts, on the engine side, that the request ended
exactly once (the engine finished it xor it received one abort), that the frontend's
in-flight count is back to zero, that no Trio task was left behind, that the client was
told what happened, and that the next request is served.

Phases are made deterministic with the mock engine's per-request knobs: the request
produces ``n`` outputs (0: "before", 3: "mid") and then hangs (``mock_hang_after``) or
fails (``mock_error_after``), so each end path strikes at a known point.

Not in the matrix, by construction: a *slow client* needs outputs flowing, so it exists
only mid-output, and only for SSE — a non-streaming (JSON) response takes every output off
its subscription as it arrives and keeps the text (bounded by ``max_tokens``) until the one
final write. It has its own test at the end.
"""

from __future__ import annotations

import json

import pytest
import trio

from tests.helpers.frontends import start_engine, start_frontend
from tests.helpers.http import raw_request, read_until
from tests.helpers.responses import named_events
from tests.helpers.waiting import wait_until
from trioserve import metrics
from trioserve.engine_programs.mock import expected_text

PHASES = {"before": 0, "mid": 3}
PATHS = ["disconnect", "deadline", "engine_error", "engine_lost", "cancel"]
KINDS = ["json", "sse"]
#: The routes, each with its body and the SSE event that carries outputs (one a token on
#: completions; one a batch of tokens on messages, so there the client has seen output
#: once it has one).
ROUTES = {
    "/v1/completions": ({"prompt": "matrix"}, "data: "),
    "/v1/messages": (
        {"messages": [{"role": "user", "content": "matrix"}]},
        "event: content_block_delta",
    ),
}


def count_tasks() -> int:
    def walk(task: trio.lowlevel.Task) -> int:
        return 1 + sum(walk(c) for n in task.child_nurseries for c in n.child_tasks)

    return walk(trio.lowlevel.current_root_task())


@pytest.fixture
async def setup(nursery, http_server):
    engine = await start_engine(nursery)
    # A short keep-alive timeout: hypercorn keeps a closed connection's idle-timer task
    # until it fires, which would otherwise read as a leftover task here.
    frontend = await start_frontend(
        nursery,
        engine,
        server=http_server,
        heartbeat_interval=0.1,
        heartbeat_timeout=1.0,
        keep_alive_timeout=0.2,
    )
    return engine, frontend


def events_of(text: str) -> list[dict | str]:
    out: list[dict | str] = []
    for event in text.split("\n\n"):
        if event.startswith("data: "):
            data = event.removeprefix("data: ")
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def relayed_all(route: str, text: str, n: int) -> bool:
    """Whether a stream read so far (``text``) carries the request's ``n`` outputs: on
    completions its n tokens, a word each (in however many events: outputs one read of
    the engine socket brings leave as one delta); on messages, whose events each carry a
    batch, one event."""
    if route != "/v1/completions":
        return ROUTES[route][1] in text
    whole = text[: text.rfind("\n\n") + 2]  # (events read whole)
    events = [e for e in events_of(whole) if isinstance(e, dict) and "choices" in e]
    return sum(len(c["text"].split()) for e in events for c in e["choices"]) >= n


async def next_request_is_served(frontend) -> None:
    async with frontend.client() as client:
        response = await client.post(
            "/v1/completions", json={"prompt": "next", "max_tokens": 2, "stream": True}
        )
    assert response.text.endswith("data: [DONE]\n\n")


def error_of(route: str, text: str) -> dict:
    """The error object a started SSE stream of ``route`` ended with (its last event)."""
    if route == "/v1/messages":
        *_, last = named_events(text)
        assert last[0] == "error"
        assert "message_stop" not in [name for name, _ in named_events(text)]
        return last[1]["error"]
    events = events_of(text)
    assert "[DONE]" not in events
    return events[-1]["error"]


@pytest.mark.parametrize("phase", PHASES)
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("route", ROUTES)
async def test_request_ends_exactly_once(setup, route, kind, path, phase):
    engine, frontend = setup
    n = PHASES[phase]
    request_id = f"{route.rsplit('/', 1)[1]}-{kind}-{path}-{phase}"
    key = (frontend.frontend_id, request_id)
    content, output_event = ROUTES[route]
    body = {
        **content,
        "max_tokens": 100_000,
        "stream": kind == "sse",
        **(
            {"mock_error_after": n, "mock_error_status": 502}
            if path == "engine_error"
            else {"mock_hang_after": n}
        ),
    }
    headers = {"x-request-id": request_id}
    if path == "deadline":
        headers["x-request-timeout"] = "1.0"
    tasks_before = count_tasks()
    aborts_before = engine.core.stats.aborts_received
    result: dict[str, object] = {}

    relayed = trio.Event()  # the client has received n outputs (SSE)

    async def reached_phase() -> None:
        await wait_until(
            lambda: key in engine.core.running and engine.core.running[key].seq >= n,
            f"{request_id} to produce {n} outputs",
        )
        if kind == "sse" and n:
            with trio.fail_after(20):
                await relayed.wait()

    if path == "disconnect":
        stream = await raw_request(frontend, "POST", route, json.dumps(body).encode(), **headers)
        if kind == "sse" and n:
            await read_until(stream, output_event.encode())  # the client has seen output
        else:
            await reached_phase()
        await stream.aclose()
    else:

        async def call() -> None:
            async with frontend.client() as client:
                async with client.stream("POST", route, json=body, headers=headers) as response:
                    text = ""
                    async for chunk in response.aiter_text():
                        text += chunk
                        if n and relayed_all(route, text, n):
                            relayed.set()
                result["status"], result["text"] = response.status_code, text

        async with trio.open_nursery() as nursery:
            nursery.start_soon(call)
            if path != "engine_error":
                await reached_phase()
            if path == "cancel":
                async with frontend.client() as client:
                    assert (await client.delete(f"/v1/requests/{request_id}")).status_code == 200
            elif path == "engine_lost":
                engine.freeze()
                await wait_until(lambda: "status" in result, "the client to be answered")
                engine.thaw()

    # The engine saw exactly one end of the request.
    expected_end = "finished" if path == "engine_error" else "aborted"
    await wait_until(lambda: frontend.ends(request_id), "the engine to see the end")
    assert frontend.ends(request_id) == [expected_end]
    assert engine.core.stats.aborts_received - aborts_before == (expected_end == "aborted")
    assert engine.core.stats.unknown_aborts == 0
    assert key not in engine.core.running

    # The client was told what happened.
    if path != "disconnect":
        code = {
            "deadline": "deadline_exceeded",
            "engine_error": "engine_error",
            "engine_lost": "engine_lost",
            "cancel": "request_cancelled",
        }[path]
        status = {"deadline": 504, "engine_error": 502, "engine_lost": 503, "cancel": 499}[path]
        if kind == "sse" and n:
            assert result["status"] == 200
            assert error_of(route, result["text"])["code"] == code
            if route == "/v1/completions":
                # The n tokens, then the error. (In as many events as the frontend's
                # reads of the engine socket made of them: outputs one read brings leave
                # as one delta, so not always n.)
                *outputs, _error = events_of(result["text"])
                sent = "".join(choice["text"] for e in outputs for choice in e["choices"])
                assert sent == expected_text(content["prompt"], n)
        else:
            assert result["status"] == status
            assert json.loads(result["text"])["error"]["code"] == code

    # Nothing is left behind, and the server keeps serving.
    await wait_until(lambda: len(frontend.app.services.registry) == 0, "the registry to empty")
    assert metrics.REGISTRY.get_sample_value("trioserve_requests_in_flight") == 0
    await wait_until(lambda: count_tasks() == tasks_before, "every request task to end")
    if path == "engine_lost":
        with trio.fail_after(20):
            await frontend.app.services.engines.wait_ready()
    await next_request_is_served(frontend)


async def test_slow_sse_client_mid_output_ends_exactly_once(nursery, http_server):
    engine = await start_engine(nursery)
    frontend = await start_frontend(
        nursery, engine, server=http_server, stream_buffer=8, keep_alive_timeout=0.2
    )
    tasks_before = count_tasks()
    sock = trio.socket.socket()
    sock.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_RCVBUF, 4096)
    await sock.connect((frontend.host, frontend.port))
    stream = trio.SocketStream(sock)
    body = json.dumps(
        {"prompt": "x", "max_tokens": 10_000_000, "stream": True, "mock_tokens_per_second": 1e6}
    ).encode()
    await stream.send_all(
        b"POST /v1/completions HTTP/1.1\r\nhost: x\r\nx-request-id: slow\r\n"
        + f"content-length: {len(body)}\r\n\r\n".encode()
        + body
    )
    await wait_until(lambda: frontend.ends("slow"), "the slow request to end")
    assert frontend.ends("slow") == ["aborted"]
    assert engine.core.stats.unknown_aborts == 0
    await stream.aclose()
    await wait_until(lambda: len(frontend.app.services.registry) == 0, "the registry to empty")
    await wait_until(lambda: count_tasks() == tasks_before, "every request task to end")
    await next_request_is_served(frontend)
