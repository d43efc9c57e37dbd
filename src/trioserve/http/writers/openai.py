"""The OpenAI chunk and body formats, rendered as JSON bytes, shared by every transport.

:class:`StreamFormat` renders one request's chunk *objects*; the writers (SSE, JSON,
WebSocket) only frame them."""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import attrs

from ...protocol import OutputItem, Usage
from ...text.agents import (
    Answer,
    Event,
    ReasoningDelta,
    TextDelta,
    ToolCallArguments,
    ToolCallStart,
)
from ...text.agents.output import OutputParser

_json_string = json.encoder.encode_basestring_ascii


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def text_of(data: str | bytes) -> str:
    return data if isinstance(data, str) else data.decode(errors="replace")


def usage_dict(usage: Usage | None) -> dict[str, Any] | None:
    if usage is None:
        return None
    out: dict[str, Any] = {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
    }
    if usage.cached_tokens is not None:  # where the engine reports its prefix cache
        out["prompt_tokens_details"] = {"cached_tokens": usage.cached_tokens}
    return out


def merge_logprobs(merged: Any, piece: Any) -> Any:
    """The log probabilities of a whole answer from its deltas': chat's are a list of
    per-token entries, completions' a map of parallel lists (see docs/protocol.md)."""
    if merged is None:
        return piece
    if isinstance(merged, list) and isinstance(piece, list):
        return merged + piece
    if isinstance(merged, dict) and isinstance(piece, dict):
        keys = [*merged, *(key for key in piece if key not in merged)]
        return {key: merged.get(key, []) + piece.get(key, []) for key in keys}
    return merged  # an engine that mixed shapes: keep what was sound


@attrs.define
class TokenDetails:
    """What vLLM's server adds to an answer when asked, from the items of engines that
    have the token ids (the direct vLLM path): the answer's token ids and the prompt's
    (``return_token_ids``), the prompt's logprobs (``prompt_logprobs``)."""

    token_ids: list[int] | None = None
    prompt_token_ids: list[int] | None = None
    prompt_logprobs: list[Any] | None = None

    def add(self, item: OutputItem) -> None:
        if item.token_ids is not None:
            self.token_ids = [*(self.token_ids or ()), *item.token_ids]
        if item.prompt_token_ids is not None:
            self.prompt_token_ids = item.prompt_token_ids
        if item.prompt_logprobs is not None:
            self.prompt_logprobs = item.prompt_logprobs


class Answered(Protocol):
    """One choice's whole answer, as the writers collect it (``writers.stream.Collected``)."""

    text: list[str]
    finish_reason: str | None
    usage: Usage | None
    logprobs: Any
    details: TokenDetails | None
    stop_reason: str | int | None


