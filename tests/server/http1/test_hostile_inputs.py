"""Hostile inputs against the running frontend (the built-in server, the mock engine), over
real sockets: each gets its clear answer and the server goes on serving everyone else.

The inputs of issue 17 (and of the shared hostile-input smoke), one test each; the
server's own bounds in isolation are in test_serve.py.
"""

from __future__ import annotations

import json

import pytest
import trio

from tests.helpers.frontends import Frontend, start_engine, start_frontend
from tests.helpers.http import read_to_end
from tests.helpers.waiting import HANG_GUARD

KEY = b"AQIDBAUGBwgJCgsMDQ4PEA=="


async def exchange(frontend: Frontend, data: bytes) -> bytes:
    """Send ``data`` on a new connection; everything the server sends until it closes."""
    stream = await trio.open_tcp_stream(frontend.host, frontend.port)
    try:
        await stream.send_all(data)
    except trio.BrokenResourceError:
        pass  # the server answered and closed before taking all of it
    with trio.fail_after(HANG_GUARD):
        received = await read_to_end(stream)
    await stream.aclose()
    return received


def answer(data: bytes) -> tuple[int, bytes, dict]:
    """The status, the head and the JSON body of one response."""
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), head.lower(), json.loads(body)


async def assert_serving(frontend: Frontend) -> None:
    """The server still answers a normal request."""
    data = await exchange(frontend, b"GET /live HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
    assert data.startswith(b"HTTP/1.1 200"), data[:100]


def upgrade(*headers: bytes, version: bytes = b"1.1") -> bytes:
    return (
        b"GET /v1/ws HTTP/%s\r\nhost: x\r\nupgrade: websocket\r\nconnection: Upgrade\r\n" % version
        + b"".join(h + b"\r\n" for h in headers)
        + b"\r\n"
    )


@pytest.mark.parametrize(
    ("request_bytes", "status", "code"),
    [
        (upgrade(), 400, "invalid_websocket_handshake"),  # neither key nor version
        (upgrade(b"sec-websocket-version: 13"), 400, "invalid_websocket_handshake"),
        (upgrade(b"sec-websocket-key: " + KEY), 400, "invalid_websocket_handshake"),
        (
            upgrade(b"sec-websocket-key: not base64!", b"sec-websocket-version: 13"),
            400,
            "invalid_websocket_handshake",
        ),
        (
            upgrade(b"sec-websocket-key: AAAA", b"sec-websocket-version: 13"),
            400,
            "invalid_websocket_handshake",
        ),
        (
            upgrade(b"sec-websocket-key: " + KEY, b"sec-websocket-key: " + KEY)
            + b"sec-websocket-version: 13\r\n",
            400,
            "invalid_websocket_handshake",
        ),
        (
            upgrade(b"sec-websocket-key: " + KEY, b"sec-websocket-version: 13", version=b"1.0"),
            400,
            "invalid_websocket_handshake",
        ),
        (
            upgrade(b"sec-websocket-key: " + KEY, b"sec-websocket-version: 8"),
            426,
            "unsupported_websocket_version",
        ),
    ],
    ids=["no-key-no-version", "no-key", "no-version", "key-not-base64", "key-too-short",
         "two-keys", "http-1.0", "version-8"],
)  # fmt: skip
async def test_a_websocket_handshake_wsproto_cannot_take_is_refused_and_the_server_goes_on(
    frontend, request_bytes, status, code
):
    data = await exchange(frontend, request_bytes)
    got, head, body = answer(data)
    assert (got, body["error"]["code"]) == (status, code), data
    assert body["error"]["type"] == "invalid_request_error" and body["error"]["message"]
    assert b"connection: close" in head
    if status == 426:  # RFC 6455 section 4.4: the versions the server speaks
        assert b"\r\nsec-websocket-version: 13" in head
    await assert_serving(frontend)


async def test_a_chunk_size_that_is_not_hex_is_400_and_the_server_goes_on(frontend):
    data = await exchange(
        frontend,
        b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n"
        b"zz\r\nab\r\n0\r\n\r\n",
    )
    status, _, body = answer(data)
    assert (status, body["error"]["code"]) == (400, "bad_request")
    await assert_serving(frontend)


@pytest.mark.parametrize(
    ("hosts", "version", "status"),
    [(200, b"1.1", 400), (2, b"1.1", 400), (0, b"1.1", 400), (2, b"1.0", 400), (0, b"1.0", 200)],
)
async def test_host_headers_follow_h11s_rules(frontend, hosts, version, status):
    # RFC 9112 section 3.2: exactly one Host on HTTP/1.1, never two.
    data = await exchange(
        frontend, b"GET /live HTTP/%s\r\n%s\r\n" % (version, b"host: x\r\n" * hosts)
    )
    assert answer(data)[0] == status, data[:200]
    await assert_serving(frontend)


@pytest.mark.parametrize("version", [b"2.0", b"0.9"])
async def test_a_request_line_of_another_http_version_is_505(frontend, version):
    data = await exchange(frontend, b"GET /live HTTP/%s\r\nhost: x\r\n\r\n" % version)
    status, head, body = answer(data)
    assert (status, body["error"]["code"]) == (505, "bad_request")
    assert b"connection: close" in head
    await assert_serving(frontend)


async def test_deeply_nested_json_is_a_4xx_and_the_server_goes_on(frontend):
    body = b"[" * 200_000
    data = await exchange(
        frontend,
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body),
    )
    assert 400 <= answer(data)[0] < 500, data[:200]
    await assert_serving(frontend)


async def test_multipart_without_a_boundary_is_400_and_the_server_goes_on(frontend):
    data = await exchange(
        frontend,
        b"POST /generate HTTP/1.1\r\nhost: x\r\ncontent-type: multipart/form-data\r\n"
        b"content-length: 6\r\nconnection: close\r\n\r\n--\r\n--",
    )
    status, _, body = answer(data)
    assert (status, body["code"]) == (400, "invalid_form")
    await assert_serving(frontend)


async def test_slow_bodies_hold_no_admission_slot_and_end_with_408(nursery):
    # Issue 17's attack at a small scale: more clients than admission slots, each
    # declaring a body and sending it a byte at a time (never stalling long enough for
    # --body-timeout). They hold connections, not slots: a normal request is served
    # meanwhile, and the total deadline ends them.
    engine = await start_engine(nursery)
    frontend = await start_frontend(
        nursery, engine, server="builtin", max_concurrent_requests=2, body_deadline=2.0
    )
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: 100000\r\n\r\n{"
    )
    answers: list[bytes] = []

    async def slow_client() -> None:
        stream = await trio.open_tcp_stream(frontend.host, frontend.port)
        await stream.send_all(head)
        received = b""
        with trio.fail_after(HANG_GUARD):
            async with trio.open_nursery() as trickle:

                async def drip() -> None:
                    while True:
                        await trio.sleep(0.05)
                        await stream.send_all(b" ")

                trickle.start_soon(drip)
                while chunk := await stream.receive_some(65536):
                    received += chunk
                trickle.cancel_scope.cancel()
        answers.append(received)

    async with trio.open_nursery() as clients:
        for _ in range(3):
            clients.start_soon(slow_client)
        # Let the server see their heads (on a server that admits them at once, they
        # would now hold both slots).
        await trio.sleep(0.3)
        async with frontend.client() as client:
            response = await client.post("/v1/completions", json={"prompt": "p", "max_tokens": 2})
            assert response.status_code == 200, response.text
    for data in answers:
        status, _, body = answer(data)
        assert (status, body["error"]["code"]) == (408, "body_timeout")
    assert frontend.app.services.admission.in_use == 0
