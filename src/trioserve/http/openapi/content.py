"""What the route tables describe their routes with: content types, references to
components, the media types of answers (JSON, Server-Sent Events, binary), and
:class:`Doc`, one route's description."""

from __future__ import annotations

from typing import Any

import attrs

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
