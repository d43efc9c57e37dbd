"""Anthropic's Messages API answers (``POST /v1/messages``): the ``Message`` object, and
its events as Server-Sent Events.

:class:`MessageEvents` is one message as it is being generated: its content blocks
(``text``, ``thinking``, ``tool_use``), its stop reason and usage, the ``Message`` object
that state shows (:meth:`MessageEvents.message`) and, when streamed, the events that tell
a client how it changed. A streamed message that completes::

    message_start
    content_block_start  content_block_delta ...  content_block_stop     (each block)
    message_delta (stop_reason, stop_sequence, usage)
    message_stop

with ``ping`` events while the engine has sent nothing yet (the keepalive), and an
``error`` event instead of the rest when it ends with an error after it started. As on
chat completions, the stream starts with the first output (or the first ping), so an
engine error before any output is still the response's own HTTP status, in Anthropic's
error shape.

The engines report a request's usage with its last output: ``message_start`` says 0 input
tokens, and ``message_delta`` the whole usage (Anthropic's clients take both from there).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import orjson

from ...protocol import OutputItem, Usage
from ...text.agents import (
    Event,
    OutputParser,
    ReasoningDelta,
    TextDelta,
    ToolCallArguments,
    ToolCallStart,
)
from .. import error_bodies
from ..errors import EngineItemError, HTTPError
from ..exchange import JSON_HEADERS, Exchange
from .openai import parsed_message, text_of
from .stream import SSE_HEADERS, WriterBase, end_batch, engine_error, stream_body

_json_string = json.encoder.encode_basestring_ascii

#: Anthropic's ``stop_reason`` of each engine finish reason (a call made: ``tool_use``).
STOP_REASONS = {"length": "max_tokens", "tool_calls": "tool_use", "content_filter": "refusal"}

PING = b'event: ping\ndata: {"type":"ping"}\n\n'


def usage_object(usage: Usage | None) -> dict[str, int]:
    """``usage`` in Anthropic's shape: ``input_tokens`` are those not read from the
    prefix cache (``cache_read_input_tokens``, where the engine says), as vLLM counts
    them."""
    if usage is None:
        return {"input_tokens": 0, "output_tokens": 0}
    cached = usage.cached_tokens
    out = {
        "input_tokens": max(usage.prompt_tokens - (cached or 0), 0),
        "output_tokens": usage.completion_tokens,
    }
    if cached is not None:
        out["cache_read_input_tokens"] = cached
    return out


def tool_use_id() -> str:
    """A ``tool_use`` block's id, as Anthropic spells them (``toolu_...``)."""
    return f"toolu_{uuid.uuid4().hex}"


def event(name: str, data: dict[str, Any]) -> bytes:
    """One named SSE event (its data carries the same ``type``, as Anthropic's do)."""
    return b"event: %s\ndata: %s\n\n" % (name.encode(), orjson.dumps({"type": name, **data}))


class _Block:
    """One content block: its type, and what it holds so far."""

    __slots__ = ("id", "kind", "name", "parts")

    def __init__(self, kind: str, call_id: str = "", name: str = "") -> None:
        self.kind = kind
        self.parts: list[str] = []  # text, thinking, or the tool call's JSON arguments
        self.id = call_id
        self.name = name

    def start(self) -> dict[str, Any]:
        """The block as ``content_block_start`` announces it (empty)."""
        if self.kind == "text":
            return {"type": "text", "text": ""}
        if self.kind == "thinking":
            return {"type": "thinking", "thinking": "", "signature": ""}
        return {"type": "tool_use", "id": self.id, "name": self.name, "input": {}}

    def whole(self) -> dict[str, Any]:
        text = "".join(self.parts)
        if self.kind == "text":
            return {"type": "text", "text": text}
        if self.kind == "thinking":
            # trioserve does not sign thinking: the signature is empty (and ignored
            # when a client sends the block back).
            return {"type": "thinking", "thinking": text, "signature": ""}
        try:
            arguments = json.loads(text) if text else {}
        except ValueError:
            arguments = {}  # (the tool-call parser hands over only whole calls)
        return {"type": "tool_use", "id": self.id, "name": self.name, "input": arguments}


#: The delta type and field of each block type's ``content_block_delta``.
_DELTAS = {
    "text": (b"text_delta", b"text"),
    "thinking": (b"thinking_delta", b"thinking"),
    "tool_use": (b"input_json_delta", b"partial_json"),
}


