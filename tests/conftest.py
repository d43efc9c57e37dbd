"""Shared fixtures: the real mock engine over real ZeroMQ, hypercorn on port 0.

Everything runs on 127.0.0.1. Waits are event-driven where possible; where a test must
poll for an effect in another component (an abort crossing ZeroMQ), ``wait_until`` polls
under a generous ceiling that only guards against hangs and never measures speed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial

import httpx
import pytest
import trio

from trioserve.config import Settings
from trioserve.sdk import MockBackend, TrioEngine, serve_engine
from trioserve.server.frontend import serve_frontend

#: Ceiling for waiting on an effect that must happen; hitting it is a failure, not a timing.
HANG_GUARD = 20.0

#: Both HTTP servers must pass the same HTTP test suite.
SERVERS = ["builtin", "hypercorn"]
_current_server = {"name": "builtin"}


@pytest.fixture(params=SERVERS)
def http_server(request: pytest.FixtureRequest) -> str:
    """Run the test once per HTTP server (the frontends it starts use that server)."""
    _current_server["name"] = request.param
    yield request.param
    _current_server["name"] = "builtin"


async def wait_until(condition: Callable[[], bool], what: str = "condition") -> None:
    with trio.move_on_after(HANG_GUARD):
        while not condition():
            await trio.sleep(0.005)
        return
    raise AssertionError(f"gave up waiting for {what}")


async def check_many_senders(send: Callable[[bytes], bool], heard: list[bytes]) -> None:
    """For a socket owner whose peer echoes: senders in many tasks send while the owner
    parks between bursts; every echo comes back (in ``heard``), each sender's in its
    order. A send that consumes a wake-up the owner needed would lose some."""
    senders, each = 20, 50

    async def sender(index: int) -> None:
        for n in range(each):
            assert send(b"%d:%d" % (index, n))
            if n % 7 == 0:
                await trio.sleep(0.001)  # let the owner park between bursts
            else:
                await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        for index in range(senders):
            nursery.start_soon(sender, index)
    await wait_until(lambda: len(heard) == senders * each, "every echo")
    for index in range(senders):
        mine = [m for m in heard if m.startswith(b"%d:" % index)]
        assert mine == [b"%d:%d" % (index, n) for n in range(each)]


class SlowFlood:
    """A flood of messages that each take a millisecond to handle (an engine frame
    carrying a step's outputs for hundreds of streams), for a socket owner's handler:
    another task (the heartbeat, a relay) must get its turn long before the owner has
    handled them all."""

    total = 300

    def __init__(self) -> None:
        self.handled: list[int] = []

    def handle(self, frames: list[bytes]) -> None:
        # Work, not a sleep: an owner's budget counts the CPU time it spends.
        end = time.thread_time() + 0.001
        while time.thread_time() < end:
            pass
        self.handled.append(int(frames[0]))

    def messages(self) -> list[bytes]:
        return [b"%d" % n for n in range(self.total)]

    async def check_others_ran(self, nursery: trio.Nursery) -> None:
        """Once every message has been sent: let them all arrive before the owner looks,
        then check another task ran many times while the owner handled them."""
        time.sleep(0.2)  # noqa: ASYNC251 - the whole thread waits, the owner too
        handled, total = self.handled, self.total
        seen_at: list[int] = []

        async def other() -> None:
            while len(handled) < total:
                seen_at.append(len(handled))
                await trio.lowlevel.checkpoint()

        nursery.start_soon(other)
        await wait_until(lambda: len(handled) == total, "every message handled")
        assert len([n for n in seen_at if 0 < n < total]) > 10
        assert handled == list(range(total))


async def start_engine(nursery: trio.Nursery, **backend_options: object) -> TrioEngine:
    # The tests drive faults through the mock's knobs: allowed here, off by default.
    options = {
        "tokens_per_second": 400.0,
        "ttft_ms": 2.0,
        "allow_fault_injection": True,
        **backend_options,
    }
    backend = MockBackend(**options)  # type: ignore[arg-type]
    return await nursery.start(partial(serve_engine, backend, "tcp://127.0.0.1:*", track_ends=True))


class Frontend:
    def __init__(self, app, drain, url: str, engine: TrioEngine | None) -> None:
        self.app = app
        self.drain = drain
        #: Set when serve_frontend has returned (the drain completed).
        self.stopped = trio.Event()
        self.url = url
        self.engine = engine
        host, port = url.removeprefix("http://").rsplit(":", 1)
        self.host, self.port = host, int(port)

    @property
    def frontend_id(self) -> bytes:
        return self.app.services.engines.connections[0].frontend_id.encode()

    def ends(self, request_id: str) -> list[str]:
        """How the engine saw request ``request_id`` end: [] while running/unknown."""
        assert self.engine is not None and self.engine.core.ends is not None
        return self.engine.core.ends.get((self.frontend_id, request_id), [])

    def client(self, **options: object) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.url, timeout=HANG_GUARD, **options)  # type: ignore[arg-type]


async def start_frontend(
    nursery: trio.Nursery, engine: TrioEngine | None, **settings: object
) -> Frontend:
    options = {
        "port": 0,
        "engines": [engine.address] if engine else [],
        "drain_delay": 0.0,
        "graceful_timeout": 5.0,
        "server": _current_server["name"],
        **settings,
    }
    stopped = trio.Event()

    async def serve(task_status: trio.TaskStatus) -> None:
        await serve_frontend(Settings(**options), handle_signals=False, task_status=task_status)  # type: ignore[arg-type]
        stopped.set()

    app, drain, binds = await nursery.start(serve)
    with trio.fail_after(HANG_GUARD):
        await app.services.engines.wait_ready()
    frontend = Frontend(app, drain, binds[0], engine)
    frontend.stopped = stopped
    return frontend


@pytest.fixture
async def engine(nursery: trio.Nursery) -> TrioEngine:
    return await start_engine(nursery)


@pytest.fixture
async def frontend(nursery: trio.Nursery, engine: TrioEngine) -> Frontend:
    return await start_frontend(nursery, engine)


async def raw_request(frontend: Frontend, method: str, path: str, body: bytes, **headers: str):
    """Open a TCP stream and send one request by hand (for disconnect tests)."""
    stream = await trio.open_tcp_stream(frontend.host, frontend.port)
    head = [f"{method} {path} HTTP/1.1", f"host: {frontend.host}", "content-type: application/json"]
    head += [f"{name.replace('_', '-')}: {value}" for name, value in headers.items()]
    head.append(f"content-length: {len(body)}")
    await stream.send_all(("\r\n".join(head) + "\r\n\r\n").encode() + body)
    return stream


async def read_until(stream: trio.SocketStream, marker: bytes) -> bytes:
    data = b""
    with trio.fail_after(HANG_GUARD):
        while marker not in data:
            chunk = await stream.receive_some(65536)
            if not chunk:
                break
            data += chunk
    return data


async def read_to_end(stream: trio.SocketStream) -> bytes:
    """Everything the peer sends until it closes (or resets) the connection."""
    received = b""
    while True:
        try:
            chunk = await stream.receive_some(65536)
        except trio.BrokenResourceError:
            return received
        if not chunk:
            return received
        received += chunk
