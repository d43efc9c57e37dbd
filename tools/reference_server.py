"""The reference frontend: the incumbent architecture, built as fast as it reasonably goes.

FastAPI on uvicorn (uvloop, httptools, no access log) in front of the same engines as
trioserve, over the same engine protocol (``trioserve.protocol``: codec and messages), with
``POST /v1/chat/completions`` answering the same bytes as trioserve for the same request id
(JSON, and SSE with ``stream_options.include_usage``); only ``created`` differs, as it is
the clock. It exists to be measured against (``tools.bench``), not deployed.

    python -m tools.reference_server --engine tcp://127.0.0.1:5555 --port 0

prints ``Running on http://127.0.0.1:PORT`` once listening (stdout and stderr);
``GET /health`` answers 200 once the engine has welcomed it.

What a competent implementation of this architecture does, and this one does:

- one asyncio DEALER client (``zmq.asyncio``) per process (``tools.reference_engine_client``):
  a single reader task decodes each frame and demultiplexes output items to per-request
  channels (a deque and a future: an ``asyncio.Queue`` does the same with more
  bookkeeping); handshake (``hello`` every 100 ms until ``welcome``), heartbeats (``ping``
  every second, engine declared lost after 3 s of silence), aborts batched per loop
  iteration and sent before any later submit;
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
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tools.reference_engine_client import APIError, Channel, EngineClient, engine_error
from trioserve.protocol import OutputItem, Submit, Usage

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
    parser = argparse.ArgumentParser(
        prog="python -m tools.reference_server", description=__doc__.split("\n\n")[0]
    )
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
