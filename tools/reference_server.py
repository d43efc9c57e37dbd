"""The reference frontend: the incumbent architecture, built as fast as it reasonably goes.

FastAPI on uvicorn (uvloop, httptools, no access log) in front of the same engines as
trioserve, over the same engine protocol (``trioserve.protocol``: codec and messages), with
``POST /v1/chat/completions`` answering the same bytes as trioserve for the same request id
(JSON, and SSE with ``stream_options.include_usage``); only ``created`` differs, as it is
the clock. It exists to be measured against (``tools/bench.py``), not deployed.

    python tools/reference_server.py --engine tcp://127.0.0.1:5555 --port 0

prints ``Running on http://127.0.0.1:PORT`` once listening (stdout and stderr);
``GET /health`` answers 200 once the engine has welcomed it.

What a competent implementation of this architecture does, and this one does:

- one asyncio DEALER client (``zmq.asyncio``) per process: a single reader task decodes each
  frame and demultiplexes output items to per-request channels (a deque and a future: an
  ``asyncio.Queue`` does the same with more bookkeeping); handshake (``hello`` every 100 ms
  until ``welcome``), heartbeats (``ping`` every second, engine declared lost after 3 s of
  silence), aborts batched per loop iteration and sent before any later submit;
- the request body is read raw and parsed with orjson, then validated by a pydantic model
  (pydantic-core, in Rust); FastAPI's own body parameter would parse it with the stdlib
  ``json`` first, which is slower;
- chunks are pre-encoded around the text, as in trioserve (one C-level JSON string encode
  per event), and a batch of items waiting for a request becomes one ``yield``, so one
  socket write;
- the client going away is noticed while waiting for the first token or for a
  non-streaming answer (a task reading ``receive()`` for ``http.disconnect``, as vLLM's
  ``with_cancellation`` does), and during a stream by Starlette's own disconnect listener;
  either way the response's ``finally`` sends exactly one abort unless the engine already
  finished the request;
- a per-request bound on buffered items (``--stream-buffer``, 256 as in trioserve) ends a
  client that falls behind, and a per-request deadline (``--request-timeout``) is one timer.

Not here (not needed for the comparison): ``/v1/completions``, WebSocket, several engines,
draining, metrics.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import logging
import re
import socket
import sys
import time
import uuid
from json.encoder import encode_basestring_ascii
from typing import Any, Literal

import orjson
import uvicorn
import uvloop
import zmq
import zmq.asyncio
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from trioserve.errors import PeerProtocolError
from trioserve.protocol import (
    PROTOCOL_VERSION,
    Abort,
    Hello,
    OutputItem,
    Outputs,
    Ping,
    Pong,
    Reject,
    Submit,
    Usage,
    Welcome,
    decode,
    encode,
)

log = logging.getLogger("reference")

# -- errors ---------------------------------------------------------------------------------

_TYPES = {
    400: "invalid_request_error",
    404: "not_found_error",
    409: "invalid_request_error",
    422: "invalid_request_error",
    499: "cancelled",
    503: "overloaded_error",
    504: "timeout_error",
}


class APIError(Exception):
    def __init__(self, status: int, message: str, code: str, type: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.type = type or _TYPES.get(status) or ("server_error" if status >= 500 else "error")

    def body(self) -> bytes:
        error = {"message": self.message, "type": self.type, "code": self.code, "param": None}
        return json.dumps({"error": error}, separators=(",", ":")).encode()

    def response(self, request_id: str | None = None) -> Response:
        headers = {"x-request-id": request_id} if request_id else None
        return Response(self.body(), self.status, headers, media_type="application/json")


def engine_error(item: OutputItem) -> APIError:
    assert item.error is not None
    status = item.error.status if 400 <= item.error.status <= 599 else 500
    return APIError(
        status, item.error.message, item.error.type, _TYPES.get(status) or item.error.type
    )


# -- the engine client (asyncio, zmq.asyncio) ---------------------------------------------


class Channel:
    """One request's outputs: filled by the reader task, drained by the response."""

    __slots__ = ("_waiter", "bound", "client", "error", "items", "request_id", "state")

    def __init__(self, client: EngineClient, request_id: str, bound: int) -> None:
        self.client = client
        self.request_id = request_id
        self.bound = bound
        self.items: collections.deque[OutputItem] = collections.deque()
        self.state = "open"  # open | finished | aborted
        self.error: APIError | None = None
        self._waiter: asyncio.Future[None] | None = None

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def deliver(self, item: OutputItem) -> None:
        if len(self.items) >= self.bound:
            self.fail(APIError(503, "the client fell behind its stream buffer", "slow_client"))
            return
        self.items.append(item)
        if item.finish_reason is not None or item.error is not None:
            self.state = "finished"
            self.client.forget(self.request_id)
        self._wake()

    def fail(self, error: APIError) -> None:
        """End early with ``error`` (slow client, engine lost, deadline): one abort."""
        if self.state == "open":
            self.error = error
            self.abort()
        self._wake()

    def abort(self) -> None:
        """Idempotent; a no-op once the engine has finished the request."""
        if self.state == "open":
            self.state = "aborted"
            self.client.forget(self.request_id)
            self.client.queue_abort(self.request_id)
            self._wake()

    async def batch(self) -> list[OutputItem]:
        """Wait for at least one item and take everything waiting; [] if ended early."""
        while not self.items:
            if self.state == "aborted":
                if self.error is not None:
                    raise self.error
                return []
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        items = list(self.items)
        self.items.clear()
        return items


