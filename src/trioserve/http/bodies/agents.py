"""What a chat request asks of tool calls and reasoning: ``tools``, ``tool_choice``,
``parallel_tool_calls``, ``chat_template_kwargs``, ``reasoning_effort``,
``include_reasoning``; checked as vLLM's ``ChatCompletionRequest`` checks them, and
translated into the parser of its answer (``text/agents``) and what the engine is sent.

The frontend parses the answer, whatever the engine; so the engine is asked only to
render the tools into the prompt and generate: it is sent ``tool_choice: "none"``
(vLLM's renderer then keeps the tools for the template and parses nothing), and for a
forced call (``required``, a named function) the constraint that holds its answer to the
call(s), as vLLM's own server hands it over (``structured_outputs``: a structural tag in
the format's own syntax, or a JSON schema; :func:`tool_constraint`).
"""

from __future__ import annotations

import json
from typing import Any

import attrs

from ...text.agents import ParserNames, ToolUse, forced_schema, output_parser
from ...text.agents.output import OutputParser
from ...text.agents.structural_tags import (
    STRUCTURAL_TAG_MODELS,
    mistral_schema,
    output_format,
    structural_tag,
)
from .validation import Errors, _json_type

#: Most tools one request may declare (OpenAI's limit): each one's schema is compiled
#: by the engine's structured outputs when a call is forced.
MAX_TOOLS = 128

#: The constraints of vLLM's ``StructuredOutputsParams`` (one at most): a forced call's
#: schema replaces any of them.
CONSTRAINTS = frozenset({"json", "regex", "choice", "grammar", "json_object", "structural_tag"})

#: What ``reasoning_effort`` takes (vLLM's values).
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")


@attrs.frozen
class AgentOptions:
    """One chat request's parsing: what :meth:`parser` builds for each choice."""

    names: ParserNames
    tool_use: ToolUse | None
    template_kwargs: dict[str, Any] | None
    reasoning_effort: str | None
    include_reasoning: bool

    def parser(self) -> OutputParser | None:
        return output_parser(
            self.names,
            self.tool_use,
            self.template_kwargs,
            self.reasoning_effort,
            self.include_reasoning,
        )


def _check_tools(tools: Any, errors: Errors) -> list[dict[str, Any]]:
    if type(tools) is not list:
        errors.add(f"expected a list of tools, got {_json_type(tools)}", "$.tools")
        return []
    if not tools:
        errors.add("`tools` must not be an empty array; omit it instead", "$.tools")
    if len(tools) > MAX_TOOLS:
        errors.add(f"at most {MAX_TOOLS} tools", "$.tools")
        return []
    for i, tool in enumerate(tools):
        if type(tool) is not dict or tool.get("type", "function") != "function":
            errors.add('expected {"type": "function", "function": {...}}', "$.tools[%d]", i)
            continue
        function = tool.get("function")
        if type(function) is not dict:
            errors.add("expected an object", "$.tools[%d].function", i)
            continue
        name = function.get("name")
        if type(name) is not str or not name:
            errors.add("expected a non-empty string", "$.tools[%d].function.name", i)
        params = function.get("parameters")
        if params is not None and type(params) is not dict:
            errors.add("expected a JSON schema object", "$.tools[%d].function.parameters", i)
    return tools


def _check_choice(choice: Any, tools: list[dict[str, Any]] | None, errors: Errors) -> Any:
    if choice is None:
        return "auto" if tools else "none"
    if choice == "none":
        return choice
    if tools is None:
        errors.add("when using `tool_choice`, `tools` must be set", "$.tool_choice")
        return "none"
    if choice in ("auto", "required"):
        return choice
    function = choice.get("function") if type(choice) is dict else None
    name = function.get("name") if type(function) is dict else None
    if type(name) is not str or not name:
        errors.add(
            'expected "none", "auto", "required" or '
            '{"type": "function", "function": {"name": "my_function"}}',
            "$.tool_choice",
        )
        return "none"
    declared = {t["function"].get("name") for t in tools if type(t.get("function")) is dict}
    if name not in declared:
        errors.add(
            f"the tool specified in `tool_choice` ({name[:64]!r}) is not one of `tools`",
            "$.tool_choice",
        )
    return choice


