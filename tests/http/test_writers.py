"""The SSE writer's synchronous path (the socket owner writing deltas, the first one
included), against a server that takes or refuses each write at once; and end to end, a
stream whose tokens arrive one engine step at a time."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from tests.helpers.http import sse_events
from trioserve.engine_programs.mock import expected_text
from trioserve.http.channel import RequestHead
from trioserve.http.exchange import Exchange, ServerState
from trioserve.http.writers.openai import StreamFormat
from trioserve.http.writers.stream import SSE_HEADERS, SSEWriter
from trioserve.protocol import ErrorInfo, OutputItem
from trioserve.server.http1 import serve as http1_serve


class FakeServer:
    """A response channel of the built-in server's kind (writes that never wait),
    recording what it was given: the synchronous writes in ``wire``, the awaiting ones in
    ``messages`` (as ASGI messages, for reading)."""

    cancel_safe = True
    writes_now = True

    def __init__(self, *, takes_start: bool = True) -> None:
        self.takes_start = takes_start
        self.takes_body = True
        self.wire: list[tuple] = []  # ("start", status, headers, body) / ("body", body)
        self.messages: list[dict] = []  # what went the awaiting way

    def try_start(self, status: int, headers: list, body: bytes) -> bool:
        if not self.takes_start:
            return False
        self.wire.append(("start", status, headers, body))
        return True

    def try_send(self, body: bytes) -> bool:
        if not self.takes_body:
            return False
        self.wire.append(("body", body))
        return True

    def prepare_start(self, status: int, headers: list) -> None:
        pass

    async def start(self, status: int, headers: list) -> None:
        self.messages.append({"type": "http.response.start", "status": status, "headers": headers})

    async def send_body(self, data: bytes, more: bool) -> None:
        self.messages.append({"type": "http.response.body", "body": data, "more_body": more})

    def exchange(self) -> Exchange:
        head = RequestHead("POST", "/v1/chat/completions", [(b"x-request-id", b"r1")])
        return Exchange(head, self, ServerState())  # type: ignore[arg-type]


def item(seq: int, text: str | None = None, finish: str | None = None) -> OutputItem:
    return OutputItem("r1", seq, data=text, finish_reason=finish)


def chat_writer(server: FakeServer) -> tuple[Exchange, SSEWriter, Callable]:
    """An exchange on ``server``, its chat SSE writer, and the writer's sink."""
    exchange = server.exchange()
    writer = SSEWriter(exchange, StreamFormat("chat", "r1", "mock", False))
    sink = writer.sink()
    assert sink is not None
    return exchange, writer, sink


def delta_of(event: bytes) -> dict:
    assert event.startswith(b"data: ") and event.endswith(b"\n\n")
    return json.loads(event[6:])["choices"][0]["delta"]


async def test_the_first_delta_starts_the_response_from_the_sink_and_names_the_role_once():
    server = FakeServer()
    exchange, writer, sink = chat_writer(server)
    assert sink([item(0, "Hel")]) == [] and sink([item(1, "lo")]) == []
    (kind, status, headers, first), (kind2, second) = server.wire
    assert (kind, status, kind2) == ("start", 200, "body")
    assert headers == [*SSE_HEADERS, (b"x-request-id", b"r1")]
    assert exchange.started
    assert delta_of(first) == {"role": "assistant", "content": "Hel"}
    assert delta_of(second) == {"content": "lo"}
    # The last token of a started stream is left whole for the awaiting path, which
    # writes it with the finish and [DONE] in one write.
    last = item(3, "!", finish="stop")
    assert sink([last]) == [last] and len(server.wire) == 2
    assert await writer.write([last])
    assert [m["type"] for m in server.messages] == ["http.response.body"]
    body = server.messages[0]["body"]
    assert body.startswith(b"data: ") and body.endswith(b"data: [DONE]\n\n")
    assert delta_of(body.split(b"\n\n")[0] + b"\n\n") == {"content": "!"}


async def test_a_first_output_without_text_opens_the_stream_with_the_role_as_vllm_does():
    # A first token that is half a character (or text held back for a stop string): the
    # client still sees the answer begin when the engine's first token does, with the
    # role and an empty content, as vLLM's server sends it; later textless outputs send
    # nothing.
    for path in ("sink", "task"):
        server = FakeServer()
        exchange, writer, sink = chat_writer(server)
        if path == "sink":
            assert sink([item(0)]) == [] and sink([item(1)]) == []
            assert sink([item(2, "Hi")]) == []
            (_, status, _, first), (_, second) = server.wire
            assert status == 200
            events = [first, second]
        else:
            assert not await writer.write([item(0), item(1), item(2, "Hi")])
            (body,) = (m["body"] for m in server.messages if "body" in m)
            events = [e + b"\n\n" for e in body.split(b"\n\n") if e]
        assert exchange.started
        assert [delta_of(e) for e in events] == [
            {"role": "assistant", "content": ""},
            {"content": "Hi"},
        ]


