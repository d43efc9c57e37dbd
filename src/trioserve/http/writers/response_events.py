"""The Responses API's typed events (``POST /v1/responses``), without I/O.

:class:`ResponseEvents` is one response as it is being generated: its state (status, its
output items so far, usage, error), the ``Response`` object that state shows
(:meth:`~ResponseEvents.snapshot`), and the typed events that tell a client how it changed,
each with its ``sequence_number``; every transport frames the same events
(``writers/responses.py``).

The event sequence of a response that completes::

    response.created  response.in_progress  response.output_item.added
    response.content_part.added  response.output_text.delta ...  response.output_text.done
    response.content_part.done  response.output_item.done  response.completed

(``response.incomplete`` instead of ``response.completed`` when the engine stopped at
``max_output_tokens``; ``response.failed`` instead of everything after the last delta when
the response ends with an error, or is cancelled.) With a parser (tool calls, reasoning),
a ``reasoning`` item (``response.reasoning_text.delta``) may come first and
``function_call`` items (``response.function_call_arguments.delta``) after the message,
each announced when it begins and done when the next begins.
"""

from __future__ import annotations

import json
import time
from typing import Any

import attrs
import orjson

from ...protocol import OutputItem, Usage
from ...text.agents import OutputParser, ReasoningDelta, TextDelta, ToolCallArguments, ToolCallStart
from ..error_bodies import openai_type
from ..errors import EngineItemError, HTTPError
from ..exchange import new_request_id
from .openai import parsed_message, text_of
from .response_items import (
    CANCELLED_CODE,
    FINAL_STATUSES,
    INCOMPLETE_REASONS,
    MESSAGE,
    REASONING,
    Event,
    FunctionCall,
    usage_object,
)
from .stream import engine_error

_json_string = json.encoder.encode_basestring_ascii


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
    #: The state of the reasoning and call items (see :meth:`ResponseEvents.mark`).
    items: Any = None


