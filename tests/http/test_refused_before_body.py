"""A request that will be refused is answered from its head alone, before any of its body
is read, and its connection closed (issue 27.2): no key or a wrong one, an unknown route,
a wrong method, a declared length over --max-body-mb. Before, the built-in server read up
to 1 MiB of such a body first (one Python object per chunk): ten keyless clients sending
2-byte chunks held 215 MiB, and got their 401 only when they closed."""

from __future__ import annotations

import json

import pytest
import trio

from tests.helpers.frontends import start_frontend
from tests.helpers.http import read_to_end
from tests.helpers.waiting import HANG_GUARD

KEY = "before-body-key"


@pytest.fixture
async def keyed(nursery, engine, http_server):
    return await start_frontend(
        nursery, engine, server=http_server, api_keys=[KEY], max_body_bytes=1_000_000
    )


@pytest.mark.parametrize(
    ("method", "path", "headers", "status", "code"),
    [
        ("POST", "/v1/chat/completions", "", 401, "invalid_api_key"),
        ("POST", "/v1/chat/completions", "authorization: Bearer wrong\r\n", 401, "invalid_api_key"),
        ("POST", "/v1/nowhere", f"authorization: Bearer {KEY}\r\n", 404, "not_found"),
        (
            "PUT",
            "/v1/chat/completions",
            f"authorization: Bearer {KEY}\r\n",
            405,
            "method_not_allowed",
        ),
    ],
)
async def test_a_refused_request_is_answered_while_its_chunked_body_is_still_coming(
    keyed, method, path, headers, status, code
):
    stream = await trio.open_tcp_stream(keyed.host, keyed.port)
    head = (
        f"{method} {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n{headers}"
        "transfer-encoding: chunked\r\n\r\n"
    )
    # Some of the body in 2-byte chunks, then nothing more: the answer must not wait.
    await stream.send_all(head.encode() + b"2\r\n{}\r\n" * 1000)
    with trio.fail_after(HANG_GUARD):
        data = await read_to_end(stream)  # the server answers and closes
    await stream.aclose()
    answer, _, body = data.partition(b"\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 %d" % status), answer
    if code is not None:
        assert json.loads(body)["error"]["code"] == code


async def test_a_declared_length_over_the_limit_is_413_before_the_body(keyed):
    stream = await trio.open_tcp_stream(keyed.host, keyed.port)
    head = (
        "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        f"authorization: Bearer {KEY}\r\ncontent-length: 1000001\r\n\r\n"
    )
    await stream.send_all(head.encode() + b'{"prompt": "')  # and nothing more
    with trio.fail_after(HANG_GUARD):
        data = await read_to_end(stream)
    await stream.aclose()
    answer, _, body = data.partition(b"\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 413"), answer
    assert json.loads(body)["error"]["code"] == "body_too_large"
    assert keyed.app.services.body_budget.held == 0
