"""The OpenAI-compatible bodies: request schemas, their translation into an engine
:class:`~trioserve.protocol.Submit`, and the response/chunk formats.

One translation and one chunk format serve every transport (JSON, SSE, and WebSocket):
:class:`StreamFormat` renders chunk *objects* as JSON bytes; the writers only frame them.
"""

from __future__ import annotations

from typing import Any, TypeVar

import attrs

from ...protocol import Submit
from ...text.agents import ParserNames
from ..errors import HTTPError
from ..writers.openai import StreamFormat
from .agents import AgentOptions, parse_agent_options
from .validation import (
    Errors,
    _json_type,
    bounded,
    check_bounds,
    documented,
    invalid,
    structure,
)

R = TypeVar("R", bound="_Common")

#: Most choices one request may ask for (``n``): each is an engine request of its own.
MAX_N = 16

ROLES = frozenset({"system", "user", "assistant", "tool", "developer", "function"})

# Bounds of a request's shape, checked before anything is built from it (docs/api.md,
# docs/security.md "Validation bounds"): what a request may make the event loop do
# before its answer is bounded by them, not by the body size alone.
#: Messages in one chat request.
MAX_MESSAGES = 2048
#: Content parts in one message, and in all messages of a request together.
MAX_CONTENT_PARTS = 256
MAX_CONTENT_PARTS_TOTAL = 4096
#: The largest ``max_tokens`` (and ``max_completion_tokens``): what an engine counts in
#: a 32-bit integer.
MAX_TOKENS = 2**31 - 1
#: Part types the frontend writes for the engine (``{"type": "image", "media": record}``,
#: docs/protocol.md): a client's part of one of these types, or any part with a
#: ``media`` field, could pass for an upload record the frontend built (whose ``path`` an
#: engine opens), so it is refused.
RESERVED_PART_TYPES = frozenset({"image", "audio", "video", "file"})


@attrs.define
class StreamOptions:
    include_usage: bool = False


#: What ``stop`` takes (checked in :func:`_check_common`).
STOP_SCHEMA = {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]}


@attrs.define
class ChatMessage:
    role: str = attrs.field(metadata={"schema": {"enum": sorted(ROLES)}})
    # str, a list of content parts, or null (checked in _check_messages)
    content: Any = documented(
        anyOf=[
            {"type": "string"},
            {"type": "array", "items": {"type": "object", "required": ["type"]}},
            {"type": "null"},
        ]
    )
    name: str | None = None


@attrs.define
class _Common:
    model: str | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    # At least 1 is the engine's rule, not the body's: vLLM refuses fewer with a 400 of
    # its own, and answers a completion's echo with max_tokens 0 with the prompt alone.
    max_tokens: int | None = bounded(None, MAX_TOKENS)
    max_completion_tokens: int | None = bounded(None, MAX_TOKENS)
    temperature: float | None = bounded(0, 2)
    top_p: float | None = bounded(0, 1, exclusive_minimum=True)
    n: int | None = bounded(1, MAX_N)
    seed: int | None = bounded()  # any int64
    stop: Any = documented(**STOP_SCHEMA)
    user: str | None = None


@attrs.define
class ChatCompletionRequest(_Common):
    messages: list[ChatMessage] = attrs.field(kw_only=True)


@attrs.define
class CompletionRequest(_Common):
    prompt: Any = attrs.field(  # str, or a list of one str
        kw_only=True,
        metadata={
            "schema": {
                "anyOf": [
                    {"type": "string"},
                    {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 1},
                ]
            }
        },
    )


#: Body fields of each request class; everything else is passed to the engine as a param.
_KNOWN: dict[type[_Common], frozenset[str]] = {
    cls: frozenset(a.name for a in attrs.fields(cls))
    for cls in (ChatCompletionRequest, CompletionRequest)
}
#: Fields that are about the HTTP exchange, not generation.
_NOT_PARAMS = frozenset({"model", "stream", "stream_options", "messages", "prompt", "user"})
#: The validated fields of each request class that go to the engine as params.
_PARAMS: dict[type[_Common], tuple[str, ...]] = {
    cls: tuple(sorted(known - _NOT_PARAMS)) for cls, known in _KNOWN.items()
}


