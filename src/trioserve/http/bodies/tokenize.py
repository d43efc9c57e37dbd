"""The bodies of ``POST /tokenize`` and ``POST /detokenize``, as vLLM's server spells them
(``vllm/entrypoints/serve/tokenize/protocol.py``): a prompt or messages in, token ids out;
token ids in, text out."""

from __future__ import annotations

from typing import Any

import attrs

from .openai import ChatMessage

#: The most token ids one ``/detokenize`` takes (what a context holds, and some).
MAX_DETOKENIZE_TOKENS = 1 << 20


@attrs.define
class TokenizeRequest:
    """``prompt`` (a completion prompt) or ``messages`` (a chat, rendered by the model's
    template first)."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    #: Default: true for a prompt, false for messages (the template writes them).
    add_special_tokens: bool | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    return_token_strs: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None


@attrs.define
class DetokenizeRequest:
    model: str | None = None
    tokens: list[int] = attrs.field(
        kw_only=True,
        metadata={
            "schema": {
                "type": "array",
                "items": {"type": "integer", "minimum": 0},
                "maxItems": MAX_DETOKENIZE_TOKENS,
            }
        },
    )
