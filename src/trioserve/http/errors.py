"""What the client is told when a request fails: the HTTP layer's side of the error tree.

The layers beneath raise neutral errors (``trioserve/errors.py``: a machine-readable code,
no status) and end requests with neutral reasons (``trioserve/ends.py``); the HTTP status,
error code and message a client reads for each are written here, once:

- :class:`HTTPError`: an error answer (status, message, code; OpenAI's ``type`` and
  ``param``, per-field ``details``, headers), raised by the HTTP layer itself;
- :data:`STATUSES` and :func:`http_error`: a neutral error (what the text layer refuses,
  what the engine client raises) as the answer a client reads;
- :data:`END_ANSWERS`: an :class:`~trioserve.ends.EndReason` -> its :class:`EndAnswer`
  (status, code, message, and the close code of a WebSocket ended so), a row per member;
- :class:`EngineItemError`, :class:`WriterRefused`: what a writer raises to end its
  request with an answer (the engine's error item; what it cannot carry).

How an answer is laid out in a body (OpenAI's, FastAPI's or Anthropic's shape) is
``error_bodies.py``'s.
"""

from __future__ import annotations

from typing import Final

import attrs

from ..ends import EndReason
from ..errors import (
    EngineError,
    InputError,
    SlowClientError,
    TrioserveError,
    UnencodableRequestError,
    WriterFailedError,
)

#: WebSocket close codes (RFC 6455).
GOING_AWAY: Final = 1001
POLICY_VIOLATION: Final = 1008


class HTTPError(TrioserveError):
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
        #: Its own OpenAI ``type``; None: its status's (``error_bodies.py``).
        self.type = type
        self.param = param
        self.details = details
        self.headers = headers or []


#: A neutral error that reaches a client -> the status it is answered with (its nearest
#: class here, walking its MRO).
STATUSES: Final[dict[type[TrioserveError], int]] = {
    InputError: 400,
    EngineError: 503,
    # The client's to change: a value the engine protocol cannot carry.
    UnencodableRequestError: 422,
    SlowClientError: 503,
    WriterFailedError: 500,
}

#: What the HTTP layer turns into an answer with :func:`http_error`.
Answerable = InputError | EngineError | SlowClientError | WriterFailedError


def status_of(error: TrioserveError) -> int:
    """The status a neutral error is answered with (500 for one without a row)."""
    for cls in type(error).__mro__:
        status = STATUSES.get(cls)
        if status is not None:
            return status
    return 500


def http_error(error: HTTPError | Answerable) -> HTTPError:
    """``error`` as the answer a client reads: its message and code, the status of
    :data:`STATUSES` (an :class:`HTTPError` as it is)."""
    if isinstance(error, HTTPError):
        return error
    if isinstance(error, InputError):
        return HTTPError(status_of(error), error.message, error.code, param=error.param)
    return HTTPError(status_of(error), str(error), error.code)


class EngineItemError(TrioserveError):
    """The engine ended the request with an error item (no abort is owed)."""

    def __init__(self, error: HTTPError) -> None:
        super().__init__(error.message)
        self.error = error


class WriterRefused(TrioserveError):
    """The writer cannot take what the engine sends; the request ends with ``reason``."""

    def __init__(self, error: HTTPError, reason: EndReason) -> None:
        super().__init__(error.message)
        self.error = error
        self.reason = reason


@attrs.frozen
class EndAnswer:
    """What a client is told of a request ended for one reason."""

    status: int
    code: str
    message: str
    #: The close code of a WebSocket whose requests are all ended for this reason.
    close_code: int = POLICY_VIOLATION


#: Every end reason's answer. A test holds it to a row per member.
END_ANSWERS: Final[dict[EndReason, EndAnswer]] = {
    # (Nothing is written: there is no one to tell.)
    EndReason.DISCONNECT: EndAnswer(499, "client_disconnected", "the client went away"),
    EndReason.DEADLINE: EndAnswer(504, "deadline_exceeded", "the request exceeded its deadline"),
    EndReason.CANCEL: EndAnswer(499, "request_cancelled", "the request was cancelled"),
    EndReason.SLOW_CLIENT: EndAnswer(
        503, "slow_client", "the client fell behind its stream buffer"
    ),
    EndReason.ENGINE_LOST: EndAnswer(503, "engine_lost", "the engine stopped responding"),
    EndReason.ENGINE_FAILED: EndAnswer(
        503,
        "engine_failed",
        "the engine broke the protocol and is out of service until it recovers",
    ),
    EndReason.DRAIN: EndAnswer(
        503, "server_shutting_down", "the server is shutting down", close_code=GOING_AWAY
    ),
    EndReason.ABANDONED: EndAnswer(
        500, "request_abandoned", "another part of the same request failed"
    ),
    EndReason.INTERNAL_ERROR: EndAnswer(
        500, "internal_error", "the server failed to answer this request"
    ),
    EndReason.ERROR: EndAnswer(500, "internal_error", "the server failed to answer this request"),
    # (A writer's refusal carries its own message: these are the fallbacks.)
    EndReason.RESPONSE_TOO_LARGE: EndAnswer(
        502, "response_too_large", "the engine's answer is too large for this response"
    ),
    EndReason.BAD_ENGINE_OUTPUT: EndAnswer(
        502, "bad_engine_output", "the engine sent an output this response cannot carry"
    ),
    EndReason.RESPONSE_OVERFLOW: EndAnswer(
        500, "response_events_overflow", "the response outgrew what the response store holds"
    ),
    # Not a failure: the client reads a 200.
    EndReason.STOP_STRING: EndAnswer(200, "", ""),
}


def end_error(reason: EndReason, message: str | None = None) -> HTTPError:
    """The error a client is told of a request ended for ``reason`` (``message`` in place
    of the table's, when the caller knows more)."""
    answer = END_ANSWERS[reason]
    return HTTPError(answer.status, message or answer.message, answer.code)
