"""The body of ``POST /v1/responses`` (the Responses API), and its translation into an
engine chat :class:`~trioserve.protocol.Submit`.

``input`` (a string, or a list of message items whose content is a string or
``input_text``/``output_text``/``input_image`` parts) becomes the chat messages, with
``instructions`` as a system message in front; ``max_output_tokens`` becomes the engine's
``max_tokens``, ``reasoning.effort`` its ``reasoning_effort``; ``temperature`` and
``top_p`` pass as they are, and so does every body field the Responses API does not
define (``seed``, ``stop``, an engine's own knobs), as on chat completions.

What trioserve does not serve on this route is refused with a 422 naming the field,
rather than ignored: conversation state (``previous_response_id``, ``conversation``),
tools, structured output (``text.format`` other than text), log probabilities, reusable
prompts, ``truncation: auto``. docs/api.md lists them.
"""

from __future__ import annotations

from typing import Any

import attrs

from ...protocol import Submit
from ..writers.responses import ResponseEvents
from .media import MediaFetcher
from .multimodal import resolve_parts
from .openai import MAX_MESSAGES, MAX_TOKENS, check_parts
from .validation import (
    Errors,
    _json_type,
    bounded,
    check_bounds,
    documented,
    invalid,
    structure,
)

#: Roles an input message may have.
INPUT_ROLES = frozenset({"user", "assistant", "system", "developer"})
#: ``metadata`` bounds (the OpenAI API's): pairs, key and value lengths.
MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY = 64
MAX_METADATA_VALUE = 512


@attrs.define
class Reasoning:
    effort: str | None = None
    summary: str | None = None
    generate_summary: str | None = None


#: What ``input`` takes (checked in :func:`_messages`).
INPUT_SCHEMA = {
    "anyOf": [
        {"type": "string"},
        {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "properties": {
                    "type": {"const": "message"},
                    "role": {"enum": sorted(INPUT_ROLES)},
                    "content": {
                        "anyOf": [
                            {"type": "string"},
                            {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "properties": {
                                        "type": {
                                            "enum": ["input_text", "output_text", "input_image"]
                                        },
                                        "text": {"type": "string"},
                                        "image_url": {"type": "string"},
                                    },
                                    "required": ["type"],
                                },
                            },
                        ]
                    },
                },
                "required": ["role", "content"],
            },
        },
    ]
}


#: The description of a field of the Responses API that is refused when set.
NOT_SERVED = "not served here: 422 when set ({})"


@attrs.define
class ResponsesRequest:
    input: Any = attrs.field(kw_only=True, metadata={"schema": INPUT_SCHEMA})
    model: str | None = None
    instructions: str | None = None
    max_output_tokens: int | None = bounded(1, MAX_TOKENS)
    temperature: float | None = bounded(0, 2)
    top_p: float | None = bounded(0, 1, exclusive_minimum=True)
    stream: bool | None = False
    background: bool | None = False
    store: bool | None = True
    metadata: dict[str, str] | None = documented(
        maxProperties=MAX_METADATA_PAIRS,
        propertyNames={"maxLength": MAX_METADATA_KEY},
        additionalProperties={"type": "string", "maxLength": MAX_METADATA_VALUE},
    )
    user: str | None = None
    reasoning: Reasoning | None = None
    parallel_tool_calls: bool | None = None
    tool_choice: Any = documented(enum=["auto", "none"])
    tools: list[Any] | None = documented(
        maxItems=0, description="tools are not served here: only an empty list"
    )
    text: Any = documented(
        type="object",
        properties={
            "format": {
                "type": ["object", "null"],
                "properties": {"type": {"const": "text"}},
                "required": ["type"],
            }
        },
    )
    truncation: str | None = documented(enum=["disabled"])
    include: list[str] | None = documented(
        maxItems=0, description="nothing extra can be included: only an empty list"
    )
    top_logprobs: int | None = documented(
        enum=[0], description="log probabilities are not served on /v1/responses: 0 or null"
    )
    max_tool_calls: int | None = bounded()  # accepted, not used (no tools)
    previous_response_id: str | None = documented(
        description=NOT_SERVED.format("no conversation state is kept")
    )
    conversation: Any = documented(description=NOT_SERVED.format("no conversation state is kept"))
    prompt: Any = documented(description=NOT_SERVED.format("reusable prompts"))
    stream_options: Any = None
    service_tier: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None