async def test_a_completion_stream_opens_with_an_empty_text():
    server = FakeServer()
    exchange = server.exchange()
    writer = SSEWriter(exchange, StreamFormat("completion", "r1", "mock", False))
    assert not await writer.write([item(0), item(1, "Hi")])
    (body,) = (m["body"] for m in server.messages if "body" in m)
    texts = [json.loads(e[6:])["choices"][0]["text"] for e in body.split(b"\n\n") if e]
    assert texts == ["", "Hi"]


async def test_a_one_token_answer_starts_with_its_token_and_leaves_the_end_to_the_task():
    # The only item is also the last: its token leaves from the sink, starting the
    # response; what comes back is the same item without its text, for the awaiting path.
    server = FakeServer()
    _, writer, sink = chat_writer(server)
    only = item(0, "Hi", finish="length")
    (rest,) = sink([only])
    assert rest.data is None
    assert (rest.seq, rest.finish_reason) == (0, "length")
    ((kind, status, _, first),) = server.wire
    assert (kind, status) == ("start", 200)
    assert delta_of(first) == {"role": "assistant", "content": "Hi"}
    assert await writer.write([rest])
    (end,) = server.messages
    events = [e for e in end["body"].split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]"
    assert json.loads(events[0][6:])["choices"][0]["finish_reason"] == "length"
    assert "content" not in json.loads(events[0][6:])["choices"][0]["delta"]
    assert end["more_body"] is False


async def test_outputs_that_came_together_leave_in_one_write_up_to_the_end():
    # What one read of the engine's socket brought for a request (a frontend that fell
    # behind reads several steps at once) reaches the client in one write, its texts in
    # one delta (as vLLM's server merges a stream's waiting deltas): the first write
    # starts the response; the end, with the last token, is left for the task; an error
    # stops the sink and goes the task's way with what follows.
    server = FakeServer()
    exchange, _, sink = chat_writer(server)
    assert sink([item(0, "a"), item(1), item(2, "b")]) == []
    ((kind, status, _, body),) = server.wire
    assert (kind, status) == ("start", 200)
    events = [e + b"\n\n" for e in body.split(b"\n\n") if e]
    assert [delta_of(e) for e in events] == [{"role": "assistant", "content": "ab"}]
    last = item(5, "!", finish="stop")
    assert sink([item(3, "c"), item(4, "d"), last]) == [last]
    (_, body) = server.wire[1]
    assert [delta_of(e + b"\n\n") for e in body.split(b"\n\n") if e] == [{"content": "cd"}]
    failed = OutputItem("r1", 7, error=ErrorInfo(500, "boom"))
    assert sink([item(6, "e"), failed, item(8, "f")]) == [failed, item(8, "f")]
    assert delta_of(server.wire[2][1]) == {"content": "e"}
    assert len(server.wire) == 3 and exchange.started


async def test_deltas_the_socket_refuses_stay_whole_and_the_role_is_still_owed():
    # The response was started by a keepalive, and the socket is full when the first
    # deltas come: nothing is sent, they all go the task's way, and the first of them
    # still names the role.
    server = FakeServer()
    exchange, writer, _ = chat_writer(server)
    await writer.keepalive()
    server.takes_body = False
    sink = writer.sink()
    assert sink is not None
    batch = [item(0, "Hel"), item(1, "lo")]
    assert sink(batch) == batch and exchange.started
    assert not await writer.write(batch)
    events = [e + b"\n\n" for e in server.messages[-1]["body"].split(b"\n\n") if e]
    assert [delta_of(e) for e in events] == [
        {"role": "assistant", "content": "Hel"},
        {"content": "lo"},
    ]


async def test_an_answer_ending_before_any_token_is_left_whole_to_the_task():
    server = FakeServer()
    exchange, _, sink = chat_writer(server)
    empty = item(0, finish="stop")
    assert sink([empty]) == [empty]
    assert server.wire == [] and not exchange.started


class PreparingServer(FakeServer):
    """... which also frames a start ahead (``prepare``), as trioserve's server does."""

    def __init__(self) -> None:
        super().__init__()
        self.prepared: list[dict] = []

    def prepare_start(self, status: int, headers: list) -> None:
        self.prepared.append({"status": status, "headers": headers})


