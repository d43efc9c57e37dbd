"""The Responses API's typed events (``POST /v1/responses``) and the writers that frame them.

:class:`ResponseEvents` is one response as it is being generated: its state (status, the
text so far, usage, error), the ``Response`` object that state shows (:meth:`snapshot`),
and the typed events that tell a client how it changed, each with its
``sequence_number``. Every transport frames the same events:

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
import time
from collections.abc import Callable
from typing import Any

import attrs
import orjson

from ...errors import EngineItemError, HTTPError
from ...protocol import OutputItem, Usage
from ..exchange import JSON_HEADERS, Exchange, new_request_id
from .stream import (
    SSE_HEADERS,
    SSE_KEEPALIVE,
    WriterBase,
    end_batch,
    engine_error,
    stream_body,
    text_of,
)
from .websocket import MessageSink

#: One typed event: its ``type`` and the event object as JSON.
Event = tuple[str, bytes]

#: Statuses a response never leaves.
FINAL_STATUSES = frozenset({"completed", "incomplete", "failed", "cancelled"})
#: Engine finish reasons that make a response ``incomplete``, and the reason it reports.
INCOMPLETE_REASONS = {"length": "max_output_tokens", "content_filter": "content_filter"}
#: The error code of a cancelled request (``lifecycle._END_ERRORS``): its response is
#: ``cancelled``, not ``failed``.
CANCELLED_CODE = "request_cancelled"

_json_string = json.encoder.encode_basestring_ascii


def new_response_id() -> str:
    """A response id: ``resp_`` and 32 random hex digits. It encodes nothing (not the
    frontend, not the engine): see docs/api.md on routing ``GET /v1/responses/{id}``."""
    return f"resp_{new_request_id()}"


def usage_object(usage: Usage | None) -> dict[str, Any] | None:
    """``usage`` in the Responses API's shape."""
    if usage is None:
        return None
    return {
        "input_tokens": usage.prompt_tokens,
        # (0 where the engine does not say: the field is not optional in this API.)
        "input_tokens_details": {
            "cached_tokens": usage.cached_tokens or 0,
            "cache_write_tokens": 0,
        },
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.total_tokens,
    }


def sse(events: list[Event]) -> bytes:
    """``events`` as Server-Sent Events, each named by its type."""
    return b"".join(b"event: %s\ndata: %s\n\n" % (name.encode(), data) for name, data in events)


@attrs.define
class _Mark:
    """What :meth:`ResponseEvents.rollback` restores."""

    seq: int
    parts: int
    status: str
    message_open: bool
    usage: Usage | None
    incomplete_reason: str | None
    completed_at: int | None


