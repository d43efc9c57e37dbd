"""Anthropic's Messages API: ``POST /v1/messages`` and ``POST /v1/messages/count_tokens``.

A message is a chat request to the engine (``bodies/anthropic.py`` translates it), run
through the one request lifecycle as chat completions are (its client leaving aborts it,
once), and answered as a ``Message`` object or its event stream (``writers/anthropic.py``).
Errors are in Anthropic's shape (the application sets the exchange's ``error_shape`` for
these paths, the 401 included); ``X-Api-Key`` carries the key as well as
``Authorization``; ``anthropic-version`` and ``anthropic-beta`` are accepted and ignored.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import orjson
import trio

from ...text.background import background
from ...text.requests import chat_request_prompt
from ..bodies.anthropic import (
    CountTokensRequest,
    MessagesRequest,
    parse_count_tokens,
    parse_messages,
)
from ..bodies.multimodal import resolve_parts
from ..exchange import JSON_HEADERS, Exchange
from ..openapi.content import Doc, json_body, sse_events
from ..services import Services
from ..writers.anthropic import (
    MessageEvents,
    MessagesJSONWriter,
    MessagesSSEWriter,
    tool_use_id,
)
from ..writers.stream import Writer
from .route import Route, Routes, generation_doc

#: Characters counted as one token by ``count_tokens`` when no tokenizer of the model is
#: known here: the usual rule of thumb for English text and code (docs/api.md).
CHARS_PER_TOKEN = 4


async def messages(services: Services, exchange: Exchange) -> None:
    timeout = services.begin(exchange)
    body = await services.json_body(exchange)
    generation = parse_messages(
        body, exchange.request_id, services.resolve_model, parsers=services.parsers
    )
    submit = generation.submit
    if generation.media:
        submit = await resolve_parts(submit, generation.media, services.media_fetcher())
    events = MessageEvents(
        f"msg_{exchange.request_id}",
        submit.model,
        stream=generation.stream,
        parser=generation.parser(tool_use_id),
    )
    writer: Writer
    if generation.stream:
        writer = MessagesSSEWriter(exchange, events)
        keepalive = services.settings.sse_keepalive
    else:
        writer, keepalive = MessagesJSONWriter(exchange, events), 0
    await services.run(exchange, submit, "chat", writer, timeout, keepalive=keepalive)


async def count_tokens(services: Services, exchange: Exchange) -> None:
    """``{"input_tokens": N}``: what the messages, the system prompt and the tools come
    to. With the model's text assets here (``Services.texts``: ``--tokenizer``, or an
    engine link that takes token ids), the prompt its chat template renders, tokenized;
    without, an estimate (``CHARS_PER_TOKEN``), which the answer says
    (``"estimated": true``)."""
    services.check_accepting()
    body = await services.json_body(exchange)
    count = parse_count_tokens(body, services.resolve_model)
    served = services.texts.get(count.model)
    if served is not None:
        params: dict[str, Any] = {"tools": count.tools} if count.tools else {}
        prompt = await trio.to_thread.run_sync(
            background(partial(chat_request_prompt, served, count.messages, params))
        )
        answer: dict[str, Any] = {"input_tokens": len(prompt.token_ids)}
    else:
        answer = {"input_tokens": estimate(count.messages, count.tools), "estimated": True}
    await exchange.respond(200, orjson.dumps(answer), JSON_HEADERS)


def estimate(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> int:
    """The tokens of ``messages`` and ``tools`` by :data:`CHARS_PER_TOKEN` characters of
    their text, their calls and the tools' JSON (images are not counted)."""
    text = [orjson.dumps(tools).decode()] if tools else []
    for message in messages:
        content = message.get("content")
        if type(content) is str:
            text.append(content)
        elif type(content) is list:
            text.extend(part["text"] for part in content if part.get("type") == "text")
        for call in message.get("tool_calls") or ():
            text.append(call["function"]["name"] + call["function"]["arguments"])
        if message.get("reasoning"):
            text.append(message["reasoning"])
    return math.ceil(sum(len(piece) for piece in text) / CHARS_PER_TOKEN)


# -- the routes ----------------------------------------------------------------------

ROUTES: Routes = {
    ("POST", "/v1/messages"): Route(
        messages,
        generation_doc(
            "createMessage",
            "A message (Anthropic's Messages API): JSON, or its events (SSE)",
            MessagesRequest,
            {**json_body("Message"), "text/event-stream": sse_events("MessageEvent")},
            description="Errors are in Anthropic's shape (AnthropicError), with 400 where "
            "the other routes say 422; the key may come as X-Api-Key.",
            example={"max_tokens": 16, "messages": [{"role": "user", "content": "Hello!"}]},
        ),
        "chat",
        error_shape="anthropic",
    ),
    ("POST", "/v1/messages/count_tokens"): Route(
        count_tokens,
        Doc(
            "countMessageTokens",
            "The input tokens of a message (Anthropic's Messages API)",
            "generation",
            CountTokensRequest,
            ok=json_body("MessageTokensCount"),
            example={"messages": [{"role": "user", "content": "Hello!"}]},
        ),
        "chat",
        error_shape="anthropic",
    ),
}
