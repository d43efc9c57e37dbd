"""The body of ``POST /v1/responses`` (the Responses API), and its translation into an
engine chat :class:`~trioserve.protocol.Submit`.

``input`` (a string, or a list of items: messages whose content is a string or
``input_text``/``output_text``/``input_image`` parts, ``function_call`` items (an
assistant's ``tool_calls``), ``function_call_output`` items (``tool`` messages) and
``reasoning`` items (the next assistant message's ``reasoning``)) becomes the chat
messages (``responses_input.py``), with ``instructions`` as a system message in front;
function ``tools`` and ``tool_choice`` are chat's (checked and parsed as chat's:
``bodies/agents.py``); ``previous_response_id`` puts a stored response's conversation
ahead of the input (the route does: ``routes/responses.py``); ``max_output_tokens``
becomes the engine's ``max_tokens``, ``reasoning.effort`` its ``reasoning_effort``;
``temperature`` and ``top_p`` pass as they are, and so does every body field the
Responses API does not define (``seed``, ``stop``, an engine's own knobs), as on chat
completions.

What trioserve does not serve on this route is refused with a 422 naming the field,
rather than ignored: ``conversation`` objects, tools other than functions, structured
output (``text.format`` other than text), log probabilities, reusable
prompts, ``truncation: auto``. docs/api.md lists them.
"""

from __future__ import annotations

from typing import Any

import attrs

from ...protocol import Submit
from ...text.agents import ParserNames
from ..writers.response_events import ResponseEvents
from .agents import AgentOptions, parse_agent_options
from .media import MediaFetcher
from .multimodal import resolve_parts
from .openai import MAX_TOKENS
from .responses_input import INPUT_ROLES, chat_messages
from .validation import (
    Errors,
    bounded,
    check_bounds,
    documented,
    structure,
)

#: ``metadata`` bounds (the OpenAI API's): pairs, key and value lengths.
MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY = 64
MAX_METADATA_VALUE = 512
#: Characters of the identifiers a response echoes or keys by (``user``,
#: ``safety_identifier``: the OpenAI API's 64; ``reasoning``'s strings, whose values are
#: short words): a stored response keeps them, so each is bounded.
MAX_IDENTIFIER = 64
#: The string fields held to :data:`MAX_IDENTIFIER`.
_IDENTIFIERS = ("user", "safety_identifier")


@attrs.define
class Reasoning:
    effort: str | None = None
    summary: str | None = None
    generate_summary: str | None = None


