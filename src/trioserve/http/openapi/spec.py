"""The OpenAPI document: each route's operation (its parameters, body, answers, and the
errors a route of its kind may answer), the components, the security schemes."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ... import __version__
from .answers import ANSWERS
from .anthropic import ANSWERS as ANTHROPIC_ANSWERS
from .content import BINARY, JSON, MULTIPART, Doc, ref
from .schemas import type_schema

OPENAPI_VERSION = "3.1.0"

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


def operation(
    doc: Doc, method: str, error_shape: str, components: dict[str, Any]
) -> dict[str, Any]:
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