# -- the common case without the converter --------------------------------------------------

_NUMBER = (int, float)
#: What each field takes as it comes from JSON, in the converter's own terms (``None``:
#: anything). Another type (a number as a string, 0/1 for a boolean) is the converter's.
_PLAIN_FIELDS: dict[str, tuple[type, ...] | None] = {
    "model": (str,),
    "user": (str,),
    "stream": (bool,),
    "max_tokens": (int,),
    "max_completion_tokens": (int,),
    "n": (int,),
    "seed": (int,),
    "temperature": _NUMBER,
    "top_p": _NUMBER,
    "stop": None,
}
_PLAIN: dict[type[_Common], dict[str, tuple[type, ...] | None]] = {
    ChatCompletionRequest: {**_PLAIN_FIELDS, "messages": (list,)},
    CompletionRequest: {**_PLAIN_FIELDS, "prompt": None},
}
_REQUIRED: dict[type[_Common], str] = {
    ChatCompletionRequest: "messages",
    CompletionRequest: "prompt",
}


def _plain(body: dict[str, Any], cls: type[R]) -> R | None:
    """``body`` as ``cls`` when every field in it has its plain JSON type: what the
    converter would build, without it (a third of its cost, and of the code a cold CPU
    must fetch on every request's way to the engine). ``None`` for anything else, which
    the converter then structures, or explains."""
    fields = _PLAIN[cls]
    kwargs: dict[str, Any] = {}
    for key, value in body.items():
        if key not in fields:
            continue  # not a field: a param for the engine (or stream_options, below)
        if value is None and key != "messages":  # null: absent, for an optional field
            kwargs[key] = None
            continue
        kinds = fields[key]
        if kinds is None:
            kwargs[key] = value
        elif type(value) not in kinds:
            return None
        elif kinds is _NUMBER:
            kwargs[key] = float(value)
        elif key == "messages":
            messages = []
            for message in value:
                if type(message) is not dict:
                    return None
                role = message.get("role")
                name = message.get("name")
                if type(role) is not str or (name is not None and type(name) is not str):
                    return None
                messages.append(ChatMessage(role, message.get("content"), name))
            kwargs[key] = messages
        else:
            kwargs[key] = value
    if _REQUIRED[cls] not in kwargs or body.get("stream_options") is not None:
        return None
    return cls(**kwargs)


def _check_common(req: _Common, errors: list[dict[str, str]]) -> None:
    check_bounds(req, errors)
    stop = req.stop
    if not (
        stop is None
        or isinstance(stop, str)
        or (isinstance(stop, list) and all(isinstance(s, str) for s in stop))
    ):
        errors.append({"loc": "$.stop", "msg": "expected a string or a list of strings"})


def check_parts(count: int, total: int, loc: str, per: str) -> None:
    """422 past the bound on content parts: ``count`` in one ``per`` (a message, an input
    item), ``total`` in the request so far."""
    if count > MAX_CONTENT_PARTS or total > MAX_CONTENT_PARTS_TOTAL:
        message = (
            f"at most {MAX_CONTENT_PARTS} content parts per {per} and "
            f"{MAX_CONTENT_PARTS_TOTAL} per request"
        )
        raise invalid([{"loc": loc, "msg": message}])


