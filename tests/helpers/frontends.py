"""The real mock engine over real ZeroMQ, and a frontend in-process on port 0 (127.0.0.1).

``start_frontend`` takes the HTTP server by name: the HTTP tests run on both
(``SERVERS``, the ``http_server`` fixture of tests/http/conftest.py), the others say
which one they run on.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import httpx
import trio

from tests.helpers.waiting import HANG_GUARD, wait_until
from trioserve.config import Settings
from trioserve.engine import LinkFactory
from trioserve.engine_programs.mock import MockBackend
from trioserve.http import App
from trioserve.protocol import Submit, decode
from trioserve.sdk import TrioEngine, serve_engine
from trioserve.sdk.core import Cancel, Start
from trioserve.server.drain import DrainController
from trioserve.server.frontend import serve_frontend

#: Both HTTP servers must pass the same HTTP test suite.
SERVERS = ["builtin", "hypercorn"]

#: A chat request that runs until it is ended (100,000 tokens of the mock).
LONG = {"messages": [{"role": "user", "content": "go on"}], "max_tokens": 100_000}


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
    def __init__(
        self, app: App, drain: DrainController, url: str, engine: TrioEngine | None
    ) -> None:
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
        return self.app.services.engines.frontend_id.encode()

    def ends(self, request_id: str) -> list[str]:
        """How the engine saw request ``request_id`` end: [] while running/unknown."""
        assert self.engine is not None and self.engine.core.ends is not None
        return self.engine.core.ends.get((self.frontend_id, request_id), [])

    def client(self, **options: object) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.url, timeout=HANG_GUARD, **options)  # type: ignore[arg-type]


async def start_frontend(
    nursery: trio.Nursery,
    engine: TrioEngine | None,
    *,
    server: str,
    links: Sequence[tuple[str, LinkFactory]] = (),
    **settings: object,
) -> Frontend:
    """A frontend on ``engine`` (or on ``settings["engines"]``, and on ``links``: engine
    links of a kind of the test's own) served by ``server`` ("builtin" or "hypercorn"),
    ready once its engines are."""
    options = {
        "port": 0,
        "engines": [engine.address] if engine else [],
        "drain_delay": 0.0,
        "graceful_timeout": 5.0,
        "server": server,
        **settings,
    }
    stopped = trio.Event()

    async def serve(
        task_status: trio.TaskStatus[tuple[App, DrainController, list[str]]],
    ) -> None:
        await serve_frontend(
            Settings(**options),  # type: ignore[arg-type]
            handle_signals=False,
            links=links,
            task_status=task_status,
        )
        stopped.set()

    app, drain, binds = await nursery.start(serve)
    with trio.fail_after(HANG_GUARD):
        await app.services.engines.wait_ready()
    frontend = Frontend(app, drain, binds[0], engine)
    frontend.stopped = stopped
    return frontend


async def running(frontend: Frontend, request_id: str) -> None:
    """Until the engine runs request ``request_id``."""
    key = (frontend.frontend_id, request_id)
    engine = frontend.engine
    assert engine is not None
    await wait_until(lambda: key in engine.core.running, f"{request_id} to run")


def capture_submits(frontend: Frontend) -> list[Submit]:
    """Every submit the engine receives from now on, in order (the engine's own view)."""
    seen: list[Submit] = []
    assert frontend.engine is not None
    core = frontend.engine.core
    original = core.handle

    def spy(identity: bytes, frame: bytes, now: float) -> list[Start | Cancel]:
        message = decode(frame)
        if isinstance(message, Submit):
            seen.append(message)
        return original(identity, frame, now)

    core.handle = spy  # type: ignore[method-assign]
    return seen