#: Fields of the Responses API: the frontend's to read; any other body field is the
#: engine's (a param, unchanged).
_KNOWN = frozenset(a.name for a in attrs.fields(ResponsesRequest))

#: Fields whose feature is not served here, and why (a 422 at that field when set).
_REFUSED = {
    "previous_response_id": "conversation state is not kept: send the earlier turns in input",
    "conversation": "conversation state is not kept: send the earlier turns in input",
    "prompt": "reusable prompts are not served",
    "top_logprobs": "log probabilities are not served on /v1/responses yet",
}


@attrs.frozen
class ResponseGeneration:
    """A validated ``POST /v1/responses``, ready for any transport."""

    submit: Submit
    stream: bool
    background: bool
    store: bool
    #: The request fields the ``Response`` object reports back.
    echo: dict[str, Any]
    #: The media parts to fetch or decode: (message index, part index, JSON path).
    media: tuple[tuple[int, int, str], ...] = ()
    capability: str = "chat"

    def events(self, response_id: str) -> ResponseEvents:
        return ResponseEvents(response_id, self.submit.model, self.echo, background=self.background)


def _text_part(part: dict[str, Any], loc: str, errors: Errors) -> dict[str, Any] | None:
    text = part.get("text")
    if type(text) is not str:
        errors.add("expected a string", f"{loc}.text")
        return None
    return {"type": "text", "text": text}


def _image_part(part: dict[str, Any], loc: str, errors: Errors) -> dict[str, Any] | None:
    url = part.get("image_url")
    if part.get("file_id") is not None:
        errors.add(
            "file ids are not served: send image_url (a URL or a data: URI)", f"{loc}.file_id"
        )
        return None
    if type(url) is not str:
        errors.add("expected a URL string", f"{loc}.image_url")
        return None
    return {"type": "image_url", "image_url": {"url": url}}


_PARTS = {"input_text": _text_part, "output_text": _text_part, "input_image": _image_part}


def _messages(
    req: ResponsesRequest, errors: Errors
) -> tuple[list[dict[str, Any]], list[tuple[int, int, str]]]:
    """The chat messages of ``req`` (instructions first), and where its media parts are."""
    messages: list[dict[str, Any]] = []
    media: list[tuple[int, int, str]] = []
    if req.instructions is not None:
        messages.append({"role": "system", "content": req.instructions})
    items = req.input
    if type(items) is str:
        messages.append({"role": "user", "content": items})
        return messages, media
    if type(items) is not list:
        errors.add(
            f"expected a string or a list of input items, got {_json_type(items)}", "$.input"
        )
        return messages, media
    if not items:
        errors.add("at least one input item is required", "$.input")
    if len(items) > MAX_MESSAGES:
        raise invalid([{"loc": "$.input", "msg": f"at most {MAX_MESSAGES} input items"}])
    parts_total = 0
    for i, item in enumerate(items):
        loc = f"$.input[{i}]"
        if type(item) is not dict:
            errors.add(f"expected an object, got {_json_type(item)}", loc)
            continue
        kind = item.get("type", "message")
        if kind != "message":
            errors.add(
                f"input items of type {str(kind)[:40]!r} are not served (only messages)",
                f"{loc}.type",
            )
            continue
        role = item.get("role")
        if type(role) is not str or role not in INPUT_ROLES:
            errors.add(f"expected one of {', '.join(sorted(INPUT_ROLES))}", f"{loc}.role")
            continue
        content = item.get("content")
        if type(content) is str:
            messages.append({"role": role, "content": content})
            continue
        if type(content) is not list:
            errors.add("expected a string or a list of content parts", f"{loc}.content")
            continue
        parts_total += len(content)
        check_parts(len(content), parts_total, f"{loc}.content", "item")
        parts: list[dict[str, Any]] = []
        for j, part in enumerate(content):
            part_loc = f"{loc}.content[{j}]"
            kind = part.get("type") if type(part) is dict else None
            convert = _PARTS.get(kind) if type(kind) is str else None
            if convert is None:
                errors.add(
                    "expected a part of type input_text, output_text or input_image",
                    f"{part_loc}.type",
                )
                continue
            converted = convert(part, part_loc, errors)
            if converted is None:
                continue
            if converted["type"] == "image_url":
                media.append((len(messages), len(parts), part_loc))
            parts.append(converted)
        messages.append({"role": role, "content": parts})
    return messages, media


