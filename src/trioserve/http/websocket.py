"""``GET /v1/ws``: many generation requests multiplexed on one WebSocket.

The connection is a nursery; each request on it is a child task running the same
:func:`~trioserve.http.lifecycle.run_generation` as an HTTP request (its own cancel scope,
subscription and deadline), with a :class:`WebSocketWriter` instead of an SSE one. The
reader task is the connection's disconnect watcher: when the socket closes (or fails), it
ends every request on it, each with one abort. Messages are documented in
docs/websocket.md.
"""

from __future__ import annotations

import itertools
import json
import logging
import re
from collections.abc import Mapping
from functools import partial
from sys import getsizeof
from time import perf_counter
from typing import Any

import orjson
import trio

from ..ends import EndReason
from . import error_bodies
from .admission import Slot
from .bodies.multimodal import resolve_chat_media
from .bodies.openai import ENDPOINTS, Generation, parse_generation
from .bodies.responses import ResponseGeneration, parse_response
from .channel import Receive, Send
from .errors import END_ANSWERS, GOING_AWAY, HTTPError
from .exchange import new_request_id
from .fanout import GroupHandle, WebSocketGroup, new_group
from .lifecycle import RequestHandle
from .memory import Holding, held_by
from .routes.responses import prepared
from .services import Services
from .writers.response_items import new_response_id
from .writers.responses import ResponsesWebSocketWriter
from .writers.websocket import WebSocketWriter

log = logging.getLogger("trioserve.websocket")

#: What ``"endpoint"`` may name: the OpenAI text routes, and the Responses API.
WS_ENDPOINTS = (*ENDPOINTS, "responses")

_CLIENT_ID_RE = re.compile(r"[A-Za-z0-9._:\-]{1,100}")
_connection_numbers = itertools.count(1)


def _invalid_id() -> HTTPError:
    return HTTPError(400, "id must be a string of 1-100 letters, digits or ._:-", "invalid_id")


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))


