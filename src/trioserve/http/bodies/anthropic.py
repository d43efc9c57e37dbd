"""The bodies of ``POST /v1/messages`` and ``POST /v1/messages/count_tokens``
(Anthropic's Messages API), and their translation into an engine chat
:class:`~trioserve.protocol.Submit`.

The mapping is vLLM's own (``vllm/entrypoints/anthropic/serving.py``), so an engine sees
what a chat completion with the same content would give it:

- ``system`` (a string or text blocks) is a system message ahead of the others;
- ``text`` blocks are text parts; ``image`` blocks (a ``base64`` or ``url`` source) are
  ``image_url`` parts, fetched or decoded as chat's are (``multimodal.resolve_parts``);
- an assistant's ``tool_use`` blocks are its message's ``tool_calls`` (the ``input`` as
  JSON ``arguments``), its ``thinking`` blocks its ``reasoning`` (``redacted_thinking`` is
  dropped: its content is opaque);
- a user's ``tool_result`` blocks are ``tool`` messages (``tool_call_id``), ahead of
  the rest of that user message; the images in a result follow as a user message;
- ``tools`` are function tools; ``tool_choice`` ``auto``/``any``/``tool``/``none`` is
  ``auto``/``required``/the named function/``none``, ``disable_parallel_tool_use`` is
  ``parallel_tool_calls: false``;
- ``thinking`` ``enabled`` asks the chat template for thinking (``chat_template_kwargs``
  ``enable_thinking``) within ``thinking_token_budget``; ``disabled`` asks it not to;
  ``output_config.effort`` is ``reasoning_effort``;
- ``max_tokens`` (required, as Anthropic requires it), ``stop_sequences`` (``stop``),
  ``temperature``, ``top_p``, ``top_k`` are the sampling parameters;
  ``metadata.user_id`` is the session key of affinity routing (never sent to the engine);
- every other body field is the engine's (a param, unchanged), as on chat completions.

What is not served is refused with a 400 naming the field: server tools (``web_search``
and the like), ``document`` and other block types, ``mcp_servers``, ``container``.
"""

from __future__ import annotations

import json
from typing import Any

import attrs

from ...protocol import Submit
from ...text.agents import OutputParser, ParserNames, output_parser
from .agents import AgentOptions, parse_agent_options
from .openai import MAX_MESSAGES, MAX_TOKENS, check_parts
from .validation import (
    Bounds,
    Errors,
    _json_type,
    bounded,
    check_bounds,
    documented,
    invalid,
    structure,
)

#: Roles a message may have (``system`` is Anthropic's top-level field; inline system
#: messages, which some agents send, are accepted as vLLM accepts them).
ROLES = ("user", "assistant", "system")
#: Anthropic's bound on ``thinking.budget_tokens``.
MIN_THINKING_BUDGET = 1024
#: Fields Anthropic defines that this server does not serve (a 400 when set).
NOT_SERVED = {
    "mcp_servers": "MCP servers are not served here",
    "container": "containers (code execution) are not served here",
}

#: Fields Anthropic defines that are about its own service, not generation: accepted and
#: not passed to the engine.
IGNORED = frozenset(
    {
        "cache_control",
        "service_tier",
        "inference_geo",
        "speed",
        "diagnostics",
        "user_profile_id",
        "workspace_id",
    }
)

_BLOCK = {"type": "object", "required": ["type"], "properties": {"type": {"type": "string"}}}
CONTENT_SCHEMA = {"anyOf": [{"type": "string"}, {"type": "array", "items": _BLOCK}]}


@attrs.define
class AnthropicMessage:
    role: str = attrs.field(metadata={"schema": {"enum": list(ROLES)}})
    content: Any = documented(**CONTENT_SCHEMA)


@attrs.define
class Tool:
    name: str
    input_schema: dict[str, Any] | None = None
    description: str | None = None
    type: str | None = documented(
        description="custom (or absent): a function tool; server tools are not served"
    )


