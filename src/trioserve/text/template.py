"""Chat templates rendered as transformers renders them, fed as vLLM feeds them.

The environment is transformers' (``utils/chat_template_utils.py``): a jinja2
``ImmutableSandboxedEnvironment`` with ``trim_blocks`` and ``lstrip_blocks``, the loop
controls extension and the ``{% generation %}`` tag, ``tojson`` without HTML escaping or key
sorting, ``raise_exception`` and ``strftime_now``; the variables are the messages, ``tools``,
``documents``, ``add_generation_prompt`` and the tokenizer's special tokens, then the request's
``chat_template_kwargs``. ``continue_final_message`` cuts the rendering where the final
message ends, with transformers' marker trick.

What vLLM does before that (``renderers/chat_utils.py``, ``renderers/hf.py``) is done here
too: a message's content becomes a string (its text parts joined with newlines) or, for a
template that loops over content parts (vLLM's "openai" content format, found in the
template's syntax tree), a list of ``{"type": "text", "text": ...}``; tool call arguments
that are JSON strings become objects; tools are dumped as vLLM's pydantic models dump them;
``developer`` turns into ``system`` for templates that do not know it.

Compiled templates are cached (by their source): rendering is the per-request cost.
"""

from __future__ import annotations

import copy
import json
from collections import deque
from collections.abc import Iterator
from datetime import datetime
from functools import lru_cache
from typing import Any

import attrs
import jinja2
import jinja2.ext
import jinja2.meta
import jinja2.nodes
import jinja2.sandbox

from ..errors import ChatTemplateError, TextInputError, UnsupportedContentError

#: Content part types that are text (vLLM's ``TEXT_PART_TYPES``), and the field that holds
#: the text of each.
TEXT_PARTS = {
    "text": "text",
    "input_text": "text",
    "output_text": "text",
    "refusal": "refusal",
    "thinking": "thinking",
}
#: Templates compiled and kept (a request may not bring its own: see :func:`render_chat`).
TEMPLATE_CACHE_SIZE = 16
#: transformers' marker for ``continue_final_message``.
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "
#: What transformers' ``apply_chat_template`` takes as named parameters: accepted among the
#: ``chat_template_kwargs`` even when the template does not name them (vLLM's
#: ``_get_hf_base_chat_template_params``).
_HF_BASE_PARAMS = frozenset(
    {
        "conversation",
        "tools",
        "documents",
        "chat_template",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
    }
)