class WebSocketConnection:
    """One accepted WebSocket and the requests running on it."""

    def __init__(
        self,
        services: Services,
        receive: Receive,
        send: Send,
        *,
        key_index: int | None = None,
        subprotocol: str | None = None,
        client: tuple[str, int] | None = None,
        headers: Mapping[bytes, bytes] | None = None,
    ) -> None:
        self.services = services
        #: The client's address, the handshake's headers (a trace parent), when the
        #: socket opened and the characters sent on it (the access log, the live view).
        self.client = client
        self.headers = headers
        self.opened = perf_counter()
        self.sent = 0
        #: The API key the connection was opened with (``http/auth.py``): its requests'
        #: owner. ``subprotocol``: what the accept selects (never a key-bearing token).
        self.key_index = key_index
        self.subprotocol = subprotocol
        self.receive = receive
        self._send = send
        self.number = next(_connection_numbers)
        self.requests: dict[str, RequestHandle | GroupHandle] = {}
        #: Requests not ended yet (cancelled ones included, until their end is written).
        self.running = 0
        #: When ``running`` last fell to 0 (or the socket opened): the idle timeout's start.
        self.idle_since = trio.current_time()
        #: Request messages received (run or refused).
        self.requests_served = 0
        self._send_lock = trio.Lock()
        self._reader_scope = trio.CancelScope()
        self._idle_scope = trio.CancelScope()
        self.close_code: int | None = None
        #: The client closed the socket (or it failed): nothing more can be sent.
        self.peer_gone = False

    async def send_text(self, text: str) -> None:
        # One sender at a time, and shielded: a cancellation inside hypercorn's send would
        # leave its connection state half-updated (see Exchange._send).
        with trio.CancelScope(shield=True):
            async with self._send_lock:
                self.sent += len(text)
                await self._send({"type": "websocket.send", "text": text})

    async def send_error(self, client_id: str | None, error: HTTPError) -> None:
        payload = error_bodies.payload(error)["error"]
        await self.send_text(_dumps({"type": "error", "id": client_id, "error": payload}))

    def end(self, reason: EndReason) -> None:
        """End every request on the connection with ``reason``, then close it with the
        reason's close code (``END_ANSWERS``: 1001, going away, for the drain; else 1008).

        Only the reader is cancelled: each request ends through its own handle, so it
        still tells the client why (unless the peer is gone) before the socket closes.
        """
        if self.close_code is None:
            self.close_code = END_ANSWERS[reason].close_code
            for handle in list(self.requests.values()):
                handle.end(reason)
            self._reader_scope.cancel()

    async def serve(self) -> None:
        services = self.services
        if (await self.receive())["type"] != "websocket.connect":
            return
        if services.state.finished:
            await self._send({"type": "websocket.close", "code": GOING_AWAY})
            return
        accept: dict[str, Any] = {"type": "websocket.accept"}
        if self.subprotocol is not None:
            accept["subprotocol"] = self.subprotocol
        await self._send(accept)
        services.connections.add(self)
        try:
            async with trio.open_nursery() as nursery:
                idle_timeout = services.settings.ws_idle_timeout
                if idle_timeout > 0:
                    nursery.start_soon(self._close_when_idle, idle_timeout)
                with self._reader_scope:
                    await self._read(nursery)
                self._idle_scope.cancel()  # (the requests end by themselves)
        finally:
            services.connections.discard(self)
            if self.close_code is not None and not self.peer_gone:
                with trio.CancelScope(shield=True), trio.move_on_after(1):
                    await self._send({"type": "websocket.close", "code": self.close_code})
            services.observer.ws_socket_done(
                client=self.client,
                socket=self.number,
                status=101,
                sent=self.sent,
                arrived=self.opened,
                end="client_closed" if self.peer_gone else f"closed_{self.close_code}",
                requests=self.requests_served,
            )

    async def _close_when_idle(self, timeout: float) -> None:
        """Close the socket with 1001 once it has had no request in flight for
        ``timeout`` seconds (checked at least every quarter of it while busy)."""
        with self._idle_scope:
            await self._watch_idle(timeout)

    async def _watch_idle(self, timeout: float) -> None:
        while True:
            now = trio.current_time()
            deadline = self.idle_since + timeout
            if not self.running and now >= deadline:
                if self.close_code is None:
                    self.close_code = GOING_AWAY
                    self._reader_scope.cancel()
                return
            await trio.sleep(deadline - now if not self.running else timeout / 4)

    async def _read(self, nursery: trio.Nursery) -> None:
        """The connection's reader, and so its disconnect watcher."""
        while True:
            message = await self.receive()
            kind = message["type"]
            if kind == "websocket.disconnect":
                self.peer_gone = True
                self.end(EndReason.DISCONNECT)  # (the peer is gone: nothing is sent)
                return
            if kind != "websocket.receive":
                continue
            text = message.get("text")
            if text is None:
                await self.send_error(
                    None, HTTPError(400, "binary messages are not supported", "binary_message")
                )
                continue
            # The message as text and as parsed, in the body budget until it is handled
            # (a request's, until that request has ended: its task releases it).
            memory = Holding(self.services.body_budget)
            try:
                memory.take(getsizeof(text))
                await self._on_text(nursery, text, memory)
            except HTTPError as spent:  # the body budget (the message not even parsed)
                await self.send_error(None, spent)
            except Exception:
                # A message no check foresaw ends with an error of its own, not the socket
                # and the other requests on it (one traceback: it is a bug to fix).
                log.exception("error handling a WebSocket message; the socket goes on")
                error = HTTPError(500, "internal error handling this message", "internal_error")
                await self.send_error(None, error)
            finally:
                memory.release()

    async def _on_text(self, nursery: trio.Nursery, text: str, memory: Holding) -> None:
        try:
            message = orjson.loads(text)  # the rules of HTTP bodies (validation.parse_json)
        except orjson.JSONDecodeError as exc:
            await self.send_error(None, HTTPError(400, f"invalid JSON: {exc}", "invalid_json"))
            return
        if not isinstance(message, dict):
            await self.send_error(None, HTTPError(400, "a message must be an object", "invalid"))
            return
        kind = message.get("type")
        client_id = message.get("id")
        try:
            memory.take(held_by(message))
        except HTTPError as spent:  # the body budget: 503 body_memory_exhausted
            await self.send_error(client_id if isinstance(client_id, str) else None, spent)
            return
        if kind == "ping":
            # Echoed as sent when it is a plain value; a list or an object (any depth:
            # json.dumps of one nested 1,000 deep raised) is not an id.
            if client_id is not None and not isinstance(client_id, str | int | float):
                await self.send_error(None, _invalid_id())
                return
            await self.send_text(_dumps({"type": "pong", "id": client_id}))
            return
        if kind not in ("request", "cancel"):
            # (Named only when it is a short string: the repr of a list nested 1,000 deep
            # raises.)
            named = repr(kind) if isinstance(kind, str) and len(kind) <= 64 else "(not a name)"
            await self.send_error(
                client_id if isinstance(client_id, str) else None,
                HTTPError(
                    400,
                    f"unknown message type {named} (expected request, cancel or ping)",
                    "unknown_message_type",
                ),
            )
            return
        if not isinstance(client_id, str) or not _CLIENT_ID_RE.fullmatch(client_id):
            await self.send_error(None, _invalid_id())
            return
        if kind == "request":
            self.requests_served += 1
        if kind == "cancel":
            # The id is free at once; the request counts against the limits (this
            # connection's and the server's admission slot) until it has really ended,
            # its error written: cancels cannot stack up requests still ending.
            cancelled = self.requests.pop(client_id, None)
            if cancelled is None:
                await self.send_error(
                    client_id, HTTPError(404, f"no request {client_id!r} is running", "not_found")
                )
            else:
                cancelled.end(EndReason.CANCEL)
            return
        arrived = perf_counter()
        try:
            generation, timeout = self._prepare(client_id, message)
            slot = self.services.admission.take(self.key_index)  # released when it ends
        except HTTPError as error:
            await self.send_error(client_id, error)
            self._log_request(message, error.status, 0, arrived, None, client_id)
            return
        headers = self.headers
        traceparent = message.get("traceparent")
        if isinstance(traceparent, str):
            headers = {b"traceparent": traceparent.encode(errors="replace")}
        fields: dict[str, Any] = {
            "route": "/v1/ws",
            "transport": "ws",
            "client": self.client,
            "socket": self.number,
            "headers": headers,
            "arrived": arrived,
        }
        request_id = generation.submit.request_id
        handle: RequestHandle | GroupHandle
        if isinstance(generation, Generation) and generation.n > 1:
            # n choices: n engine requests, ended together by a cancel or the socket.
            handle = new_group(request_id, generation.choices(), owner=self.key_index, **fields)
        else:
            handle = RequestHandle(request_id, owner=self.key_index, **fields)
        self.requests[client_id] = handle
        self.running += 1
        nursery.start_soon(
            self._run, client_id, handle, slot, memory.hand_over(), generation, timeout, message
        )

    def _prepare(self, client_id: str, message: dict[str, Any]) -> Any:
        services = self.services
        services.check_accepting()
        if client_id in self.requests:
            raise HTTPError(409, f"request {client_id!r} is already running", "duplicate_id")
        if self.running >= services.settings.ws_max_requests:
            raise HTTPError(
                429,
                f"at most {services.settings.ws_max_requests} requests may run at once on one "
                "connection",
                "too_many_requests",
            )
        endpoint = message.get("endpoint", "")
        if not isinstance(endpoint, str):  # (a list or an object is not even hashable)
            endpoint = ""
        capability = ENDPOINTS.get(endpoint) if endpoint != "responses" else "chat"
        if capability is None:
            raise HTTPError(
                400,
                f"endpoint must be one of {', '.join(WS_ENDPOINTS)}",
                "invalid_endpoint",
            )
        body = message.get("body")
        if not isinstance(body, dict):
            raise HTTPError(422, "body must be an object", "invalid_request")
        timeout = services.timeout(message.get("timeout"), "timeout")
        # Unique per request, even when a client reuses an id right after a cancel, and
        # unguessable: a sequential id let anyone cancel strangers' requests by scanning
        # DELETE /v1/requests/{id}.
        request_id = f"ws-{new_request_id()}.{client_id}"
        if endpoint == "responses":
            response = parse_response(
                body, request_id, services.resolve_model, streamed=True, parsers=services.parsers
            )
            return response, timeout
        generation = parse_generation(
            capability,
            body,
            request_id,
            services.resolve_model,
            streamed=True,
            parsers=services.parsers,
        )
        return generation, timeout

    async def _run(
        self,
        client_id: str,
        handle: RequestHandle | GroupHandle,
        slot: Slot,
        memory: Holding,
        generation: Any,
        timeout: float,
        message: dict[str, Any],
    ) -> None:
        services = self.services
        writer: WebSocketWriter | ResponsesWebSocketWriter | WebSocketGroup
        if isinstance(handle, GroupHandle):
            writer = WebSocketGroup(self, client_id, generation.choice_formats(), handle)
        elif isinstance(generation, ResponseGeneration):
            keep = partial(services.responses.keep, owner=self.key_index)
            events = generation.events(new_response_id())
            writer = ResponsesWebSocketWriter(
                self, client_id, events, keep if generation.store else None
            )
        else:
            writer = WebSocketWriter(self, client_id, generation.stream_format())
        status: int | None = None
        try:
            if isinstance(generation, ResponseGeneration):
                generation = await prepared(services, generation, events, self.key_index)
            else:
                generation = await resolve_chat_media(generation, services.media_fetcher())
            # No watch of its own: the connection's reader ends its requests when the
            # socket closes.
            if isinstance(writer, WebSocketGroup):
                await writer.run(services, generation.choices(), generation.capability, timeout)
            else:
                assert isinstance(handle, RequestHandle)
                await services.generations.run(
                    handle, generation.submit, generation.capability, writer, timeout
                )
        except HTTPError as error:  # refused before it started (duplicate id, bad media)
            status = error.status
            await self.send_error(client_id, error)
        finally:
            self.running -= 1
            if not self.running:
                self.idle_since = trio.current_time()
            slot.release()
            memory.release()
            if self.requests.get(client_id) is handle:
                del self.requests[client_id]
            if status is None:
                status = writer.status or (200 if handle.completed else 499)
            self._log_request(message, status, writer.sent, handle.arrived, handle, handle.id)

    def _log_request(
        self,
        message: dict[str, Any],
        status: int,
        sent: int,
        arrived: float,
        handle: RequestHandle | GroupHandle | None,
        request_id: str,
    ) -> None:
        endpoint = message.get("endpoint")
        self.services.observer.ws_request_done(
            client=self.client,
            socket=self.number,
            endpoint=endpoint if isinstance(endpoint, str) and endpoint in WS_ENDPOINTS else "-",
            status=status,
            sent=sent,
            arrived=arrived,
            handle=handle,
            request_id=request_id,
        )