async def test_the_response_start_is_built_before_the_first_token_and_again_if_a_drain_began():
    for drain in (False, True):
        server = PreparingServer()
        exchange = server.exchange()
        writer = SSEWriter(exchange, StreamFormat("chat", "r1", "mock", False))
        writer.prepare()  # while the engine works
        (prepared,) = server.prepared
        if drain:
            exchange.state.closing = True
        sink = writer.sink()
        assert sink is not None and sink([item(0, "Hi")]) == []
        ((_, status, headers, _),) = server.wire
        assert status == 200
        if drain:  # built again: the head now says close
            assert headers[-1] == (b"connection", b"close")
            assert headers[:-1] == prepared["headers"]
        else:  # the very message the server framed ahead
            assert headers is prepared["headers"]
            assert (b"connection", b"close") not in headers


async def test_a_first_delta_the_server_cannot_take_at_once_keeps_its_role():
    # The socket is full: nothing is sent, and the item goes the awaiting way, where it
    # must still be the first delta, the one that names the role.
    server = FakeServer(takes_start=False)
    exchange, writer, sink = chat_writer(server)
    first = item(1, "Hel")
    assert sink([first]) == [first]
    assert not exchange.started and server.wire == []
    assert not await writer.write([item(1, "Hel")])
    start, body = server.messages
    assert start["type"] == "http.response.start" and start["status"] == 200
    assert delta_of(body["body"]) == {"role": "assistant", "content": "Hel"}


async def test_without_the_servers_synchronous_start_the_first_delta_waits_for_the_task():
    server = FakeServer()
    server.writes_now = False  # hypercorn's channel: every write awaits
    exchange = server.exchange()
    writer = SSEWriter(exchange, StreamFormat("chat", "r1", "mock", False))
    assert writer.sink() is None


@pytest.mark.parametrize("tokens", [1, 6])
@pytest.mark.parametrize("kind", ["chat", "completion"])
async def test_a_stream_whose_tokens_come_one_step_at_a_time(
    frontend, http_server, kind, tokens, monkeypatch
):
    # One token per engine step: every delta reaches the client through the synchronous
    # path on trioserve's server (the first one starting the response, even when it is
    # also the last), through the relay task on hypercorn. Same bytes either way.
    starts = []
    original = http1_serve.HttpExchange.try_start

    def counting(self, status, headers, body):
        starts.append(body)
        return original(self, status, headers, body)

    monkeypatch.setattr(http1_serve.HttpExchange, "try_start", counting)
    params = {"max_tokens": tokens, "stream": True, "mock_tokens_per_second": 200}
    if kind == "chat":
        url, body = "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}
    else:
        url, body = "/v1/completions", {"prompt": "hi"}
    async with frontend.client() as client:
        response = await client.post(url, json={**body, **params})
        # The connection serves the next request: the stream's framing was whole.
        again = await client.post(url, json={**body, **params})
    for r in (response, again):
        assert r.status_code == 200
        assert r.headers["content-type"] == "text/event-stream; charset=utf-8"
        assert r.headers["x-accel-buffering"] == "no"
        assert r.headers["x-request-id"]
        events = sse_events(r.text)
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        # The tokens and the finish: a token an event, unless the frontend was kept off
        # the CPU for a step (the outputs one read brings leave as one delta).
        assert 2 <= len(chunks) <= tokens + 1
        if kind == "chat":
            deltas = [c["choices"][0]["delta"] for c in chunks]
            assert deltas[0]["role"] == "assistant"
            assert all("role" not in d for d in deltas[1:])
            text = "".join(d.get("content", "") for d in deltas)
        else:
            text = "".join(c["choices"][0]["text"] for c in chunks)
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert text == expected_text("hi", tokens)
    # On trioserve's server both responses were started by their first token's sink.
    assert len(starts) == (2 if http_server == "builtin" else 0)


@pytest.mark.parametrize("text", ["hi", "é ü", 'a"b\\c', "line\nbreak\t", "\x00\x1f", "😀", ""])
def test_a_delta_carries_any_text_exactly_as_json_dumps_escapes_it(text):
    fmt = StreamFormat("chat", "r1", "mock", False)
    chunk = fmt.delta(text)
    assert json.loads(chunk)["choices"][0]["delta"]["content"] == text
    assert json.dumps(text).encode() in chunk  # ASCII-only, as the reference sends it
    assert chunk.isascii()