class _GenerationTag(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}`` (transformers' AssistantTracker): renders
    its body; the assistant-token mask it exists for is not needed here."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller: Any) -> str:
        return str(caller())


def _raise_exception(message: Any) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


def _environment() -> jinja2.sandbox.ImmutableSandboxedEnvironment:
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


_ENV = _environment()


@attrs.frozen(eq=False)
class ChatTemplate:
    """One compiled template, with what vLLM reads from its syntax tree."""

    source: str
    template: jinja2.Template
    #: "openai" if the template loops over a message's content parts, else "string".
    content_format: str
    #: The variables the template reads (request kwargs outside them are dropped).
    variables: frozenset[str]
    #: Whether it names the ``developer`` role (else such messages become ``system``).
    knows_developer: bool

    def render(self, conversation: list[dict[str, Any]], **variables: Any) -> str:
        try:
            return self.template.render(messages=conversation, **variables)
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(str(exc)) from exc
        except (TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:
            # A template that breaks on this conversation (vLLM answers 400 too).
            raise ChatTemplateError(f"the chat template failed to render: {exc}") from exc


@lru_cache(maxsize=TEMPLATE_CACHE_SIZE)
def compile_template(source: str) -> ChatTemplate:
    """``source`` compiled in transformers' environment (cached); 400 if it does not
    parse."""
    try:
        tree = _ENV.parse(source)
        template = _ENV.from_string(tree)
        # A plain dict of the environment's globals (fixed once made) instead of jinja's
        # ChainMap over them: each render copies the globals into its context, and a
        # ChainMap is copied a key at a time in Python (docs/benchmarks.md).
        template.globals = dict(template.globals)
    except jinja2.TemplateError as exc:
        raise ChatTemplateError(f"the chat template does not compile: {exc}") from exc
    try:
        content_format = "openai" if next(_content_loops(tree), None) is not None else "string"
    except Exception:  # vLLM falls back to "string" when its tree walk fails
        content_format = "string"
    knows_developer = '"developer"' in source or "'developer'" in source
    variables = frozenset(jinja2.meta.find_undeclared_variables(tree))
    return ChatTemplate(source, template, content_format, variables, knows_developer)


# -- vLLM's content-format detection (renderers/hf.py), on the syntax tree ------------------


def _is_var(node: jinja2.nodes.Node, name: str) -> bool:
    return isinstance(node, jinja2.nodes.Name) and node.ctx == "load" and node.name == name


def _is_attr(node: jinja2.nodes.Node, name: str, key: str) -> bool:
    if isinstance(node, jinja2.nodes.Getitem):
        return (
            _is_var(node.node, name)
            and isinstance(node.arg, jinja2.nodes.Const)
            and node.arg.value == key
        )
    if isinstance(node, jinja2.nodes.Getattr):
        return _is_var(node.node, name) and node.attr == key
    return False


def _is_var_or_elems(node: jinja2.nodes.Node, name: str, key: str | None = None) -> bool:
    if isinstance(node, jinja2.nodes.Filter):
        return node.node is not None and _is_var_or_elems(node.node, name, key)
    if isinstance(node, jinja2.nodes.Test):
        return _is_var_or_elems(node.node, name, key)
    if isinstance(node, jinja2.nodes.Getitem) and isinstance(node.arg, jinja2.nodes.Slice):
        return _is_var_or_elems(node.node, name, key)
    return _is_attr(node, name, key) if key else _is_var(node, name)


def _names_bound_to(root: jinja2.nodes.Node, name: str) -> Iterator[str]:
    yield name
    related = deque([name])
    while related:
        current = related.popleft()
        for assign in root.find_all(jinja2.nodes.Assign):
            if _is_var_or_elems(assign.node, current) and isinstance(
                assign.target, jinja2.nodes.Name
            ):
                yield assign.target.name
                if assign.target.name != current:
                    related.append(assign.target.name)


def _message_names(root: jinja2.nodes.Node) -> Iterator[str]:
    names = list(_names_bound_to(root, "messages"))
    for loop in root.find_all(jinja2.nodes.For):
        for name in names:
            if _is_var_or_elems(loop.iter, name) and isinstance(loop.target, jinja2.nodes.Name):
                yield loop.target.name
                break


def _content_loops(root: jinja2.nodes.Node) -> Iterator[jinja2.nodes.For]:
    """The loops over a message's content parts (vLLM's ``_iter_nodes_assign_content_item``,
    macros that take ``message.content`` included)."""
    messages = list(_message_names(root))
    params_by_loop: dict[int, set[str]] = {}
    in_macros: set[int] = set()
    for macro in root.find_all(jinja2.nodes.Macro):
        param_names = {arg.name for arg in macro.args}
        content_params: set[str] = set()
        for call in root.find_all(jinja2.nodes.Call):
            if isinstance(call.node, jinja2.nodes.Name) and call.node.name == macro.name:
                for i, arg in enumerate(call.args):
                    if i < len(macro.args) and any(
                        _is_var_or_elems(arg, m, "content") for m in messages
                    ):
                        content_params.add(macro.args[i].name)
                for kwarg in call.kwargs:
                    if kwarg.key in param_names and any(
                        _is_var_or_elems(kwarg.value, m, "content") for m in messages
                    ):
                        content_params.add(kwarg.key)
        for loop in macro.find_all(jinja2.nodes.For):
            in_macros.add(id(loop))
            if content_params:
                params_by_loop[id(loop)] = content_params
    for loop in root.find_all(jinja2.nodes.For):
        if any(_is_var_or_elems(loop.iter, m, "content") for m in messages):
            yield loop
            continue
        bound = params_by_loop.get(id(loop))
        if isinstance(loop.iter, jinja2.nodes.Name) and (
            (bound is not None and loop.iter.name in bound)
            or (id(loop) not in in_macros and loop.iter.name == "content")
        ):
            yield loop


# -- messages into the conversation a template sees --------------------------------------


def _text_of(part: Any, where: str) -> str | None:
    """A content part's text; ``None`` for a text part with no text (vLLM skips those);
    400 for a part that is not text."""
    if isinstance(part, str):
        return part
    kind = part.get("type") if isinstance(part, dict) else None
    field = TEXT_PARTS.get(kind) if isinstance(kind, str) else None
    if field is None:
        raise UnsupportedContentError(
            f"content parts of type {kind!r} are not supported on this model's text "
            "pipeline (only text parts are)",
            param=f"{where}.type",
        )
    text = part.get(field)
    if text is None:
        return None
    if not isinstance(text, str):
        raise TextInputError(f"{where}.{field} must be a string", param=f"{where}.{field}")
    return text


def conversation(messages: list[dict[str, Any]], content_format: str) -> list[dict[str, Any]]:
    """``messages`` (OpenAI chat messages, already checked for shape) as vLLM hands them to
    the template (``parse_chat_messages``, text only)."""
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        role = message["role"]
        content = message.get("content")
        if content is None:
            parts: list[Any] = []
        elif isinstance(content, str):
            parts = [content]
        else:
            parts = content
        texts = [
            text
            for j, part in enumerate(parts)
            if (text := _text_of(part, f"messages[{i}].content[{j}]")) is not None
        ]
        turn: dict[str, Any] = {"role": role}
        if content_format == "openai":
            turn["content"] = [{"type": "text", "text": text} for text in texts]
        else:
            turn["content"] = "\n".join(texts)
        if role == "assistant":
            if message.get("tool_calls") is not None:
                turn["tool_calls"] = copy.deepcopy(list(message["tool_calls"]))
            reasoning = message.get("reasoning", message.get("reasoning_content"))
            if reasoning is not None:
                turn["reasoning"] = turn["reasoning_content"] = reasoning
        elif role == "tool":
            if "tool_call_id" in message:
                turn["tool_call_id"] = message["tool_call_id"]
            if isinstance(turn["content"], list):
                turn["content"] = "\n".join(p["text"] for p in turn["content"])
        if isinstance(message.get("name"), str):
            turn["name"] = message["name"]
        if role == "developer":
            turn["tools"] = message.get("tools")
        out.append(turn)
    _tool_call_arguments_as_objects(out)
    return out


def _tool_call_arguments_as_objects(turns: list[dict[str, Any]]) -> None:
    """vLLM's ``_postprocess_messages``: templates expect arguments as objects."""
    for turn in turns:
        if turn["role"] != "assistant" or "tool_calls" not in turn:
            continue
        calls = turn["tool_calls"]
        if not calls:
            del turn["tool_calls"]
            continue
        for call in calls:
            if not isinstance(call, dict):
                raise TextInputError(
                    "assistant tool_calls entries must be objects.", param="tool_calls"
                )
            function = call.get("function")
            if call.get("type", "function") != "function" or not isinstance(function, dict):
                raise TextInputError(
                    "chat completions only support assistant tool_calls of type 'function'.",
                    param="tool_calls",
                )
            arguments = function.get("arguments")
            if not arguments:
                function["arguments"] = {}
            elif not isinstance(arguments, dict):
                parsed: Any = None
                if isinstance(arguments, str):
                    try:
                        parsed = json.loads(arguments)
                    except ValueError:
                        parsed = None  # vLLM keeps the conversation going with {}
                function["arguments"] = parsed if isinstance(parsed, dict) else {}


def _developer_as_system(turns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """vLLM's ``_convert_developer_to_system`` then ``_consolidate_system_messages``."""
    converted = []
    for turn in turns:
        if turn["role"] == "developer":
            turn = {k: v for k, v in turn.items() if k != "tools"}
            turn["role"] = "system"
        converted.append(turn)
    system_texts: list[str] = []
    rest: list[dict[str, Any]] = []
    merge = False
    for i, turn in enumerate(converted):
        if turn["role"] != "system":
            rest.append(turn)
            continue
        if i > 0 or system_texts:
            merge = True
        content = turn.get("content", "")
        if isinstance(content, list):
            content = "\n".join(p["text"] for p in content if isinstance(p, dict) and "text" in p)
        if content:
            system_texts.append(content)
    if not merge:
        return converted
    return [{"role": "system", "content": "\n\n".join(system_texts)}, *rest]


def dump_tools(tools: list[Any]) -> list[dict[str, Any]]:
    """Tools as vLLM's ``ChatCompletionToolsParam.model_dump()`` gives them to the template:
    ``description`` and ``parameters`` present (null if absent), ``strict`` and
    ``defer_loading`` only when set."""
    dumped = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or not isinstance(tool.get("function"), dict):
            raise TextInputError(
                "each tool must be an object with a 'function'", param=f"tools[{i}]"
            )
        function = tool["function"]
        if not isinstance(function.get("name"), str):
            raise TextInputError(
                "a tool's function needs a name", param=f"tools[{i}].function.name"
            )
        fn: dict[str, Any] = {
            "name": function["name"],
            "description": function.get("description"),
            "parameters": function.get("parameters"),
        }
        defer = function.get("defer_loading", tool.get("defer_loading"))
        if function.get("strict") is not None:
            fn["strict"] = function["strict"]
        if defer is not None:
            fn["defer_loading"] = defer
        entry: dict[str, Any] = {"type": tool.get("type", "function"), "function": fn}
        if tool.get("defer_loading") is not None:
            entry["defer_loading"] = tool["defer_loading"]
        dumped.append(entry)
    return dumped


@attrs.frozen
class ChatOptions:
    """What a chat request says about its prompt (vLLM's names and defaults)."""

    add_generation_prompt: bool = True
    continue_final_message: bool = False
    tools: list[Any] | None = None
    documents: list[dict[str, Any]] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_effort: str | None = None


def template_variables(template: ChatTemplate, options: ChatOptions) -> dict[str, Any]:
    """The request's variables as vLLM merges them (``build_chat_params``: the request's
    ``chat_template_kwargs``, overridden by the fields that are set), filtered as
    ``resolve_chat_template_kwargs`` filters them."""
    given = dict(options.chat_template_kwargs or {})
    unexpected = {"chat_template", "tokenize"} & given.keys()
    if unexpected:
        raise TextInputError(
            f"Found unexpected chat template kwargs from request: {unexpected}",
            param="chat_template_kwargs",
        )
    extra: dict[str, Any] = {
        "add_generation_prompt": options.add_generation_prompt,
        "continue_final_message": options.continue_final_message,
        "documents": options.documents,
        "reasoning_effort": options.reasoning_effort,
    }
    if options.reasoning_effort is not None and "enable_thinking" not in given:
        extra["enable_thinking"] = options.reasoning_effort != "none"
    merged = given | {k: v for k, v in extra.items() if v is not None and v != "auto"}
    accepted = template.variables | _HF_BASE_PARAMS
    return {k: v for k, v in merged.items() if k in accepted}


def render_chat(
    template: ChatTemplate,
    messages: list[dict[str, Any]],
    options: ChatOptions,
    special_tokens: dict[str, Any],
) -> str:
    """The prompt text for ``messages`` (transformers' ``apply_chat_template(tokenize=False)``
    as vLLM calls it). 400 (:class:`~trioserve.errors.ChatTemplateError`) for what the
    template refuses."""
    if not messages:
        raise TextInputError(
            "Cannot apply chat template to an empty conversation.", param="messages"
        )
    turns = conversation(messages, template.content_format)
    if not template.knows_developer and any(t["role"] == "developer" for t in turns):
        turns = _developer_as_system(turns)
    variables = template_variables(template, options)
    add_generation_prompt = bool(variables.pop("add_generation_prompt", False))
    continue_final = variables.pop("continue_final_message", False)
    documents = variables.pop("documents", None)
    for name in _HF_BASE_PARAMS:  # apply_chat_template's own parameters, not the template's
        variables.pop(name, None)
    if continue_final and add_generation_prompt:
        raise TextInputError(
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
            param="continue_final_message",
        )
    tools = dump_tools(options.tools) if options.tools is not None else None
    final_text = None
    if continue_final:
        final_text = _mark_final_message(turns, template.source)
    rendered = template.render(
        turns,
        **{**special_tokens, **variables},
        tools=tools,
        documents=documents,
        add_generation_prompt=add_generation_prompt,
    )
    if final_text is not None:
        rendered = _cut_at_final_message(rendered, final_text)
    return rendered


def _mark_final_message(turns: list[dict[str, Any]], source: str) -> str:
    """transformers' ``continue_final_message``: the final message's text gets a marker the
    rendering is cut at. Returns the text to continue."""
    final = turns[-1]
    content = final.get("content")
    if content is None:
        raise TextInputError(
            'continue_final_message is set but the final message has no "content" to continue!',
            param="continue_final_message",
        )
    if "content" not in source:
        raise TextInputError(
            'continue_final_message is set to "content" but this is not an accepted field '
            "in the chat_template",
            param="continue_final_message",
        )
    if isinstance(content, list):
        for part in reversed(content):
            if "text" in part:
                text = part["text"]
                part["text"] = text + _CONTINUE_TAG
                return str(text)
        raise TextInputError(
            "continue_final_message is set but we could not find any text to continue in "
            "the final message!",
            param="continue_final_message",
        )
    final["content"] = content + _CONTINUE_TAG
    return str(content)


def _cut_at_final_message(rendered: str, final_text: str) -> str:
    tag = _CONTINUE_TAG.strip()
    if final_text.strip() not in rendered or tag not in rendered:
        raise ChatTemplateError(
            "continue_final_message is set but the final message does not appear in the "
            "chat after applying the chat template!"
        )
    at = rendered.rindex(tag)
    if rendered[at : at + len(_CONTINUE_TAG)] == _CONTINUE_TAG:
        return rendered[:at]
    return rendered[:at].rstrip()
