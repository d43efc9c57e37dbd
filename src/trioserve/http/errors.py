"""HTTP errors and their bodies: OpenAI-shaped ``{"error": {"message", "type", "code"}}``,
or ``{"detail": ...}`` on the native routes."""

from __future__ import annotations

import json
from typing import Any

_TYPES = {
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


class HTTPError(Exception):
    """An error answer. ``details`` (optional) lists ``{"loc", "msg"}`` per bad field."""

    def __init__(
        self,
        status: int,
        message: str,
        code: str,
        *,
        type: str | None = None,
        param: str | None = None,
        details: list[dict[str, str]] | None = None,
        headers: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.type = type or _TYPES.get(status) or ("server_error" if status >= 500 else "error")
        self.param = param
        self.details = details
        self.headers = headers or []

    def payload(self) -> dict[str, Any]:
        error: dict[str, Any] = {
            "message": self.message,
            "type": self.type,
            "code": self.code,
            "param": self.param,
        }
        if self.details is not None:
            error["details"] = self.details
        return {"error": error}

    def body(self) -> bytes:
        return json.dumps(self.payload(), separators=(",", ":")).encode()

    def detail_payload(self) -> dict[str, Any]:
        """The ``{"detail": ...}`` shape of the native routes (FastAPI's): the message, or
        for 422 the list of ``{"loc", "msg"}``; plus the machine-readable ``code``."""
        detail: Any = self.details if self.details is not None else self.message
        return {"detail": detail, "code": self.code}

    def detail_body(self) -> bytes:
        return json.dumps(self.detail_payload(), separators=(",", ":")).encode()


def from_engine(status: int, message: str, type: str) -> HTTPError:
    """An engine error item as the client will see it: the engine's own status."""
    if not 400 <= status <= 599:
        status = 500
    return HTTPError(status, message, code=type, type=_TYPES.get(status) or type)
