"""``GET /openapi.json``: the HTTP API described from the code that serves it.

Every route of the application's table (``app.py``) carries a :class:`Doc`: what it is
for, the attrs class its body is structured into, the content types it accepts, and what
it answers. Request schemas are generated here by walking those attrs classes, the very
classes cattrs validates requests with: their field types, which fields are required,
the ranges declared on the fields (``validation.bounded``, which the checks read too)
and the JSON Schema of fields whose type says too little (``validation.documented``).
There is no second copy of a request schema to drift. Answers are described here by
hand (the writers render them as bytes, not from classes); CI's schemathesis run holds
every answer to them (tests/process/test_openapi_conformance.py).
"""

from __future__ import annotations

import types
import typing
from collections.abc import Iterable
from typing import Any

import attrs

from .. import __version__
from .openapi_anthropic import ANSWERS as ANTHROPIC_ANSWERS

OPENAPI_VERSION = "3.1.0"

JSON = "application/json"
URLENCODED = "application/x-www-form-urlencoded"
MULTIPART = "multipart/form-data"

INT64 = {"type": "integer", "minimum": -(2**63), "maximum": 2**63 - 1}


def ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def json_body(name: str) -> dict[str, dict[str, Any]]:
    return {JSON: {"schema": ref(name)}}


STREAM = {"type": "string", "description": "a stream of lines, see docs/api.md"}


def sse(chunk: str) -> dict[str, Any]:
    """A Server-Sent Events answer (OpenAPI 3.2's ``itemSchema``: each event): ``data`` is
    a ``chunk`` as JSON, an error object (the stream's last event), or ``[DONE]``."""
    return {
        "itemSchema": {
            "type": "object",
            "properties": {
                "data": {
                    "anyOf": [
                        {"const": "[DONE]"},
                        {
                            "type": "string",
                            "contentMediaType": "application/json",
                            "contentSchema": {"anyOf": [ref(chunk), ref("Error")]},
                        },
                    ]
                }
            },
            "required": ["data"],
        }
    }


def sse_events(event: str) -> dict[str, Any]:
    """A Server-Sent Events answer whose events are named (``event:``, the Responses API):
    ``data`` is an ``event`` as JSON; there is no ``[DONE]``."""
    return {
        "itemSchema": {
            "type": "object",
            "properties": {
                "event": {"type": "string"},
                "data": {
                    "type": "string",
                    "contentMediaType": "application/json",
                    "contentSchema": ref(event),
                },
            },
            "required": ["event", "data"],
        }
    }


BINARY = {"type": "string", "contentMediaType": "application/octet-stream"}


@attrs.frozen
class Doc:
    """What ``/openapi.json`` says about one route."""

    operation_id: str
    summary: str
    tag: str
    #: The attrs class the request body is structured into (None: no body).
    body: type | None = None
    #: The request content types the route accepts; each is described by ``body``.
    content: tuple[str, ...] = (JSON,)
    #: File fields of a multipart body, and which of them are required.
    files: tuple[str, ...] = ()
    required_files: tuple[str, ...] = ()
    #: The success answer: content type -> media type object.
    ok: dict[str, dict[str, Any]] = attrs.field(factory=dict)
    ok_status: int = 200
    description: str = ""
    #: More answers that are not errors of the Error shape (``/health``'s 503).
    others: dict[int, tuple[str, dict[str, dict[str, Any]]]] = attrs.field(factory=dict)
    #: A generation route: it may end in any way of docs/api.md's "How a request can end".
    generation: bool = False
    #: The path parameter of a templated path, described.
    parameter: str = ""
    #: Query parameters: name -> (JSON Schema, description).
    query: dict[str, tuple[dict[str, Any], str]] = attrs.field(factory=dict)
    #: OpenAPI links of the success answer: name -> (operation id, the ``id`` parameter
    #: as a runtime expression), so a client (and schemathesis' stateful phase) knows
    #: which calls take what this one made.
    links: dict[str, tuple[str, str]] = attrs.field(factory=dict)
    #: An example JSON body (checked against the schema by the conformance run).
    example: dict[str, Any] | None = None


# -- schemas of the attrs classes -----------------------------------------------------


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    kind = schema.get("type")
    if isinstance(kind, str):
        out = {**schema, "type": [kind, "null"]}
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
        return out
    if not schema:  # anything: null included
        return schema
    return {"anyOf": [schema, {"type": "null"}]}


