"""trioserve's error tree: one place, each name saying whose fault it was.

::

    TrioserveError            neutral: no HTTP status of its own
      HTTPError               an answer to the client: status, message, machine-readable code
        TextInputError        what the text layer refuses (400): a sampling parameter vLLM
                              would reject, a prompt too long, a template's raise_exception
          ChatTemplateError, PromptTooLongError, UnsupportedContentError
      EngineError             about an engine: the request did not complete (503 family)
        NoEngineError, EngineLostError, EngineOverloadedError, UnencodableRequestError,
        EngineCallError,
        EngineFailedError > ProtocolVersionError
      SlowClientError         the client fell behind its buffer bound (503)
      WriterFailedError       a bug in one response's writer (500)
      EngineItemError         the engine ended the request with an error item (its HTTPError)
      WriterRefused           the response cannot take what the engine sends (its HTTPError)
      ClientGone              the client went away (its request ends quietly)
      HttpProtocolError       the client broke HTTP/1.1 (the built-in server answers 4xx, closes)
      PeerProtocolError       an engine-link message the protocol does not allow (the peer's)
      ZmtpProtocolError       the engine link broke ZeroMQ's wire protocol (the peer's)
        ZmtpRefusedError      the engine refused this frontend (ZMTP ERROR; a CURVE key)
      RequestError            raised by an engine backend (SDK) to end a request with a status
      CommandError            a command's usage or environment error (the CLI's exit status)

Only what reaches a client carries a status and a code: :class:`HTTPError`, and the
errors the request lifecycle answers with one (:class:`EngineError`,
:class:`SlowClientError`, :class:`WriterFailedError`). The transport's, the protocols',
the SDK's and the CLI's carry none. The bodies a client reads are the HTTP layer's
(``http/error_bodies.py``); this module imports nothing of trioserve.
"""

from __future__ import annotations


class TrioserveError(Exception):
    """Base of every error trioserve raises on purpose. Neutral: only the errors that
    reach a client (:class:`HTTPError`, and what the request lifecycle turns into one:
    :class:`EngineError`, :class:`SlowClientError`, :class:`WriterFailedError`) carry an
    HTTP status and a machine-readable code; how a client reads them is the HTTP
    layer's (``http/error_bodies.py``)."""


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


class EngineCallError(EngineError):
    """The engine answered a call with a failure (a vLLM EngineCore UTILITY call's
    message): that call failed, the engine serves on."""

    code = "engine_call_failed"


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


class ClientGone(TrioserveError):
    """The client disconnected (or was dropped: a write that could not finish)."""


class HttpProtocolError(TrioserveError):
    """The client broke HTTP/1.1: answer ``status`` (4xx) and close the connection."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class PeerProtocolError(TrioserveError, ValueError):
    """A frame from the other end of an engine link (engine or frontend) that is not a
    valid message of this protocol version: the peer's fault."""


class ZmtpProtocolError(TrioserveError):
    """The engine link's peer broke ZeroMQ's wire protocol (greeting, handshake, framing,
    CURVE's boxes and nonces): that connection is dropped."""


class ZmtpRefusedError(ZmtpProtocolError):
    """The engine link's peer refused us with an ERROR command (under CURVE, usually a key
    its ZAP handler does not authorize)."""


class RequestError(TrioserveError):
    """Raised by an engine backend (the SDK) to end a request with an HTTP status the
    client will see."""

    def __init__(self, status: int, message: str, type: str = "engine_error") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type


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
        #: Its own OpenAI ``type``; None: its status's (``http/error_bodies.py``).
        self.type = type
        self.param = param
        self.details = details
        self.headers = headers or []


class TextInputError(HTTPError):
    """A request the text layer refuses before anything reaches the engine: a 400 naming
    the parameter (``param``), with vLLM's own message where vLLM refuses the same."""

    default_code = "invalid_request"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(400, message, code or self.default_code, param=param)


class ChatTemplateError(TextInputError):
    """The chat template refused the conversation (its ``raise_exception``), failed to
    render it, or the model has none: the template's own message."""

    default_code = "chat_template_error"


class PromptTooLongError(TextInputError):
    """The prompt leaves no room in the model's context (or ``max_tokens`` asks for more
    than there is)."""

    default_code = "context_length_exceeded"


class UnsupportedContentError(TextInputError):
    """A content part the text pipeline cannot render (an image, audio: multimodal input
    is not served on the token-id path)."""

    default_code = "unsupported_content"


class EngineItemError(TrioserveError):
    """The engine ended the request with an error item (no abort is owed)."""

    def __init__(self, error: HTTPError) -> None:
        super().__init__(error.message)
        self.error = error


class WriterRefused(TrioserveError):
    """The writer cannot take what the engine sends; the request ends with ``reason`` (a
    member of ``trioserve.ends.EndReason``)."""

    def __init__(self, error: HTTPError, reason: str) -> None:
        super().__init__(error.message)
        self.error = error
        self.reason = reason


class CommandError(TrioserveError):
    """A usage or environment error of a ``trioserve`` command: one line that names the
    cause and the fix, and the exit status (2: the command line is wrong; 1: something it
    names cannot be used), without a traceback (but with it under ``--log-level debug``)."""

    def __init__(self, message: str, exit_status: int = 1) -> None:
        super().__init__(message)
        self.exit_status = exit_status