#: What ``input`` takes (checked in ``responses_input.chat_messages``).
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
    user: str | None = documented(maxLength=MAX_IDENTIFIER)
    reasoning: Reasoning | None = None
    parallel_tool_calls: bool | None = None
    tool_choice: Any = documented(
        anyOf=[
            {"enum": ["auto", "none", "required"]},
            {
                "type": "object",
                "properties": {"type": {"const": "function"}, "name": {"type": "string"}},
                "required": ["type", "name"],
            },
        ]
    )
    tools: list[Any] | None = documented(
        items={
            "type": "object",
            "properties": {
                "type": {"const": "function"},
                "name": {"type": "string"},
                "description": {"type": ["string", "null"]},
                "parameters": {"type": ["object", "null"]},
                "strict": {"type": ["boolean", "null"]},
            },
            "required": ["type", "name"],
        },
        description="function tools (the client runs them)",
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
    max_tool_calls: int | None = bounded()  # accepted, not used
    previous_response_id: str | None = documented(
        description="continue from a stored response of this key: its conversation is "
        "put ahead of input (its instructions are not)"
    )
    conversation: Any = documented(description=NOT_SERVED.format("no conversation state is kept"))
    prompt: Any = documented(description=NOT_SERVED.format("reusable prompts"))
    stream_options: Any = None
    service_tier: str | None = None
    safety_identifier: str | None = documented(maxLength=MAX_IDENTIFIER)
    prompt_cache_key: str | None = None


#: Fields of the Responses API: the frontend's to read; any other body field is the
#: engine's (a param, unchanged).
_KNOWN = frozenset(a.name for a in attrs.fields(ResponsesRequest))

#: Fields whose feature is not served here, and why (a 422 at that field when set).
_REFUSED = {
    "conversation": "conversation objects are not served: use previous_response_id, or "
    "send the earlier turns in input",
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
    #: Tool calls and reasoning to parse out of the answer (``bodies/agents.py``).
    agents: AgentOptions | None = None
    #: The stored response this one continues (``previous_response_id``).
    previous: str | None = None
    #: Messages ahead of the input's in ``submit.inputs`` (the instructions).
    lead: int = 0

    def events(self, response_id: str) -> ResponseEvents:
        parser = self.agents.parser() if self.agents is not None else None
        return ResponseEvents(
            response_id, self.submit.model, self.echo, background=self.background, parser=parser
        )

    @property
    def input_messages(self) -> list[dict[str, Any]]:
        """The conversation this response adds to (its messages, less the instructions:
        a response that continues it brings its own)."""
        messages: list[dict[str, Any]] = self.submit.inputs["messages"]
        return messages[self.lead :]

    def continuing(self, history: list[dict[str, Any]]) -> ResponseGeneration:
        """This response with ``history`` (a stored response's conversation, media
        resolved) between its instructions and its input."""
        inputs = self.submit.inputs
        messages = inputs["messages"]
        joined = [*messages[: self.lead], *history, *messages[self.lead :]]
        modalities = list(inputs.get("modalities") or ["text"])
        for message in history:
            content = message.get("content")
            for part in content if type(content) is list else ():
                if part.get("type") not in modalities:
                    modalities.append(part.get("type"))
        submit = attrs.evolve(
            self.submit, inputs={**inputs, "messages": joined, "modalities": modalities}
        )
        return attrs.evolve(self, submit=submit)


def _tools(req: ResponsesRequest, errors: Errors) -> dict[str, Any]:
    """The chat ``tools``, ``tool_choice`` and ``parallel_tool_calls`` of ``req``."""
    chat: dict[str, Any] = {}
    if req.tools:
        tools = []
        for i, tool in enumerate(req.tools):
            if type(tool) is not dict or tool.get("type") != "function":
                kind = tool.get("type") if type(tool) is dict else None
                errors.add(
                    f"only function tools are served (not {str(kind)[:40]!r})", f"$.tools[{i}].type"
                )
                continue
            function = {
                name: tool[name]
                for name in ("name", "description", "parameters", "strict")
                if tool.get(name) is not None
            }
            tools.append({"type": "function", "function": function})
        chat["tools"] = tools
    choice = req.tool_choice
    if type(choice) is dict:
        if choice.get("type") != "function" or type(choice.get("name")) is not str:
            errors.add('expected {"type": "function", "name": ...}', "$.tool_choice")
        else:
            chat["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    elif choice is not None and (req.tools or choice != "auto"):
        chat["tool_choice"] = choice
    if req.parallel_tool_calls is not None:
        chat["parallel_tool_calls"] = req.parallel_tool_calls
    return chat


def _check(req: ResponsesRequest, errors: Errors, streamed: bool) -> None:
    out_of_range: list[dict[str, str]] = []
    check_bounds(req, out_of_range)
    errors.extend(out_of_range)
    for name, why in _REFUSED.items():
        if getattr(req, name) not in (None, 0):
            errors.add(why, f"$.{name}")
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
    for name in _IDENTIFIERS:
        value = getattr(req, name)
        if value is not None and len(value) > MAX_IDENTIFIER:
            errors.add(f"at most {MAX_IDENTIFIER} characters", f"$.{name}")
    reasoning = req.reasoning
    if reasoning is not None:
        for name in ("effort", "summary", "generate_summary"):
            value = getattr(reasoning, name)
            if value is not None and len(value) > MAX_IDENTIFIER:
                errors.add(f"at most {MAX_IDENTIFIER} characters", f"$.reasoning.{name}")
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
        "previous_response_id": req.previous_response_id,
        # What was read of it, not the body's object (which may hold anything, kept as
        # long as the response is).
        "reasoning": _reasoning_echo(req.reasoning),
        "store": store,
        "temperature": req.temperature,
        "text": {"format": {"type": "text"}},
        "tool_choice": req.tool_choice or "auto",
        "tools": [tool for tool in req.tools or () if type(tool) is dict],
        "top_p": req.top_p,
        "truncation": "disabled",
        "user": req.user,
    }


def _reasoning_echo(reasoning: Reasoning | None) -> dict[str, Any] | None:
    if reasoning is None:
        return None
    return {"effort": reasoning.effort, "summary": reasoning.summary or reasoning.generate_summary}


def parse_response(
    body: dict[str, Any],
    request_id: str,
    resolve_model: Any,
    *,
    streamed: bool = False,
    parsers: ParserNames = ParserNames(),  # noqa: B008 (frozen)
) -> ResponseGeneration:
    """Validate ``body`` and translate it (a 422 :class:`HTTPError` if it is bad).

    ``resolve_model(requested: str | None) -> str`` picks the model (503/404 from it);
    ``streamed``: the transport streams whatever the body says (WebSocket); ``parsers``:
    the formats the server parses tool calls and reasoning in.
    """
    req = structure(body, ResponsesRequest)
    errors = Errors()
    messages, media = chat_messages(req.instructions, req.input, errors)
    _check(req, errors, streamed)
    chat = _tools(req, errors)
    if errors:
        raise errors.error()
    params = engine_params(req, body)
    if req.reasoning is not None and req.reasoning.effort is not None:
        chat["reasoning_effort"] = req.reasoning.effort
    if body.get("chat_template_kwargs") is not None:
        chat["chat_template_kwargs"] = body["chat_template_kwargs"]
    params.update({k: v for k, v in chat.items() if k not in ("reasoning_effort",)})
    agents = parse_agent_options(chat, parsers, params)
    store = req.store is not False
    submit = Submit(
        request_id,
        resolve_model(req.model),
        "chat",
        {"messages": messages},
        params,
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
        agents=agents,
        previous=req.previous_response_id,
        lead=1 if req.instructions is not None else 0,
    )


async def resolve_media(
    generation: ResponseGeneration, fetcher: MediaFetcher
) -> ResponseGeneration:
    """``generation`` with its image parts fetched or decoded into media records
    (``multimodal.resolve_parts``)."""
    submit = await resolve_parts(generation.submit, generation.media, fetcher)
    return attrs.evolve(generation, submit=submit)