def tool_constraint(
    tool_call_parser: str | None,
    tools: list[dict[str, Any]],
    choice: Any,
    parallel: bool | None,
    params: dict[str, Any],
    strict_level: str = "auto",
) -> dict[str, Any] | None:
    """The structured outputs constraint that holds the model to the calls, as vLLM 0.32's
    server sets it for the request's tool-call format (``text/agents/structural_tags.py``):
    a structural tag in the format's own syntax (hermes, llama3_json, qwen3_coder; also
    for ``auto`` with a strict tool or ``parallel_tool_calls: false``), Mistral's call
    array, or, without a format, the generic JSON schema of vLLM's generic path; for
    ``auto`` with a strict tool and a constraint of the request's own, a tag that is the
    calls or that constraint; None: no constraint (the request's own, if any, stays)."""
    if tool_call_parser in STRUCTURAL_TAG_MODELS:
        given = params.get("structured_outputs")
        constrained = params.get("response_format") not in (None, {"type": "text"}) or (
            isinstance(given, dict) and any(given.get(k) is not None for k in CONSTRAINTS)
        )
        own = _own_constraint(params) if constrained else None
        output = None if own is None else output_format(own)
        tag = structural_tag(
            tool_call_parser, tools, choice, parallel, constrained, output, strict_level
        )
        return None if tag is None else {"structural_tag": tag}
    if tool_call_parser == "mistral":
        # vLLM's Mistral parser forces nothing over structured outputs of the request's
        # own, nor over a structural-tag response format: those stay alone.
        given_format = params.get("response_format")
        format_type = given_format.get("type") if isinstance(given_format, dict) else None
        if params.get("structured_outputs") is not None or format_type == "structural_tag":
            return None
        schema = mistral_schema(tools, choice)
    else:
        schema = forced_schema(tools, choice, parallel)
    return None if schema is None else {"json": schema}


def _own_constraint(params: dict[str, Any]) -> dict[str, Any] | None:
    """The request's own structured-outputs constraint (``response_format`` over
    ``structured_outputs``, as vLLM's ``structured_outputs_from_response_format``), when
    it is well formed; None otherwise (it then stays as given, for
    ``text/structured.py`` to refuse with vLLM's 400)."""
    response_format = params.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type") != "text":
        kind = response_format.get("type")
        if kind == "json_object":
            return {"json_object": True}
        if kind == "json_schema":
            schema = response_format.get("json_schema")
            schema = (
                schema.get("schema", schema.get("json_schema"))
                if isinstance(schema, dict)
                else None
            )
            return {"json": schema} if isinstance(schema, dict) else None
        if kind == "structural_tag":
            return {"structural_tag": response_format}
        return None
    given = params.get("structured_outputs")
    if not isinstance(given, dict):
        return None
    own = {k: given[k] for k in CONSTRAINTS if given.get(k) is not None}
    if len(own) != 1:
        return None
    [(kind, value)] = own.items()
    well_formed = {
        "json": isinstance(value, dict) or (isinstance(value, str) and _is_json(value)),
        "regex": isinstance(value, str),
        "choice": isinstance(value, list)
        and bool(value)
        and all(isinstance(c, str) for c in value),
        "grammar": isinstance(value, str) and bool(value.strip()),
        "json_object": value is True,
        "structural_tag": isinstance(value, str) and _is_json(value),
    }
    return own if well_formed[kind] else None


def _is_json(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def parse_agent_options(
    body: dict[str, Any], names: ParserNames, params: dict[str, Any]
) -> AgentOptions | None:
    """Check ``body``'s tool and reasoning fields (a 422 when they are wrong); adjust
    ``params`` (what the engine is sent) in place; None when the answer is plain text."""
    errors = Errors()
    tools = body.get("tools")
    if tools is not None:
        tools = _check_tools(tools, errors)
    choice = _check_choice(body.get("tool_choice"), tools, errors)
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and type(parallel) is not bool:
        errors.add("expected a boolean", "$.parallel_tool_calls")
    include_reasoning = body.get("include_reasoning", True)
    if type(include_reasoning) is not bool:
        errors.add("expected a boolean", "$.include_reasoning")
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None and type(kwargs) is not dict:
        errors.add("expected an object", "$.chat_template_kwargs")
        kwargs = None
    effort = body.get("reasoning_effort")
    if effort is not None and effort not in EFFORTS:
        errors.add(f"expected one of {', '.join(EFFORTS)}", "$.reasoning_effort")
        effort = None
    if errors:
        raise errors.error()
    if choice == "auto" and names.tool_call is None:
        errors.add(
            '"auto" tool choice requires a tool-call parser: start trioserve with '
            "--tool-call-parser NAME (docs/api.md, Tool calls)",
            "$.tool_choice",
        )
        raise errors.error()

    tool_use = None
    if tools and choice != "none":
        named = choice["function"]["name"] if isinstance(choice, dict) else None
        tool_use = ToolUse(tools, named or choice, named, parallel is not False)
        constraint = tool_constraint(
            names.tool_call, tools, choice, parallel, params, names.tool_strict_level
        )
        if constraint is not None:
            # As vLLM's adjust_request: the call is the answer, whatever format was asked;
            # the client's options of structured outputs (disable_any_whitespace, ...) stay.
            given = params.get("structured_outputs")
            options = {
                k: v
                for k, v in (given if isinstance(given, dict) else {}).items()
                if k not in CONSTRAINTS
            }
            params["structured_outputs"] = {**options, **constraint}
            params.pop("response_format", None)
        # Tool-call markers are special tokens in some models: keep them in the text.
        params.setdefault("skip_special_tokens", False)
    if tools is not None:
        params["tool_choice"] = "none"  # the engine renders the tools, this frontend parses
    if tool_use is None and names.reasoning is None:
        return None
    return AgentOptions(names, tool_use, kwargs, effort, include_reasoning)