class EngineClient:
    """One DEALER socket to one engine: handshake, heartbeats, demultiplexing, aborts."""

    def __init__(self, address: str, heartbeat: float = 1.0, timeout: float = 3.0) -> None:
        self.address = address
        self.heartbeat = heartbeat
        self.timeout = timeout
        self.frontend_id = f"reference-{uuid.uuid4().hex[:12]}"
        self.ctx = zmq.asyncio.Context()
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.IMMEDIATE, 1)
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.setsockopt(zmq.ROUTING_ID, self.frontend_id.encode())
        sock.connect(address)
        self.sock = sock
        self.welcome: Welcome | None = None
        self.channels: dict[str, Channel] = {}
        self._aborts: list[str] = []
        self._flush_scheduled = False
        self._last_heard = 0.0
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def ready(self) -> bool:
        return self.welcome is not None

    def _send(self, frame: bytes) -> None:
        future = self.sock.send(frame, copy=False)
        if future.done():
            future.result()  # surface an immediate error
        else:
            future.add_done_callback(_log_send_error)

    def submit(self, message: Submit, bound: int) -> Channel:
        if self.welcome is None:
            raise APIError(503, "no engine is connected", "engine_unavailable")
        if message.request_id in self.channels:
            raise APIError(
                409,
                f"request id {message.request_id!r} is already in flight",
                "duplicate_request_id",
            )
        channel = Channel(self, message.request_id, bound)
        self._flush_aborts()  # an abort queued earlier must not overtake this submit
        self._send(encode(message))
        self.channels[message.request_id] = channel
        return channel

    def forget(self, request_id: str) -> None:
        self.channels.pop(request_id, None)

    def queue_abort(self, request_id: str) -> None:
        self._aborts.append(request_id)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush_aborts)

    def _flush_aborts(self) -> None:
        self._flush_scheduled = False
        if self._aborts:
            ids, self._aborts = self._aborts, []
            with contextlib.suppress(zmq.ZMQError):
                self._send(encode(Abort(ids)))

    async def _reader(self) -> None:
        sock = self.sock
        loop = asyncio.get_running_loop()
        while True:
            frames = await sock.recv_multipart(copy=True)
            if len(frames) != 1:
                continue
            try:
                message = decode(frames[0])
            except PeerProtocolError as exc:
                log.warning("dropping malformed frame: %s", exc)
                continue
            self._last_heard = loop.time()
            if type(message) is Outputs:
                channels = self.channels
                for item in message.items:
                    channel = channels.get(item.request_id)
                    if channel is not None:
                        channel.deliver(item)
            elif type(message) is Pong:
                if self.welcome is not None and message.session != self.welcome.session:
                    self._lost("the engine restarted")
            elif type(message) is Welcome:
                if message.protocol_version != PROTOCOL_VERSION:
                    log.error("engine speaks protocol %d", message.protocol_version)
                    continue
                if self.welcome is None:
                    log.info("engine %s connected", self.address)
                self.welcome = message
            elif type(message) is Reject:
                log.error("engine refused us: %s", message.message)
                self.welcome = None

    def _lost(self, why: str) -> None:
        log.warning("engine %s lost: %s", self.address, why)
        self.welcome = None
        for channel in list(self.channels.values()):
            channel.fail(APIError(503, "the engine stopped responding", "engine_lost"))

    async def _heartbeat(self) -> None:
        loop = asyncio.get_running_loop()
        hello = encode(Hello(PROTOCOL_VERSION, self.frontend_id))
        seq = 0
        due = loop.time()
        while True:
            if self.welcome is None:
                with contextlib.suppress(zmq.ZMQError):
                    self._send(hello)
                await asyncio.sleep(min(self.heartbeat, 0.1))
                continue
            now = loop.time()
            if now - self._last_heard > self.timeout:
                waiting = bool(self.sock.get(zmq.EVENTS) & zmq.POLLIN)
                log.warning(
                    "engine silent for %.1f s (heartbeat %.2f s late, input waiting: %s)",
                    now - self._last_heard,
                    now - due,
                    waiting,
                )
                self._lost(f"no message for {self.timeout:g} s")
                continue
            seq += 1
            self._send(encode(Ping(seq)))
            due = loop.time() + self.heartbeat
            await asyncio.sleep(self.heartbeat)

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._reader()), loop.create_task(self._heartbeat())]

    async def close(self) -> None:
        for channel in list(self.channels.values()):
            channel.abort()
        self._flush_aborts()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.sock.close(linger=0)
        self.ctx.term()


