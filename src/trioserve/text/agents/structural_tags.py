"""What vLLM 0.32's server hands the engine to hold a tool call to the model's own format:
an xgrammar structural tag (``structured_outputs.structural_tag``), for the formats whose
vLLM parser names one (``structural_tag_model``: hermes, llama, qwen_3_coder), and, for
``mistral`` with a Hugging Face tokenizer, the JSON schema of its native call array.

vLLM's ``Parser._apply_structural_tag`` (``vllm/parser/abstract_parser.py``) with its
defaults (``VLLM_ENFORCE_STRICT_TOOL_CALLING`` on, ``--tool-strict-level auto``), made
sans-io here:

- ``required``: the answer is one or more calls (``parallel_tool_calls: false``: one),
  each in the format's envelope, nothing else around them for hermes (llama and
  qwen3_coder allow text before the first);
- a named function: exactly one call of it;
- ``auto``: no constraint, unless a tool says ``strict: true`` or the request says
  ``parallel_tool_calls: false`` (the envelope is then constrained wherever the model
  opens a call, and at most one call for the latter);
- ``auto`` with structured outputs of the request's own (``response_format``,
  ``structured_outputs``): that constraint alone, unless a tool says ``strict: true``:
  then the answer is either the calls (as for ``required``) or the request's format,
  one xgrammar ``or`` of the two (:func:`output_format` writes the request's constraint
  as xgrammar's format, as vLLM's ``structured_outputs_to_format`` does);
- a call's arguments follow the tool's schema only when the tool says ``strict: true``;
  otherwise they are any JSON (qwen3_coder: any parameters), as vLLM leaves them.

The model then writes calls as the format's parser reads them (``output.py`` parses a
forced answer as ``auto``, as vLLM does for these formats). The tags are built as
vLLM's registry builds them (``vllm/tool_parsers/structural_tag_registry.py``, hermes)
and xgrammar's (``xgrammar/builtin_structural_tag.py``, llama and qwen_3_coder), and
serialized as vLLM serializes them (``json.dumps`` of the pydantic models, every field),
so the engine gets the same bytes: tests/vllm/test_tool_constraints.py holds them to
vLLM's own on the same requests.
"""

from __future__ import annotations

import json
from typing import Any

from ..structured import _likely_lark

#: The structural-tag model of each tool-call format (vLLM's parser class's
#: ``structural_tag_model``).
STRUCTURAL_TAG_MODELS = {
    "hermes": "hermes",
    "qwen3_json": "hermes",
    "llama3_json": "llama",
    "llama4_json": "llama",
    "qwen3_coder": "qwen_3_coder",
    "qwen3_xml": "qwen_3_coder",
}

#: The formats whose forced calls vLLM parses as ``auto`` (its parser class's
#: ``supports_required_and_named`` is false): the answer is in the format's own syntax.
NATIVE_FORCED_FORMATS = frozenset({*STRUCTURAL_TAG_MODELS, "mistral"})

_THINK = ["<think>", "</think>"]


def _json_schema(schema: Any, style: str = "json") -> dict[str, Any]:
    return {
        "type": "json_schema",
        "json_schema": schema,
        "style": style,
        "any_order": False,
        "max_whitespace_cnt": None,
        "excludes": [],
    }


def _tag(begin: str, content: dict[str, Any], end: str) -> dict[str, Any]:
    return {"type": "tag", "begin": begin, "content": content, "end": end}


def _triggered(
    triggers: list[str], tags: list[dict[str, Any]], at_least_one: bool, excludes: list[str]
) -> dict[str, Any]:
    return {
        "type": "triggered_tags",
        "triggers": triggers,
        "tags": tags,
        "at_least_one": at_least_one,
        "stop_after_first": False,
        "excludes": excludes,
    }


def _arguments(function: dict[str, Any], strict: bool) -> Any:
    """A call's argument schema: the tool's when it is strict, else any (``true``)."""
    if not strict:
        return True
    return function["parameters"] if function.get("parameters") is not None else True


def _hermes(calls: list[tuple[str, Any]], choice: str) -> dict[str, Any]:
    tags = [
        _tag(begin + name + '", "arguments": ', _json_schema(schema), end)
        for name, schema in calls
        for begin, end in (
            ('<tool_call>\n{"name": "', "}\n</tool_call>"),
            ('<tool_call>{"name": "', "}</tool_call>"),
        )
    ]
    if choice == "auto":
        return _triggered(["<tool_call>"], tags, False, [])
    return {
        "type": "tags_with_separator",
        "tags": tags,
        "separator": "",
        "at_least_one": True,
        "stop_after_first": choice == "forced",
    }


def _llama(calls: list[tuple[str, Any]], choice: str) -> dict[str, Any]:
    tags = [
        _tag('{"name": "' + name + '", "parameters": ', _json_schema(schema), "}")
        for name, schema in calls
    ]
    if choice == "forced":
        return tags[0]
    return _triggered(['{"name": '], tags, choice == "required", list(_THINK))


def _qwen_3_coder(calls: list[tuple[str, Any]], choice: str) -> dict[str, Any]:
    tags = [
        _tag(
            f"<tool_call>\n<function={name}>\n",
            _json_schema(schema, "qwen_xml"),
            "\n</function>\n</tool_call>",
        )
        for name, schema in calls
    ]
    if choice == "forced":
        return tags[0]
    return _triggered(["<tool_call>\n<function="], tags, choice == "required", list(_THINK))


_BUILDERS = {"hermes": _hermes, "llama": _llama, "qwen_3_coder": _qwen_3_coder}


