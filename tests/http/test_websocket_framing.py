"""WebSocket framing a hostile client controls, on both servers (issue 27): empty
continuation frames count toward the message limit, a message in many fragments is still
one message, permessage-deflate is never negotiated (a frame would be inflated before
any size check), and while one socket floods frames another client is still served."""

from __future__ import annotations

import json
import zlib

import trio

from tests.helpers.frontends import start_frontend
from tests.helpers.http import get
from tests.helpers.websocket import CONTINUATION, TEXT, FrameReader, frame, open_raw, request
from trioserve.engine_programs.mock import expected_text
from trioserve.server.http1.websocket import max_message_fragments


async def test_empty_continuation_frames_are_bounded_and_close_1009(nursery, engine, http_server):
    frontend = await start_frontend(nursery, engine, server=http_server, ws_max_message_bytes=4096)
    stream, head = await open_raw(frontend)
    assert head.startswith(b"HTTP/1.1 101")
    fragments = max_message_fragments(4096)
    # One byte of payload in all: only the number of fragments is over the bound.
    data = frame(TEXT, b"{", fin=False) + frame(CONTINUATION, fin=False) * (fragments + 10)
    try:
        await stream.send_all(data)
    except trio.BrokenResourceError:
        pass  # closed before it took all of them: what should happen
    assert await FrameReader(stream).close_code() == 1009
    await stream.aclose()
    status, _ = await get(frontend, "/live")
    assert status == 200


async def test_a_message_in_many_fragments_within_the_bounds_is_one_message(
    nursery, engine, http_server
):
    frontend = await start_frontend(nursery, engine, server=http_server, ws_max_message_bytes=4096)
    stream, _ = await open_raw(frontend)
    text = json.dumps({"type": "ping", "id": "p"}).encode()
    pieces = [frame(TEXT, text[:1], fin=False)]
    pieces += [frame(CONTINUATION, fin=False)] * 20  # empty ones, within the bound
    pieces += [frame(CONTINUATION, bytes([b]), fin=False) for b in text[1:-1]]
    pieces.append(frame(CONTINUATION, text[-1:], fin=True))
    await stream.send_all(b"".join(pieces))
    assert await FrameReader(stream).text() == {"type": "pong", "id": "p"}
    await stream.aclose()


async def test_permessage_deflate_is_declined(frontend):
    stream, head = await open_raw(
        frontend, b"sec-websocket-extensions: permessage-deflate; client_max_window_bits"
    )
    assert head.startswith(b"HTTP/1.1 101")
    assert b"sec-websocket-extensions" not in head.lower()
    # A compressed frame (RSV1) is then a protocol error (1002), never inflated: a
    # compressed ping gets no pong.
    compressor = zlib.compressobj(wbits=-15)
    ping = compressor.compress(b'{"type":"ping","id":"z"}') + compressor.flush(zlib.Z_SYNC_FLUSH)
    await stream.send_all(frame(TEXT, ping[:-4], rsv1=True))
    assert await FrameReader(stream).close_code() == 1002
    await stream.aclose()


async def test_other_clients_are_served_while_sockets_flood_empty_frames(
    nursery, engine, http_server
):
    frontend = await start_frontend(nursery, engine, server=http_server)
    flood = frame(TEXT, b"{", fin=False) + frame(CONTINUATION, fin=False) * 2000
    done = trio.Event()

    async def flooder() -> None:
        stream, _ = await open_raw(frontend)
        try:
            while not done.is_set():
                # Each message ends within its bounds, so the socket stays open.
                await stream.send_all(flood + frame(CONTINUATION, b"}", fin=True))
        except trio.BrokenResourceError:
            pass
        finally:
            await stream.aclose()

    for _ in range(3):
        nursery.start_soon(flooder)
    await trio.sleep(0.2)
    # Another client: its /live answered, and a stream on its own socket flowing to the end.
    for _ in range(5):
        status, _ = await get(frontend, "/live")
        assert status == 200
    other, _ = await open_raw(frontend)
    await other.send_all(frame(TEXT, request("s", "still flowing", max_tokens=6).encode()))
    reader = FrameReader(other)
    messages = [await reader.text()]
    while messages[-1]["type"] not in ("done", "error"):
        messages.append(await reader.text())
    assert messages[-1]["type"] == "done"
    text = "".join(m["data"]["choices"][0]["text"] for m in messages if m["type"] == "chunk")
    assert text == expected_text("still flowing", 6)
    done.set()
    await other.aclose()