@attrs.define
class ToolChoice:
    type: str = attrs.field(metadata={"schema": {"enum": ["auto", "any", "tool", "none"]}})
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


@attrs.define
class Thinking:
    type: str = attrs.field(metadata={"schema": {"enum": ["enabled", "disabled", "adaptive"]}})
    budget_tokens: int | None = bounded(MIN_THINKING_BUDGET, MAX_TOKENS)
    display: str | None = None


@attrs.define
class OutputConfig:
    effort: str | None = None


@attrs.define
class _MessagesBody:
    messages: list[AnthropicMessage] = attrs.field(kw_only=True)
    model: str | None = None
    system: Any = documented(**CONTENT_SCHEMA)
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None


@attrs.define
class CountTokensRequest(_MessagesBody):
    """``POST /v1/messages/count_tokens``: what ``/v1/messages`` takes, less what only
    generation needs."""


@attrs.define
class MessagesRequest(_MessagesBody):
    max_tokens: int = attrs.field(
        kw_only=True, metadata={"bounds": Bounds(1, MAX_TOKENS), "schema": {}}
    )
    stop_sequences: list[str] | None = None
    stream: bool | None = False
    temperature: float | None = bounded(0, 1)
    top_p: float | None = bounded(0, 1)
    top_k: int | None = bounded(0)
    metadata: dict[str, Any] | None = None


#: Fields of the Messages API: the frontend's to read; any other body field is the
#: engine's (a param, unchanged).
_KNOWN = frozenset(a.name for a in attrs.fields(MessagesRequest)) | frozenset(NOT_SERVED) | IGNORED


@attrs.frozen
class MessagesGeneration:
    """A validated ``POST /v1/messages``, ready for any transport."""

    submit: Submit
    stream: bool
    #: The image parts to fetch or decode: (message index, part index, JSON path).
    media: tuple[tuple[int, int, str], ...] = ()
    #: Tool calls and reasoning to parse out of the answer (``bodies/agents.py``).
    agents: AgentOptions | None = None

    def parser(self, make_id: Any) -> OutputParser | None:
        """The parser of this message's answer (calls' ids from ``make_id()``), or None
        when its text is the answer as it is."""
        agents = self.agents
        if agents is None:
            return None
        return output_parser(
            agents.names,
            agents.tool_use,
            agents.template_kwargs,
            agents.reasoning_effort,
            agents.include_reasoning,
            make_id=make_id,
        )


def _image_url(source: Any, loc: str, errors: Errors) -> str | None:
    """An image block's ``source`` as the URL (or data URI) of an ``image_url`` part."""
    if type(source) is not dict:
        errors.add("expected an object with a 'type' (base64 or url)", loc)
        return None
    kind = source.get("type")
    if kind == "url":
        url = source.get("url")
        if type(url) is not str:
            errors.add("expected a URL string", f"{loc}.url")
            return None
        return url
    if kind == "base64":
        data, media_type = source.get("data"), source.get("media_type")
        if type(data) is not str:
            errors.add("expected a base64 string", f"{loc}.data")
            return None
        if type(media_type) is not str or not media_type.startswith("image/"):
            errors.add("expected an image media type (image/png, ...)", f"{loc}.media_type")
            return None
        return f"data:{media_type};base64,{data}"
    errors.add("only base64 and url image sources are served", f"{loc}.type")
    return None