def _check_messages(body: dict[str, Any], errors: Errors) -> None:
    """Check ``body["messages"]`` whole, before anything is built from it: its size
    first (a 422 at once past :data:`MAX_MESSAGES` or a content part bound), then every
    message and part, at a few hundred nanoseconds each, whatever they hold. What passes
    here, the converter structures without an error of its own."""
    messages = body.get("messages")
    if type(messages) is not list:
        return  # missing, or not a list: the converter says which
    if len(messages) > MAX_MESSAGES:
        raise invalid([{"loc": "$.messages", "msg": f"at most {MAX_MESSAGES} messages"}])
    if not messages:
        errors.add("at least one message is required", "$.messages")
    parts_total = 0
    for i, message in enumerate(messages):
        if type(message) is not dict:
            errors.add(f"expected an object, got {_json_type(message)}", "$.messages[%d]", i)
            continue
        role = message.get("role")
        if role is None:
            errors.add("field required", "$.messages[%d].role", i)
        elif type(role) is not str:
            errors.add(f"expected a string, got {type(role).__name__}", "$.messages[%d].role", i)
        elif role not in ROLES:
            errors.add(f"unknown role {role[:40]!r}", "$.messages[%d].role", i)
        name = message.get("name")
        if name is not None and type(name) is not str:
            errors.add(f"expected a string, got {type(name).__name__}", "$.messages[%d].name", i)
        content = message.get("content")
        if content is None or type(content) is str:
            continue
        if type(content) is not list:
            errors.add(
                "expected a string, a list of content parts or null", "$.messages[%d].content", i
            )
            continue
        parts_total += len(content)
        check_parts(len(content), parts_total, f"$.messages[{i}].content", "message")
        for j, part in enumerate(content):
            _check_part(part, i, j, errors)


def _check_part(part: Any, i: int, j: int, errors: Errors) -> None:
    if type(part) is not dict or type(kind := part.get("type")) is not str:
        errors.add("expected an object with a 'type'", "$.messages[%d].content[%d]", i, j)
    elif kind == "text":
        if type(part.get("text")) is not str:
            errors.add("expected a string", "$.messages[%d].content[%d].text", i, j)
    elif kind in RESERVED_PART_TYPES:
        errors.add(
            f"{kind!r} parts are what the server builds for the engine; send media as "
            "image_url, input_audio, audio_url or video_url",
            "$.messages[%d].content[%d].type",
            i,
            j,
        )
    if type(part) is dict and "media" in part:
        errors.add(
            "'media' is reserved for the records the server builds for the engine",
            "$.messages[%d].content[%d].media",
            i,
            j,
        )


def parse_chat(body: dict[str, Any]) -> ChatCompletionRequest:
    errors = Errors()
    _check_messages(body, errors)
    if errors:
        # Nothing is built from faulty messages; the other fields are still checked.
        try:
            structure({**body, "messages": []}, ChatCompletionRequest)
        except HTTPError as error:
            errors.extend(error.details or [])
        raise errors.error()
    req = _plain(body, ChatCompletionRequest) or structure(body, ChatCompletionRequest)
    details: list[dict[str, str]] = []
    _check_common(req, details)
    if details:
        raise invalid(details)
    return req


def parse_completion(body: dict[str, Any]) -> CompletionRequest:
    req = _plain(body, CompletionRequest) or structure(body, CompletionRequest)
    errors: list[dict[str, str]] = []
    prompt = req.prompt
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        req.prompt = prompt[0]
    elif not isinstance(prompt, str):
        errors.append({"loc": "$.prompt", "msg": "expected a string (one prompt per request)"})
    _check_common(req, errors)
    if errors:
        raise invalid(errors)
    return req


def engine_params(req: _Common, body: dict[str, Any]) -> dict[str, Any]:
    """Sampling parameters for the engine: the validated fields, then unknown extras."""
    cls = type(req)
    known = _KNOWN[cls]
    params: dict[str, Any] = {k: v for k, v in body.items() if k not in known}
    for name in _PARAMS[cls]:
        value = getattr(req, name)
        if value is not None:
            params[name] = value
    if req.max_completion_tokens is not None:  # the current name wins over the old one
        params["max_tokens"] = req.max_completion_tokens
    params.pop("max_completion_tokens", None)
    return params


def chat_submit(
    request_id: str, model: str, req: ChatCompletionRequest, body: dict[str, Any]
) -> Submit:
    # The messages as the client sent them (validated above): fields this frontend does
    # not check, such as tool_calls and tool_call_id, are the engine's to read.
    return Submit(
        request_id, model, "chat", {"messages": body["messages"]}, engine_params(req, body)
    )


def completion_submit(
    request_id: str, model: str, req: CompletionRequest, body: dict[str, Any]
) -> Submit:
    return Submit(request_id, model, "completion", {"prompt": req.prompt}, engine_params(req, body))