def _single_call(node: Any) -> None:
    """At most one call: every list of calls stops after its first (vLLM's
    ``limit_to_single_tool_call``)."""
    if isinstance(node, dict):
        if node.get("type") in ("triggered_tags", "tags_with_separator"):
            node["stop_after_first"] = True
        for value in node.values():
            _single_call(value)
    elif isinstance(node, list):
        for value in node:
            _single_call(value)


def output_format(constraint: dict[str, Any]) -> dict[str, Any] | None:
    """The xgrammar format of a request's own constraint (one of vLLM's structured
    outputs, a response format already translated: ``{"json": schema}``,
    ``{"regex": ...}``, ...), as vLLM's ``structured_outputs_to_format`` writes it;
    None for what cannot be written so without xgrammar (a Lark grammar: vLLM converts
    it with xgrammar's ``Grammar.from_lark``), which then stays the only constraint."""
    if constraint.get("json_object"):
        return _json_schema({"type": "object"})
    if constraint.get("json") is not None:
        schema = constraint["json"]
        return _json_schema(json.loads(schema) if isinstance(schema, str) else schema)
    if constraint.get("regex") is not None:
        return {"type": "regex", "pattern": constraint["regex"]}
    if constraint.get("choice") is not None:
        values = constraint["choice"]
        return {"type": "or", "elements": [{"type": "const_string", "value": v} for v in values]}
    if constraint.get("grammar") is not None:
        grammar = constraint["grammar"]
        return None if _likely_lark(grammar) else {"type": "grammar", "grammar": grammar}
    if constraint.get("structural_tag") is not None:
        tag = constraint["structural_tag"]
        tag = json.loads(tag) if isinstance(tag, str) else tag
        if "structures" in tag:  # the legacy form: triggers and begin/schema/end
            tags = [
                _tag(t["begin"], _json_schema(t["schema"]), t["end"]) for t in tag["structures"]
            ]
            return _triggered(tag["triggers"], tags, False, [])
        # xgrammar fills a format's defaults when it reads it (vLLM sends them written).
        given = tag.get("format")
        return given if isinstance(given, dict) else None
    return None


#: vLLM's ``--tool-strict-level`` (``ToolStrictLevel``): ``auto`` derives the call
#: constraint from ``tool_choice`` and each tool's ``strict``; ``function`` constrains the
#: call envelope of every request with tools; ``parameter`` also holds every tool's
#: arguments to its schema, as if each said ``strict: true``.
TOOL_STRICT_LEVELS = {"auto": 0, "function": 1, "parameter": 2}


def structural_tag(
    format_name: str,
    tools: list[dict[str, Any]],
    choice: Any,
    parallel: bool | None,
    constrained: bool,
    output: dict[str, Any] | None = None,
    strict_level: str = "auto",
) -> str | None:
    """The structural tag (JSON text) vLLM's server constrains a request of tool-call
    format ``format_name`` with, or None when it sets none. ``choice`` is the request's
    ``tool_choice`` (``"auto"``, ``"required"`` or ``{"function": {"name": ...}}``);
    ``constrained``: the request has structured outputs of its own, ``output`` their
    xgrammar format (:func:`output_format`; None if they have none): ``auto`` with a
    strict tool then allows the calls or that format, else that constraint stays alone
    (None here)."""
    model = STRUCTURAL_TAG_MODELS.get(format_name)
    if model is None or choice == "none" or not tools:
        return None
    functions = [t["function"] for t in tools if t.get("type", "function") == "function"]
    auto = choice == "auto"
    single = parallel is False
    # vLLM's tool strict level, raised to "function" (the envelope constrained) when the
    # calls must be counted.
    level = TOOL_STRICT_LEVELS[strict_level]
    if single and not (auto and constrained):
        level = max(level, TOOL_STRICT_LEVELS["function"])
    if auto and level == 0 and not any(f.get("strict") is True for f in functions):
        return None
    pinned = level >= TOOL_STRICT_LEVELS["parameter"]
    joined = auto and constrained
    if joined and output is None:
        return None
    if isinstance(choice, dict):
        name = choice["function"]["name"]
        functions, simplified = [f for f in functions if f["name"] == name], "forced"
    else:
        # Joined with the request's format, "auto"'s text is that format's branch.
        simplified = "auto" if auto and not joined else "required"
    if not functions:
        return None
    calls = [(f["name"], _arguments(f, pinned or f.get("strict") is True)) for f in functions]
    tag = _BUILDERS[model](calls, simplified)
    if single:
        _single_call(tag)
    if joined:
        tag = {"type": "or", "elements": [tag, output]}
    return json.dumps({"type": "structural_tag", "format": tag})


def mistral_schema(tools: list[dict[str, Any]], choice: Any) -> dict[str, Any] | None:
    """The JSON schema vLLM's Mistral parser forces a call with on a Hugging Face
    tokenizer (``_build_guided_schema_pre_v11``): an array of ``{"name", "arguments"}``
    (one, for a named function); None for ``auto`` and ``none``."""
    if choice == "required":
        chosen = tools
        extra: dict[str, Any] = {}
    elif isinstance(choice, dict):
        name = choice["function"]["name"]
        chosen = [t for t in tools if t["function"]["name"] == name]
        extra = {"maxItems": 1}
    else:
        return None
    variants = [
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "enum": [t["function"]["name"]]},
                "arguments": t["function"].get("parameters") or {"type": "object"},
            },
            "required": ["name", "arguments"],
        }
        for t in chosen
    ]
    return {"type": "array", "minItems": 1, **extra, "items": {"type": "object", "anyOf": variants}}