class _Translation:
    """The chat messages of a Messages body, and where their images are."""

    def __init__(self, errors: Errors) -> None:
        self.errors = errors
        self.messages: list[dict[str, Any]] = []
        self.media: list[tuple[int, int, str]] = []
        self.parts_total = 0

    def _count(self, blocks: list[Any], loc: str) -> None:
        self.parts_total += len(blocks)
        check_parts(len(blocks), self.parts_total, loc, "message")

    def _image(self, parts: list[dict[str, Any]], block: dict[str, Any], loc: str) -> None:
        url = _image_url(block.get("source"), f"{loc}.source", self.errors)
        if url is not None:
            # (The index this message will have: it is appended after its blocks.)
            self.media.append((len(self.messages), len(parts), loc))
            parts.append({"type": "image_url", "image_url": {"url": url}})

    def system(self, system: Any) -> None:
        if system is None:
            return
        text = self._system_text(system, "$.system")
        if text:
            self.messages.append({"role": "system", "content": text})

    def _system_text(self, content: Any, loc: str) -> str | None:
        if type(content) is str:
            return content
        if type(content) is not list:
            self.errors.add("expected a string or a list of text blocks", loc)
            return None
        self._count(content, loc)
        texts = []
        for j, block in enumerate(content):
            if type(block) is not dict or block.get("type") != "text":
                self.errors.add("expected a text block", f"{loc}[{j}]")
            elif type(text := block.get("text")) is not str:
                self.errors.add("expected a string", f"{loc}[{j}].text")
            else:
                texts.append(text)
        return "".join(texts)

    def message(self, i: int, role: str, content: Any) -> None:
        loc = f"$.messages[{i}].content"
        if role == "system":
            text = self._system_text(content, loc)
            if text:
                self.messages.append({"role": "system", "content": text})
            return
        if type(content) is str:
            self.messages.append({"role": role, "content": content})
            return
        if type(content) is not list:
            self.errors.add("expected a string or a list of content blocks", loc)
            return
        self._count(content, loc)
        parts: list[dict[str, Any]] = []
        calls: list[dict[str, Any]] = []
        reasoning: list[str] = []
        for j, block in enumerate(content):
            self._block(role, block, f"{loc}[{j}]", parts, calls, reasoning)
        message: dict[str, Any] = {"role": role}
        if parts:
            only_text = len(parts) == 1 and parts[0]["type"] == "text"
            message["content"] = parts[0]["text"] if only_text else parts
        elif calls or reasoning:
            message["content"] = None
        else:
            # (A user message of tool results only: those are its tool messages.)
            if role == "assistant":
                message["content"] = ""
                self.messages.append(message)
            return
        if calls:
            message["tool_calls"] = calls
        if reasoning:
            message["reasoning"] = "".join(reasoning)
        self.messages.append(message)

    def _block(
        self,
        role: str,
        block: Any,
        loc: str,
        parts: list[dict[str, Any]],
        calls: list[dict[str, Any]],
        reasoning: list[str],
    ) -> None:
        errors = self.errors
        if type(block) is not dict or type(kind := block.get("type")) is not str:
            errors.add("expected a content block (an object with a 'type')", loc)
            return
        if kind == "text":
            if type(text := block.get("text")) is not str:
                errors.add("expected a string", f"{loc}.text")
            else:
                parts.append({"type": "text", "text": text})
        elif kind == "image":
            self._image(parts, block, loc)
        elif kind == "tool_use" and role == "assistant":
            call_id, name, arguments = block.get("id"), block.get("name"), block.get("input")
            if type(call_id) is not str or type(name) is not str:
                errors.add("a tool_use block needs a string id and name", loc)
            elif arguments is not None and type(arguments) is not dict:
                errors.add("expected an object", f"{loc}.input")
            else:
                calls.append(
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": name, "arguments": json.dumps(arguments or {})},
                    }
                )
        elif kind == "tool_result" and role == "user":
            self._tool_result(block, loc)
        elif kind == "thinking" and role == "assistant":
            if type(thinking := block.get("thinking")) is not str:
                errors.add("expected a string", f"{loc}.thinking")
            else:
                reasoning.append(thinking)
        elif kind == "redacted_thinking" and role == "assistant":
            pass  # opaque: nothing an engine could read
        else:
            errors.add(f"{kind[:40]!r} blocks are not served in a {role} message", f"{loc}.type")

    def _tool_result(self, block: dict[str, Any], loc: str) -> None:
        errors = self.errors
        call_id = block.get("tool_use_id")
        if type(call_id) is not str:
            errors.add("expected the id of the tool_use it answers", f"{loc}.tool_use_id")
            return
        content = block.get("content")
        texts: list[str] = []
        images: list[dict[str, Any]] = []
        if type(content) is str:
            texts.append(content)
        elif type(content) is list:
            self._count(content, f"{loc}.content")
            for k, item in enumerate(content):
                item_loc = f"{loc}.content[{k}]"
                kind = item.get("type") if type(item) is dict else None
                if kind == "text" and type(item.get("text")) is str:
                    texts.append(item["text"])
                elif kind == "image":
                    self._image(images, item, item_loc)
                else:
                    errors.add("expected a text or image block", item_loc)
        elif content is not None:
            errors.add("expected a string or a list of blocks", f"{loc}.content")
        self.messages.append({"role": "tool", "tool_call_id": call_id, "content": "\n".join(texts)})
        if images:
            # Their positions were recorded for the message after this tool message.
            self.media[-len(images) :] = [
                (len(self.messages), p, where) for _, p, where in self.media[-len(images) :]
            ]
            self.messages.append({"role": "user", "content": images})


