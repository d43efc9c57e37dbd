"""A generation request made ready for a token-id engine, in one call: the prompt's token ids,
the lowered sampling parameters and, for ``echo``, what the answer begins with
(:func:`prepare`), with every check vLLM's serving layer and input processor make on the
way. What the render routes answer, and what an engine link that takes token ids submits.

CPU-bound (rendering, encoding): from an event loop, run it in a worker thread unless
:func:`small_enough_inline` says the hop would cost more than the work. Raises
:class:`~trioserve.errors.TextInputError` (400) for anything vLLM would refuse; owes the engine
nothing (nothing was sent).
"""

from __future__ import annotations

from typing import Any

import attrs

from ..errors import TextInputError
from .prompts import Prompt, chat_prompt, check_prompt_length, completion_prompt
from .registry import ServedText
from .sampling import Sampling, lower
from .template import ChatOptions

#: vLLM's refusal of a request's own chat template (without --trust-request-chat-template).
UNTRUSTED_TEMPLATE = (
    "Chat template is passed with request, but --trust-request-chat-template is not set. "
    "Refused request with untrusted chat template."
)


@attrs.frozen
class Prepared:
    """A request as a token-id engine takes it."""

    prompt: Prompt
    sampling: Sampling
    #: What the answer begins with when the request asked for ``echo`` (:func:`echoed`);
    #: None without ``echo``.
    echo: str | None = None


#: Request fields neither vLLM path's text pipeline serves yet, and what they are: a 400
#: naming them (only ``--backend asyncllm`` serves them), never an answer without them.
UNSERVED_FIELDS = {
    "lora_request": "LoRA adapters",
    "lora": "LoRA adapters",
    "mm_processor_kwargs": "multimodal inputs",
    "prompt_embeds": "prompt embeddings",
}


def unserved_field(params: dict[str, Any]) -> tuple[str, str] | None:
    """The first of :data:`UNSERVED_FIELDS` the request sets, and what it is."""
    for name, what in UNSERVED_FIELDS.items():
        if params.get(name) is not None:
            return name, what
    return None


#: The most characters of text a request may carry to be prepared in the event loop rather
#: than in a worker thread: below it the hop to the thread costs more CPU than the
#: rendering and encoding, and the loop's other requests wait at most about a quarter of a
#: millisecond (the figures: docs/benchmarks.md, "A short request").
INLINE_CHARS = 1024


def small_enough_inline(task: str, inputs: dict[str, Any], params: dict[str, Any]) -> bool:
    """Whether :func:`prepare` of this request is cheaper run where it is than in a worker
    thread: text (message contents and their parts' text, or the prompt) of at most
    :data:`INLINE_CHARS` characters, and nothing else that the template renders at length
    (tools, documents, a template of the request's own)."""
    if params.get("tools") or params.get("documents") or params.get("chat_template"):
        return False
    budget = INLINE_CHARS
    if task == "completion":
        prompt = inputs.get("prompt")
        if isinstance(prompt, str):
            return len(prompt) <= budget
        # Token ids (or a list of them): no encoding, only checks.
        return isinstance(prompt, list) and len(prompt) <= budget
    for message in inputs.get("messages") or ():
        if not isinstance(message, dict) or len(message) > 2:
            return False  # tool calls, names, reasoning: rendered at length
        content = message.get("content")
        if isinstance(content, str):
            budget -= len(content)
        elif isinstance(content, list):
            for part in content:
                text = part.get("text") if isinstance(part, dict) else None
                if not isinstance(text, str) or len(part) > 2:
                    return False  # media, or a part with more than its type and text
                budget -= len(text)
        elif content is not None:
            return False
        if budget < 0:
            return False
    return True


def _bool(params: dict[str, Any], name: str, default: bool) -> bool:
    value = params.get(name, default)
    if value is None:
        return default
    if type(value) is not bool:
        raise TextInputError(f"{name} must be a boolean", param=name)
    return value