class StreamFormat:
    """Renders one request's chunks and final body. Pre-encodes everything but the text.

    A delta chunk is ``prefix + json(text) + suffix``: one JSON string encode per event.
    """

    def __init__(self, kind: str, request_id: str, model: str, include_usage: bool) -> None:
        self.kind = kind  # "chat" or "completion"
        self.model = model
        self.created = int(time.time())
        self.include_usage = include_usage
        if kind == "chat":
            self.id = f"chatcmpl-{request_id}"
            self.object = "chat.completion.chunk"
        else:
            self.id = f"cmpl-{request_id}"
            self.object = "text_completion"
        # vLLM writes a completion chunk's stop_reason on every chunk (null until the
        # last), a chat chunk's on the last only.
        self._suffix = (
            b'},"logprobs":null,"finish_reason":null}]}'
            if kind == "chat"
            else b',"logprobs":null,"finish_reason":null,"stop_reason":null}]}'
        )
        #: Whether the first delta (the one that names the role) has been sent.
        self.started = False
        #: The choice these chunks are of (``n`` > 1 streams one format per choice).
        self.index = 0
        #: Whether the request asked for log probabilities: its deltas carry them, and
        #: take :meth:`delta_with_logprobs` (writers give such streams no fast path).
        self.with_logprobs = False
        #: Whether the request asked for token ids (``return_token_ids``): its deltas
        #: carry them, built whole as with logprobs.
        self.with_token_ids = False
        #: Whether the request asked for them (``return_token_ids``): a JSON answer shows
        #: the prompt's only then (a completion's echo streams them unasked, as vLLM's).
        self.returns_token_ids = False
        #: The parser of this stream's text (tool calls, reasoning), and how to make one
        #: for each choice of a whole body; None: the text is the answer as it comes.
        #: A parsed stream's deltas are built whole (no fast path either).
        self.parser: OutputParser | None = None
        self.parsers: Callable[[], OutputParser | None] | None = None

    # The pre-encoded parts of a streamed chunk, each built on first use: a non-streaming
    # answer never needs them.

    @functools.cached_property
    def _head(self) -> bytes:
        head = _dumps({"id": self.id, "object": self.object, "created": self.created})[:-1]
        return head + b',"model":' + _dumps(self.model) + b',"choices":'

    @functools.cached_property
    def _prefix(self) -> bytes:
        if self.kind == "chat":
            return self._head + b'[{"index":%d,"delta":{"content":' % self.index
        return self._head + b'[{"index":%d,"text":' % self.index

    @functools.cached_property
    def _first_prefix(self) -> bytes:
        if self.kind == "chat":
            return self._head + b'[{"index":%d,"delta":{"role":"assistant","content":' % self.index
        return self._prefix

    def prepare(self) -> None:
        """Build the parts of a streamed chunk now: called once the request is submitted,
        so that the work is done while the engine computes the first token, not on the
        way from that token to the client."""
        _ = self._first_prefix, self._prefix

    def delta(self, text: str, frame: tuple[bytes, bytes] = (b"", b"")) -> bytes:
        """A delta chunk between ``frame``'s two parts (an SSE event's, say: one join per
        token); the first one names the role (a caller whose chunk did not leave sets
        :attr:`started` back)."""
        if self.parser is not None:
            before, after = frame
            return b"".join(before + chunk + after for chunk in self.chunks(text))
        prefix = self._prefix if self.started else self._first_prefix
        self.started = True
        before, after = frame
        return b"".join((before, prefix, _json_string(text).encode(), self._suffix, after))

    def opening(self, frame: tuple[bytes, bytes] = (b"", b"")) -> bytes:
        """The chunk that opens the stream when its first output has no text yet (a
        character not yet whole, text held back while a stop string could be completing):
        the role and an empty content (chat), an empty text (completions), as vLLM's
        server sends at a request's first output, so that the client sees the answer
        begin when the engine's first token does."""
        if self.parser is not None:
            before, after = frame
            return before + self._chunk({"content": ""}, None) + after
        return self.delta("", frame)

    def item_delta(self, item: OutputItem, frame: tuple[bytes, bytes] = (b"", b"")) -> bytes:
        """The chunk of ``item``'s delta between ``frame``'s parts (a parsed stream's
        chunks, each framed): built whole with the log probabilities or token ids it
        carries, else its text, else the stream's opening if nothing has been sent
        (``b""`` for a later item without text: its finish or usage alone)."""
        if item.logprobs is not None or item.token_ids or item.prompt_token_ids:
            return self.delta_with_logprobs(text_of(item.data or ""), item.logprobs, frame, item)
        if item.data:
            return self.delta(text_of(item.data), frame)
        if not self.started:
            return self.opening(frame)
        return b""

    def chunks(self, text: str, logprobs: Any = None) -> list[bytes]:
        """The chunks of one delta of a parsed stream (none while the parser holds its
        text back), the log probabilities on the first (on an empty delta if there is
        none, as vLLM sends them)."""
        assert self.parser is not None
        deltas = event_deltas(self.parser.feed(text))
        if logprobs is not None and not deltas:
            deltas = [{}]
        return [self._chunk(delta, logprobs if i == 0 else None) for i, delta in enumerate(deltas)]

    def flush(self) -> list[bytes]:
        """The chunks of what the parser held back, at the end of the stream."""
        if self.parser is None:
            return []
        return [self._chunk(delta, None) for delta in event_deltas(self.parser.finish())]

    def _chunk(self, delta: dict[str, Any], logprobs: Any) -> bytes:
        if not self.started:
            delta = {"role": "assistant", **delta}
            self.started = True
        choice = {
            "index": self.index,
            "delta": delta,
            "logprobs": None if logprobs is None else {"content": logprobs},
            "finish_reason": None,
        }
        return self._head + _dumps([choice]) + b"}"

    def delta_with_logprobs(
        self,
        text: str,
        logprobs: Any,
        frame: tuple[bytes, bytes] = (b"", b""),
        item: OutputItem | None = None,
    ) -> bytes:
        """A delta chunk with the engine's log probabilities of its tokens (in the
        OpenAI shape of the task: see docs/protocol.md), and ``item``'s token ids where
        it has them (as vLLM streams them: the choice's ``token_ids``; the prompt's with
        the first, on the chunk for chat, on the choice for completions), built whole."""
        if self.parser is not None:
            before, after = frame
            return b"".join(before + chunk + after for chunk in self.chunks(text, logprobs))
        if self.kind == "chat":
            delta: dict[str, Any] = {"content": text}
            if not self.started:
                delta = {"role": "assistant", **delta}
            choice: dict[str, Any] = {
                "index": self.index,
                "delta": delta,
                "logprobs": None if logprobs is None else {"content": logprobs},
            }
        else:
            choice = {"index": self.index, "text": text, "logprobs": logprobs}
        choice["finish_reason"] = None
        if self.kind != "chat":
            choice["stop_reason"] = None
        head = self._head
        if item is not None:
            if item.token_ids is not None:
                choice["token_ids"] = item.token_ids
            if item.prompt_token_ids is not None:
                if self.kind == "chat":
                    head = head[: -len(b'"choices":')]
                    head += b'"prompt_token_ids":' + _dumps(item.prompt_token_ids) + b',"choices":'
                else:
                    choice["prompt_token_ids"] = item.prompt_token_ids
        self.started = True
        before, after = frame
        return b"".join((before, head, _dumps([choice]), b"}", after))

    def finish(self, reason: str, stop_reason: str | int | None = None) -> bytes:
        """The chunk that ends the stream (after :meth:`flush`'s): ``tool_calls`` is the
        reason of a stream that called tools; ``stop_reason`` is vLLM's (the stop string
        or stop token id that ended it, else null)."""
        if self.parser is not None:
            reason = self.parser.finish_reason(reason)
        choice: dict[str, Any] = {"index": self.index}
        if self.kind == "chat":
            choice["delta"] = {}
        else:
            choice["text"] = ""
        choice.update(logprobs=None, finish_reason=reason, stop_reason=stop_reason)
        return self._head + _dumps([choice]) + b"}"

    def usage(self, usage: Usage | None) -> bytes:
        return self._head + b'[],"usage":' + _dumps(usage_dict(usage)) + b"}"

    def complete_choices(self, choices: Sequence[Answered]) -> bytes:
        """The whole non-streaming body of ``n`` choices: the prompt counted once, as
        vLLM does, the completions summed."""
        first = choices[0].usage
        usage = None
        if first is not None:
            completion = sum(c.usage.completion_tokens for c in choices if c.usage is not None)
            usage = Usage(first.prompt_tokens, completion)
        out = [
            self._choice(i, "".join(c.text), c.finish_reason, c.logprobs, c.stop_reason)
            for i, c in enumerate(choices)
        ]
        extra: dict[str, Any] = {}
        for choice, answered in zip(out, choices, strict=True):
            extra = self._details(choice, answered.details)
        return self._body(out, usage, extra)

    def complete(
        self,
        text: str,
        finish_reason: str | None,
        usage: Usage | None,
        logprobs: Any = None,
        stop_reason: str | int | None = None,
        details: TokenDetails | None = None,
    ) -> bytes:
        """The whole non-streaming response body (``logprobs``: every delta's, merged
        with :func:`merge_logprobs`; ``stop_reason``: vLLM's, as in :meth:`finish`;
        ``details``: see :meth:`_details`)."""
        choice = self._choice(0, text, finish_reason, logprobs, stop_reason)
        return self._body([choice], usage, self._details(choice, details))

    def _details(self, choice: dict[str, Any], details: TokenDetails | None) -> dict[str, Any]:
        """Put what vLLM adds where it puts them: the token ids on the choice, the
        prompt's on the choice for completions; for chat, returned for the response."""
        if details is None:
            return {}
        if details.token_ids is not None:
            choice["token_ids"] = details.token_ids
        prompt = {
            "prompt_logprobs": details.prompt_logprobs,
            "prompt_token_ids": details.prompt_token_ids if self.returns_token_ids else None,
        }
        prompt = {key: value for key, value in prompt.items() if value is not None}
        if self.kind == "chat":
            return prompt
        choice.update(prompt)
        return {}

    def _choice(
        self,
        index: int,
        text: str,
        finish_reason: str | None,
        logprobs: Any,
        stop_reason: str | int | None,
    ) -> dict[str, Any]:
        if self.kind == "chat":
            parser = self.parsers() if self.parsers is not None else None
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if parser is not None:
                message, called = parsed_message(parser, text)
                if called and not parser.named and finish_reason == "stop":
                    finish_reason = "tool_calls"
            return {
                "index": index,
                "message": message,
                "logprobs": None if logprobs is None else {"content": logprobs},
                "finish_reason": finish_reason,
                "stop_reason": stop_reason,
            }
        return {
            "index": index,
            "text": text,
            "logprobs": logprobs,
            "finish_reason": finish_reason,
            "stop_reason": stop_reason,
        }

    def _body(
        self,
        choices: list[dict[str, Any]],
        usage: Usage | None,
        extra: dict[str, Any] | None = None,
    ) -> bytes:
        return _dumps(
            {
                "id": self.id,
                "object": "chat.completion" if self.kind == "chat" else "text_completion",
                "created": self.created,
                "model": self.model,
                "choices": choices,
                "usage": usage_dict(usage),
                **(extra or {}),
            }
        )


