"""trioserve's own HTTP/1.1 server at its connection limits, with small ASGI apps and raw
sockets on 127.0.0.1: past ``max_connections`` (a 503 and a close, one log line, the probes
still answered, a probe refused at once when the connections waiting to be turned away are
full) and out of file descriptors at accept (one log line, then the server recovers)."""

from __future__ import annotations

import errno
import json

import trio

from tests.helpers.http import read_to_end
from tests.helpers.http1 import get, read_responses, refusal, serve
from tests.helpers.waiting import HANG_GUARD
from trioserve.server.http1 import connection as http1_connection
from trioserve.server.http1 import serve as http1_serve


async def test_past_max_connections_a_new_connection_gets_503_and_is_closed(
    nursery, monkeypatch, caplog
):
    monkeypatch.setattr(http1_connection, "LOG_INTERVAL", 3600.0)  # the whole test in one interval
    port, _ = await serve(nursery, max_connections=2, keep_alive_timeout=3600)
    held = []
    for n in range(2):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(get(f"/held{n}"))
        await read_responses(stream, 1)
        held.append(stream)
    for _ in range(3):
        extra = await trio.open_tcp_stream("127.0.0.1", port)
        await extra.send_all(get("/extra"))
        data = b""
        with trio.fail_after(HANG_GUARD):
            while chunk := await extra.receive_some(65536):
                data += chunk
        head, error = refusal(data)
        assert head.startswith(b"HTTP/1.1 503") and error["code"] == "too_many_connections"
        assert b"\r\nretry-after: 1" in head
    # Quiet: one log line for the three refusals.
    assert len([r for r in caplog.records if "refusing connections" in r.getMessage()]) == 1
    await held[0].send_all(get("/held0-again"))  # the held ones are still served
    assert b'"/held0-again"' in await read_responses(held[0], 1)
    await held[1].aclose()
    with trio.fail_after(HANG_GUARD):  # the server notices the close, then serves a new one
        while True:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.send_all(get("/new"))
            data = await read_responses(stream, 1)
            if data.startswith(b"HTTP/1.1 200"):
                break
            await trio.sleep(0.01)


async def _hold_every_slot(port: int, count: int) -> list[trio.SocketStream]:
    held = []
    for n in range(count):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(get(f"/held{n}"))
        await read_responses(stream, 1)
        held.append(stream)
    return held


async def _answer(port: int, request: bytes) -> bytes:
    """What the server answers ``request`` on a new connection, to its close."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(request)
    with trio.fail_after(HANG_GUARD):
        return await read_to_end(stream)


async def test_past_max_connections_the_probes_are_still_answered_and_the_rest_refused(nursery):
    port, _ = await serve(
        nursery, max_connections=2, keep_alive_timeout=3600, probe_paths=frozenset({"/live"})
    )
    held = await _hold_every_slot(port, 2)
    for probe in (get("/live"), get("/live?verbose=1"), b"HEAD /live HTTP/1.1\r\nhost: x\r\n\r\n"):
        data = await _answer(port, probe)
        head, _, body = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200") and b"\r\nconnection: close" in head.lower()
        if probe.startswith(b"GET"):
            assert json.loads(body)["path"] == "/live"  # the app answered it
    # Another path, another method on the probe's path, an upgrade there: the 503.
    upgrade = (
        b"GET /live HTTP/1.1\r\nhost: x\r\nupgrade: websocket\r\nconnection: upgrade\r\n"
        b"sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\nsec-websocket-version: 13\r\n\r\n"
    )
    post = b"POST /live HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\nhi"
    for refused in (get("/other"), post, upgrade):
        head, error = refusal(await _answer(port, refused))
        assert head.startswith(b"HTTP/1.1 503") and error["code"] == "too_many_connections"
    # A connection that says nothing gets the 503 once its moment is over.
    silent = await trio.open_tcp_stream("127.0.0.1", port)
    with trio.fail_after(HANG_GUARD):
        head, error = refusal(await read_to_end(silent))
    assert head.startswith(b"HTTP/1.1 503") and error["code"] == "too_many_connections"
    await held[0].send_all(get("/held0-again"))  # the held ones are still served
    assert b'"/held0-again"' in await read_responses(held[0], 1)


async def test_past_max_connections_with_the_door_full_a_probe_gets_503_at_once(
    nursery, monkeypatch
):
    monkeypatch.setattr(http1_serve, "TURN_AWAY_LINGERING", 1)
    monkeypatch.setattr(http1_serve, "TURN_AWAY_LINGER", HANG_GUARD)
    port, _ = await serve(
        nursery, max_connections=1, keep_alive_timeout=3600, probe_paths=frozenset({"/live"})
    )
    held = await _hold_every_slot(port, 1)
    at_the_door = await trio.open_tcp_stream("127.0.0.1", port)  # silent: holds the door
    await at_the_door.send_all(b"GET /li")  # a head in part: the server waits for the rest
    head, error = refusal(await _answer(port, get("/live")))
    assert head.startswith(b"HTTP/1.1 503") and error["code"] == "too_many_connections"
    await at_the_door.send_all(b"ve HTTP/1.1\r\nhost: x\r\n\r\n")  # it is still answered
    with trio.fail_after(HANG_GUARD):
        assert (await read_to_end(at_the_door)).startswith(b"HTTP/1.1 200")
    await held[0].aclose()


async def test_accept_out_of_descriptors_logs_one_line_and_the_server_recovers(
    nursery, monkeypatch, caplog
):
    monkeypatch.setattr(http1_serve, "ACCEPT_BACKOFF", 0.001)
    monkeypatch.setattr(http1_connection, "LOG_INTERVAL", 3600.0)  # the whole test in one interval
    real_accept = trio.SocketListener.accept
    failures = {"left": 50}

    async def accept(self):
        if failures["left"]:
            failures["left"] -= 1
            await trio.lowlevel.checkpoint()
            raise OSError(errno.EMFILE, "Too many open files")
        return await real_accept(self)

    monkeypatch.setattr(trio.SocketListener, "accept", accept)
    port, _ = await serve(nursery)
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(get("/after-emfile"))
    assert b'"/after-emfile"' in await read_responses(stream, 1)
    assert failures["left"] == 0
    assert len([r for r in caplog.records if r.getMessage().startswith("accept:")]) == 1