class ResponseEvents:
    """One response: its state, the ``Response`` object of that state, and its events.

    ``echo``: the request fields the ``Response`` object reports back (``instructions``,
    ``max_output_tokens``, ``temperature``, ``metadata``, ...; see
    ``bodies/responses.py``). A background response starts ``queued`` and turns
    ``in_progress`` with its first output; a foreground one starts ``in_progress``.

    ``parser`` (``text/agents``): what reads the model's text into reasoning, text and
    function calls, when the request has tools or the server a reasoning parser. Its
    output items come in the order the model writes them (a ``reasoning`` item, the
    ``message``, each ``function_call``); streamed, each of its events is rendered as it
    comes (a call's name in its ``output_item.added``, its arguments as
    ``response.function_call_arguments.delta``); a whole answer (:meth:`add_text`,
    :meth:`complete`) is read at the end as chat completions read it.
    """

    def __init__(
        self,
        response_id: str,
        model: str,
        echo: dict[str, Any],
        *,
        background: bool = False,
        parser: OutputParser | None = None,
    ) -> None:
        self.id = response_id
        self.model = model
        self.echo = echo
        self.background = background
        self.parser = parser
        self.created_at = int(time.time())
        self.message_id = f"msg_{new_request_id()}"
        self.reasoning_id = f"rs_{new_request_id()}"
        self.status = "queued" if background else "in_progress"
        #: The next event's ``sequence_number`` (events are numbered from 0).
        self.seq = 0
        #: Whether ``response.created`` has been rendered.
        self.began = False
        #: Whether the output message has been announced (``response.output_item.added``).
        self.message_open = False
        #: Whether its ``...done`` events have been rendered (a call came after it).
        self.message_closed = False
        self.parts: list[str] = []
        #: The reasoning (its parts), and whether its item is announced / done.
        self.thought: list[str] = []
        self.reasoning_open = False
        self.reasoning_closed = False
        self.calls: list[FunctionCall] = []
        #: The output items in the order they were announced.
        self.order: list[Any] = []
        #: The model's text as it came (a whole answer with a parser: read at the end).
        self.raw: list[str] = []
        #: Whitespace held ahead of the message (streamed, with a parser).
        self.blank: list[str] = []
        #: The conversation this response continues and its own input, as chat messages
        #: (media resolved): what a next turn's ``previous_response_id`` puts ahead of
        #: its input, with this response's output (:meth:`output_messages`).
        self.inputs: list[dict[str, Any]] = []
        self.usage: Usage | None = None
        self.error: dict[str, Any] | None = None
        self.incomplete_reason: str | None = None
        self.completed_at: int | None = None
        self._delta_head = b'{"type":"response.output_text.delta","sequence_number":'
        self._delta_mid = self._delta_where(0)

    def _delta_where(self, index: int) -> bytes:
        item = _json_string(self.message_id).encode()
        return b',"item_id":%s,"output_index":%d,"content_index":0,"delta":' % (item, index)

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
            "output": [self._item(entry) for entry in self.order],
            "usage": usage_object(self.usage),
            **self.echo,
        }

    def _item(self, entry: Any) -> dict[str, Any]:
        if entry == MESSAGE:
            return self._message()
        if entry == REASONING:
            return self._reasoning()
        item: dict[str, Any] = entry.item()
        return item

    def snapshot_json(self) -> bytes:
        return orjson.dumps(self.snapshot())

    def output_messages(self) -> list[dict[str, Any]]:
        """What this response answered, as the chat messages a next turn sends the
        engine (``previous_response_id``): one assistant message, with its reasoning,
        text and calls."""
        message: dict[str, Any] = {"role": "assistant", "content": self.text or None}
        if self.thought:
            message["reasoning"] = "".join(self.thought)
        if self.calls:
            message["tool_calls"] = [
                {
                    "id": call.call_id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": "".join(call.parts)},
                }
                for call in self.calls
            ]
        elif message["content"] is None:
            message["content"] = ""
        return [message]

    def _message_status(self) -> str:
        if self.status in ("queued", "in_progress"):
            return "completed" if self.message_closed else "in_progress"
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

    def _reasoning(self, *, empty: bool = False) -> dict[str, Any]:
        item: dict[str, Any] = {"id": self.reasoning_id, "type": "reasoning", "summary": []}
        if not empty:
            item["content"] = [{"type": "reasoning_text", "text": "".join(self.thought)}]
        item["status"] = "completed" if self.reasoning_closed else "in_progress"
        return item

    # -- state changes, without events (a JSON answer needs none) -------------------------

    def add_text(self, text: str) -> None:
        if self.parser is not None:
            self.raw.append(text)  # read whole (complete)
            return
        if not self.message_open:
            self.message_open = True
            self.order.append(MESSAGE)
        self.parts.append(text)

    def complete(self, finish_reason: str, usage: Usage | None) -> None:
        """The engine finished: ``completed``, or ``incomplete`` (``max_output_tokens``)."""
        parser = self.parser
        if parser is not None and not self.order and self.raw:
            self._read_whole(parser)
        if parser is not None:
            finish_reason = parser.finish_reason(finish_reason)
        if not self.message_open and not self.order:
            self.message_open = True
            self.order.append(MESSAGE)
        self.usage = usage
        self.incomplete_reason = INCOMPLETE_REASONS.get(finish_reason)
        self.status = "completed" if self.incomplete_reason is None else "incomplete"
        self.completed_at = int(time.time())
        self.reasoning_closed = self.reasoning_open
        for call in self.calls:
            call.done = True

    def _read_whole(self, parser: OutputParser) -> None:
        message, _ = parsed_message(parser, "".join(self.raw))
        self.raw = []
        if message.get("reasoning"):
            self.thought.append(message["reasoning"])
            self.reasoning_open = True
            self.order.append(REASONING)
        if message.get("content"):
            self.parts.append(message["content"])
            self.message_open = True
            self.order.append(MESSAGE)
        for call in message.get("tool_calls") or ():
            entry = FunctionCall(call["id"], call["function"]["name"])
            entry.parts.append(call["function"]["arguments"])
            self.calls.append(entry)
            self.order.append(entry)

    def mark(self) -> _Mark:
        return _Mark(
            self.seq,
            len(self.parts),
            self.status,
            self.message_open,
            self.usage,
            self.incomplete_reason,
            self.completed_at,
            (
                self.message_closed,
                len(self.thought),
                self.reasoning_open,
                self.reasoning_closed,
                [(call, len(call.parts), call.done) for call in self.calls],
                len(self.order),
                self._delta_mid,
                len(self.blank),
            ),
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
        (
            self.message_closed,
            thought,
            self.reasoning_open,
            self.reasoning_closed,
            calls,
            order,
            self._delta_mid,
            blank,
        ) = mark.items
        del self.thought[thought:]
        self.calls = [call for call, _, _ in calls]
        for call, parts, done in calls:
            del call.parts[parts:]
            call.done = done
        del self.order[order:]
        del self.blank[blank:]

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

    def _start(self, out: list[Event]) -> None:
        """The events that must precede the first output item."""
        if not self.began:
            out += self.begin()
        if self.status == "queued":
            self.status = "in_progress"
            out.append(self._lifecycle("response.in_progress"))

    def _close_current(self, out: list[Event]) -> None:
        """The ``...done`` events of the item being written, before another begins."""
        current = self.order[-1] if self.order else None
        if current == REASONING and not self.reasoning_closed:
            self._close_reasoning(out)
        elif current == MESSAGE and not self.message_closed:
            self.message_closed = True
            self._message_done(out)
        elif isinstance(current, FunctionCall) and not current.done:
            self._call_done(current, out)

    def _open(self, out: list[Event]) -> None:
        """The events that must precede the message's first text."""
        self._start(out)
        if not self.message_open:
            self._close_current(out)
            self.message_open = True
            index = len(self.order)
            self.order.append(MESSAGE)
            self._delta_mid = self._delta_where(index)
            out.append(
                self._event(
                    "response.output_item.added",
                    {"output_index": index, "item": self._message(empty=True)},
                )
            )
            out.append(
                self._event(
                    "response.content_part.added",
                    {
                        "item_id": self.message_id,
                        "output_index": index,
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

    def reasoning(self, text: str) -> list[Event]:
        """A ``response.reasoning_text.delta`` (the reasoning item opened first)."""
        out: list[Event] = []
        self._start(out)
        where = {"item_id": self.reasoning_id, "output_index": 0, "content_index": 0}
        if not self.reasoning_open:
            self.reasoning_open = True
            self.order.append(REASONING)
            where["output_index"] = len(self.order) - 1
            out.append(
                self._event(
                    "response.output_item.added",
                    {"output_index": where["output_index"], "item": self._reasoning(empty=True)},
                )
            )
            part = {"type": "reasoning_text", "text": ""}
            out.append(self._event("response.content_part.added", {**where, "part": part}))
        where["output_index"] = self.order.index(REASONING)
        self.thought.append(text)
        out.append(self._event("response.reasoning_text.delta", {**where, "delta": text}))
        return out

    def _close_reasoning(self, out: list[Event]) -> None:
        self.reasoning_closed = True
        text = "".join(self.thought)
        where = {
            "item_id": self.reasoning_id,
            "output_index": self.order.index(REASONING),
            "content_index": 0,
        }
        out.append(self._event("response.reasoning_text.done", {**where, "text": text}))
        part = {"type": "reasoning_text", "text": text}
        out.append(self._event("response.content_part.done", {**where, "part": part}))
        out.append(
            self._event(
                "response.output_item.done",
                {"output_index": where["output_index"], "item": self._reasoning()},
            )
        )

    def call_start(self, call_id: str, name: str) -> list[Event]:
        """A ``function_call`` item begins: its name is known, its arguments follow."""
        out: list[Event] = []
        self._start(out)
        self._close_current(out)
        self.blank = []
        call = FunctionCall(call_id, name)
        self.calls.append(call)
        self.order.append(call)
        out.append(
            self._event(
                "response.output_item.added",
                {"output_index": len(self.order) - 1, "item": call.item()},
            )
        )
        return out

    def call_arguments(self, text: str) -> list[Event]:
        """More of the last call's arguments (``response.function_call_arguments.delta``)."""
        call = self.calls[-1] if self.calls else None
        if call is None or call.done or not text:
            return []
        call.parts.append(text)
        where = {"item_id": call.id, "output_index": self.order.index(call)}
        return [self._event("response.function_call_arguments.delta", {**where, "delta": text})]

    def _call_done(self, call: FunctionCall, out: list[Event]) -> None:
        call.done = True
        index = self.order.index(call)
        arguments = "".join(call.parts)
        out.append(
            self._event(
                "response.function_call_arguments.done",
                {"item_id": call.id, "output_index": index, "arguments": arguments},
            )
        )
        out.append(
            self._event("response.output_item.done", {"output_index": index, "item": call.item()})
        )

    def _message_done(self, out: list[Event]) -> None:
        text = self.text
        index = self.order.index(MESSAGE)
        where = {"item_id": self.message_id, "output_index": index, "content_index": 0}
        out.append(
            self._event("response.output_text.done", {**where, "text": text, "logprobs": []})
        )
        out.append(self._event("response.content_part.done", {**where, "part": self._part(text)}))
        out.append(
            self._event(
                "response.output_item.done", {"output_index": index, "item": self._message()}
            )
        )

    def finish(self, finish_reason: str, usage: Usage | None) -> list[Event]:
        """The events that close the output and the response."""
        out: list[Event] = []
        if not self.order or (self.blank and not self.message_open and not self.calls):
            blank, self.blank = "".join(self.blank), []
            out += self.output(blank) if blank else []
            if not self.order:
                self._open(out)
        else:
            self._start(out)
        current = self.order[-1]
        self.complete(finish_reason, usage)
        if current == MESSAGE and not self.message_closed:
            self._message_done(out)
        elif current == REASONING:
            self.reasoning_closed = False
            self._close_reasoning(out)
        elif isinstance(current, FunctionCall):
            current.done = False
            self._call_done(current, out)
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
            "type": openai_type(error),
            "param": error.param,
        }
        self.usage = None
        self.incomplete_reason = None
        self.completed_at = None
        out: list[Event] = [] if self.began else self.begin()
        out.append(self._lifecycle("response.failed"))
        return out

    def _feed(self, text: str) -> list[Event]:
        """The model's ``text``: through the parser, if any."""
        parser = self.parser
        if parser is None:
            return self.output(text)
        return self._render(parser.feed(text))

    def _render(self, events: list[Any]) -> list[Event]:
        out: list[Event] = []
        for parsed in events:
            if isinstance(parsed, TextDelta):
                if not self.message_open:
                    # Whitespace ahead of a call (a newline after the reasoning) makes no
                    # message, as in a whole answer: held until text that is not.
                    self.blank.append(parsed.text)
                    if parsed.text.isspace() or not parsed.text:
                        continue
                    text, self.blank = "".join(self.blank), []
                    out += self.output(text)
                elif parsed.text:
                    out += self.output(parsed.text)
            elif isinstance(parsed, ReasoningDelta):
                if parsed.text:
                    out += self.reasoning(parsed.text)
            elif isinstance(parsed, ToolCallStart):
                out += self.call_start(parsed.id, parsed.name)
            elif isinstance(parsed, ToolCallArguments):
                out += self.call_arguments(parsed.text)
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
                    out += self._feed("".join(texts))
                return out, False, engine_error(item)
            data = item.data
            if data:
                texts.append(data if type(data) is str else text_of(data))
            if item.finish_reason is not None:
                if texts:
                    out += self._feed("".join(texts))
                if self.parser is not None:
                    out += self._render(self.parser.finish())
                out += self.finish(item.finish_reason, item.usage)
                return out, True, None
        if texts:
            out += self._feed("".join(texts))
        return out, False, None
