"""``POST /v1/chat/completions`` and ``POST /v1/completions``: JSON or SSE, ``n`` choices.

One choice is one engine request through the request lifecycle; ``n`` > 1 choices are
``n`` engine requests run as a group (``fanout.py``), streamed with each chunk's ``index``
or answered as one body.
"""

from __future__ import annotations

from ..bodies.multimodal import resolve_chat_media
from ..bodies.openai import ChatCompletionRequest, CompletionRequest, parse_generation
from ..exchange import JSON_HEADERS, Exchange
from ..fanout import StreamingGroup, run_group
from ..openapi.content import json_body, sse
from ..services import Services, with_session
from ..writers.stream import Collected, JSONWriter, SSEWriter, Writer
from .route import Route, Routes, generation_doc


async def chat_completions(services: Services, exchange: Exchange) -> None:
    await _generate(services, exchange, "chat")


async def completions(services: Services, exchange: Exchange) -> None:
    await _generate(services, exchange, "completion")


async def _generate(services: Services, exchange: Exchange, capability: str) -> None:
    timeout = services.begin(exchange)
    body = await services.json_body(exchange)
    generation = parse_generation(
        capability, body, exchange.request_id, services.resolve_model, parsers=services.parsers
    )
    generation = await resolve_chat_media(generation, services.media_fetcher())
    submit = with_session(exchange, generation.submit)
    if submit is not generation.submit:
        generation = generation.with_submit(submit)
    fmt = generation.stream_format()
    if generation.n > 1:
        submits = generation.choices()
        stream = None
        if generation.stream:
            stream = StreamingGroup(exchange, generation.choice_formats(), generation.include_usage)

        async def answer(collected: list[Collected]) -> None:
            if stream is not None:
                await stream.finish(collected)
                return
            await exchange.respond(200, fmt.complete_choices(collected), JSON_HEADERS)

        await run_group(services, exchange, submits, capability, timeout, answer, stream=stream)
        return
    if generation.stream:
        writer: Writer = SSEWriter(exchange, fmt)
        keepalive = services.settings.sse_keepalive
    else:
        writer, keepalive = JSONWriter(exchange, fmt), 0
    await services.run(
        exchange, generation.submit, capability, writer, timeout, keepalive=keepalive
    )


# -- the routes ----------------------------------------------------------------------

ROUTES: Routes = {
    ("POST", "/v1/chat/completions"): Route(
        chat_completions,
        generation_doc(
            "createChatCompletion",
            "Chat completion, JSON or streamed (SSE)",
            ChatCompletionRequest,
            {**json_body("ChatCompletion"), "text/event-stream": sse("ChatCompletionChunk")},
            example={"messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 16},
        ),
        "chat",
    ),
    ("POST", "/v1/completions"): Route(
        completions,
        generation_doc(
            "createCompletion",
            "Text completion, JSON or streamed (SSE)",
            CompletionRequest,
            {**json_body("Completion"), "text/event-stream": sse("CompletionChunk")},
            example={"prompt": "Once upon a time", "max_tokens": 16},
        ),
        "completion",
    ),
}
