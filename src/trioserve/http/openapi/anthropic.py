"""The answers of Anthropic's Messages API routes (``/v1/messages``), for ``/openapi.json``
(``spec.py`` merges them into its components): the ``Message`` object, its stream's
events, the token count, and Anthropic's error shape. Written to what
``writers/anthropic.py`` renders; CI's schemathesis run holds every answer to them."""

from __future__ import annotations

from typing import Any

_NATURAL = {"type": "integer", "minimum": 0}
_STOP_REASON = {"enum": ["end_turn", "max_tokens", "stop_sequence", "tool_use", "refusal", None]}

_USAGE = {
    "type": "object",
    "properties": {
        "input_tokens": _NATURAL,
        "output_tokens": _NATURAL,
        "cache_read_input_tokens": _NATURAL,
    },
    "required": ["input_tokens", "output_tokens"],
}

_TEXT = {
    "type": "object",
    "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
    "required": ["type", "text"],
}
_THINKING = {
    "type": "object",
    "properties": {
        "type": {"const": "thinking"},
        "thinking": {"type": "string"},
        "signature": {"type": "string"},
    },
    "required": ["type", "thinking", "signature"],
}
_TOOL_USE = {
    "type": "object",
    "properties": {
        "type": {"const": "tool_use"},
        "id": {"type": "string"},
        "name": {"type": "string"},
        "input": {"type": "object"},
    },
    "required": ["type", "id", "name", "input"],
}
_BLOCK = {"anyOf": [_TEXT, _THINKING, _TOOL_USE]}


def _message(content: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "id": {"type": "string"},
            "type": {"const": "message"},
            "role": {"const": "assistant"},
            "model": {"type": "string"},
            "content": content,
            "stop_reason": _STOP_REASON,
            "stop_sequence": {"type": ["string", "null"]},
            "usage": _USAGE,
        },
        "required": [
            "id",
            "type",
            "role",
            "model",
            "content",
            "stop_reason",
            "stop_sequence",
            "usage",
        ],
    }


def _event(kind: str, **fields: Any) -> dict[str, Any]:
    properties = {"type": {"const": kind}, **fields}
    return {"type": "object", "properties": properties, "required": list(properties)}


_ERROR_OBJECT = {
    "type": "object",
    "properties": {
        "type": {"type": "string"},
        "message": {"type": "string"},
        "code": {"type": "string"},
        "details": {"type": "array"},
    },
    "required": ["type", "message"],
}

_DELTA = {
    "anyOf": [
        {
            "type": "object",
            "properties": {"type": {"const": "text_delta"}, "text": {"type": "string"}},
            "required": ["type", "text"],
        },
        {
            "type": "object",
            "properties": {"type": {"const": "thinking_delta"}, "thinking": {"type": "string"}},
            "required": ["type", "thinking"],
        },
        {
            "type": "object",
            "properties": {
                "type": {"const": "input_json_delta"},
                "partial_json": {"type": "string"},
            },
            "required": ["type", "partial_json"],
        },
    ]
}

ANSWERS: dict[str, dict[str, Any]] = {
    "AnthropicError": {
        "type": "object",
        "description": "the errors of Anthropic's Messages API routes (their 401 too): "
        "Anthropic's shape, with trioserve's code (docs/api.md, Anthropic's Messages API)",
        "properties": {
            "type": {"const": "error"},
            "error": _ERROR_OBJECT,
            "request_id": {"type": "string"},
        },
        "required": ["type", "error"],
    },
    "Message": {
        "description": "a message of Anthropic's Messages API: docs/api.md",
        **_message({"type": "array", "items": _BLOCK, "minItems": 1}),
    },
    "MessageEvent": {
        "description": "an event of a streamed message (its data's type is the event's "
        "name): docs/api.md, Anthropic's Messages API",
        "anyOf": [
            _event("message_start", message=_message({"type": "array", "maxItems": 0})),
            _event("content_block_start", index=_NATURAL, content_block=_BLOCK),
            _event("content_block_delta", index=_NATURAL, delta=_DELTA),
            _event("content_block_stop", index=_NATURAL),
            _event(
                "message_delta",
                delta={
                    "type": "object",
                    "properties": {
                        "stop_reason": _STOP_REASON,
                        "stop_sequence": {"type": ["string", "null"]},
                    },
                    "required": ["stop_reason", "stop_sequence"],
                },
                usage=_USAGE,
            ),
            _event("message_stop"),
            _event("ping"),
            _event("error", error=_ERROR_OBJECT),
        ],
    },
    "MessageTokensCount": {
        "type": "object",
        "properties": {
            "input_tokens": _NATURAL,
            "estimated": {
                "type": "boolean",
                "description": "true: estimated by characters (no tokenizer of the "
                "model here); absent when the model's tokenizer counted them",
            },
        },
        "required": ["input_tokens"],
    },
}
