"""The writers of the Responses API (``POST /v1/responses``): what frames its typed events.

:class:`~.response_events.ResponseEvents` is one response as it is being generated (its
state, its ``Response`` object, its typed events: ``writers/response_events.py``, from the
parts in ``writers/response_items.py``). Every
transport frames the same events:

- :class:`ResponsesSSEWriter`: ``event: <type>`` / ``data: <event>`` (a streamed request);
- :class:`ResponsesJSONWriter`: the final ``Response`` object only (no events rendered);
- :class:`ResponsesWebSocketWriter`: ``{"type": "event", "id", "data": <event>}`` on
  ``/v1/ws``;
- the response store's writer (``responses_store.RecordWriter``): retained for replay
  (background responses).

The event sequence of a response that completes::

    response.created  response.in_progress  response.output_item.added
    response.content_part.added  response.output_text.delta ...  response.output_text.done
    response.content_part.done  response.output_item.done  response.completed

(``response.incomplete`` instead of ``response.completed`` when the engine stopped at
``max_output_tokens``; ``response.failed`` instead of everything after the last delta when
the response ends with an error, or is cancelled.) A streamed request's first events leave
with its first output (or its first keepalive), so an engine error before any output is
still the response's own HTTP status, as on chat completions.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import orjson

from ...protocol import OutputItem
from ..errors import HTTPError
from ..exchange import JSON_HEADERS, Exchange
from .openai import text_of
from .response_events import ResponseEvents
from .response_items import Event, sse, usage_object
from .stream import (
    SSE_HEADERS,
    SSE_KEEPALIVE,
    WriterBase,
    end_batch,
    engine_error,
    stream_body,
)
from .websocket import MessageSink

#: Called with a response once it has finished (``store``: true keeps it).
OnDone = Callable[[ResponseEvents], None]


class ResponsesJSONWriter(WriterBase):
    """Not streamed: the final ``Response`` object, once (``completed`` or
    ``incomplete``); an error is the request's HTTP error, as on chat completions."""

    def __init__(self, exchange: Exchange, events: ResponseEvents, on_done: OnDone | None) -> None:
        self.exchange = exchange
        self.events = events
        self.on_done = on_done

    async def write(self, batch: list[OutputItem]) -> bool:
        events = self.events
        for item in batch:
            if item.error is not None:
                raise engine_error(item)
            if item.data:
                events.add_text(text_of(item.data))
            if item.finish_reason is not None:
                events.complete(item.finish_reason, item.usage)
                if self.on_done is not None:  # kept before the client can ask for it
                    self.on_done(events)
                await self.exchange.respond(200, events.snapshot_json(), JSON_HEADERS)
                return True
        return False

    async def fail(self, error: HTTPError) -> None:
        if not self.exchange.started:
            await self.exchange.respond_error(error)


class ResponsesSSEWriter(WriterBase):
    """Streamed: the typed events as SSE, each batch in one write. No ``[DONE]``: the
    stream ends after ``response.completed``, ``response.incomplete`` or
    ``response.failed``."""

    transport = "sse"

    def __init__(self, exchange: Exchange, events: ResponseEvents, on_done: OnDone | None) -> None:
        self.exchange = exchange
        self.events = events
        self.on_done = on_done

    async def write(self, batch: list[OutputItem]) -> bool:
        events, done, failure = self.events.take(batch)
        if done and self.on_done is not None:  # kept before the client can ask for it
            self.on_done(self.events)
        out = [sse(events)] if events else []
        return await end_batch(self.exchange, SSE_HEADERS, out, done, failure)

    async def keepalive(self) -> None:
        """While the engine prefills: the first keepalive sends ``response.created`` and
        ``response.in_progress`` (which start the response: an error after them is a
        ``response.failed`` event, not a status), later ones a comment line."""
        events = self.events
        data = SSE_KEEPALIVE if events.began else sse(events.begin())
        await stream_body(self.exchange, SSE_HEADERS, data, more=True)

    async def fail(self, error: HTTPError) -> None:
        exchange = self.exchange
        if not exchange.started:
            await exchange.respond_error(error)
        else:
            await exchange.body(sse(self.events.fail(error)), more=False)


class ResponsesWebSocketWriter(WriterBase):
    """On ``/v1/ws``: one ``{"type": "event", "id", "data"}`` message per typed event,
    then ``done`` (with the Responses usage), or ``response.failed`` and ``error``."""

    transport = "ws"

    def __init__(
        self,
        connection: MessageSink,
        client_id: str,
        events: ResponseEvents,
        on_done: OnDone | None,
    ) -> None:
        self.connection = connection
        self.client_id = client_id
        self.events = events
        self.on_done = on_done
        self._head = '{"type":"event","id":' + json.dumps(client_id) + ',"data":'
        #: What this request's messages came to (characters), and the status of its
        #: error message if it ended with one (the access log).
        self.sent = 0
        self.status: int | None = None

    async def _send_text(self, text: str) -> None:
        self.sent += len(text)
        await self.connection.send_text(text)

    async def _send(self, events: list[Event]) -> None:
        for _, data in events:
            await self._send_text(self._head + data.decode() + "}")

    async def write(self, batch: list[OutputItem]) -> bool:
        events, done, failure = self.events.take(batch)
        if done and self.on_done is not None:  # kept before the client can ask for it
            self.on_done(self.events)
        await self._send(events)
        if failure is not None:
            raise failure
        if done:
            done_message = {
                "type": "done",
                "id": self.client_id,
                "usage": usage_object(self.events.usage),
            }
            await self._send_text(orjson.dumps(done_message).decode())
        return done

    async def fail(self, error: HTTPError) -> None:
        self.status = error.status
        if self.connection.peer_gone:
            return
        if self.events.began:
            await self._send(self.events.fail(error))
        await self.connection.send_error(self.client_id, error)
