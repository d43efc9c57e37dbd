"""serve_frontend: the settings reach what they configure (the engine link, the built-in
server)."""

from __future__ import annotations

import resource

from tests.helpers.frontends import start_engine, start_frontend
from trioserve.cli import build_parser
from trioserve.config import Settings
from trioserve.server.frontend import http1_config
from trioserve.server.http1 import config as http1_limits


async def test_the_engine_frame_bound_setting_reaches_the_link(nursery):
    """--engine-max-frame-mb: an engine frame over it fails that engine (its request a
    503 engine_failed), not the frontend. Here a speech chunk (2,400 bytes a word) is
    over a 1 KiB bound."""
    engine = await start_engine(nursery)
    frontend = await start_frontend(
        nursery, engine, server="builtin", engine_max_message_bytes=1024
    )
    async with frontend.client() as client:
        answer = await client.post("/v1/audio/speech", json={"input": "hello there"})
        assert answer.status_code == 503, answer.text
        assert answer.json()["error"]["code"] == "engine_failed"
        assert (await client.get("/live")).status_code == 200


def test_the_bounds_reach_the_server_from_the_settings_and_the_cli(monkeypatch):
    args = build_parser().parse_args(["run", "--max-connections", "5", "--body-deadline", "7"])
    assert (args.max_connections, args.body_deadline) == (5, 7)
    config = http1_config(
        Settings(max_connections=5, body_deadline=7, body_timeout=3, max_body_bytes=1000)
    )
    assert (config.max_connections, config.body_deadline) == (5, 7)
    # The default: three quarters of the descriptor limit, the rest kept for the others.
    monkeypatch.setattr(resource, "getrlimit", lambda which: (1024, 4096))
    assert http1_limits.default_max_connections() == 768
