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

from ...errors import HTTPError, TextInputError
from ...text.prompts import Prompt, chat_prompt, check_prompt_token_ids, completion_prompt
from ...text.registry import ServedText
from ...text.sampling import Sampling, lower
from ...text.template import ChatOptions
from ..bodies.openai import parse_chat, parse_completion
from ..bodies.tokenize import DetokenizeRequest, TokenizeRequest
from ..bodies.validation import invalid, structure
from ..exchange import Exchange
from ..services import Services

T = TypeVar("T")

#: vLLM's refusal of a request's own chat template (without --trust-request-chat-template).
UNTRUSTED_TEMPLATE = (
    "Chat template is passed with request, but --trust-request-chat-template is not set. "
    "Refused request with untrusted chat template."
)


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
    return await trio.to_thread.run_sync(fn)


def _options(body: dict[str, Any]) -> ChatOptions:
    if body.get("chat_template") is not None or (
        isinstance(body.get("chat_template_kwargs"), dict)
        and body["chat_template_kwargs"].get("chat_template") is not None
    ):
        raise TextInputError(UNTRUSTED_TEMPLATE, param="chat_template")
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise invalid([{"loc": "$.chat_template_kwargs", "msg": "expected an object"}])
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise invalid([{"loc": "$.tools", "msg": "expected a list"}])
    if tools == []:
        raise TextInputError(
            "`tools` must not be an empty array. Either provide at least one tool or omit "
            "the field entirely.",
            param="tools",
        )
    documents = body.get("documents")
    add_generation_prompt = body.get("add_generation_prompt", True)
    continue_final = body.get("continue_final_message", False)
    if type(add_generation_prompt) is not bool or type(continue_final) is not bool:
        raise invalid([{"loc": "$", "msg": "add_generation_prompt and "
                        "continue_final_message must be booleans"}])  # fmt: skip
    if continue_final and add_generation_prompt and "add_generation_prompt" in body:
        raise TextInputError(
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
            param="continue_final_message",
        )
    if continue_final:
        add_generation_prompt = False
    effort = body.get("reasoning_effort")
    return ChatOptions(
        add_generation_prompt=add_generation_prompt,
        continue_final_message=continue_final,
        tools=tools,
        documents=documents if isinstance(documents, list) else None,
        chat_template_kwargs=kwargs,
        reasoning_effort=effort if isinstance(effort, str) else None,
    )


def _add_special_tokens(body: dict[str, Any], default: bool) -> bool:
    value = body.get("add_special_tokens")
    if value is None:
        return default
    if type(value) is not bool:
        raise invalid([{"loc": "$.add_special_tokens", "msg": "expected a boolean"}])
    return value


async def tokenize(services: Services, exchange: Exchange) -> None:
    services.check_accepting()
    body = await services.json_body(exchange)
    req = structure({**body, "messages": None}, TokenizeRequest)  # types (messages: below)
    _, served = served_text(services, req.model)
    text = served.text
    if body.get("messages") is not None:
        parse_chat({"messages": body["messages"]})  # their shape, 422 as the chat route's
        options = _options(body)
        special = _add_special_tokens(body, False)
        prompt: Prompt = await _in_thread(
            partial(chat_prompt, text, body["messages"], options, add_special_tokens=special)
        )
    elif req.prompt is not None:
        special = _add_special_tokens(body, True)
        prompt = await _in_thread(
            partial(completion_prompt, text, req.prompt, add_special_tokens=special)
        )
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


def _generate_request(
    request_id: str, model: str, prompt: Prompt, sampling: Sampling, stream: bool
) -> dict[str, Any]:
    """vLLM's ``GenerateRequest`` as its render routes answer it: the params as a client
    sends them (the fields vLLM sets itself, with a leading underscore, left out)."""
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
        "token_ids": prompt.token_ids,
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
    options = _options(body)
    special = _add_special_tokens(body, False)
    limits = served.limits
    prompt = await _in_thread(
        partial(
            chat_prompt,
            served.text,
            body["messages"],
            options,
            add_special_tokens=special,
            max_model_len=limits.max_model_len,
        )
    )
    stream = _stream(body)
    sampling = lower(
        body,
        endpoint="chat",
        prompt_len=len(prompt.token_ids),
        model=served.text,
        limits=limits,
        stream=stream,
    )
    answer = _generate_request(f"chatcmpl-{exchange.request_id}", model, prompt, sampling, stream)
    await exchange.respond_json(200, answer)


async def render_completion(services: Services, exchange: Exchange) -> None:
    services.check_accepting()
    body = await services.json_body(exchange)
    prompt_value: Any = body.get("prompt")
    token_prompt = isinstance(prompt_value, list) and all(type(i) is int for i in prompt_value)
    req = parse_completion({**body, "prompt": "-"} if token_prompt else body)
    model, served = served_text(services, req.model)
    special = _add_special_tokens(body, True)
    limits = served.limits
    given: str | list[int] = list(prompt_value) if token_prompt else str(req.prompt)
    prompt = await _in_thread(
        partial(
            completion_prompt,
            served.text,
            given,
            add_special_tokens=special,
            max_model_len=limits.max_model_len,
        )
    )
    if not prompt.token_ids:
        raise TextInputError("No token_ids rendered", param="prompt")
    stream = _stream(body)
    sampling = lower(
        body,
        endpoint="completion",
        prompt_len=len(prompt.token_ids),
        model=served.text,
        limits=limits,
        stream=stream,
    )
    answer = _generate_request(f"cmpl-{exchange.request_id}", model, prompt, sampling, stream)
    await exchange.respond_json(200, [answer])