class ResponseEvents:
    """One response: its state, the ``Response`` object of that state, and its events.

    ``echo``: the request fields the ``Response`` object reports back (``instructions``,
    ``max_output_tokens``, ``temperature``, ``metadata``, ...; see
    ``bodies/responses.py``). A background response starts ``queued`` and turns
    ``in_progress`` with its first output; a foreground one starts ``in_progress``.
    """

    def __init__(
        self, response_id: str, model: str, echo: dict[str, Any], *, background: bool = False
    ) -> None:
        self.id = response_id
        self.model = model
        self.echo = echo
        self.background = background
        self.created_at = int(time.time())
        self.message_id = f"msg_{new_request_id()}"
        self.status = "queued" if background else "in_progress"
        #: The next event's ``sequence_number`` (events are numbered from 0).
        self.seq = 0
        #: Whether ``response.created`` has been rendered.
        self.began = False
        #: Whether the output message has been announced (``response.output_item.added``).
        self.message_open = False
        self.parts: list[str] = []
        self.usage: Usage | None = None
        self.error: dict[str, Any] | None = None
        self.incomplete_reason: str | None = None
        self.completed_at: int | None = None
        item = _json_string(self.message_id)
        self._delta_head = b'{"type":"response.output_text.delta","sequence_number":'
        self._delta_mid = (
            b',"item_id":' + item.encode() + b',"output_index":0,"content_index":0,"delta":'
        )

    @property
    def finished(self) -> bool:
        return self.status in FINAL_STATUSES

    @property
    def text(self) -> str:
        return "".join(self.parts)

    # -- the Response object -------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """The ``Response`` object as of now."""
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": self.status,
            "background": self.background,
            "completed_at": self.completed_at,
            "error": self.error,
            "incomplete_details": (
                None if self.incomplete_reason is None else {"reason": self.incomplete_reason}
            ),
            "model": self.model,
            "output": [self._message()] if self.message_open else [],
            "usage": usage_object(self.usage),
            **self.echo,
        }

    def snapshot_json(self) -> bytes:
        return orjson.dumps(self.snapshot())

    def _message_status(self) -> str:
        if self.status in ("queued", "in_progress"):
            return "in_progress"
        return "completed" if self.status == "completed" else "incomplete"

    def _part(self, text: str) -> dict[str, Any]:
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}

    def _message(self, *, empty: bool = False) -> dict[str, Any]:
        return {
            "id": self.message_id,
            "type": "message",
            "status": self._message_status(),
            "role": "assistant",
            "content": [] if empty else [self._part(self.text)],
        }

    # -- state changes, without events (a JSON answer needs none) -------------------------

    def add_text(self, text: str) -> None:
        self.message_open = True
        self.parts.append(text)

    def complete(self, finish_reason: str, usage: Usage | None) -> None:
        """The engine finished: ``completed``, or ``incomplete`` (``max_output_tokens``)."""
        self.message_open = True
        self.usage = usage
        self.incomplete_reason = INCOMPLETE_REASONS.get(finish_reason)
        self.status = "completed" if self.incomplete_reason is None else "incomplete"
        self.completed_at = int(time.time())

    def mark(self) -> _Mark:
        return _Mark(
            self.seq,
            len(self.parts),
            self.status,
            self.message_open,
            self.usage,
            self.incomplete_reason,
            self.completed_at,
        )

    def rollback(self, mark: _Mark) -> None:
        """Forget what was rendered since ``mark`` (its events were not kept)."""
        self.seq = mark.seq
        del self.parts[mark.parts :]
        self.status = mark.status
        self.message_open = mark.message_open
        self.usage = mark.usage
        self.incomplete_reason = mark.incomplete_reason
        self.completed_at = mark.completed_at

    # -- events --------------------------------------------------------------------------

    def _event(self, kind: str, fields: dict[str, Any]) -> Event:
        event = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return kind, orjson.dumps(event)

    def _lifecycle(self, kind: str) -> Event:
        return self._event(kind, {"response": self.snapshot()})

    def begin(self) -> list[Event]:
        """``response.created`` (and ``response.in_progress`` unless queued)."""
        self.began = True
        out = [self._lifecycle("response.created")]
        if self.status == "in_progress":
            out.append(self._lifecycle("response.in_progress"))
        return out

    def _open(self, out: list[Event]) -> None:
        """The events that must precede the first output."""
        if not self.began:
            out += self.begin()
        if self.status == "queued":
            self.status = "in_progress"
            out.append(self._lifecycle("response.in_progress"))
        if not self.message_open:
            self.message_open = True
            out.append(
                self._event(
                    "response.output_item.added",
                    {"output_index": 0, "item": self._message(empty=True)},
                )
            )
            out.append(
                self._event(
                    "response.content_part.added",
                    {
                        "item_id": self.message_id,
                        "output_index": 0,
                        "content_index": 0,
                        "part": self._part(""),
                    },
                )
            )

    def output(self, text: str) -> list[Event]:
        """A ``response.output_text.delta`` of ``text`` (after what must precede it)."""
        out: list[Event] = []
        self._open(out)
        self.parts.append(text)
        seq = self.seq
        self.seq += 1
        data = b"".join(
            (
                self._delta_head,
                b"%d" % seq,
                self._delta_mid,
                _json_string(text).encode(),
                b',"logprobs":[]}',
            )
        )
        out.append(("response.output_text.delta", data))
        return out

    def finish(self, finish_reason: str, usage: Usage | None) -> list[Event]:
        """The events that close the output and the response."""
        out: list[Event] = []
        self._open(out)
        self.complete(finish_reason, usage)
        text = self.text
        where = {"item_id": self.message_id, "output_index": 0, "content_index": 0}
        out.append(
            self._event("response.output_text.done", {**where, "text": text, "logprobs": []})
        )
        out.append(self._event("response.content_part.done", {**where, "part": self._part(text)}))
        out.append(
            self._event("response.output_item.done", {"output_index": 0, "item": self._message()})
        )
        kind = "response.completed" if self.status == "completed" else "response.incomplete"
        out.append(self._lifecycle(kind))
        return out

    def fail(self, error: HTTPError) -> list[Event]:
        """``response.failed``: the response ended with ``error`` (``cancelled`` when
        that is a cancel), and ``response.created`` before it if nothing was sent yet."""
        self.status = "cancelled" if error.code == CANCELLED_CODE else "failed"
        # The error object of every other answer (docs/api.md), without details.
        self.error = {
            "code": error.code,
            "message": error.message,
            "type": error.type,
            "param": error.param,
        }
        self.usage = None
        self.incomplete_reason = None
        self.completed_at = None
        out: list[Event] = [] if self.began else self.begin()
        out.append(self._lifecycle("response.failed"))
        return out

    def take(self, batch: list[OutputItem]) -> tuple[list[Event], bool, EngineItemError | None]:
        """The events of one batch of engine outputs (its deltas as one
        ``response.output_text.delta``: everything that was waiting, at once), whether it
        held the last item, and the engine's error if it ended with one (the events of
        the outputs ahead of it come first)."""
        out: list[Event] = []
        texts: list[str] = []
        for item in batch:
            if item.error is not None:
                if texts:
                    out += self.output("".join(texts))
                return out, False, engine_error(item)
            data = item.data
            if data:
                texts.append(data if type(data) is str else text_of(data))
            if item.finish_reason is not None:
                if texts:
                    out += self.output("".join(texts))
                out += self.finish(item.finish_reason, item.usage)
                return out, True, None
        if texts:
            out += self.output("".join(texts))
        return out, False, None


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