class MessageEvents:
    """One message: its state, the ``Message`` object of that state, and (``stream``)
    its events, as SSE bytes. Without ``stream`` the methods only change the state.

    ``parser`` (``text/agents``): what reads the model's text into thinking, text and
    tool calls, when the request has tools or the server a reasoning parser. Streamed,
    each of its events is rendered as it comes (a call's name in its
    ``content_block_start``, its arguments as they are generated); not streamed, the
    whole answer is read at the end as chat completions read it (a call that broke off
    leaves the answer as text, whitespace around calls is no text block)."""

    def __init__(
        self, message_id: str, model: str, *, stream: bool, parser: OutputParser | None = None
    ) -> None:
        self.id = message_id
        self.model = model
        self.stream = stream
        self.parser = parser
        #: The answer's text as the engine wrote it (not streamed, with a parser).
        self.raw: list[str] = []
        #: Whitespace held ahead of a text block (streamed, with a parser).
        self.blank: list[str] = []
        self.blocks: list[_Block] = []
        self.open: _Block | None = None
        #: Whether ``message_start`` has been rendered.
        self.began = False
        self.stop_reason: str | None = None
        self.stop_sequence: str | None = None
        self.usage: Usage | None = None

    # -- the Message object --------------------------------------------------------------

    def _object(self, content: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": self.stop_reason,
            "stop_sequence": self.stop_sequence,
            "usage": usage_object(self.usage),
        }

    def message(self) -> dict[str, Any]:
        """The ``Message`` object as of now (an empty answer is one empty text block,
        Anthropic's shape for it)."""
        content = [block.whole() for block in self.blocks] or [{"type": "text", "text": ""}]
        return self._object(content)

    # -- events --------------------------------------------------------------------------

    def begin(self) -> list[bytes]:
        """``message_start`` (once)."""
        if self.began:
            return []
        self.began = True
        return [event("message_start", {"message": self._object([])})] if self.stream else []

    def _switch(self, kind: str, call_id: str = "", name: str = "") -> list[bytes]:
        """Close the open block, open a new one of ``kind``."""
        out = self._close()
        block = _Block(kind, call_id, name)
        self.blocks.append(block)
        self.open = block
        if self.stream:
            index = len(self.blocks) - 1
            out.append(
                event("content_block_start", {"index": index, "content_block": block.start()})
            )
        return out

    def _close(self) -> list[bytes]:
        if self.open is None:
            return []
        self.open = None
        if not self.stream:
            return []
        return [event("content_block_stop", {"index": len(self.blocks) - 1})]

    def _delta(self, kind: str, text: str) -> list[bytes]:
        out = [] if self.open is not None and self.open.kind == kind else self._switch(kind)
        return self._append(out, text)

    def _append(self, out: list[bytes], text: str) -> list[bytes]:
        block = self.open
        assert block is not None
        block.parts.append(text)
        if self.stream:
            delta, field = _DELTAS[block.kind]
            out.append(
                b'event: content_block_delta\ndata: {"type":"content_block_delta","index":%d,'
                b'"delta":{"type":"%s","%s":%s}}\n\n'
                % (len(self.blocks) - 1, delta, field, _json_string(text).encode())
            )
        return out

    def text(self, text: str) -> list[bytes]:
        if not text:
            return []
        if (
            self.parser is not None
            and self.stream
            and (self.open is None or self.open.kind != "text")
        ):
            # Whitespace ahead of a call (a newline after the thinking) makes no text
            # block, as in a whole answer: held until text that is not whitespace comes.
            self.blank.append(text)
            if text.isspace():
                return []
            text, self.blank = "".join(self.blank), []
        return self._delta("text", text)

    def thinking(self, text: str) -> list[bytes]:
        return self._delta("thinking", text) if text else []

    def tool_call(self, call_id: str, name: str) -> list[bytes]:
        """A ``tool_use`` block begins (its arguments follow)."""
        self.blank = []
        return self._switch("tool_use", call_id, name)

    def tool_arguments(self, text: str) -> list[bytes]:
        """More of the open ``tool_use`` block's JSON input."""
        if not text or self.open is None or self.open.kind != "tool_use":
            return []
        return self._append([], text)

    def finish(
        self, finish_reason: str, usage: Usage | None, stop_reason: str | int | None = None
    ) -> list[bytes]:
        """The events that close the open block and the message. ``stop_reason`` is the
        engine's (vLLM's): a stop string it matched is the message's ``stop_sequence``."""
        out: list[bytes] = []
        if self.blank and not self.blocks:  # an answer of whitespace only
            blank, self.blank = "".join(self.blank), []
            out += self._delta("text", blank)
        out += self._close()
        called = any(block.kind == "tool_use" for block in self.blocks)
        reason = STOP_REASONS.get(finish_reason, "end_turn")
        if called and reason == "end_turn":
            reason = "tool_use"
        elif reason == "end_turn" and isinstance(stop_reason, str):
            # As vLLM's Messages API: a stop token's id (an int) is no stop sequence.
            reason, self.stop_sequence = "stop_sequence", stop_reason
        self.stop_reason = reason
        self.usage = usage
        if self.stream:
            delta = {"stop_reason": self.stop_reason, "stop_sequence": self.stop_sequence}
            out.append(event("message_delta", {"delta": delta, "usage": usage_object(usage)}))
            out.append(event("message_stop", {}))
        return out

    def fail(self, error: HTTPError) -> bytes:
        """The ``error`` event of a stream that ends with ``error``."""
        return event("error", {"error": error_bodies.anthropic_payload(error)["error"]})

    def _feed(self, text: str) -> list[bytes]:
        """The model's ``text``: through the parser, if any."""
        if not text:
            return []
        parser = self.parser
        if parser is None:
            return self.text(text)
        if not self.stream:
            self.raw.append(text)  # read whole at the end (:meth:`_parsed`)
            return []
        return self._render(parser.feed(text))

    def _render(self, events: list[Event]) -> list[bytes]:
        out: list[bytes] = []
        for parsed in events:
            if isinstance(parsed, TextDelta):
                out += self.text(parsed.text)
            elif isinstance(parsed, ReasoningDelta):
                out += self.thinking(parsed.text)
            elif isinstance(parsed, ToolCallStart):
                out += self.tool_call(parsed.id, parsed.name)
            elif isinstance(parsed, ToolCallArguments):
                out += self.tool_arguments(parsed.text)
            # (ToolCallEnd: the block closes with the next one, or with the message.)
        return out

    def _parsed(self) -> None:
        """The blocks of a whole answer (not streamed), read as chat completions read it."""
        assert self.parser is not None
        message, _ = parsed_message(self.parser, "".join(self.raw))
        if message.get("reasoning"):
            self.thinking(message["reasoning"])
        if message.get("content"):
            self.text(message["content"])
        for call in message.get("tool_calls") or ():
            self.tool_call(call["id"], call["function"]["name"])
            self.tool_arguments(call["function"]["arguments"])
        self._close()

    def take(self, batch: list[OutputItem]) -> tuple[list[bytes], bool, EngineItemError | None]:
        """What one batch of engine outputs renders (the deltas of each block joined),
        whether it held the last item, and the engine's error if it ended with one."""
        out: list[bytes] = []
        texts: list[str] = []
        done = False
        failure = None
        for item in batch:
            if item.error is not None:
                failure = engine_error(item)
                break
            if item.data:
                texts.append(text_of(item.data))
            if item.finish_reason is not None:
                out += self._feed("".join(texts))
                texts = []
                reason = item.finish_reason
                parser = self.parser
                if parser is not None:
                    if self.stream:
                        out += self._render(parser.finish())
                    else:
                        self._parsed()
                    reason = parser.finish_reason(reason)
                out += self.finish(reason, item.usage, item.stop_reason)
                done = True
                break
        if texts:
            out += self._feed("".join(texts))
        if out:
            out[:0] = self.begin()
        return out, done, failure


