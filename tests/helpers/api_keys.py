"""A frontend that asks for an API key (``--api-key``): two keys, and their headers."""

from __future__ import annotations

from typing import Any

import trio

from tests.helpers.frontends import Frontend, start_engine, start_frontend

KEY, OTHER = "sk-test-alice", "sk-test-bob"
ALICE = {"authorization": f"Bearer {KEY}"}
BOB = {"authorization": f"Bearer {OTHER}"}


async def keyed_frontend(nursery: trio.Nursery, *, server: str, **settings: Any) -> Frontend:
    """A frontend on its own engine that serves the holders of ``KEY`` and ``OTHER``."""
    engine = await start_engine(nursery)
    return await start_frontend(nursery, engine, server=server, api_keys=[KEY, OTHER], **settings)