def type_schema(tp: Any, components: dict[str, Any]) -> dict[str, Any]:
    """The JSON Schema of a field type (an attrs class becomes a component)."""
    if tp is Any:
        return {}
    if tp is type(None):
        return {"type": "null"}
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        present = [a for a in args if a is not type(None)]
        inner = (
            type_schema(present[0], components)
            if len(present) == 1
            else {"anyOf": [type_schema(a, components) for a in present]}
        )
        return _nullable(inner) if len(present) < len(args) else inner
    if tp is bool:
        return {"type": "boolean"}
    if tp is int:
        return dict(INT64)
    if tp is float:
        return {"type": "number"}
    if tp is str:
        return {"type": "string"}
    if origin is list:
        (item,) = typing.get_args(tp) or (Any,)
        return {"type": "array", "items": type_schema(item, components)}
    if origin is dict or tp is dict:
        return {"type": "object"}
    if attrs.has(tp):
        name = tp.__name__
        if name not in components:
            components[name] = {}  # (a class that refers to itself)
            components[name] = class_schema(tp, components)
        return ref(name)
    raise TypeError(f"no JSON Schema for {tp!r}")


def class_schema(cls: type, components: dict[str, Any]) -> dict[str, Any]:
    """The object schema of an attrs request class: a property per field, the fields
    without a default required; other properties are allowed (a route passes the fields
    it does not know to the engine)."""
    hints = typing.get_type_hints(cls)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for field in attrs.fields(cls):
        properties[field.name] = field_schema(field, hints[field.name], components)
        if field.default is attrs.NOTHING:
            required.append(field.name)
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    return schema


def field_schema(field: Any, tp: Any, components: dict[str, Any]) -> dict[str, Any]:
    declared = field.metadata.get("schema") or {}
    bounds = field.metadata.get("bounds")
    args = typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, types.UnionType) else ()
    optional = type(None) in args or field.default is None
    base = [a for a in args if a is not type(None)] if args else [tp]
    if "anyOf" in declared:
        # The declared alternatives replace what the type says (``Any``).
        alternatives = declared["anyOf"]
        if optional and {"type": "null"} not in alternatives:
            alternatives = [*alternatives, {"type": "null"}]
        return {**declared, "anyOf": alternatives}
    schema = type_schema(base[0] if len(base) == 1 else tp, components)
    if "$ref" in schema and declared:
        schema = {"allOf": [schema]}
    schema.update(declared)
    if bounds is not None:
        if bounds.minimum is not None:
            key = "exclusiveMinimum" if bounds.exclusive_minimum else "minimum"
            schema.pop("minimum", None)
            schema[key] = bounds.minimum
        if bounds.maximum is not None:
            schema["maximum"] = bounds.maximum
    return _nullable(schema) if optional and schema else schema


# -- answers ----------------------------------------------------------------------------

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

#: What each error status a generation route may answer means (docs/api.md).
GENERATION_ERRORS = {
    400: "a bad header, Content-Type, form, media or param (unsupported_content_type, "
    "invalid_request_timeout, invalid_form, invalid_media, fault_injection_disabled, ...)",
    404: "no connected engine does what the route needs (route_not_supported), or the "
    "model is not served (model_not_found)",
    408: "the request body stopped arriving (body_timeout)",
    409: "this X-Request-Id is in flight already (duplicate_request_id)",
    413: "the body is too large (body_too_large)",
    422: "the body does not validate (invalid_request, with details)",
    499: "cancelled by DELETE /v1/requests/{id} (request_cancelled)",
    500: "an engine error (the engine's code)",
    502: "the engine's answer is malformed or too large (bad_engine_output, "
    "response_too_large, ...)",
    503: "overloaded, shutting down, no engine, engine lost or failed, slow client",
    504: "the deadline passed (deadline_exceeded)",
}
#: The error schema of each error shape (``Exchange.error_shape``).
ERROR_SCHEMAS = {"openai": "Error", "detail": "DetailError", "anthropic": "AnthropicError"}
UNAUTHORIZED = "no valid API key (invalid_api_key; only when the server has API keys)"


def _error_response(description: str, schema: str = "Error") -> dict[str, Any]:
    return {
        "description": description,
        "headers": {"X-Request-Id": {"$ref": "#/components/headers/X-Request-Id"}},
        "content": {JSON: {"schema": ref(schema)}},
    }