class MessagesJSONWriter(WriterBase):
    """Not streamed: the final ``Message`` object, once; an error is the request's HTTP
    error (in Anthropic's shape: the exchange's)."""

    def __init__(self, exchange: Exchange, events: MessageEvents) -> None:
        self.exchange = exchange
        self.events = events

    async def write(self, batch: list[OutputItem]) -> bool:
        _, done, failure = self.events.take(batch)
        if failure is not None:
            raise failure
        if done:
            await self.exchange.respond(200, orjson.dumps(self.events.message()), JSON_HEADERS)
        return done

    async def fail(self, error: HTTPError) -> None:
        if not self.exchange.started:
            await self.exchange.respond_error(error)


class MessagesSSEWriter(WriterBase):
    """Streamed: the events as SSE, each batch's in one write; ``ping`` as the keepalive."""

    transport = "sse"

    def __init__(self, exchange: Exchange, events: MessageEvents) -> None:
        self.exchange = exchange
        self.events = events

    def prepare(self) -> None:
        self.exchange.prepare_start(200, SSE_HEADERS)

    async def write(self, batch: list[OutputItem]) -> bool:
        out, done, failure = self.events.take(batch)
        return await end_batch(self.exchange, SSE_HEADERS, out, done, failure)

    async def keepalive(self) -> None:
        """A ``ping`` (which starts the response: an error after it is an ``error``
        event, not a status)."""
        await stream_body(self.exchange, SSE_HEADERS, b"".join([*self.events.begin(), PING]), True)

    async def fail(self, error: HTTPError) -> None:
        exchange = self.exchange
        if not exchange.started:
            await exchange.respond_error(error)
        else:
            await exchange.body(self.events.fail(error), more=False)
