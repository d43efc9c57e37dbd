"""Prompts into token ids, as vLLM's serving layer makes them, with its length rules.

- Chat: the template renders the text (which holds the BOS the template writes), then the
  text is encoded with ``add_special_tokens`` as the request says, **false** by default
  (vLLM's ``ChatCompletionRequest.add_special_tokens``: the template already wrote them).
- Completions: a string is encoded with ``add_special_tokens`` true by default; token ids
  are taken as they are (checked against the vocabulary).
- Length: a prompt longer than ``max_model_len`` is vLLM's renderer 400; an empty prompt
  and a prompt of exactly ``max_model_len`` tokens are the input processor's 400s (see
  :func:`check_prompt_length`).

Encoding is the expensive step (a 100k-token prompt takes tens of milliseconds: see
docs/benchmarks.md); HF ``tokenizers`` releases the GIL while it encodes, so callers on an
event loop run :func:`chat_prompt` and :func:`completion_prompt` in a worker thread.
"""

from __future__ import annotations

from typing import Any

import attrs

from ..errors import PromptTooLongError, TextInputError
from .assets import ModelText
from .template import ChatOptions, compile_template, render_chat


@attrs.frozen
class Prompt:
    """What a request is submitted with: its token ids, and its text where there is one
    (the rendered chat, or the completion prompt as sent)."""

    token_ids: list[int]
    text: str | None = None


def _check_text_length(model: ModelText, text: str, max_model_len: int | None) -> None:
    """vLLM's ``_text_len_check``: a text longer than any prompt of ``max_model_len``
    tokens could be is refused before encoding (which would be work for nothing)."""
    if max_model_len is None:
        return
    bound = max_model_len * model.max_chars_per_token
    if len(text) > bound:
        raise PromptTooLongError(
            f"This model's maximum context length is {max_model_len} tokens. However, your "
            f"prompt contains {len(text)} characters (more than {bound} characters, which "
            f"is the upper bound for {max_model_len} input tokens). Please reduce the "
            "length of the input prompt.",
            param="input_text",
        )


def _encode(
    model: ModelText, text: str, add_special_tokens: bool, max_model_len: int | None
) -> list[int]:
    _check_text_length(model, text, max_model_len)
    encoding = model.encoding(text, add_special_tokens=add_special_tokens)
    check_prompt_tokens(len(encoding), max_model_len)  # before the ids' list is made
    ids: list[int] = encoding.ids
    return ids


def check_prompt_tokens(count: int, max_model_len: int | None) -> None:
    """vLLM's renderer check (``_token_len_check``): more tokens than the context holds."""
    if max_model_len is not None and count > max_model_len:
        raise PromptTooLongError(
            f"This model's maximum context length is {max_model_len} tokens. However, your "
            f"prompt contains {count} input tokens, which exceeds this limit even without "
            "any output tokens. Please reduce the length of the input prompt.",
            param="input_tokens",
        )


def check_prompt_token_ids(model: ModelText, token_ids: list[int]) -> None:
    """vLLM's ``validate_token_ids``: a prompt id outside the tokenizer's and the model's
    vocabulary (an embedding index out of range)."""
    if not token_ids:
        return
    low, high = min(token_ids), max(token_ids)
    if low < 0:
        raise TextInputError(f"Token id {low} is out of vocabulary", param="prompt")
    if high > max(model.max_token_id, model.vocab_size - 1):
        raise TextInputError(f"Token id {high} is out of vocabulary", param="prompt")


def check_prompt_length(count: int, max_model_len: int) -> None:
    """vLLM's input processor check (``_validate_prompt_len``), made before the request
    reaches the engine: an empty prompt, or one that leaves no room for a token."""
    if count == 0:
        raise TextInputError("The decoder prompt cannot be empty", param="prompt")
    if count > max_model_len:
        raise PromptTooLongError(
            f"The decoder prompt (length {count}) is longer than the maximum model length "
            f"of {max_model_len}. Make sure that `max_model_len` is no smaller than the "
            "number of text tokens.",
            param="prompt",
        )
    if count == max_model_len:
        raise PromptTooLongError(
            f"The decoder prompt (length {count}) plus the number of requested output "
            f"tokens (at least 1) is longer than the maximum model length of "
            f"{max_model_len}. Make sure that `max_model_len` is no smaller than the number "
            "of text tokens (prompt + requested output tokens).",
            param="prompt",
        )


def render_chat_text(
    model: ModelText,
    messages: list[dict[str, Any]],
    options: ChatOptions | None = None,
    chat_template: str | None = None,
) -> str:
    """The chat prompt as text (what ``/v1/chat/completions/render`` and ``/tokenize`` with
    messages start from). ``chat_template``: a named template of the model's, or the text of
    one (the caller decides whether a request may bring its own)."""
    options = options or ChatOptions()
    source = model.resolve_chat_template(chat_template, tools=options.tools is not None)
    return render_chat(compile_template(source), messages, options, model.special_tokens_map)


def chat_prompt(
    model: ModelText,
    messages: list[dict[str, Any]],
    options: ChatOptions | None = None,
    *,
    add_special_tokens: bool = False,
    max_model_len: int | None = None,
    chat_template: str | None = None,
) -> Prompt:
    """A chat request's prompt: rendered, then encoded (400s as vLLM's)."""
    text = render_chat_text(model, messages, options, chat_template)
    return Prompt(_encode(model, text, add_special_tokens, max_model_len), text)


def completion_prompt(
    model: ModelText,
    prompt: str | list[int],
    *,
    add_special_tokens: bool = True,
    max_model_len: int | None = None,
) -> Prompt:
    """A completion request's prompt: a string encoded, or token ids checked."""
    if isinstance(prompt, str):
        return Prompt(_encode(model, prompt, add_special_tokens, max_model_len), prompt)
    if not all(type(i) is int for i in prompt):
        raise TextInputError("a token-id prompt must be a list of integers", param="prompt")
    check_prompt_token_ids(model, prompt)
    check_prompt_tokens(len(prompt), max_model_len)
    return Prompt(list(prompt))