def operation(doc: Doc, method: str, error_shape: str, components: dict[str, Any]) -> dict:
    request_id = {"$ref": "#/components/headers/X-Request-Id"}
    op: dict[str, Any] = {
        "operationId": doc.operation_id,
        "summary": doc.summary,
        "tags": [doc.tag],
    }
    if doc.description:
        op["description"] = doc.description
    parameters: list[dict[str, Any]] = []
    if doc.parameter:
        parameters.append(
            {
                "name": "id",
                "in": "path",
                "required": True,
                "description": doc.parameter,
                "schema": {"type": "string", "minLength": 1},
            }
        )
    for name, (schema, description) in doc.query.items():
        parameters.append(
            {"name": name, "in": "query", "description": description, "schema": schema}
        )
    if parameters:
        op["parameters"] = parameters
    if doc.body is not None:
        schema = type_schema(doc.body, components)
        content: dict[str, Any] = {}
        for kind in doc.content:
            if kind == MULTIPART and doc.files:
                fields = components[doc.body.__name__]
                form = {
                    **fields,
                    "properties": {
                        **fields["properties"],
                        **{name: BINARY for name in doc.files},
                    },
                    "required": [*fields.get("required", []), *doc.required_files],
                }
                content[kind] = {"schema": form}
            else:
                content[kind] = {"schema": schema}
                if kind == JSON and doc.example is not None:
                    content[kind]["example"] = doc.example
        op["requestBody"] = {"required": True, "content": content}
    responses: dict[str, Any] = {
        str(doc.ok_status): {"description": "success", "headers": {"X-Request-Id": request_id}}
    }
    if doc.ok:
        responses[str(doc.ok_status)]["content"] = doc.ok
    if doc.links:
        responses[str(doc.ok_status)]["links"] = {
            name: {"operationId": target, "parameters": {"id": expression}}
            for name, (target, expression) in doc.links.items()
        }
    for status, (description, answer) in doc.others.items():
        responses[str(status)] = {
            "description": description,
            "headers": {"X-Request-Id": request_id},
            "content": answer,
        }
    shape = ERROR_SCHEMAS[error_shape]
    if doc.generation:
        for status, description in GENERATION_ERRORS.items():
            if error_shape == "anthropic" and status == 422:
                continue  # (Anthropic's 400)
            if error_shape == "anthropic" and status == 400:
                description = (
                    f"{description}; the body does not validate ({GENERATION_ERRORS[422]})"
                )
            responses[str(status)] = _error_response(description, shape)
    responses["401"] = _error_response(
        UNAUTHORIZED, "AnthropicError" if error_shape == "anthropic" else "Error"
    )
    # Anything else (405, errors of the HTTP server itself): the error body.
    responses["default"] = _error_response(
        "an error: the body says which (code)",
        "AnyError" if error_shape == "detail" else shape,
    )
    op["responses"] = responses
    return op


def build_spec(
    routes: Iterable[tuple[str, str, Doc, str]],
    *,
    api_keys: bool,
    open_paths: Iterable[str],
) -> dict[str, Any]:
    """The OpenAPI document for ``routes``: (method, path template, doc, the shape of its
    errors: ``Exchange.error_shape``). With ``api_keys``, every path but ``open_paths``
    needs a key (a bearer token, or ``X-Api-Key``)."""
    components: dict[str, Any] = {**ANSWERS, **ANTHROPIC_ANSWERS}
    components["AnyError"] = {"anyOf": [ref("Error"), ref("DetailError")]}
    paths: dict[str, dict[str, Any]] = {}
    open_set = set(open_paths)
    for method, path, doc, error_shape in routes:
        op = operation(doc, method, error_shape, components)
        if api_keys and path in open_set:
            op["security"] = []
            del op["responses"]["401"]
        elif not api_keys:
            del op["responses"]["401"]
        paths.setdefault(path, {})[method.lower()] = op
    spec: dict[str, Any] = {
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": "trioserve",
            "version": __version__,
            "description": DESCRIPTION,
        },
        "paths": paths,
        "components": {
            "schemas": dict(sorted(components.items())),
            "headers": {
                "X-Request-Id": {
                    "description": "the request's id (the client's X-Request-Id when usable, "
                    "else a fresh one); the id DELETE /v1/requests/{id} takes",
                    "required": True,
                    "schema": {"type": "string"},
                }
            },
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "apiKey": {"type": "apiKey", "in": "header", "name": "X-Api-Key"},
            },
        },
    }
    if api_keys:
        spec["security"] = [{"bearer": []}, {"apiKey": []}]
    return spec


DESCRIPTION = """\
An OpenAI-compatible frontend for model-inference engines (docs/api.md is the reference).

- Generation routes exist only where a connected engine declares what they need:
  otherwise 404 `route_not_supported`.
- Request fields this schema does not name are passed to the engine as parameters.
- Integers, numbers and booleans are accepted as strings too (`"16"`, `"true"`);
  `null` is the same as an absent optional field.
- `stream: true` answers Server-Sent Events (`text/event-stream`) on the chat and
  completion routes, NDJSON on `/generate`.
- Headers: `X-Request-Id` (optional, echoed), `X-Request-Timeout` (seconds, generation
  routes).
- WebSocket: `GET /v1/ws` multiplexes streaming requests on one socket
  (docs/websocket.md); OpenAPI cannot describe it.
"""