def event_deltas(events: list[Event]) -> list[dict[str, Any]]:
    """The chat ``delta`` objects of a parser's events: as few as keep their order
    (reasoning, then content, then calls), the name and the first arguments of a call
    together, as OpenAI streams them."""
    deltas: list[dict[str, Any]] = []
    delta: dict[str, Any] = {}
    for event in events:
        if isinstance(event, ReasoningDelta):
            if "content" in delta or "tool_calls" in delta:
                deltas.append(delta)
                delta = {}
            delta["reasoning"] = delta.get("reasoning", "") + event.text
        elif isinstance(event, TextDelta):
            if "tool_calls" in delta:
                deltas.append(delta)
                delta = {}
            delta["content"] = delta.get("content", "") + event.text
        elif isinstance(event, ToolCallStart):
            delta.setdefault("tool_calls", []).append(
                {
                    "index": event.index,
                    "id": event.id,
                    "type": "function",
                    "function": {"name": event.name},
                }
            )
        elif isinstance(event, ToolCallArguments):
            calls = delta.setdefault("tool_calls", [])
            if calls and calls[-1]["index"] == event.index:
                function = calls[-1]["function"]
                function["arguments"] = function.get("arguments", "") + event.text
            else:
                calls.append({"index": event.index, "function": {"arguments": event.text}})
    if delta:
        deltas.append(delta)
    return deltas


def parsed_message(parser: OutputParser, text: str) -> tuple[dict[str, Any], bool]:
    """The ``message`` of a whole answer ``text``, parsed, and whether it calls tools: as
    vLLM answers it, a call that broke off (malformed, or cut by ``max_tokens``) leaves
    the whole answer as text, and content that is only whitespace around calls is none."""
    answer = Answer()
    answer.add(parser.feed(text))
    answer.add(parser.finish())
    content = answer.text
    calls = answer.calls
    if any(not call.complete for call in calls):
        calls, content = [], "".join(parser.answer_text) or None
    if calls and content is not None and not content.strip():
        content = None
    if calls and parser.forced:
        content = content or ""  # as vLLM answers a forced call
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if parser.reasoning is not None:
        message["reasoning"] = answer.thinking
    if parser.tools is not None:
        message["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            for call in calls
        ]
    return message, bool(calls)
