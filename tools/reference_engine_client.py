"""The reference frontend's engine client (``tools.reference_server`` is the frontend): one
asyncio DEALER (``zmq.asyncio``) per process whose single reader task demultiplexes output
items to per-request channels, with the handshake, heartbeats and batched aborts; and the
errors it and the frontend answer with (``APIError``, rendered as OpenAI's error body)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import uuid
from typing import Any

import zmq
import zmq.asyncio
from fastapi.responses import Response

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