def _tools(req: _MessagesBody, errors: Errors) -> list[dict[str, Any]] | None:
    if req.tools is None:
        return None
    tools = []
    for i, tool in enumerate(req.tools):
        if tool.type not in (None, "custom"):
            errors.add(
                f"server tools ({tool.type[:40]!r}) are not served: only tools with an "
                "input_schema, which the client runs",
                f"$.tools[{i}].type",
            )
            continue
        if tool.input_schema is None:
            errors.add("field required", f"$.tools[{i}].input_schema")
            continue
        function: dict[str, Any] = {"name": tool.name, "parameters": tool.input_schema}
        if tool.description is not None:
            function["description"] = tool.description
        tools.append({"type": "function", "function": function})
    return tools


def _tool_choice(req: _MessagesBody, errors: Errors) -> tuple[Any, bool | None]:
    """The chat ``tool_choice`` and ``parallel_tool_calls`` of ``req``."""
    choice = req.tool_choice
    if choice is None:
        return None, None
    parallel = (
        None if choice.disable_parallel_tool_use is None else not choice.disable_parallel_tool_use
    )
    if choice.type == "tool":
        if not choice.name:
            errors.add("tool_choice of type 'tool' names the tool", "$.tool_choice.name")
            return None, parallel
        return {"type": "function", "function": {"name": choice.name}}, parallel
    chosen = {"auto": "auto", "any": "required", "none": "none"}.get(choice.type)
    if chosen is None:
        errors.add("expected auto, any, tool or none", "$.tool_choice.type")
    elif chosen != "none" and not req.tools:
        errors.add(f"tool_choice {choice.type!r} needs tools", "$.tool_choice")
    return chosen, parallel


def _translate(req: _MessagesBody, errors: Errors) -> tuple[_Translation, dict[str, Any]]:
    """The chat messages of ``req`` and the params its tools, thinking and effort make."""
    if not req.messages:
        errors.add("at least one message is required", "$.messages")
    translation = _Translation(errors)
    translation.system(req.system)
    for i, message in enumerate(req.messages):
        if message.role not in ROLES:
            errors.add(f"expected one of {', '.join(ROLES)}", f"$.messages[{i}].role")
            continue
        translation.message(i, message.role, message.content)
    params: dict[str, Any] = {}
    tools = _tools(req, errors)
    if tools is not None:
        params["tools"] = tools
    choice, parallel = _tool_choice(req, errors)
    if choice is not None:
        params["tool_choice"] = choice
    elif tools:
        params["tool_choice"] = "auto"
    if parallel is not None:
        params["parallel_tool_calls"] = parallel
    thinking = req.thinking
    if thinking is not None:
        if thinking.type == "enabled":
            if thinking.budget_tokens is None:
                errors.add("field required", "$.thinking.budget_tokens")
            else:
                params["thinking_token_budget"] = thinking.budget_tokens
            params["chat_template_kwargs"] = {"enable_thinking": True}
        elif thinking.type == "disabled":
            params["chat_template_kwargs"] = {"enable_thinking": False}
        elif thinking.type != "adaptive":
            errors.add("expected enabled, disabled or adaptive", "$.thinking.type")
    if req.output_config is not None and req.output_config.effort is not None:
        params["reasoning_effort"] = req.output_config.effort
    return translation, params


