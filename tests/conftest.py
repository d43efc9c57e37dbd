"""Fixtures shared by every test: the real mock engine over real ZeroMQ, and a frontend
in-process on port 0 (tests/helpers/frontends.py), all on 127.0.0.1."""

from __future__ import annotations

import pytest
import trio

from tests.helpers.frontends import Frontend, start_engine, start_frontend
from trioserve.sdk import TrioEngine


@pytest.fixture
def http_server() -> str:
    """The HTTP server of the frontends a test starts: the built-in one, unless the test
    is parametrized over ``SERVERS`` (every test of tests/http is, by its conftest)."""
    return "builtin"


@pytest.fixture
async def engine(nursery: trio.Nursery) -> TrioEngine:
    return await start_engine(nursery)


@pytest.fixture
async def frontend(nursery: trio.Nursery, engine: TrioEngine, http_server: str) -> Frontend:
    return await start_frontend(nursery, engine, server=http_server)
