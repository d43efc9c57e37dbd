"""An engine connection's failure stays with it: an engine that breaks the protocol fails
alone, its requests with it (one abort each), while the frontend serves on from the others
and tries it again after the backoff."""

from __future__ import annotations

import trio

from tests.helpers.fake_engine import FakeEngine, receive_a, welcome
from tests.helpers.frontends import start_engine, start_frontend
from tests.helpers.waiting import wait_until
from trioserve.links import protocol as connection
from trioserve.protocol import PROTOCOL_VERSION, Abort, Hello, Submit


async def test_an_engine_that_breaks_the_protocol_fails_alone_and_the_server_serves_on(
    nursery, monkeypatch
):
    # Served by two engines, one hand-driven. Its second welcome, of another protocol
    # version, used to stop the whole frontend: now its streams end with 503
    # engine_failed (one abort each), and the other engine goes on serving.
    monkeypatch.setattr(connection, "FAIL_BACKOFF", 0.05)
    engine = await start_engine(nursery)
    fake = FakeEngine()
    try:

        async def welcome_it() -> None:
            ident, _ = await receive_a(fake, Hello)
            fake.send(ident, welcome(model="fake"))

        nursery.start_soon(welcome_it)
        frontend = await start_frontend(
            nursery,
            engine,
            server="builtin",
            engines=[engine.address, fake.address],
            heartbeat_timeout=60.0,
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
            await wait_until(lambda: frontend.app.services.engines.links[1].ready, "the fake back")
            assert frontend.app.services.engines.failures() == {}
    finally:
        fake.close()
