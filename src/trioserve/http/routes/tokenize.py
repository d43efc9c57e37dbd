"""The text pipeline's routes, as vLLM's server spells them: ``POST /tokenize`` (a prompt or
messages), ``POST /detokenize``, ``POST /v1/chat/completions/render`` and
``POST /v1/completions/render`` (the token ids and sampling parameters a request would be
submitted with, vLLM's ``GenerateRequest`` shape).

They need the model's text assets (``Services.texts``: ``trioserve run --tokenizer PATH``,
or an engine link that takes token ids); without them, 501 ``tokenizer_unavailable``.
Tokenizing and rendering run in a worker thread (HF ``tokenizers`` releases the GIL while it
encodes), so a long prompt does not stall the event loop's other requests.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

import trio

from ...errors import TextInputError
from ...text.background import background
from ...text.prompts import Prompt, check_prompt_token_ids
from ...text.registry import ServedText
from ...text.requests import (
    Prepared,
    chat_request_prompt,
    completion_request_prompt,
    prepare,
)
from ..bodies.openai import ChatCompletionRequest, CompletionRequest, parse_chat, parse_completion
from ..bodies.tokenize import DetokenizeRequest, TokenizeRequest
from ..bodies.validation import invalid, structure
from ..errors import HTTPError
from ..exchange import Exchange
from ..openapi.content import JSON, Doc, json_body, ref
from ..services import Services
from .route import NEEDS_TOKENIZER, Route, Routes

T = TypeVar("T")


def served_text(services: Services, requested: Any) -> tuple[str, ServedText]:
    """The model a request names (or the default) and its text assets; 501 without any."""
    if requested is not None and not isinstance(requested, str):
        raise invalid([{"loc": "$.model", "msg": "expected a string"}])
    texts = services.texts
    if requested is not None and requested in texts.by_model:
        return requested, texts.by_model[requested]
    model = services.resolve_model(requested) if services.engines.models() else requested
    served = texts.get(model) if model is not None else texts.default
    if served is None:
        raise HTTPError(
            501,
            f"no tokenizer is loaded for model {model!r}: serve it through a token-id engine "
            "(--vllm), or give trioserve run --tokenizer PATH (a model directory)",
            "tokenizer_unavailable",
        )
    return model or "default", served


async def _in_thread(fn: Callable[[], T]) -> T:
    return await trio.to_thread.run_sync(background(fn))


async def tokenize(services: Services, exchange: Exchange) -> None:
    services.check_accepting()
    body = await services.json_body(exchange)
    req = structure({**body, "messages": None}, TokenizeRequest)  # types (messages: below)
    _, served = served_text(services, req.model)
    text = served.text
    if body.get("messages") is not None:
        parse_chat({"messages": body["messages"]})  # their shape, 422 as the chat route's
        messages = body["messages"]
        prompt: Prompt = await _in_thread(partial(chat_request_prompt, served, messages, body))
    elif req.prompt is not None:
        prompt = await _in_thread(partial(completion_request_prompt, served, req.prompt, body))
    else:
        raise invalid([{"loc": "$", "msg": "either 'prompt' or 'messages' is required"}])
    answer: dict[str, Any] = {
        "count": len(prompt.token_ids),
        "max_model_len": served.limits.max_model_len,
        "tokens": prompt.token_ids,
        "token_strs": None,
    }
    if req.return_token_strs:
        answer["token_strs"] = [text.tokenizer.id_to_token(i) for i in prompt.token_ids]
    await exchange.respond_json(200, answer)


async def detokenize(services: Services, exchange: Exchange) -> None:
    services.check_accepting()
    body = await services.json_body(exchange)
    req = structure(body, DetokenizeRequest)
    if not all(type(i) is int for i in req.tokens):
        raise invalid([{"loc": "$.tokens", "msg": "expected a list of integers"}])
    _, served = served_text(services, req.model)
    check_prompt_token_ids(served.text, req.tokens)
    text = await _in_thread(partial(served.text.decode, req.tokens))
    await exchange.respond_json(200, {"prompt": text})


def _generate_request(request_id: str, model: str, ready: Prepared, stream: bool) -> dict[str, Any]:
    """vLLM's ``GenerateRequest`` as its render routes answer it: the params as a client
    sends them (the fields vLLM sets itself, with a leading underscore, left out)."""
    sampling = ready.sampling
    params = {k: v for k, v in sampling.params.items() if not k.startswith("_")}
    params["n"] = sampling.n
    structured = params.get("structured_outputs")
    if structured is not None:
        params["structured_outputs"] = {
            k: v for k, v in structured.items() if not k.startswith("_")
        }
    if params.get("logit_bias") is not None:
        params["logit_bias"] = {str(k): v for k, v in params["logit_bias"].items()}
    return {
        "request_id": request_id,
        "token_ids": ready.prompt.token_ids,
        "sampling_params": params,
        "model": model,
        "stream": stream,
    }


def _stream(body: dict[str, Any]) -> bool:
    stream = body.get("stream", False)
    return stream if isinstance(stream, bool) else False


async def render_chat(services: Services, exchange: Exchange) -> None:
    services.check_accepting()
    body = await services.json_body(exchange)
    req = parse_chat(body)
    model, served = served_text(services, req.model)
    stream = _stream(body)
    ready = await _in_thread(
        partial(prepare, served, "chat", body, body, stream=stream, for_engine=False)
    )
    answer = _generate_request(f"chatcmpl-{exchange.request_id}", model, ready, stream)
    await exchange.respond_json(200, answer)


async def render_completion(services: Services, exchange: Exchange) -> None:
    services.check_accepting()
    body = await services.json_body(exchange)
    prompt: Any = body.get("prompt")
    token_prompt = isinstance(prompt, list) and all(type(i) is int for i in prompt)
    req = parse_completion({**body, "prompt": "-"} if token_prompt else body)
    model, served = served_text(services, req.model)
    stream = _stream(body)
    inputs = {"prompt": list(prompt) if token_prompt else req.prompt}
    ready = await _in_thread(
        partial(prepare, served, "completion", inputs, body, stream=stream, for_engine=False)
    )
    if not ready.prompt.token_ids:
        raise TextInputError("No token_ids rendered", param="prompt")
    answer = _generate_request(f"cmpl-{exchange.request_id}", model, ready, stream)
    await exchange.respond_json(200, [answer])


# -- the routes ----------------------------------------------------------------------

ROUTES: Routes = {
    ("POST", "/tokenize"): Route(
        tokenize,
        Doc(
            "tokenize",
            "Token ids of a prompt, or of messages rendered by the model's chat template",
            "text",
            TokenizeRequest,
            ok=json_body("Tokenized"),
            description=NEEDS_TOKENIZER,
            example={"prompt": "Hello, world"},
        ),
    ),
    ("POST", "/detokenize"): Route(
        detokenize,
        Doc(
            "detokenize",
            "The text of token ids",
            "text",
            DetokenizeRequest,
            ok=json_body("Detokenized"),
            description=NEEDS_TOKENIZER,
            example={"tokens": [1, 2, 3]},
        ),
    ),
    ("POST", "/v1/chat/completions/render"): Route(
        render_chat,
        Doc(
            "renderChatCompletion",
            "The token ids and sampling parameters a chat request would be submitted with",
            "text",
            ChatCompletionRequest,
            ok=json_body("RenderedRequest"),
            description=NEEDS_TOKENIZER,
            example={"messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 16},
        ),
    ),
    ("POST", "/v1/completions/render"): Route(
        render_completion,
        Doc(
            "renderCompletion",
            "The token ids and sampling parameters a completion request would be "
            "submitted with (a list: one per prompt)",
            "text",
            CompletionRequest,
            ok={JSON: {"schema": {"type": "array", "items": ref("RenderedRequest")}}},
            description=NEEDS_TOKENIZER,
            example={"prompt": "Once upon a time", "max_tokens": 16},
        ),
    ),
}