def chat_options(params: dict[str, Any]) -> ChatOptions:
    """The chat request's prompt options (vLLM's names and defaults), checked."""
    kwargs = params.get("chat_template_kwargs")
    if params.get("chat_template") is not None or (
        isinstance(kwargs, dict) and kwargs.get("chat_template") is not None
    ):
        raise TextInputError(UNTRUSTED_TEMPLATE, param="chat_template")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise TextInputError("chat_template_kwargs must be an object", param="chat_template_kwargs")
    tools = params.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise TextInputError("tools must be a list", param="tools")
    if tools == []:
        raise TextInputError(
            "`tools` must not be an empty array. Either provide at least one tool or omit "
            "the field entirely.",
            param="tools",
        )
    documents = params.get("documents")
    if documents is not None and (
        not isinstance(documents, list) or not all(isinstance(d, dict) for d in documents)
    ):
        raise TextInputError("documents must be a list of objects", param="documents")
    continue_final = _bool(params, "continue_final_message", False)
    add_generation_prompt = _bool(params, "add_generation_prompt", True)
    if continue_final and add_generation_prompt and "add_generation_prompt" in params:
        raise TextInputError(
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
            param="continue_final_message",
        )
    effort = params.get("reasoning_effort")
    return ChatOptions(
        add_generation_prompt=add_generation_prompt and not continue_final,
        continue_final_message=continue_final,
        tools=tools,
        documents=documents,
        chat_template_kwargs=kwargs,
        reasoning_effort=effort if isinstance(effort, str) else None,
    )


def chat_request_prompt(served: ServedText, messages: list[Any], params: dict[str, Any]) -> Prompt:
    """A chat request's prompt (its template rendered, then encoded)."""
    return chat_prompt(
        served.text,
        messages,
        chat_options(params),
        add_special_tokens=_bool(params, "add_special_tokens", False),
        max_model_len=served.limits.max_model_len,
    )


def completion_request_prompt(served: ServedText, prompt: Any, params: dict[str, Any]) -> Prompt:
    """A completion request's prompt: a string, or token ids."""
    if not isinstance(prompt, (str, list)):
        raise TextInputError("prompt must be a string or a list of token ids", param="prompt")
    return completion_prompt(
        served.text,
        prompt,
        add_special_tokens=_bool(params, "add_special_tokens", True),
        max_model_len=served.limits.max_model_len,
    )


def prepare(
    served: ServedText,
    task: str,
    inputs: dict[str, Any],
    params: dict[str, Any],
    *,
    stream: bool,
    for_engine: bool = True,
) -> Prepared:
    """``task`` (``"chat"``: ``inputs["messages"]``; ``"completion"``: ``inputs["prompt"]``)
    with ``params`` (the request's OpenAI parameters), ready for the engine. ``for_engine``:
    the input processor's prompt-length rules too (an empty prompt; one that fills the
    context), which vLLM applies at submission, not when it renders."""
    if task == "chat":
        prompt = chat_request_prompt(served, inputs.get("messages") or [], params)
    elif task == "completion":
        prompt = completion_request_prompt(served, inputs.get("prompt"), params)
    else:
        raise TextInputError(f"the text pipeline does not serve {task!r} requests", param=None)
    sampling = lower(
        params,
        endpoint=task,
        prompt_len=len(prompt.token_ids),
        model=served.text,
        limits=served.limits,
        stream=stream,
    )
    if for_engine:  # after the sampling checks, as vLLM's order has it
        check_prompt_length(len(prompt.token_ids), served.limits.max_model_len)
    echo = echoed(task, inputs, params, prompt, sampling) if sampling.echo else None
    return Prepared(prompt, sampling, echo)


def echoed(
    task: str, inputs: dict[str, Any], params: dict[str, Any], prompt: Prompt, sampling: Sampling
) -> str:
    """What an ``echo`` answer begins with, as vLLM's serving layer has it: a completion's
    prompt (none when token ids are returned), or a chat's last message if it has the
    answer's role (``assistant``; without a generation prompt, the last message's own),
    its text parts joined by newlines."""
    if task != "chat":
        return "" if sampling.return_token_ids else prompt.text or ""
    messages = list(inputs.get("messages") or ())
    if not messages or not isinstance(messages[-1], dict):
        return ""
    last = messages[-1]
    generation_prompt = params.get("add_generation_prompt", True)
    role = "assistant" if generation_prompt else last.get("role")
    if last.get("role") != role:
        return ""
    content = last.get("content")
    if isinstance(content, list):
        return "\n".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return content if isinstance(content, str) else ""
