"""The answers' schemas, by component name: the OpenAI-shaped objects and chunks, the
Responses API's objects and events, the native route's, the errors. Written by hand to
what the writers render; CI's schemathesis run holds every answer to them."""

from __future__ import annotations

from typing import Any

from .content import ref

_USAGE = {
    "type": ["object", "null"],
    "properties": {
        "prompt_tokens": {"type": "integer"},
        "completion_tokens": {"type": "integer"},
        "total_tokens": {"type": "integer"},
    },
    "required": ["prompt_tokens", "completion_tokens", "total_tokens"],
}
_LOGPROBS: dict[str, Any] = {}  # the engine's, in the OpenAI shape of the task


def _completion_object(choice: dict[str, Any], kind: str) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "id": {"type": "string"},
            "object": {"const": kind},
            "created": {"type": "integer"},
            "model": {"type": "string"},
            "choices": {"type": "array", "items": choice},
            "usage": ref("Usage"),
        },
        "required": ["id", "object", "created", "model", "choices", "usage"],
    }


def _chunk(choice: dict[str, Any], kind: str) -> dict[str, Any]:
    """A streamed chunk: a delta or a finish per choice, or (``include_usage``) the last
    one, with no choices and the usage."""
    schema = _completion_object(choice, kind)
    schema["required"] = ["id", "object", "created", "model", "choices"]
    return schema


#: vLLM's field: what stopped an answer that ended ``stop`` (docs/api.md).
_STOP_REASON = {
    "type": ["string", "integer", "null"],
    "description": "the stop string matched, or the stop token's id; null otherwise",
}
_CHAT_CHOICE = {
    "type": "object",
    "properties": {
        "index": {"type": "integer"},
        "message": {
            "type": "object",
            "properties": {"role": {"const": "assistant"}, "content": {"type": "string"}},
            "required": ["role", "content"],
        },
        "logprobs": _LOGPROBS,
        "finish_reason": {"type": ["string", "null"]},
        "stop_reason": _STOP_REASON,
    },
    "required": ["index", "message", "finish_reason"],
}
_TEXT_CHOICE = {
    "type": "object",
    "properties": {
        "index": {"type": "integer"},
        "text": {"type": "string"},
        "logprobs": _LOGPROBS,
        "finish_reason": {"type": ["string", "null"]},
        "stop_reason": _STOP_REASON,
    },
    "required": ["index", "text", "finish_reason"],
}
_B64_LIST = {
    "type": "object",
    "properties": {
        "created": {"type": "integer"},
        "data": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"b64_json": {"type": "string"}, "mime_type": {"type": "string"}},
                "required": ["b64_json"],
            },
        },
    },
    "required": ["created", "data"],
}
_DETAIL = {
    "type": "object",
    "properties": {"loc": {"type": "string"}, "msg": {"type": "string"}},
    "required": ["loc", "msg"],
}
_MODEL = {
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "object": {"const": "model"},
        "created": {"type": "integer"},
        "owned_by": {"type": "string"},
    },
    "required": ["id", "object", "created", "owned_by"],
}