def _log_send_error(future: asyncio.Future[Any]) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.warning("send failed: %s", future.exception())


# -- the OpenAI chat schema (pydantic) and chunk format -----------------------------------


class StreamOptions(BaseModel):
    include_usage: bool = False


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "user", "assistant", "tool", "developer", "function"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None


class ChatCompletionRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    messages: list[ChatMessage] = Field(min_length=1)
    model: str | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    n: Literal[1] | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    user: str | None = None


_PARAMS = ("max_tokens", "temperature", "top_p", "n", "seed", "stop")


def engine_params(req: ChatCompletionRequest) -> dict[str, Any]:
    """Unknown body fields (e.g. the mock's ``mock_*`` knobs), then the validated ones."""
    params = dict(req.model_extra or {})
    for name in _PARAMS:
        value = getattr(req, name)
        if value is not None:
            params[name] = value
    if req.max_completion_tokens is not None:
        params["max_tokens"] = req.max_completion_tokens
    return params


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def _usage(usage: Usage | None) -> dict[str, int] | None:
    if usage is None:
        return None
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }


class ChatFormat:
    """Chat chunks and bodies, byte for byte as trioserve renders them."""

    __slots__ = ("_first", "_head", "_prefix", "_started", "created", "id", "model")
    _SUFFIX = b'},"logprobs":null,"finish_reason":null}]}\n\n'

    def __init__(self, request_id: str, model: str) -> None:
        self.id = f"chatcmpl-{request_id}"
        self.model = model
        self.created = int(time.time())
        head = _dumps({"id": self.id, "object": "chat.completion.chunk", "created": self.created})
        self._head = head[:-1] + b',"model":' + _dumps(model) + b',"choices":'
        self._prefix = b"data: " + self._head + b'[{"index":0,"delta":{"content":'
        self._first = b"data: " + self._head + b'[{"index":0,"delta":{"role":"assistant","content":'
        self._started = False

    def event(self, text: str) -> bytes:
        """One SSE event for a delta, framing included."""
        prefix = self._prefix if self._started else self._first
        self._started = True
        return prefix + encode_basestring_ascii(text).encode() + self._SUFFIX

    def finish(self, reason: str) -> bytes:
        choice = {"index": 0, "delta": {}, "logprobs": None, "finish_reason": reason}
        return b"data: " + self._head + _dumps([choice]) + b"}\n\n"

    def usage(self, usage: Usage | None) -> bytes:
        return b"data: " + self._head + b'[],"usage":' + _dumps(_usage(usage)) + b"}\n\n"

    def complete(self, text: str, finish_reason: str | None, usage: Usage | None) -> bytes:
        return _dumps(
            {
                "id": self.id,
                "object": "chat.completion",
                "created": self.created,
                "model": self.model,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": text},
                        "logprobs": None,
                        "finish_reason": finish_reason,
                    }
                ],
                "usage": _usage(usage),
            }
        )


