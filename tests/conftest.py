"""Fixtures shared by every test: the real mock engine over real ZeroMQ, and a frontend
in-process on port 0 (tests/helpers/frontends.py), all on 127.0.0.1."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
import trio

from tests.helpers.frontends import Frontend, start_engine, start_frontend
from tests.helpers.nginx import nginx_binary
from trioserve.config import Settings
from trioserve.sdk import TrioEngine


@pytest.fixture(scope="session", autouse=True)
def default_port_held() -> Iterator[None]:
    """Hold trioserve's default port for the whole session, as a user's ``trioserve run``
    (the README's first command) would: a test that needs it free fails here every time,
    not only on the machines where it happens to be taken. Already taken: the same."""
    holder = socket.socket()
    try:
        holder.bind(("127.0.0.1", Settings().port))
        holder.listen(1)
    except OSError:
        pass
    try:
        yield
    finally:
        holder.close()


@pytest.fixture
def http_server() -> str:
    """The HTTP server of the frontends a test starts: the built-in one, unless the test
    is parametrized over ``SERVERS`` (every test of tests/http is, by its conftest)."""
    return "builtin"


@pytest.fixture
def nginx() -> str:
    """nginx, for the tests behind a load balancer, or a skip saying how to get it. A
    synchronous fixture: a skip raised inside a trio test or fixture reaches pytest through
    pytest-trio, which drops its reason."""
    return nginx_binary()


@pytest.fixture
async def engine(nursery: trio.Nursery) -> TrioEngine:
    return await start_engine(nursery)


@pytest.fixture
async def frontend(nursery: trio.Nursery, engine: TrioEngine, http_server: str) -> Frontend:
    return await start_frontend(nursery, engine, server=http_server)
