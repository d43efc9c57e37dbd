"""The OpenAI chunk and body formats, rendered as JSON bytes, shared by every transport.

:class:`StreamFormat` renders one request's chunk *objects*; the writers (SSE, JSON,
WebSocket) only frame them."""

from __future__ import annotations

import functools
import json
import time
from typing import Any

from ...protocol import Usage

_json_string = json.encoder.encode_basestring_ascii


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


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
        self._suffix = (
            b'},"logprobs":null,"finish_reason":null}]}'
            if kind == "chat"
            else b',"logprobs":null,"finish_reason":null}]}'
        )
        #: Whether the first delta (the one that names the role) has been sent.
        self.started = False
        #: The choice these chunks are of (``n`` > 1 streams one format per choice).
        self.index = 0
        #: Whether the request asked for log probabilities: its deltas carry them, and
        #: take :meth:`delta_with_logprobs` (writers give such streams no fast path).
        self.with_logprobs = False

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
        prefix = self._prefix if self.started else self._first_prefix
        self.started = True
        before, after = frame
        return b"".join((before, prefix, _json_string(text).encode(), self._suffix, after))

    def delta_with_logprobs(
        self, text: str, logprobs: Any, frame: tuple[bytes, bytes] = (b"", b"")
    ) -> bytes:
        """A delta chunk with the engine's log probabilities of its tokens (in the
        OpenAI shape of the task: see docs/protocol.md), built whole."""
        if self.kind == "chat":
            delta: dict[str, Any] = {"content": text}
            if not self.started:
                delta = {"role": "assistant", **delta}
            choice: dict[str, Any] = {
                "index": self.index,
                "delta": delta,
                "logprobs": {"content": logprobs},
            }
        else:
            choice = {"index": self.index, "text": text, "logprobs": logprobs}
        choice["finish_reason"] = None
        self.started = True
        before, after = frame
        return b"".join((before, self._head, _dumps([choice]), b"}", after))

    def finish(self, reason: str) -> bytes:
        if self.kind == "chat":
            choice = {"index": self.index, "delta": {}, "logprobs": None, "finish_reason": reason}
        else:
            choice = {"index": self.index, "text": "", "logprobs": None, "finish_reason": reason}
        return self._head + _dumps([choice]) + b"}"

    def usage(self, usage: Usage | None) -> bytes:
        return self._head + b'[],"usage":' + _dumps(usage_dict(usage)) + b"}"

    def complete_choices(self, choices: list[tuple[str, str | None, Usage | None]]) -> bytes:
        """The whole non-streaming body of ``n`` choices, each (text, finish reason,
        usage): the prompt counted once, as vLLM does, the completions summed."""
        first = choices[0][2]
        usage = None
        if first is not None:
            completion = sum(u.completion_tokens for _, _, u in choices if u is not None)
            usage = Usage(first.prompt_tokens, completion)
        return self._body(
            [self._choice(i, text, finish, None) for i, (text, finish, _) in enumerate(choices)],
            usage,
        )

    def complete(
        self, text: str, finish_reason: str | None, usage: Usage | None, logprobs: Any = None
    ) -> bytes:
        """The whole non-streaming response body (``logprobs``: every delta's, merged
        with :func:`merge_logprobs`)."""
        return self._body([self._choice(0, text, finish_reason, logprobs)], usage)

    def _choice(
        self, index: int, text: str, finish_reason: str | None, logprobs: Any
    ) -> dict[str, Any]:
        if self.kind == "chat":
            return {
                "index": index,
                "message": {"role": "assistant", "content": text},
                "logprobs": None if logprobs is None else {"content": logprobs},
                "finish_reason": finish_reason,
            }
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}

    def _body(self, choices: list[dict[str, Any]], usage: Usage | None) -> bytes:
        return _dumps(
            {
                "id": self.id,
                "object": "chat.completion" if self.kind == "chat" else "text_completion",
                "created": self.created,
                "model": self.model,
                "choices": choices,
                "usage": usage_dict(usage),
            }
        )