# The Responses API (writers/responses.py renders these).
_NATURAL = {"type": "integer", "minimum": 0}
_OUTPUT_TEXT = {
    "type": "object",
    "properties": {
        "type": {"const": "output_text"},
        "text": {"type": "string"},
        "annotations": {"type": "array", "maxItems": 0},
        "logprobs": {"type": "array", "maxItems": 0},
    },
    "required": ["type", "text", "annotations", "logprobs"],
}
_OUTPUT_MESSAGE = {
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "type": {"const": "message"},
        "status": {"enum": ["in_progress", "completed", "incomplete"]},
        "role": {"const": "assistant"},
        "content": {"type": "array", "items": _OUTPUT_TEXT, "maxItems": 1},
    },
    "required": ["id", "type", "status", "role", "content"],
}
_REASONING_TEXT = {
    "type": "object",
    "properties": {"type": {"const": "reasoning_text"}, "text": {"type": "string"}},
    "required": ["type", "text"],
}
_OUTPUT_REASONING = {
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "type": {"const": "reasoning"},
        "summary": {"type": "array", "maxItems": 0},
        "content": {"type": "array", "items": _REASONING_TEXT, "maxItems": 1},
        "status": {"enum": ["in_progress", "completed"]},
    },
    "required": ["id", "type", "summary"],
}
_OUTPUT_FUNCTION_CALL = {
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "type": {"const": "function_call"},
        "call_id": {"type": "string"},
        "name": {"type": "string"},
        "arguments": {"type": "string"},
        "status": {"enum": ["in_progress", "completed"]},
    },
    "required": ["id", "type", "call_id", "name", "arguments", "status"],
}
_OUTPUT_ITEM = {"anyOf": [_OUTPUT_MESSAGE, _OUTPUT_REASONING, _OUTPUT_FUNCTION_CALL]}
_RESPONSE_USAGE = {
    "type": ["object", "null"],
    "properties": {
        "input_tokens": {"type": "integer"},
        "input_tokens_details": {
            "type": "object",
            "properties": {
                "cached_tokens": {"type": "integer"},
                "cache_write_tokens": {"type": "integer"},
            },
            "required": ["cached_tokens", "cache_write_tokens"],
        },
        "output_tokens": {"type": "integer"},
        "output_tokens_details": {
            "type": "object",
            "properties": {"reasoning_tokens": {"type": "integer"}},
            "required": ["reasoning_tokens"],
        },
        "total_tokens": {"type": "integer"},
    },
    "required": [
        "input_tokens",
        "input_tokens_details",
        "output_tokens",
        "output_tokens_details",
        "total_tokens",
    ],
}
_RESPONSE_PROPERTIES: dict[str, Any] = {
    "id": {"type": "string", "pattern": "^resp_"},
    "object": {"const": "response"},
    "created_at": {"type": "integer"},
    "status": {"enum": ["queued", "in_progress", "completed", "incomplete", "failed", "cancelled"]},
    "background": {"type": "boolean"},
    "completed_at": {"type": ["integer", "null"]},
    "error": {
        "type": ["object", "null"],
        "description": "why it failed (or was cancelled): the fields of every error body",
        "properties": {
            "code": {"type": "string"},
            "message": {"type": "string"},
            "type": {"type": "string"},
            "param": {"type": ["string", "null"]},
        },
        "required": ["code", "message", "type", "param"],
    },
    "incomplete_details": {
        "type": ["object", "null"],
        "properties": {"reason": {"enum": ["max_output_tokens", "content_filter"]}},
        "required": ["reason"],
    },
    "model": {"type": "string"},
    "output": {
        "type": "array",
        "items": _OUTPUT_ITEM,
        "description": "in the order the model wrote them: its reasoning, its message, "
        "each function call",
    },
    "usage": _RESPONSE_USAGE,
    # The request's fields, echoed:
    "instructions": {"type": ["string", "null"]},
    "max_output_tokens": {"type": ["integer", "null"]},
    "metadata": {"type": "object", "additionalProperties": {"type": "string"}},
    "parallel_tool_calls": {"type": "boolean"},
    "previous_response_id": {"type": ["string", "null"]},
    "reasoning": {"type": ["object", "null"]},
    "store": {"type": "boolean"},
    "temperature": {"type": ["number", "null"]},
    "text": {
        "type": "object",
        "properties": {
            "format": {
                "type": "object",
                "properties": {"type": {"const": "text"}},
                "required": ["type"],
            }
        },
        "required": ["format"],
    },
    "tool_choice": {
        "anyOf": [
            {"enum": ["auto", "none", "required"]},
            {"type": "object", "properties": {"type": {"const": "function"}}},
        ]
    },
    "tools": {"type": "array", "items": {"type": "object"}},
    "top_p": {"type": ["number", "null"]},
    "truncation": {"const": "disabled"},
    "user": {"type": ["string", "null"]},
}


def _response_event(kinds: list[str], **fields: Any) -> dict[str, Any]:
    properties = {"type": {"enum": kinds}, "sequence_number": _NATURAL, **fields}
    return {"type": "object", "properties": properties, "required": list(properties)}


_WHERE = {"item_id": {"type": "string"}, "output_index": _NATURAL, "content_index": _NATURAL}