def _check_body(body: dict[str, Any]) -> None:
    """What must hold before the body is structured (a field whose absence the converter
    would report less clearly)."""
    messages = body.get("messages")
    if messages is not None and type(messages) is not list:
        loc = "$.messages"
        raise invalid([{"loc": loc, "msg": f"expected a list, got {_json_type(messages)}"}])
    if messages is not None and len(messages) > MAX_MESSAGES:
        # (Before anything is built from them.)
        raise invalid([{"loc": "$.messages", "msg": f"at most {MAX_MESSAGES} messages"}])


def parse_messages(
    body: dict[str, Any],
    request_id: str,
    resolve_model: Any,
    *,
    streamed: bool = False,
    parsers: ParserNames = ParserNames(),  # noqa: B008 (frozen)
) -> MessagesGeneration:
    """Validate ``body`` and translate it (a 422 :class:`HTTPError`, which this route
    answers as Anthropic's 400, if it is bad).

    ``resolve_model(requested: str | None) -> str`` picks the model (503/404 from it);
    ``streamed``: the transport streams whatever the body says; ``parsers``: the formats
    the server parses tool calls and reasoning in (``--tool-call-parser``, ...).
    """
    _check_body(body)
    req = structure(body, MessagesRequest)
    errors = Errors()
    out_of_range: list[dict[str, str]] = []
    check_bounds(req, out_of_range)
    errors.extend(out_of_range)
    for name, why in NOT_SERVED.items():
        if body.get(name) not in (None, [], {}):
            errors.add(why, f"$.{name}")
    translation, params = _translate(req, errors)
    thinking = req.thinking
    budget = thinking.budget_tokens if thinking is not None else None
    if budget is not None and budget >= req.max_tokens:
        errors.add("must be less than max_tokens", "$.thinking.budget_tokens")
    if errors:
        raise errors.error()
    engine: dict[str, Any] = {k: v for k, v in body.items() if k not in _KNOWN}
    engine["max_tokens"] = req.max_tokens
    if req.stop_sequences:
        engine["stop"] = req.stop_sequences
    for name in ("temperature", "top_p", "top_k"):
        value = getattr(req, name)
        if value is not None:
            engine[name] = value
    # The client's own chat_template_kwargs (an engine's field) win over thinking's.
    kwargs = {**params.pop("chat_template_kwargs", {}), **(body.get("chat_template_kwargs") or {})}
    engine.update(params)
    if kwargs:
        engine["chat_template_kwargs"] = kwargs
    # What chat completions check and parse, in chat's terms: the tools, the choice, the
    # thinking asked of the template. (The engine is sent what chat's would be.)
    chat: dict[str, Any] = {
        name: engine[name]
        for name in ("tools", "tool_choice", "parallel_tool_calls", "reasoning_effort")
        if name in engine
    }
    if kwargs:
        chat["chat_template_kwargs"] = kwargs
    agents = parse_agent_options(chat, parsers, engine)
    user = (req.metadata or {}).get("user_id")
    submit = Submit(
        request_id,
        resolve_model(req.model),
        "chat",
        {"messages": translation.messages},
        engine,
        session_key=user if type(user) is str and user else None,
    )
    return MessagesGeneration(
        submit,
        stream=bool(req.stream) or streamed,
        media=tuple(translation.media),
        agents=agents,
    )


@attrs.frozen
class TokenCount:
    """A validated ``POST /v1/messages/count_tokens``: what the model would read."""

    model: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None


def parse_count_tokens(body: dict[str, Any], resolve_model: Any) -> TokenCount:
    _check_body(body)
    req = structure(body, CountTokensRequest)
    errors = Errors()
    translation, params = _translate(req, errors)
    if errors:
        raise errors.error()
    return TokenCount(resolve_model(req.model), translation.messages, params.get("tools"))
