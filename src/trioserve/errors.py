"""trioserve's error tree: one place, each name saying whose fault it was."""

from __future__ import annotations


class TrioserveError(Exception):
    """Base of every error trioserve raises on purpose."""

    #: The HTTP status and machine-readable code a client is answered with.
    status = 500
    code = "internal_error"


class EngineError(TrioserveError):
    """Something about an engine; the request did not complete."""

    status = 503
    code = "engine_unavailable"


class NoEngineError(EngineError):
    """No connected engine serves what the request asks for."""


class EngineLostError(EngineError):
    """The engine stopped answering heartbeats (or went away) while the request ran."""

    code = "engine_lost"


class EngineOverloadedError(EngineError):
    """The engine's send queue is full: the engine is not reading."""

    code = "engine_overloaded"


class UnencodableRequestError(EngineError):
    """The request holds a value the engine protocol cannot carry (an integer beyond 64
    bits, say): the client's to change. Raised before anything reaches the engine."""

    status = 422
    code = "invalid_request"


class EngineFailedError(EngineError):
    """The engine broke the protocol (refused our version, changed it, sent a frame over
    the bound): it is out of service, and tried again after a backoff."""

    code = "engine_failed"


class ProtocolVersionError(EngineFailedError):
    """The engine speaks another protocol version (an :class:`EngineFailedError`)."""

    code = "protocol_version_mismatch"


class SlowClientError(TrioserveError):
    """The client fell further behind than the per-request buffer allows."""

    status = 503
    code = "slow_client"


class WriterFailedError(TrioserveError):
    """A bug in one response's writer (its synchronous path, run by the engine link):
    that request ends with a 500 and one abort; nothing else is affected."""

    status = 500
    code = "internal_error"