def _text(data: str | bytes) -> str:
    return data if isinstance(data, str) else data.decode(errors="replace")


SSE_DONE = b"data: [DONE]\n\n"


class StreamError(Exception):
    """An engine error item, and the events of the same batch rendered before it."""

    def __init__(self, error: APIError, partial: bytes) -> None:
        super().__init__(error.message)
        self.error = error
        self.partial = partial


def render(fmt: ChatFormat, batch: list[OutputItem], include_usage: bool) -> tuple[bytes, bool]:
    """One write's worth of SSE for ``batch``; True once the stream is complete.

    Raises :class:`StreamError` for an engine error item, with what came before it.
    """
    out: list[bytes] = []
    for item in batch:
        if item.error is not None:
            raise StreamError(engine_error(item), b"".join(out))
        if item.data:
            out.append(fmt.event(_text(item.data)))
        if item.finish_reason is not None:
            out.append(fmt.finish(item.finish_reason))
            if include_usage:
                out.append(fmt.usage(item.usage))
            out.append(SSE_DONE)
            return b"".join(out), True
    return b"".join(out), False


# -- the application ------------------------------------------------------------------------

_REQUEST_ID_RE = re.compile(r"[A-Za-z0-9._:\-]{1,128}")
SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


class Settings:
    engine = "tcp://127.0.0.1:5555"
    stream_buffer = 256
    request_timeout = 600.0


settings = Settings()
engine: EngineClient | None = None


@contextlib.asynccontextmanager
async def lifespan(_app: FastAPI):  # type: ignore[no-untyped-def]
    global engine
    engine = EngineClient(settings.engine)
    engine.start()
    try:
        yield
    finally:
        await engine.close()


app = FastAPI(lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)


async def _watch_disconnect(request: Request, channel: Channel) -> None:
    receive = request.receive
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            channel.abort()
            return


class EngineStreamingResponse(StreamingResponse):
    """A StreamingResponse whose end, however it comes, aborts the engine request."""

    def __init__(self, content: Any, channel: Channel, headers: dict[str, str]) -> None:
        super().__init__(content, headers=headers, media_type="text/event-stream")
        self.channel = channel

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.channel.abort()  # no-op if the engine finished it


def _deadline(channel: Channel) -> asyncio.TimerHandle | None:
    if settings.request_timeout <= 0:
        return None
    error = APIError(
        504,
        f"the request exceeded its deadline of {settings.request_timeout:g} s",
        "deadline_exceeded",
    )
    return asyncio.get_running_loop().call_later(settings.request_timeout, channel.fail, error)


