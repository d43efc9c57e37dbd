"""An :class:`~trioserve.http.errors.HTTPError` as the client reads it: the body in each
of the three shapes the routes answer in (``Exchange.error_shape``), and an engine's
error item as an ``HTTPError``.

- ``openai``: ``{"error": {"message", "type", "code", "param"[, "details"]}}``, every
  route's but these two;
- ``detail``: FastAPI's ``{"detail": ..., "code"}``, the native ``/generate``;
- ``anthropic``: ``{"type": "error", "error": {"type", "message", "code"}, "request_id"}``,
  Anthropic's Messages API (whose body that does not validate is a 400, not a 422).

The error tree (``trioserve/errors.py``) is shared by every layer and renders nothing;
which status each of its errors is answered with is ``errors.py``'s beside this one, and
what a client reads is written here.
"""

from __future__ import annotations

import json
from typing import Any

from .errors import HTTPError

#: OpenAI's error ``type`` by status (anything else: ``server_error`` from 500 on, else
#: ``error``), unless the error names its own.
OPENAI_TYPES = {
    400: "invalid_request_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    499: "cancelled",
    503: "overloaded_error",
    504: "timeout_error",
}

#: Anthropic's error types by status (anything else: ``invalid_request_error`` below 500,
#: ``api_error`` from 500 on).
ANTHROPIC_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
}


def _dumps(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload, separators=(",", ":")).encode()


def openai_type(error: HTTPError) -> str:
    """The error's ``type`` in the OpenAI shape: its own, else its status's."""
    status = error.status
    return error.type or OPENAI_TYPES.get(status) or ("server_error" if status >= 500 else "error")


def payload(error: HTTPError) -> dict[str, Any]:
    """The OpenAI shape, as an object."""
    body: dict[str, Any] = {
        "message": error.message,
        "type": openai_type(error),
        "code": error.code,
        "param": error.param,
    }
    if error.details is not None:
        body["details"] = error.details
    return {"error": body}


def body(error: HTTPError) -> bytes:
    """The OpenAI shape, as JSON."""
    return _dumps(payload(error))


def detail_payload(error: HTTPError) -> dict[str, Any]:
    """The ``{"detail": ...}`` shape of the native routes (FastAPI's): the message, or
    for 422 the list of ``{"loc", "msg"}``; plus the machine-readable ``code``."""
    detail: Any = error.details if error.details is not None else error.message
    return {"detail": detail, "code": error.code}


def detail_body(error: HTTPError) -> bytes:
    return _dumps(detail_payload(error))


def anthropic_status(error: HTTPError) -> int:
    """The status of ``error`` on Anthropic's routes (``/v1/messages``), which answer a
    body that does not validate with 400, not 422."""
    return 400 if error.status == 422 else error.status


def anthropic_payload(error: HTTPError, request_id: str | None = None) -> dict[str, Any]:
    """Anthropic's error shape (``{"type": "error", "error": {"type", "message"}}``, and
    the request's id), with trioserve's machine-readable ``code`` and the field
    ``details`` kept inside ``error``: more than Anthropic sends, which its clients
    ignore."""
    status = error.status
    inner: dict[str, Any] = {
        "type": ANTHROPIC_TYPES.get(status)
        or ("api_error" if status >= 500 else "invalid_request_error"),
        "message": error.message,
        "code": error.code,
    }
    if error.details is not None:
        inner["details"] = error.details
    out: dict[str, Any] = {"type": "error", "error": inner}
    if request_id is not None:
        out["request_id"] = request_id
    return out


def anthropic_body(error: HTTPError, request_id: str | None = None) -> bytes:
    return _dumps(anthropic_payload(error, request_id))


def from_engine(status: int, message: str, type: str, param: str | None = None) -> HTTPError:
    """An engine error item as the client will see it: the engine's own status (a 500
    for one outside 400-599), its type as the code, the parameter it names."""
    if not 400 <= status <= 599:
        status = 500
    return HTTPError(status, message, code=type, type=OPENAI_TYPES.get(status) or type, param=param)