#: The answers' schemas, by component name.
ANSWERS: dict[str, dict[str, Any]] = {
    "Error": {
        "type": "object",
        "description": "every error but those of the native route (and 401s, which are "
        "this shape everywhere): docs/api.md, Error body",
        "properties": {
            "error": {
                "type": "object",
                "properties": {
                    "message": {"type": "string"},
                    "type": {"type": "string"},
                    "code": {"type": "string"},
                    "param": {"type": ["string", "null"]},
                    "details": {"type": "array", "items": _DETAIL},
                },
                "required": ["message", "type", "code", "param"],
            }
        },
        "required": ["error"],
    },
    "DetailError": {
        "type": "object",
        "description": "errors of the native route POST /generate (FastAPI's shape)",
        "properties": {
            "detail": {"anyOf": [{"type": "string"}, {"type": "array", "items": _DETAIL}]},
            "code": {"type": "string"},
        },
        "required": ["detail", "code"],
    },
    "Usage": _USAGE,
    "ChatCompletion": _completion_object(_CHAT_CHOICE, "chat.completion"),
    "Completion": _completion_object(_TEXT_CHOICE, "text_completion"),
    "ChatCompletionChunk": _chunk(
        {
            "type": "object",
            "properties": {
                "index": {"type": "integer"},
                "delta": {
                    "type": "object",
                    "properties": {
                        "role": {"const": "assistant"},
                        "content": {"type": "string"},
                    },
                },
                "logprobs": _LOGPROBS,
                "finish_reason": {"type": ["string", "null"]},
                "stop_reason": _STOP_REASON,
            },
            "required": ["index", "delta", "finish_reason"],
        },
        "chat.completion.chunk",
    ),
    "CompletionChunk": _chunk(_TEXT_CHOICE, "text_completion"),
    "Model": _MODEL,
    "ModelList": {
        "type": "object",
        "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": _MODEL}},
        "required": ["object", "data"],
    },
    "EmbeddingList": {
        "type": "object",
        "properties": {
            "object": {"const": "list"},
            "data": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "object": {"const": "embedding"},
                        "index": {"type": "integer"},
                        "embedding": {
                            "description": "a list of numbers (encoding_format float), or "
                            "the float32 little-endian bytes in base64 (base64)",
                            "anyOf": [
                                {"type": "array", "items": {"type": "number"}},
                                {"type": "string", "contentEncoding": "base64"},
                            ],
                        },
                    },
                    "required": ["object", "index", "embedding"],
                },
            },
            "model": {"type": "string"},
            "usage": {
                "type": "object",
                "properties": {
                    "prompt_tokens": {"type": "integer"},
                    "total_tokens": {"type": "integer"},
                },
                "required": ["prompt_tokens", "total_tokens"],
            },
        },
        "required": ["object", "data", "model", "usage"],
    },
    "Generation": {
        "type": "object",
        "properties": {
            "id": {"type": "string"},
            "object": {"const": "generation"},
            "created": {"type": "integer"},
            "model": {"type": "string"},
            "text": {"type": "string"},
            "media": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "modality": {"type": "string"},
                        "mime_type": {"type": ["string", "null"]},
                        "data": {"type": "string", "contentEncoding": "base64"},
                    },
                },
            },
            "finish_reason": {"type": ["string", "null"]},
            "stop_reason": _STOP_REASON,
            "usage": _USAGE,
        },
        "required": ["id", "object", "created", "model", "text", "media", "finish_reason"],
    },
    "Images": _B64_LIST,
    "Videos": _B64_LIST,
    "Cancelled": {
        "type": "object",
        "properties": {
            "id": {"type": "string"},
            "object": {"const": "request"},
            "cancelled": {"const": True},
        },
        "required": ["id", "object", "cancelled"],
    },
    "Tokenized": {
        "type": "object",
        "properties": {
            "count": {"type": "integer"},
            "max_model_len": {"type": "integer"},
            "tokens": {"type": "array", "items": {"type": "integer"}},
            "token_strs": {"type": ["array", "null"], "items": {"type": "string"}},
        },
        "required": ["count", "max_model_len", "tokens", "token_strs"],
    },
    "Detokenized": {
        "type": "object",
        "properties": {"prompt": {"type": "string"}},
        "required": ["prompt"],
    },
    "RenderedRequest": {
        "type": "object",
        "description": "vLLM's GenerateRequest: the prompt's token ids and the request's "
        "sampling parameters as vLLM's SamplingParams fields",
        "properties": {
            "request_id": {"type": "string"},
            "token_ids": {"type": "array", "items": {"type": "integer"}},
            "sampling_params": {"type": "object"},
            "model": {"type": "string"},
            "stream": {"type": "boolean"},
        },
        "required": ["request_id", "token_ids", "sampling_params", "model", "stream"],
    },
    "Status": {
        "type": "object",
        "properties": {"status": {"enum": ["ok", "draining", "no_engine", "alive"]}},
        "required": ["status"],
    },
    "Response": {
        "type": "object",
        "description": "a response of the Responses API: docs/api.md, The Response object",
        "properties": _RESPONSE_PROPERTIES,
        "required": list(_RESPONSE_PROPERTIES),
    },
    "ResponseEvent": {
        "description": "a typed event of a streamed response, numbered from 0 by "
        "sequence_number: docs/api.md, Streamed: typed events",
        "anyOf": [
            _response_event(
                [
                    "response.created",
                    "response.in_progress",
                    "response.completed",
                    "response.incomplete",
                    "response.failed",
                ],
                response=ref("Response"),
            ),
            _response_event(
                ["response.output_item.added", "response.output_item.done"],
                output_index=_NATURAL,
                item=_OUTPUT_ITEM,
            ),
            _response_event(
                ["response.content_part.added", "response.content_part.done"],
                **_WHERE,
                part={"anyOf": [_OUTPUT_TEXT, _REASONING_TEXT]},
            ),
            _response_event(["response.reasoning_text.delta"], **_WHERE, delta={"type": "string"}),
            _response_event(["response.reasoning_text.done"], **_WHERE, text={"type": "string"}),
            _response_event(
                ["response.function_call_arguments.delta"],
                item_id={"type": "string"},
                output_index=_NATURAL,
                delta={"type": "string"},
            ),
            _response_event(
                ["response.function_call_arguments.done"],
                item_id={"type": "string"},
                output_index=_NATURAL,
                arguments={"type": "string"},
            ),
            _response_event(
                ["response.output_text.delta"],
                **_WHERE,
                delta={"type": "string"},
                logprobs={"type": "array", "maxItems": 0},
            ),
            _response_event(
                ["response.output_text.done"],
                **_WHERE,
                text={"type": "string"},
                logprobs={"type": "array", "maxItems": 0},
            ),
        ],
    },
    "ResponseDeleted": {
        "type": "object",
        "properties": {
            "id": {"type": "string"},
            "object": {"const": "response"},
            "deleted": {"const": True},
        },
        "required": ["id", "object", "deleted"],
    },
}