@app.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    supplied = request.headers.get("x-request-id")
    if supplied is not None and _REQUEST_ID_RE.fullmatch(supplied):
        request_id = supplied
    else:
        request_id = uuid.uuid4().hex
    raw = await request.body()
    try:
        body = orjson.loads(raw)
        if not isinstance(body, dict):
            raise ValueError("the body must be a JSON object")
        req = ChatCompletionRequest.model_validate(body)
    except ValidationError as exc:
        message = "; ".join(
            f"$.{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors(include_url=False)
        )
        return APIError(422, message, "invalid_request").response(request_id)
    except ValueError as exc:  # orjson.JSONDecodeError is one
        return APIError(422, f"$: {exc}", "invalid_request").response(request_id)
    assert engine is not None
    welcome = engine.welcome
    models = [card.id for card in welcome.models] if welcome else []
    model = req.model or (models[0] if models else "")
    if models and model not in models:
        error = APIError(404, f"model {model!r} is not served here", "model_not_found")
        return error.response(request_id)
    submit = Submit(request_id, model, "chat", {"messages": body["messages"]}, engine_params(req))
    try:
        channel = engine.submit(submit, settings.stream_buffer)
    except APIError as error:
        return error.response(request_id)
    fmt = ChatFormat(request_id, model)
    timer = _deadline(channel)
    watcher = asyncio.get_running_loop().create_task(_watch_disconnect(request, channel))
    streaming = False
    try:
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            # The response starts with the first output, so an engine error before any
            # token is the error's own status, as in trioserve.
            first, done = render(fmt, await channel.batch(), include_usage)
            if not first and channel.state == "aborted":
                return Response(status_code=499)  # the client went away
            watcher.cancel()  # from here on, Starlette's own listener watches for it
            headers = {**SSE_HEADERS, "x-request-id": request_id}
            streaming = True
            return EngineStreamingResponse(
                _sse(channel, fmt, first, done, include_usage, timer), channel, headers
            )
        parts: list[str] = []
        while True:
            batch = await channel.batch()
            if not batch:
                return Response(status_code=499)  # the client went away
            for item in batch:
                if item.error is not None:
                    return engine_error(item).response(request_id)
                if item.data:
                    parts.append(_text(item.data))
                if item.finish_reason is not None:
                    content = fmt.complete("".join(parts), item.finish_reason, item.usage)
                    return Response(
                        content, headers={"x-request-id": request_id}, media_type="application/json"
                    )
    except StreamError as error:
        return error.error.response(request_id)
    except APIError as error:
        return error.response(request_id)
    finally:
        if not watcher.done():
            watcher.cancel()
        if not streaming:
            if timer is not None:
                timer.cancel()
            channel.abort()  # a no-op when the engine finished it


async def _sse(channel, fmt, first, done, include_usage, timer):  # type: ignore[no-untyped-def]
    try:
        if first:
            yield first
        while not done:
            try:
                data, done = render(fmt, await channel.batch(), include_usage)
            except StreamError as exc:
                # A data event with an "error" object and no [DONE], as trioserve ends it.
                yield exc.partial + b"data: " + exc.error.body() + b"\n\n"
                return
            except APIError as error:  # slow client, deadline, engine lost
                yield b"data: " + error.body() + b"\n\n"
                return
            if data:
                yield data
            elif channel.state == "aborted":
                return
    finally:
        if timer is not None:
            timer.cancel()
        channel.abort()


@app.get("/health")
async def health() -> Response:
    if engine is not None and engine.ready:
        return Response(b'{"status":"ok"}', media_type="application/json")
    return Response(b'{"status":"no_engine"}', 503, media_type="application/json")


# -- main -----------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", default=settings.engine, help="ZeroMQ address of the engine")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001, help="0 picks a free port")
    parser.add_argument("--stream-buffer", type=int, default=settings.stream_buffer)
    parser.add_argument("--request-timeout", type=float, default=settings.request_timeout)
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args()
    settings.engine = args.engine
    settings.stream_buffer = args.stream_buffer
    settings.request_timeout = args.request_timeout
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    sock.set_inheritable(True)
    host, port = sock.getsockname()[:2]
    config = uvicorn.Config(
        app,
        loop="uvloop",
        http="httptools",
        lifespan="on",
        access_log=False,
        log_level=args.log_level,
        server_header=False,
        timeout_keep_alive=5,
        backlog=2048,
    )
    server = uvicorn.Server(config)
    line = f"Running on http://{host}:{port}"

    async def serve() -> None:
        task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
        while not server.started and not task.done():
            await asyncio.sleep(0.01)
        print(line, flush=True)
        print(line, file=sys.stderr, flush=True)
        await task

    uvloop.run(serve())


if __name__ == "__main__":
    main()