@attrs.frozen
class Generation:
    """A validated generation request, ready for any transport."""

    submit: Submit
    capability: str  # "chat" or "completion"
    stream: bool
    include_usage: bool
    #: Choices asked for; more than one are as many engine requests (:meth:`choices`).
    n: int = 1
    #: Tool calls and reasoning to parse out of each choice's text (``bodies/agents.py``).
    agents: AgentOptions | None = None

    def with_submit(self, submit: Submit) -> Generation:
        """This request with ``submit`` in place of its own (made directly: ``attrs.evolve``
        introspects the class on every call, and this is every request's path)."""
        return Generation(
            submit, self.capability, self.stream, self.include_usage, self.n, self.agents
        )

    def choices(self) -> list[Submit]:
        """The engine requests of ``n`` > 1 choices: ids ``<id>.<i>``, and with a seed,
        seed + i for choice i (as vLLM seeds its parallel samples, so that the choices
        differ and each is reproducible). Each keeps ``n`` among its params, so that an
        engine can judge the request as asked (vLLM refuses greedy n > 1); it generates
        one sequence for each (docs/protocol.md)."""
        params = self.submit.params
        seed = params.get("seed")
        return [
            attrs.evolve(
                self.submit,
                request_id=f"{self.submit.request_id}.{i}",
                params=params if seed is None else {**params, "seed": seed + i},
            )
            for i in range(self.n)
        ]

    def stream_format(self) -> StreamFormat:
        fmt = StreamFormat(
            self.capability, self.submit.request_id, self.submit.model, self.include_usage
        )
        # chat: "logprobs": true; completions: "logprobs": N, where 0 asks for them too
        # (and 0 == False: hence the identity tests).
        asked = self.submit.params.get("logprobs")
        fmt.with_logprobs = asked is not None and asked is not False
        # (vLLM streams a completion's echo with the prompt's token ids, unasked.)
        params = self.submit.params
        echo = self.capability == "completion" and bool(params.get("echo"))
        fmt.returns_token_ids = bool(params.get("return_token_ids"))
        fmt.with_token_ids = fmt.returns_token_ids or echo
        if self.agents is not None:
            fmt.parsers = self.agents.parser
            fmt.parser = self.agents.parser()
        return fmt

    def choice_formats(self) -> list[StreamFormat]:
        """The chunk formats of ``n`` streamed choices: one each, with its ``index``."""
        formats = [self.stream_format() for _ in range(self.n)]
        for index, fmt in enumerate(formats):
            fmt.index = index
        return formats


#: Endpoint names (as the WebSocket route spells them) and their capability.
ENDPOINTS = {"chat.completions": "chat", "completions": "completion"}


def parse_generation(
    capability: str,
    body: dict[str, Any],
    request_id: str,
    resolve_model: Any,
    *,
    streamed: bool = False,
    parsers: ParserNames = ParserNames(),  # noqa: B008 (frozen)
) -> Generation:
    """Validate ``body`` for ``capability`` and translate it (422 :class:`HTTPError` if bad).

    ``resolve_model(requested: str | None) -> str`` picks the model to use; ``streamed``:
    the transport streams whatever the body says (WebSocket); ``parsers``: the formats
    the server parses tool calls and reasoning in (chat only).
    """
    req: _Common
    agents = None
    if capability == "chat":
        req = parse_chat(body)
        submit = chat_submit(request_id, resolve_model(req.model), req, body)
        agents = parse_agent_options(body, parsers, submit.params)
    else:
        req = parse_completion(body)
        submit = completion_submit(request_id, resolve_model(req.model), req, body)
    if req.user:  # the session key of affinity routing (not sent to the engine)
        submit = attrs.evolve(submit, session_key=req.user)
    if req.stream or streamed:
        # For the engine's checks: vLLM refuses what a stream cannot carry (its
        # prompt_logprobs), and the text layer lowers the request as vLLM does.
        submit.params["stream"] = True
    options = req.stream_options
    n = req.n or 1
    include_usage = bool(options and options.include_usage)
    return Generation(submit, capability, bool(req.stream), include_usage, n, agents)


#: What ``json.dumps`` does with a str, without the two Python calls around it (per token).