def _check(req: ResponsesRequest, errors: Errors, streamed: bool) -> None:
    out_of_range: list[dict[str, str]] = []
    check_bounds(req, out_of_range)
    errors.extend(out_of_range)
    for name, why in _REFUSED.items():
        if getattr(req, name) not in (None, 0):
            errors.add(why, f"$.{name}")
    if req.tools:
        errors.add("tools are not served on /v1/responses yet", "$.tools")
    if req.tool_choice not in (None, "auto", "none"):
        errors.add("tool_choice needs tools, which are not served here", "$.tool_choice")
    if req.include:
        errors.add("include is not served (nothing extra can be included)", "$.include")
    if req.truncation not in (None, "disabled"):
        errors.add(
            "only 'disabled' is served: the engine refuses what does not fit", "$.truncation"
        )
    text = req.text
    if text is not None:
        form = text.get("format") if isinstance(text, dict) else None
        if not isinstance(text, dict) or (
            form is not None and (not isinstance(form, dict) or form.get("type") != "text")
        ):
            errors.add(
                "only text output is served (text.format json_schema/json_object is not)",
                "$.text.format",
            )
    metadata = req.metadata or {}
    if len(metadata) > MAX_METADATA_PAIRS:
        errors.add(f"at most {MAX_METADATA_PAIRS} pairs", "$.metadata")
    for key, item in metadata.items():
        if len(key) > MAX_METADATA_KEY or len(item) > MAX_METADATA_VALUE:
            errors.add(
                f"keys of at most {MAX_METADATA_KEY} characters, values of at most "
                f"{MAX_METADATA_VALUE}",
                "$.metadata",
            )
            break
    if req.background and req.store is False:
        errors.add("a background response must be stored (store: true)", "$.store")
    if req.background and streamed:
        errors.add("background responses are created over HTTP, not on /v1/ws", "$.background")


def engine_params(req: ResponsesRequest, body: dict[str, Any]) -> dict[str, Any]:
    """What the engine gets: the sampling fields, under their chat names, and every body
    field the Responses API does not define, unchanged."""
    params: dict[str, Any] = {k: v for k, v in body.items() if k not in _KNOWN}
    if req.max_output_tokens is not None:
        params["max_tokens"] = req.max_output_tokens
    if req.temperature is not None:
        params["temperature"] = req.temperature
    if req.top_p is not None:
        params["top_p"] = req.top_p
    if req.reasoning is not None and req.reasoning.effort is not None:
        params["reasoning_effort"] = req.reasoning.effort
    return params


def _echo(req: ResponsesRequest, store: bool, body: dict[str, Any]) -> dict[str, Any]:
    return {
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "metadata": req.metadata or {},
        "parallel_tool_calls": True if req.parallel_tool_calls is None else req.parallel_tool_calls,
        "previous_response_id": None,
        "reasoning": body.get("reasoning"),
        "store": store,
        "temperature": req.temperature,
        "text": {"format": {"type": "text"}},
        "tool_choice": req.tool_choice or "auto",
        "tools": [],
        "top_p": req.top_p,
        "truncation": "disabled",
        "user": req.user,
    }


def parse_response(
    body: dict[str, Any], request_id: str, resolve_model: Any, *, streamed: bool = False
) -> ResponseGeneration:
    """Validate ``body`` and translate it (a 422 :class:`HTTPError` if it is bad).

    ``resolve_model(requested: str | None) -> str`` picks the model (503/404 from it);
    ``streamed``: the transport streams whatever the body says (WebSocket).
    """
    req = structure(body, ResponsesRequest)
    errors = Errors()
    messages, media = _messages(req, errors)
    _check(req, errors, streamed)
    if errors:
        raise errors.error()
    store = req.store is not False
    submit = Submit(
        request_id,
        resolve_model(req.model),
        "chat",
        {"messages": messages},
        engine_params(req, body),
        # The session key of affinity routing (never sent to the engine): what the
        # Responses API has for "keep my prompt's cache", else the user.
        session_key=req.prompt_cache_key or req.user or None,
    )
    return ResponseGeneration(
        submit,
        stream=bool(req.stream) or streamed,
        background=bool(req.background),
        store=store,
        echo=_echo(req, store, body),
        media=tuple(media),
    )


async def resolve_media(
    generation: ResponseGeneration, fetcher: MediaFetcher
) -> ResponseGeneration:
    """``generation`` with its image parts fetched or decoded into media records
    (``multimodal.resolve_parts``)."""
    submit = await resolve_parts(generation.submit, generation.media, fetcher)
    return attrs.evolve(generation, submit=submit)
